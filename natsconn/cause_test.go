package natsconn

import (
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// Cause names why real connections fail: a closed port, a name that does
// not resolve, an HTTP server on the port, wrong credentials.
func TestCause(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.NotFoundHandler()}
	go srv.Serve(ln)
	defer srv.Close()
	auth, err := StartEmbeddedAuth("127.0.0.1", -1, "", Auth{Token: "right"})
	if err != nil {
		t.Fatal(err)
	}
	defer auth.Shutdown()
	for _, c := range []struct{ url, token, says string }{
		{"nats://127.0.0.1:1", "", "nothing listens on that port"},
		{"nats://no-such-host.invalid:4222", "", "does not resolve"},
		{"nats://" + ln.Addr().String(), "", "not as NATS does"},
		{auth.URL(), "wrong", "refused the credentials"},
	} {
		var mu sync.Mutex
		var last error
		note := func(_ *nats.Conn, err error) { mu.Lock(); last = err; mu.Unlock() }
		nc, err := Connect(Options{URL: c.url, Token: c.token}, nats.ReconnectErrHandler(note),
			nats.DisconnectErrHandler(note), nats.Timeout(500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			e := last
			mu.Unlock()
			if e == nil {
				e = nc.LastError()
			}
			if e != nil && strings.Contains(Cause(e), c.says) {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s: %v: %q, want %q", c.url, e, Cause(e), c.says)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		nc.Close()
	}
	if Cause(nil) != "" {
		t.Error("nil has a cause")
	}
}
