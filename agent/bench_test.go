package agent

import (
	"bufio"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/tps"
)

// intakeLines are 8 ranks' JSON lines, as the Python hook writes them.
func intakeLines(ranks, steps int) [][]byte {
	out := make([][]byte, ranks)
	t0 := time.Now().Add(-time.Duration(steps+3600) * time.Second).UnixNano()
	for r := range out {
		var b []byte
		for s := 0; s < steps; s++ {
			l, _ := json.Marshal(tps.StepRecord{Job: "bench", Step: int64(s), Rank: int64(r), WorldSize: int64(ranks), Tokens: 8192,
				StartUnixNs: t0 + int64(s)*1e9, EndUnixNs: t0 + int64(s)*1e9 + 9e8, DataWaitNs: 4e6, FwdNs: 3e8, BwdNs: 5e8})
			b = append(append(b, l...), '\n')
		}
		out[r] = b
	}
	return out
}

// BenchmarkIntake: 8 ranks write JSON lines to a real agent (which
// validates, batches, encodes and publishes to an in-process NATS server),
// against a baseline in the same run that reads the same bytes from a unix
// socket and splits lines without decoding them.
//
//	go test -run '^$' -bench Intake -benchtime 1x ./agent/
func BenchmarkIntake(b *testing.B) {
	const ranks, steps = 8, 25000
	data := intakeLines(ranks, steps)
	total := float64(ranks * steps)
	dir, _ := os.MkdirTemp("", "tpsprof-bench")
	defer os.RemoveAll(dir)
	send := func(path string) {
		var wg sync.WaitGroup
		for r := 0; r < ranks; r++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := net.Dial("unix", path)
				if err != nil {
					panic(err)
				}
				c.Write(data[r])
				c.Close()
			}()
		}
		wg.Wait()
	}
	// Baseline: read and split lines only.
	rawPath := filepath.Join(dir, "raw.sock")
	ln, _ := net.Listen("unix", rawPath)
	var lines sync.WaitGroup
	lines.Add(ranks)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				sc := bufio.NewScanner(c)
				sc.Buffer(make([]byte, 64<<10), 64<<10)
				for sc.Scan() {
				}
				lines.Done()
			}()
		}
	}()
	t0 := time.Now()
	send(rawPath)
	lines.Wait()
	rawRate := total / time.Since(t0).Seconds()
	ln.Close()

	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Shutdown()
	a, err := Start(Config{Socket: filepath.Join(dir, "a.sock"), NATS: natsconn.Options{URL: srv.URL()}, ResubscribeGrace: time.Millisecond, MaxLinesPerSec: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	b.ResetTimer()
	t1 := time.Now()
	send(a.Socket())
	deadline := time.Now().Add(2 * time.Minute)
	for a.Stats().Records < int64(total) {
		if time.Now().After(deadline) {
			b.Fatalf("agent took in %d of %v: %+v", a.Stats().Records, total, a.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	a.Flush(10 * time.Second)
	rate := total / time.Since(t1).Seconds()
	b.StopTimer()
	if st := a.Stats(); st.Published != int64(total) {
		b.Fatalf("published %d of %v: %+v", st.Published, total, st)
	}
	b.ReportMetric(rate, "records/s")
	b.ReportMetric(rawRate, "raw_lines/s")
	b.ReportMetric(rate/rawRate, "ratio")
}
