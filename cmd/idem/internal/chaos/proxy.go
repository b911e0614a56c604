package chaos

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
)

// Proxy is a TCP proxy the harness puts between the roles and PostgreSQL, so that it can break
// the database connections the way a network does: Cut drops every connection at once (and
// refuses new ones until Restore), Stall stops copying bytes in both directions (connections
// stay open and hang) until Resume. It is safe for concurrent use.
type Proxy struct {
	ln      net.Listener
	network string
	target  string

	mu      sync.Mutex
	conns   map[*proxyConn]struct{}
	refuse  bool
	stalled chan struct{} // non-nil while stalled; closed by Resume
	closed  bool
	wg      sync.WaitGroup
}

// proxyConn is one proxied connection: the client's side and the server's.
type proxyConn struct {
	client, server net.Conn
	once           sync.Once
}

func (c *proxyConn) close() {
	c.once.Do(func() {
		_ = c.client.Close()
		_ = c.server.Close()
	})
}

// NewProxy listens on 127.0.0.1 on a free port and forwards every connection to target on
// network ("tcp" or "unix").
func NewProxy(network, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("chaos: proxy: listen: %w", err)
	}
	p := &Proxy{ln: ln, network: network, target: target, conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's listening address, host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		refuse, closed := p.refuse, p.closed
		p.mu.Unlock()
		if refuse || closed {
			_ = c.Close()
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	server, err := net.Dial(p.network, p.target)
	if err != nil {
		_ = client.Close()
		return
	}
	pc := &proxyConn{client: client, server: server}
	p.mu.Lock()
	if p.refuse || p.closed {
		p.mu.Unlock()
		pc.close()
		return
	}
	p.conns[pc] = struct{}{}
	p.mu.Unlock()

	done := make(chan struct{}, 2)
	go func() { p.copy(server, client); done <- struct{}{} }()
	go func() { p.copy(client, server); done <- struct{}{} }()
	<-done
	pc.close() // one direction ended: end both, as a dropped connection would
	<-done
	p.mu.Lock()
	delete(p.conns, pc)
	p.mu.Unlock()
}

// copy moves bytes from src to dst, holding each chunk while the proxy is stalled.
func (p *Proxy) copy(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.waitFlowing()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// waitFlowing returns at once unless the proxy is stalled, else when it is resumed (Close
// resumes it too).
func (p *Proxy) waitFlowing() {
	p.mu.Lock()
	ch := p.stalled
	p.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

// Cut closes every proxied connection and refuses new ones until Restore. It reports how many
// connections it closed.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	p.refuse = true
	conns := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
	return len(conns)
}

// Restore accepts connections again after Cut.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.refuse = false
	p.mu.Unlock()
}

// Stall stops copying bytes on every connection, open or new, until Resume: queries hang
// rather than fail, as behind a saturated or partitioned network.
func (p *Proxy) Stall() {
	p.mu.Lock()
	if p.stalled == nil && !p.closed {
		p.stalled = make(chan struct{})
	}
	p.mu.Unlock()
}

// Resume copies bytes again after Stall.
func (p *Proxy) Resume() {
	p.mu.Lock()
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
	p.mu.Unlock()
}

// Conns reports how many connections the proxy carries.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Close stops listening, closes every connection and waits for the proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.Resume()
	err := p.ln.Close()
	p.Cut()
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

var _ io.Closer = (*Proxy)(nil)
