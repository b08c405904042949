package collector

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Unauthenticated HTTP must not exhaust the collector: 60 clients that ask
// for a large /api/summary and never read share one encoding (memory stays
// bounded), idle keep-alive connections past the limit are closed to make
// room, and with every slot held by slow readers /metrics still answers;
// records published meanwhile are all accepted.
func TestHTTPSlowReadersAndIdleConnections(t *testing.T) {
	c, nc := startCollector(t)
	for i := 0; i < 100; i++ {
		publishSteps(t, nc, fmt.Sprintf("job-%03d", i), 0, 3)
	}
	if err := c.Sync(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const limit = 32
	srv, l := NewHTTPServer(c.Handler(), ln, limit)
	lim := l.(*connLimiter)
	go srv.Serve(lim)
	t.Cleanup(func() { srv.Close() })
	addr := ln.Addr().String()
	base := "http://" + addr

	size := func() int {
		resp, err := http.Get(base + "/api/summary?limit=500")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if !strings.Contains(string(b), `"jobs_total":100`) {
			t.Fatalf("summary: %.200s", b)
		}
		return len(b)
	}
	body := size()

	// idle keep-alive connections, more than the limit
	var idle []net.Conn
	for i := 0; i < 2*limit; i++ {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, conn)
		fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n") // the live page: cheap
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("idle connection %d: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if n, _ := lim.open(); n > limit {
		t.Errorf("%d connections open, limit %d", n, limit)
	}

	// slow readers: a large page requested, never read
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	builds0 := c.summaryCache.builds.Load()
	var slow []net.Conn
	for i := 0; i < 60; i++ {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conn.(*net.TCPConn).SetReadBuffer(4096)
		slow = append(slow, conn)
		fmt.Fprintf(conn, "GET /api/summary?limit=500 HTTP/1.1\r\nHost: x\r\n\r\n")
	}
	time.Sleep(300 * time.Millisecond)
	runtime.GC() // what the slow readers hold, not the garbage of building pages
	runtime.ReadMemStats(&ms1)
	grew := int64(ms1.HeapInuse) - int64(ms0.HeapInuse)
	t.Logf("summary %d bytes; 60 slow readers: heap grew %.1f MiB", body, float64(grew)/(1<<20))
	// The pages the slow readers hold are the builds (one per second at
	// most, shared); a copy each would be 60 builds. The heap figure is
	// logged: other work of the collector moves it under load.
	if b := c.summaryCache.builds.Load() - builds0; b > 5 {
		t.Errorf("%d pages built for 60 requests within a second or so", b)
	}

	// a scrape gets through although slow readers hold the slots
	// (retried for a few seconds: the 503s handed to the slow readers
	// past the limit take a moment to close their connections)
	for i := 0; i < 3; i++ {
		var got string
		for deadline := time.Now().Add(5 * time.Second); ; {
			resp, err := http.Get(base + "/metrics")
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 200 && strings.Contains(string(b), "tpsprof_records_accepted_total") {
					break
				}
				got = fmt.Sprintf("%d %.200s", resp.StatusCode, b)
			} else {
				got = err.Error()
			}
			if time.Now().After(deadline) {
				t.Fatalf("scrape %d: %s", i, got)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if n, _ := lim.open(); n > limit+httpScrapeConns {
		t.Errorf("%d connections open, limit %d + %d for scrapes", n, limit, httpScrapeConns)
	}

	// the collector keeps ingesting
	publishSteps(t, nc, "after", 0, 5)
	if err := c.Sync(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Records != 100*3*4+5*4 {
		t.Errorf("%d records accepted, want %d", st.Records, 100*3*4+5*4)
	}
	for _, conn := range append(idle, slow...) {
		conn.Close()
	}
}
