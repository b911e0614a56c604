package chaos

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// natsServer is the JetStream server the harness owns: embedded, on a fixed port, with a file
// store in a directory of the run's, so that a restart (a new server on the same port and
// directory) keeps the streams, their messages and the durable consumers' state.
type natsServer struct {
	dir  string
	port int

	mu  sync.Mutex
	srv *server.Server
}

// startNATS starts a server with a file store in dir on a free port of 127.0.0.1.
func startNATS(dir string) (*natsServer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	n := &natsServer{dir: dir, port: port}
	if err := n.start(); err != nil {
		return nil, err
	}
	return n, nil
}

// URL is the server's client URL; it stays the same across restarts.
func (n *natsServer) URL() string { return "nats://127.0.0.1:" + strconv.Itoa(n.port) }

func (n *natsServer) start() error {
	opts := &server.Options{
		ServerName: "idem-chaos",
		Host:       "127.0.0.1",
		Port:       n.port,
		JetStream:  true,
		StoreDir:   n.dir,
		NoLog:      true,
		NoSigs:     true,
		// The roles' connections must not be dropped as slow while the harness is busy.
		MaxPending: 64 << 20,
	}
	var srv *server.Server
	var err error
	// Right after a shutdown the port can take a moment to be free again.
	for attempt := 0; attempt < 50; attempt++ {
		srv, err = server.NewServer(opts)
		if err != nil {
			return fmt.Errorf("chaos: NATS server: %w", err)
		}
		srv.Start()
		if srv.ReadyForConnections(10 * time.Second) {
			break
		}
		srv.Shutdown()
		srv.WaitForShutdown()
		srv = nil
		time.Sleep(100 * time.Millisecond)
	}
	if srv == nil {
		return errors.New("chaos: NATS server did not become ready")
	}
	n.mu.Lock()
	n.srv = srv
	n.mu.Unlock()
	return nil
}

// stop shuts the server down and waits until it is gone.
func (n *natsServer) stop() {
	n.mu.Lock()
	srv := n.srv
	n.srv = nil
	n.mu.Unlock()
	if srv != nil {
		srv.Shutdown()
		srv.WaitForShutdown()
	}
}

// restart stops the server, keeps it down for down, and starts a new one on the same port and
// store directory.
func (n *natsServer) restart(down time.Duration) error {
	n.stop()
	time.Sleep(down)
	return n.start()
}

// freePort asks the kernel for a free TCP port on 127.0.0.1.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("chaos: find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
