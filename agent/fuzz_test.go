package agent

import (
	"log/slog"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/internal/ratelog"
)

// newOffline returns an agent with no socket and no NATS connection, for
// exercising the intake decoder alone; records queue in its publisher.
func newOffline() *Agent {
	cfg := Config{Node: "fuzz", BatchRecords: 1 << 30, BufferBytes: 1 << 20, MaxLineBytes: 64 << 10,
		ClockTolerance: time.Hour, MetaInterval: time.Hour, Clock: time.Now, Logger: slog.New(slog.DiscardHandler)}
	a := &Agent{cfg: cfg, rejected: map[string]int64{}, log: ratelog.New(nil, time.Minute), done: make(chan struct{})}
	a.pub = newPublisher(a)
	return a
}

// FuzzIntakeLine: whatever a rank writes, the agent neither panics nor
// loses count: every non-blank line is accepted or rejected with a reason.
func FuzzIntakeLine(f *testing.F) {
	for _, s := range []string{
		`{"job":"j","step":1,"rank":0,"world_size":2,"tokens":10,"start_unix_ns":1760000000000000000,"end_unix_ns":1760000001000000000}`,
		`{"type":"event","job":"j","kind":"eval","start_unix_ns":1760000000000000000}`,
		`{"type":"meta","job":"j","topology":{"dp":2,"tp":1,"pp":1}}`,
		`{"type":"meta","job":"j","topology":{"dp":-2}}`,
		`{"job":"j","step":"x"}`, `[]`, `{`, "\x00\xff", `{"type":7}`, `{"job":"j","loss":1e400}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		a := newOffline()
		a.handleLineFrom(line, &connInfo{})
		s := a.Stats()
		handled := s.Records + s.Events + s.Metas
		for _, n := range s.Rejected {
			handled += n
		}
		if handled != s.Lines {
			t.Fatalf("%d lines read, %d accounted for (%+v)", s.Lines, handled, s)
		}
	})
}
