package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/payments"
	"github.com/idemkit/idem/idemamqp"
	"github.com/idemkit/idem/idemredis"
)

// The brokers a chaos run can drive (Options.BrokerURL).
const (
	// BrokerNATS is an embedded JetStream server the harness owns and restarts (no BrokerURL).
	BrokerNATS = "nats"
	// BrokerAMQP is a RabbitMQ server (amqp:// or amqps://): the run declares its own work
	// queue and delay queues, and its broker faults close the run's own connections.
	BrokerAMQP = "amqp"
	// BrokerRedis is a Redis server (redis:// or rediss://): the run adds to a stream of its
	// own, and its broker faults kill the run's own client connections.
	BrokerRedis = "redis"
)

// brokerKind names the broker of url: BrokerNATS for "", else by the URL's scheme.
func brokerKind(url string) (string, error) {
	scheme, _, _ := strings.Cut(url, "://")
	switch {
	case url == "":
		return BrokerNATS, nil
	case scheme == "amqp" || scheme == "amqps":
		return BrokerAMQP, nil
	case scheme == "redis" || scheme == "rediss":
		return BrokerRedis, nil
	}
	return "", errors.New("want an amqp://, amqps://, redis:// or rediss:// URL (empty: an embedded NATS server)")
}

// connName is the name under which a role of the run connects to the broker, so that the
// harness closes this run's connections and nobody else's. Redis refuses spaces in names.
func connName(runID, role string) string {
	return "idem-chaos-" + runID[len(runID)-8:] + "-" + role
}

// amqpSourceConfig is the run's queue as every consumer (and the harness) declares it: the
// declarations must agree, or RabbitMQ refuses the later ones.
func amqpSourceConfig(queue string) idemamqp.SourceConfig {
	// A queue a crashed run leaves behind goes away once unused this long.
	expires := amqp.Table{"x-expires": (2 * streamMaxAge).Milliseconds()}
	return idemamqp.SourceConfig{
		Queue:          queue,
		Lease:          ackWait,
		MessageTTL:     streamMaxAge,
		QueueArgs:      expires,
		DelayQueueArgs: expires,
	}
}

// redisSourceConfig is the run's consumer group on its stream.
func redisSourceConfig(stream, group string) idemredis.SourceConfig {
	return idemredis.SourceConfig{Stream: stream, Group: group, Lease: ackWait, Poll: 500 * time.Millisecond}
}

// newRedisClient opens a client of url named name; it reconnects by itself.
func newRedisClient(url, name string) (*redis.Client, error) {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("parse Redis URL: %w", err)
	}
	opts.ClientName = name
	opts.DialTimeout = 2 * time.Second
	return redis.NewClient(opts), nil
}

// roleBroker is a role's way to the run's broker when it is RabbitMQ or Redis.
type roleBroker struct {
	kind string
	a    RoleArgs
	name string
	rdb  *redis.Client

	mu   sync.Mutex
	conn *amqp.Connection // raw publishes (AMQP), opened on first use and again after a loss
	ch   *amqp.Channel    // in confirm mode: a publish counts once the broker confirmed it
}

func openRoleBroker(a RoleArgs) (*roleBroker, error) {
	kind, err := brokerKind(a.BrokerURL)
	if err != nil {
		return nil, fmt.Errorf("--broker: %w", err)
	}
	b := &roleBroker{kind: kind, a: a, name: connName(a.RunID, a.Name)}
	if kind == BrokerRedis {
		if b.rdb, err = newRedisClient(a.BrokerURL, b.name); err != nil {
			return nil, err
		}
	}
	return b, nil
}

func (b *roleBroker) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dropChannel()
	if b.rdb != nil {
		_ = b.rdb.Close()
	}
}

// sink is the relay's sink.
func (b *roleBroker) sink(ctx context.Context) (idem.Sink, error) {
	if b.kind == BrokerRedis {
		return idemredis.NewSink(b.rdb, idemredis.SinkConfig{})
	}
	return idemamqp.NewSink(ctx, idemamqp.DialURL(b.a.BrokerURL, b.name), idemamqp.SinkConfig{})
}

// source is a consumer's source.
func (b *roleBroker) source(ctx context.Context) (idem.Source, error) {
	if b.kind == BrokerRedis {
		return idemredis.NewSource(ctx, b.rdb, redisSourceConfig(b.a.Subject, b.a.Durable))
	}
	return idemamqp.NewSource(ctx, idemamqp.DialURL(b.a.BrokerURL, b.name), amqpSourceConfig(b.a.Subject))
}

