package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The sentinels' texts carry no package prefix: they are always wrapped in an error that does.

// ErrUnroutable is wrapped by a publish the broker returned because no queue is bound to its
// exchange and routing key (the message was published mandatory, so it is not silently dropped).
var ErrUnroutable = errors.New("unroutable: no queue is bound for the message's exchange and routing key")

// ErrNacked is wrapped by a publish the broker refused with a negative confirm (a queue at its
// x-max-length with x-overflow reject-publish, or an internal error).
var ErrNacked = errors.New("the broker refused the message (negative confirm)")

// errChannelClosed is wrapped by a publish whose channel closed before its confirm arrived.
var errChannelClosed = errors.New("channel closed before the broker confirmed")

// publisher is a channel in confirm mode that matches each publish with its confirm and with a
// basic.return. The broker sends a return before the confirm of the same message, and the
// client hands both to one goroutine (router) in that order over unbuffered channels, so a
// returned message is marked before its confirm is resolved.
type publisher struct {
	ch *amqp.Channel

	mu sync.Mutex // serialises publishes, so the next sequence number is the publish's tag

	pmu     sync.Mutex
	pending map[uint64]*pending
	closed  bool
	done    chan struct{} // closed when the channel closed and every pending publish failed
}

// pending is one published message awaiting its confirm.
type pending struct {
	msgID, exchange, key string
	returned             *amqp.Return
	res                  chan error // receives the outcome once
}

// newPublisher opens a channel on conn and puts it in confirm mode.
func newPublisher(conn *amqp.Connection) (*publisher, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("confirm mode: %w", err)
	}
	p := &publisher{ch: ch, pending: make(map[uint64]*pending), done: make(chan struct{})}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation))
	returns := ch.NotifyReturn(make(chan amqp.Return))
	go p.route(confirms, returns)
	return p, nil
}

// route resolves pending publishes until the channel closes.
func (p *publisher) route(confirms <-chan amqp.Confirmation, returns <-chan amqp.Return) {
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			p.pmu.Lock()
			for _, pd := range p.pending {
				// Every message of one id, exchange and key shares a route and so a fate.
				if pd.returned == nil && pd.msgID == r.MessageId && pd.exchange == r.Exchange && pd.key == r.RoutingKey {
					pd.returned = &r
				}
			}
			p.pmu.Unlock()
		case c, ok := <-confirms:
			if !ok {
				p.pmu.Lock()
				p.closed = true
				for tag, pd := range p.pending {
					pd.res <- errChannelClosed
					delete(p.pending, tag)
				}
				p.pmu.Unlock()
				close(p.done)
				// The client closes returns too; drain it so its sender never blocks.
				if returns != nil {
					for range returns {
					}
				}
				return
			}
			p.pmu.Lock()
			pd := p.pending[c.DeliveryTag]
			delete(p.pending, c.DeliveryTag)
			p.pmu.Unlock()
			if pd == nil {
				continue
			}
			switch {
			case !c.Ack:
				pd.res <- ErrNacked
			case pd.returned != nil:
				pd.res <- fmt.Errorf("%w: exchange %q, routing key %q: %d %s", ErrUnroutable,
					pd.returned.Exchange, pd.returned.RoutingKey, pd.returned.ReplyCode, pd.returned.ReplyText)
			default:
				pd.res <- nil
			}
		}
	}
}

// publish sends msg mandatory to exchange with routing key and returns the handle to wait for
// its confirm with.
func (p *publisher) publish(ctx context.Context, exchange, key string, msg amqp.Publishing) (*pending, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("not sent: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	pd := &pending{msgID: msg.MessageId, exchange: exchange, key: key, res: make(chan error, 1)}
	tag := p.ch.GetNextPublishSeqNo()
	p.pmu.Lock()
	if p.closed {
		p.pmu.Unlock()
		return nil, errChannelClosed
	}
	p.pending[tag] = pd
	p.pmu.Unlock()
	if err := p.ch.PublishWithContext(ctx, exchange, key, true, false, msg); err != nil {
		p.pmu.Lock()
		delete(p.pending, tag)
		p.pmu.Unlock()
		if errors.Is(err, amqp.ErrClosed) {
			return nil, fmt.Errorf("%w: %w", errChannelClosed, err)
		}
		return nil, err
	}
	return pd, nil
}

// wait returns the outcome of pd, or an error when ctx ends first (the message may or may not
// have been stored then).
func (p *publisher) wait(ctx context.Context, pd *pending) error {
	select {
	case err := <-pd.res:
		return err
	case <-ctx.Done():
		return fmt.Errorf("no confirm from the broker: %w", ctx.Err())
	}
}

// publishWait is publish and wait.
func (p *publisher) publishWait(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	pd, err := p.publish(ctx, exchange, key, msg)
	if err != nil {
		return err
	}
	return p.wait(ctx, pd)
}

// dead reports whether the channel has closed.
func (p *publisher) dead() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}
