package idemamqp

import (
	"context"
	"fmt"
	"net"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Dialer opens a connection to the broker. A Source and a Sink dial through it again after
// losing their connection, so it must return a new connection on every call.
type Dialer func(ctx context.Context) (*amqp.Connection, error)

// DialTimeoutDefault bounds opening one connection (TCP, TLS and the AMQP handshake).
const DialTimeoutDefault = 10 * time.Second

// DialURL returns a Dialer for an amqp:// or amqps:// URL; name appears as the connection's
// name in the management UI and in rabbitmqctl list_connections.
func DialURL(url, name string) Dialer {
	return func(ctx context.Context) (*amqp.Connection, error) {
		props := amqp.NewConnectionProperties()
		props.SetClientConnectionName(name)
		timeout := DialTimeoutDefault
		if dl, ok := ctx.Deadline(); ok {
			timeout = min(timeout, time.Until(dl))
		}
		conn, err := amqp.DialConfig(url, amqp.Config{
			Properties: props,
			Heartbeat:  10 * time.Second,
			Dial: func(network, addr string) (net.Conn, error) {
				d := net.Dialer{Timeout: timeout}
				c, err := d.DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				// The handshake must finish within the timeout too; the client clears the
				// deadline once it is connected.
				if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
					_ = c.Close()
					return nil, err
				}
				return c, nil
			},
		})
		if err != nil {
			return nil, fmt.Errorf("dial %s: %w", redactURL(url), err)
		}
		return conn, nil
	}
}

// redactURL hides the password of an AMQP URL for error messages.
func redactURL(raw string) string {
	u, err := amqp.ParseURI(raw)
	if err != nil {
		return "(unparsable AMQP URL)"
	}
	u.Password = ""
	return u.String()
}
