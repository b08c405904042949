package agent

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/client"
	"github.com/tpsprof/tpsprof/natsconn"
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
		c := client.New(path, client.Options{Queue: 256, WriteTimeout: 100 * time.Millisecond})
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
	c := client.New(filepath.Join(dir, "none.sock"), client.Options{})
	defer c.Close(time.Second)
	r := tps.StepRecord{Job: "j", WorldSize: 1, Tokens: 1, StartUnixNs: tps.MinUnixNs, EndUnixNs: tps.MinUnixNs + 1, DurationNs: 1}
	b.ReportAllocs()
	for b.Loop() {
		c.RecordStep(r)
	}
}

// Connections that send half a line and go quiet cannot fill the intake:
// at the bound the one idle the longest is closed for a new rank, and
// every idle connection times out.
func TestIdleIntakeConnections(t *testing.T) {
	dir, _ := os.MkdirTemp("", "tpsprof-idle")
	defer os.RemoveAll(dir)
	a, err := Start(Config{Socket: filepath.Join(dir, "a.sock"), NATS: natsconn.Options{URL: "nats://127.0.0.1:1"}, MaxConnections: 8, IdleTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var idle []net.Conn
	for i := 0; i < 8; i++ {
		c, err := net.Dial("unix", a.Socket())
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte(`{"job":"j","step":`)) // half a line, then nothing
		idle = append(idle, c)
	}
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	time.Sleep(600 * time.Millisecond)
	c := client.New(a.Socket(), client.Options{})
	rec, _ := tps.NewRecorder(tps.RecorderConfig{Job: "idle", WorldSize: 1}, c)
	rec.Start(0)
	rec.End(10)
	c.Close(2 * time.Second)
	deadline := time.Now().Add(3 * time.Second)
	for a.Stats().Records < 1 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(700 * time.Millisecond) // past the idle timeout of the others
	st := a.Stats()
	if st.Records != 1 || st.Rejected["conn:idle_closed"] < 1 || st.Rejected["conn:too_many"] != 0 || st.Rejected["conn:idle_timeout"] < 6 {
		t.Errorf("stats: records %d, rejected %v", st.Records, st.Rejected)
	}
}

// Connections that send an empty line (or garbage) every few tenths of a
// second are not active: at the bound the idlest of them is closed for a
// new rank (they used to lock new ranks out for good).
func TestBlankLinesDoNotHoldTheIntake(t *testing.T) {
	dir, _ := os.MkdirTemp("", "tpsprof-blank")
	defer os.RemoveAll(dir)
	a, err := Start(Config{Socket: filepath.Join(dir, "a.sock"), NATS: natsconn.Options{URL: "nats://127.0.0.1:1"}, MaxConnections: 4, IdleTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	stop := make(chan struct{})
	defer close(stop)
	for i := 0; i < 4; i++ {
		c, err := net.Dial("unix", a.Socket())
		if err != nil {
			t.Fatal(err)
		}
		go func(c net.Conn, garbage bool) {
			defer c.Close()
			tick := time.NewTicker(200 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					line := "\n"
					if garbage {
						line = "not json\n"
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}
		}(c, i%2 == 1)
	}
	time.Sleep(1500 * time.Millisecond) // past half the idle timeout
	c := client.New(a.Socket(), client.Options{})
	rec, _ := tps.NewRecorder(tps.RecorderConfig{Job: "blank", WorldSize: 1}, c)
	rec.Start(0)
	rec.End(10)
	c.Close(2 * time.Second)
	deadline := time.Now().Add(3 * time.Second)
	for a.Stats().Records < 1 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if st := a.Stats(); st.Records != 1 || st.Rejected["conn:too_many"] != 0 {
		t.Errorf("a rank after 4 blank-line connections: records %d, rejected %v", st.Records, st.Rejected)
	}
}

// An agent does not take over a socket another user squats on the default
// path; it says whose it is (launch's own test: package launch).
func TestSquattedSocket(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to give the socket to another uid")
	}
	dir, _ := os.MkdirTemp("", "tpsprof-squat")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "a.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	os.Chown(path, 4242, 4242)
	if _, err := Start(Config{Socket: path, NATS: natsconn.Options{URL: "nats://127.0.0.1:1"}}); err == nil || !strings.Contains(err.Error(), "uid 4242") {
		t.Errorf("agent start on a squatted socket: %v", err)
	}
}
