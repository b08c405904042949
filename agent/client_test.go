package agent

import (
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/tps"
)

// With the agent gone, or alive but not reading, a training step's call
// returns at once and the record is dropped and counted. The bound (50 ms
// for the slowest of 20,000 calls) is far above a normal call (well under a
// microsecond) and far below a blocked write (forever).
func TestClientNeverBlocksTraining(t *testing.T) {
	dir, _ := os.MkdirTemp("", "tpsprof-client")
	defer os.RemoveAll(dir)
	stuck := filepath.Join(dir, "stuck.sock")
	ln, err := net.Listen("unix", stuck) // accepts, never reads
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for name, path := range map[string]string{"missing": filepath.Join(dir, "none.sock"), "stuck": stuck} {
		c := NewClient(path, ClientOptions{Queue: 256, WriteTimeout: 100 * time.Millisecond})
		rec, _ := tps.NewRecorder(tps.RecorderConfig{Job: "j", WorldSize: 1}, c)
		var worst time.Duration
		for i := 0; i < 20000; i++ {
			rec.Start(int64(i))
			t0 := time.Now()
			rec.End(1)
			worst = max(worst, time.Since(t0))
		}
		c.Close(200 * time.Millisecond)
		sent, dropped, _ := c.Counts()
		if worst > 50*time.Millisecond {
			t.Errorf("%s agent: slowest step call %v", name, worst)
		}
		if dropped == 0 {
			t.Errorf("%s agent: nothing dropped (sent %d)", name, sent)
		}
	}
}

func BenchmarkClientRecordStep(b *testing.B) {
	dir, _ := os.MkdirTemp("", "tpsprof-clientb")
	defer os.RemoveAll(dir)
	c := NewClient(filepath.Join(dir, "none.sock"), ClientOptions{})
	defer c.Close(time.Second)
	r := tps.StepRecord{Job: "j", WorldSize: 1, Tokens: 1, StartUnixNs: tps.MinUnixNs, EndUnixNs: tps.MinUnixNs + 1, DurationNs: 1}
	b.ReportAllocs()
	for b.Loop() {
		c.RecordStep(r)
	}
}