// publishRaw publishes a poison identity as a foreign producer would, past every check of
// idem's sinks: Redis takes any bytes in any field; AMQP carries the event id in message_id,
// a short string of at most 255 bytes, so a longer id travels in a header the consumer does not
// read as one, and arrives without an event id.
func (b *roleBroker) publishRaw(ctx context.Context, id, tenant string, order int, payload []byte) error {
	occurred := time.Now().UTC().Format(time.RFC3339Nano)
	if b.kind == BrokerRedis {
		values := []any{idemredis.FieldType, payments.EventType, idemredis.FieldOccurredAt, occurred,
			idemredis.FieldPayload, string(payload), headerOrder, strconv.Itoa(order)}
		if id != "" {
			values = append(values, idemredis.FieldEventID, id)
		}
		if tenant != "" {
			values = append(values, idemredis.FieldTenant, tenant)
		}
		stream := idemredis.PrefixDefault + b.a.Subject
		return b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: values}).Err()
	}
	h := amqp.Table{idemamqp.HeaderType: payments.EventType, idemamqp.HeaderOccurredAt: occurred, headerOrder: strconv.Itoa(order)}
	if tenant != "" {
		h[idemamqp.HeaderTenant] = tenant
	}
	msgID := id
	if len(id) > 255 {
		h["Chaos-Event-Id"], msgID = id, ""
	}
	ch, err := b.channel(ctx)
	if err != nil {
		return err
	}
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", b.a.Subject, false, false, amqp.Publishing{
		MessageId: msgID, Headers: h, DeliveryMode: amqp.Persistent, Body: payload,
	})
	if err == nil {
		var acked bool
		if acked, err = conf.WaitContext(ctx); err == nil && !acked {
			err = errors.New("the broker did not confirm the publish")
		}
	}
	if err != nil {
		b.mu.Lock()
		b.dropChannel()
		b.mu.Unlock()
	}
	return err
}

// dropChannel closes the raw-publish connection; b.mu is held.
func (b *roleBroker) dropChannel() {
	if b.conn != nil {
		_ = b.conn.Close()
	}
	b.conn, b.ch = nil, nil
}

// channel returns the raw-publish channel, dialling again after a loss.
func (b *roleBroker) channel(ctx context.Context) (*amqp.Channel, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch != nil && !b.ch.IsClosed() {
		return b.ch, nil
	}
	b.dropChannel()
	conn, err := idemamqp.DialURL(b.a.BrokerURL, b.name)(ctx)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("open a confirming channel: %w", err)
	}
	b.conn, b.ch = conn, ch
	return ch, nil
}

// proxiedBrokerURL points an amqp:// or redis:// URL at addr (the harness's proxy), and
// returns the host:port it pointed at before.
func proxiedBrokerURL(raw, addr string) (proxied, target string, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", "", fmt.Errorf("parse broker URL: %w", err)
	}
	target = u.Host
	if u.Port() == "" {
		port := "5672"
		switch u.Scheme {
		case "amqps":
			port = "5671"
		case "redis", "rediss":
			port = "6379"
		}
		target = net.JoinHostPort(u.Hostname(), port)
	}
	u.Host = addr
	return u.String(), target, nil
}

// errNoReadback says a broker cannot be read back after the run: a RabbitMQ queue gives each
// message to its consumers once, so per-key order cannot be checked from it.
var errNoReadback = errors.New("the broker's queue cannot be read back")

// brokerTarget is the harness's hold on the run's RabbitMQ or Redis broker.
type brokerTarget interface {
	// backlog is what the broker still holds for the consumers.
	backlog(ctx context.Context) (int, error)
	// firstSeqs is streamFirstSeqs for this broker, or errNoReadback.
	firstSeqs(ctx context.Context) (map[int]uint64, error)
	// killConns closes every connection of the run's roles from the server's side and returns
	// how many it closed.
	killConns(ctx context.Context) (int, error)
	close()
}

// openBrokerTarget declares the run's queue or stream and group on the broker at url, so that
// the relay's first publish finds them.
func openBrokerTarget(ctx context.Context, url, runID, topic, group string) (brokerTarget, error) {
	kind, err := brokerKind(url)
	if err != nil {
		return nil, err
	}
	prefix := connName(runID, "")
	self := strings.TrimSuffix(prefix, "-")
	if kind == BrokerRedis {
		rdb, err := newRedisClient(url, self)
		if err != nil {
			return nil, err
		}
		src, err := idemredis.NewSource(ctx, rdb, redisSourceConfig(topic, group))
		if err != nil {
			_ = rdb.Close()
			return nil, fmt.Errorf("create the run's stream and group: %w", err)
		}
		return &redisTarget{rdb: rdb, src: src, stream: idemredis.PrefixDefault + topic, prefix: prefix}, nil
	}
	dial := idemamqp.DialURL(url, self)
	src, err := idemamqp.NewSource(ctx, dial, amqpSourceConfig(topic))
	if err != nil {
		return nil, fmt.Errorf("declare the run's queues: %w", err)
	}
	_ = src.Close() // declared: the queues stay (x-expires removes them long after the run)
	conn, err := dial(ctx)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("inspection channel: %w", err)
	}
	queues := []string{topic}
	for _, tier := range idemamqp.DelayTiersDefault {
		queues = append(queues, idemamqp.DelayQueueName(topic, tier))
	}
	return &amqpTarget{conn: conn, ch: ch, queues: queues, prefix: prefix}, nil
}

