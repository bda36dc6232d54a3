package redistest

import (
	"bytes"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

// Cutter is a TCP proxy in front of a server that forwards both ways and,
// when armed, cuts a connection in the middle of the server's replies, as
// a failover's reset does: the server has run the commands, and the client
// reads some of their replies, then an EOF.
type Cutter struct {
	Addr string // where clients connect: 127.0.0.1:port

	to    string
	ln    net.Listener
	armed atomic.Int64 // replies to wait for before the cut; 0: none
	cuts  atomic.Int64

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// NewCutter starts a Cutter in front of the server at to; it is closed
// when the test ends.
func NewCutter(t testing.TB, to string) *Cutter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: cutter: %v", err)
	}
	c := &Cutter{Addr: ln.Addr().String(), to: to, ln: ln, conns: map[net.Conn]struct{}{}}
	c.wg.Add(1)
	go c.accept()
	t.Cleanup(c.close)
	return c
}

// CutAfter arms the cut: the next connection the server answers on is
// cut once the server has sent n whole replies, after the client has been
// given the first n/2 of them. Each call cuts one connection.
func (c *Cutter) CutAfter(n int) { c.armed.Store(int64(n)) }

// Cuts returns how many connections were cut.
func (c *Cutter) Cuts() int { return int(c.cuts.Load()) }

func (c *Cutter) accept() {
	defer c.wg.Done()
	for {
		client, err := c.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", c.to)
		if err != nil {
			client.Close()
			continue
		}
		if !c.track(client, server) {
			return
		}
		c.wg.Add(2)
		go func() {
			defer c.wg.Done()
			defer server.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := client.Read(buf)
				if n > 0 {
					if _, werr := server.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
		go func() {
			defer c.wg.Done()
			defer client.Close()
			c.replies(client, server)
		}()
	}
}

// track keeps the pair to close them at the end; false once closed.
func (c *Cutter) track(conns ...net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conns == nil {
		for _, cn := range conns {
			cn.Close()
		}
		return false
	}
	for _, cn := range conns {
		c.conns[cn] = struct{}{}
	}
	return true
}

// replies forwards the server's bytes to the client, cutting both when
// the cut is armed.
func (c *Cutter) replies(client, server net.Conn) {
	defer server.Close()
	buf := make([]byte, 32<<10)
	var held []byte // the server's bytes, held while waiting for the cut
	want := 0
	for {
		n, err := server.Read(buf)
		if n > 0 {
			if want == 0 {
				if w := c.armed.Swap(0); w > 0 {
					want = int(w)
				}
			}
			if want == 0 {
				if _, werr := client.Write(buf[:n]); werr != nil {
					return
				}
			} else {
				held = append(held, buf[:n]...)
				if ends := frameEnds(held); len(ends) >= want {
					if half := want / 2; half > 0 {
						_, _ = client.Write(held[:ends[half-1]])
					}
					c.cuts.Add(1)
					if tc, ok := client.(*net.TCPConn); ok {
						_ = tc.SetLinger(0) // a reset, as a failover's
					}
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

func (c *Cutter) close() {
	c.ln.Close()
	c.mu.Lock()
	for cn := range c.conns {
		cn.Close()
	}
	c.conns = nil
	c.mu.Unlock()
	c.wg.Wait()
}

// frameEnds returns the offsets in b where each whole top-level reply
// (RESP2 or RESP3) ends.
func frameEnds(b []byte) []int {
	var ends []int
	for off := 0; ; {
		end, ok := frameEnd(b, off)
		if !ok {
			return ends
		}
		ends = append(ends, end)
		off = end
	}
}

// frameEnd returns where the reply that starts at off ends, if b holds it
// whole.
func frameEnd(b []byte, off int) (int, bool) {
	if off >= len(b) {
		return 0, false
	}
	i := bytes.Index(b[off:], []byte("\r\n"))
	if i < 0 {
		return 0, false
	}
	line, next := b[off+1:off+i], off+i+2
	switch b[off] {
	case '+', '-', ':', '_', '#', ',', '(':
		return next, true
	case '$', '=', '!':
		n, err := strconv.Atoi(string(line))
		if err != nil {
			return 0, false
		}
		if n < 0 {
			return next, true
		}
		if next+n+2 > len(b) {
			return 0, false
		}
		return next + n + 2, true
	case '*', '~', '>', '%', '|':
		n, err := strconv.Atoi(string(line))
		if err != nil {
			return 0, false
		}
		if b[off] == '%' || b[off] == '|' {
			n *= 2
		}
		for range max(n, 0) {
			var ok bool
			if next, ok = frameEnd(b, next); !ok {
				return 0, false
			}
		}
		if b[off] == '|' { // an attribute precedes the reply it is about
			return frameEnd(b, next)
		}
		return next, true
	}
	return 0, false
}
