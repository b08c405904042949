package collector

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// Limits of the collector's HTTP server (the live page, /api/summary,
// /metrics): it is unauthenticated and may face anyone who can reach it, so
// no client may hold memory or connections for long (docs/security.md).
const (
	HTTPReadHeaderTimeout = 5 * time.Second
	HTTPReadTimeout       = 10 * time.Second
	// HTTPWriteTimeout bounds how long a client that does not read holds
	// its response (and the memory behind it).
	HTTPWriteTimeout = 30 * time.Second
	HTTPIdleTimeout  = 60 * time.Second
	// DefaultMaxHTTPConns is how many connections are open at once. Past
	// it an idle keep-alive connection is closed to make room; with none
	// idle (slow readers hold them all), up to httpScrapeConns more are
	// served /metrics only, so that scrapes keep working, and closed after
	// one response; past those a new connection gets 503 at once.
	DefaultMaxHTTPConns = 128
	httpScrapeConns     = 16
)

// NewHTTPServer returns a server for h with the limits above on ln, which
// it wraps so that at most maxConns connections are open at once (0:
// DefaultMaxHTTPConns). Serve it with srv.Serve(ln) on the returned
// listener.
func NewHTTPServer(h http.Handler, ln net.Listener, maxConns int) (*http.Server, net.Listener) {
	if maxConns <= 0 {
		maxConns = DefaultMaxHTTPConns
	}
	l := &connLimiter{Listener: ln, max: maxConns, conns: map[net.Conn]http.ConnState{}, scrapeOnly: map[net.Conn]bool{}}
	guarded := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Context().Value(scrapeOnlyKey{}) != nil {
			w.Header().Set("Connection", "close")
			if r.URL.Path != "/metrics" {
				http.Error(w, "too many connections: try again soon", http.StatusServiceUnavailable)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
	srv := &http.Server{Handler: guarded, ReadHeaderTimeout: HTTPReadHeaderTimeout, ReadTimeout: HTTPReadTimeout,
		WriteTimeout: HTTPWriteTimeout, IdleTimeout: HTTPIdleTimeout, MaxHeaderBytes: 16 << 10, ConnState: l.track,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if l.isScrapeOnly(c) {
				return context.WithValue(ctx, scrapeOnlyKey{}, true)
			}
			return ctx
		}}
	return srv, l
}

type scrapeOnlyKey struct{}

// connLimiter counts the server's connections (through ConnState) and
// keeps them under max: a scrape must get through even when others hold
// idle keep-alive connections by the thousand.
type connLimiter struct {
	net.Listener
	max        int
	mu         sync.Mutex
	conns      map[net.Conn]http.ConnState // open connections and their state
	scrapeOnly map[net.Conn]bool           // past max: served /metrics only
	rejected   int64
}

func (l *connLimiter) isScrapeOnly(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.scrapeOnly[c]
}

func (l *connLimiter) track(c net.Conn, st http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch st {
	case http.StateClosed, http.StateHijacked:
		delete(l.conns, c)
		delete(l.scrapeOnly, c)
	default:
		l.conns[c] = st
	}
}

var busy = []byte("HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: 36\r\n\r\ntoo many connections: try again soon")

func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		var idle net.Conn
		l.mu.Lock()
		full := len(l.conns)-len(l.scrapeOnly) >= l.max
		if full {
			for k, st := range l.conns {
				if st == http.StateIdle && !l.scrapeOnly[k] {
					idle = k
					break
				}
			}
			switch {
			case idle != nil:
				delete(l.conns, idle) // its slot is the new one's
				full = false
			case len(l.scrapeOnly) < httpScrapeConns:
				l.scrapeOnly[c] = true
				full = false
			default:
				l.rejected++
			}
		}
		if !full {
			l.conns[c] = http.StateNew
		}
		l.mu.Unlock()
		if idle != nil {
			idle.Close() // the server sees it closed and forgets it
		}
		if full {
			// No I/O under the lock; the write is bounded so a client that
			// does not read cannot hold the accept loop.
			c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			c.Write(busy)
			c.Close()
			continue
		}
		return c, nil
	}
}

func (l *connLimiter) open() (n int, rejected int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns), l.rejected
}