type redisTarget struct {
	rdb            *redis.Client
	src            *idemredis.Source
	stream, prefix string
}

func (t *redisTarget) backlog(ctx context.Context) (int, error) {
	n, err := t.src.Backlog(ctx)
	return int(n), err
}

// firstSeqs reads the whole stream: an entry's position in it is its sequence.
func (t *redisTarget) firstSeqs(ctx context.Context) (map[int]uint64, error) {
	first := map[int]uint64{}
	var seq uint64
	for start := "-"; ; {
		entries, err := t.rdb.XRangeN(ctx, t.stream, start, "+", 1000).Result()
		if err != nil {
			return nil, fmt.Errorf("read stream %s: %w", t.stream, err)
		}
		for _, e := range entries {
			seq++
			if s, ok := e.Values[headerOrder].(string); ok {
				if i, err := strconv.Atoi(s); err == nil {
					if _, seen := first[i]; !seen {
						first[i] = seq
					}
				}
			}
		}
		if len(entries) < 1000 {
			return first, nil
		}
		start = "(" + entries[len(entries)-1].ID
	}
}

// killConns is CLIENT KILL ID for each client named after the run's roles: the server is
// shared, so CLIENT KILL TYPE normal would cut every other user's clients too.
func (t *redisTarget) killConns(ctx context.Context) (int, error) {
	list, err := t.rdb.ClientList(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("CLIENT LIST: %w", err)
	}
	n := 0
	for _, line := range strings.Split(list, "\n") {
		var id string
		mine := false
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "id="); ok {
				id = v
			}
			if v, ok := strings.CutPrefix(f, "name="); ok && strings.HasPrefix(v, t.prefix) {
				mine = true
			}
		}
		if !mine || id == "" {
			continue
		}
		if err := t.rdb.ClientKillByFilter(ctx, "ID", id).Err(); err == nil {
			n++
		}
	}
	return n, nil
}

func (t *redisTarget) close() {
	_ = t.src.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var keys []string
	iter := t.rdb.Scan(ctx, 0, t.stream+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if len(keys) > 0 {
		_ = t.rdb.Del(ctx, keys...).Err()
	}
	_ = t.rdb.Close()
}

type amqpTarget struct {
	conn   *amqp.Connection
	ch     *amqp.Channel
	queues []string
	prefix string
}

// backlog counts the ready messages of the work queue and of the delay queues (naks waiting
// out their delay); deliveries in a consumer's hands are not counted, the orders table tells.
func (t *amqpTarget) backlog(context.Context) (int, error) {
	n := 0
	for _, q := range t.queues {
		st, err := t.ch.QueueDeclarePassive(q, true, false, false, false, nil)
		if err != nil {
			return 0, fmt.Errorf("inspect queue %s: %w", q, err)
		}
		n += st.Messages
	}
	return n, nil
}

func (t *amqpTarget) firstSeqs(context.Context) (map[int]uint64, error) { return nil, errNoReadback }

// killConns closes, with rabbitmqctl close_connection, each connection whose client-provided
// name is one of the run's roles: the server is shared, so close_all_connections or
// stop_app would cut every other user's connections too.
func (t *amqpTarget) killConns(ctx context.Context) (int, error) {
	out, err := exec.CommandContext(ctx, "rabbitmqctl", "-q", "list_connections", "--no-table-headers", "pid", "client_properties").Output()
	if err != nil {
		return 0, fmt.Errorf("rabbitmqctl list_connections: %w", err)
	}
	var pids []string
	for _, line := range strings.Split(string(out), "\n") {
		pid, props, ok := strings.Cut(line, "\t")
		if ok && strings.Contains(props, `"`+t.prefix) {
			pids = append(pids, pid)
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	n := 0
	for _, pid := range pids {
		wg.Go(func() {
			if exec.CommandContext(ctx, "rabbitmqctl", "-q", "close_connection", pid, "idem chaos: broker fault").Run() == nil {
				mu.Lock()
				n++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return n, nil
}

func (t *amqpTarget) close() {
	for _, q := range t.queues {
		_, _ = t.ch.QueueDelete(q, false, false, false)
	}
	_ = t.conn.Close()
}
