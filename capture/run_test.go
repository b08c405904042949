package capture

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/wire"
)

// forger answers a job's capture requests as a hostile agent would (any
// NATS credential that sees the requests can): answer(req) gives its acks
// for a request and what it sends to the reply subject after a start.
type forger struct {
	nc     *nats.Conn
	seen   chan Request
	answer func(req Request, reply func(data []byte, hdr nats.Header))
}

func startForger(t *testing.T, job string, answer func(req Request, reply func([]byte, nats.Header))) (*nats.Conn, *forger) {
	t.Helper()
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	f := &forger{seen: make(chan Request, 16), answer: answer}
	f.nc, err = nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.nc.Close)
	if _, err := f.nc.Subscribe(wire.CaptureSubject(job), func(m *nats.Msg) {
		var req Request
		if json.Unmarshal(m.Data, &req) != nil {
			return
		}
		select {
		case f.seen <- req:
		default:
		}
		f.answer(req, func(data []byte, hdr nats.Header) {
			to := m.Reply
			if req.Op == "start" && hdr != nil {
				to = req.Reply
			}
			f.nc.PublishMsg(&nats.Msg{Subject: to, Data: data, Header: hdr})
		})
	}); err != nil {
		t.Fatal(err)
	}
	f.nc.Flush()
	cli, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cli.Close)
	return cli, f
}

func ackOf(ranks ...RankState) []byte {
	b, _ := json.Marshal(Ack{Node: "n0", Ranks: ranks})
	return b
}

// A kept trace never lands through a link another user planted: the
// forger learns the capture id from the request, plants
// DIR/<id>/rank0.step5.pt.trace.json.gz as a link to a file of the user
// running the CLI, and answers with a trace. Before, the CLI (as root)
// followed the link and overwrote that file with the forger's bytes; now
// the capture folder is made fresh and owner-only before the id goes out,
// the file is created new (O_EXCL), and the victim file is untouched.
func TestKeptTraceNeverFollowsALink(t *testing.T) {
	keepDir := t.TempDir()
	victim := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(victim, []byte("the user's own bytes"), 0o600)
	planted := make(chan error, 1)
	cli, _ := startForger(t, "job", func(req Request, reply func([]byte, nats.Header)) {
		switch req.Op {
		case "probe":
			reply(ackOf(RankState{Rank: 0, WorldSize: 1, Step: 3}), nil)
		case "start":
			// the id is in the request: plant the link where the trace goes
			err := os.Symlink(victim, filepath.Join(keepDir, req.ID, fmt.Sprintf("rank0.step%d.pt.trace.json.gz", req.AtStep)))
			planted <- err
			reply(ackOf(RankState{Rank: 0, WorldSize: 1, Step: 3}), nil)
			r, _ := json.Marshal(Report{ID: req.ID, Node: "n0", Rank: 0, State: StateTraced, Step: req.AtStep, Chunks: 1})
			reply(r, nats.Header{"X": []string{"report"}})
			reply(gzipped(t, `{"the forger's": "trace"}`), nats.Header{HeaderChunk: []string{fmt.Sprintf("0/%d/0", req.AtStep)}, HeaderID: []string{req.ID}})
		}
	})
	_, err := Run(context.Background(), cli, Options{Job: "job", Steps: 1, AtStep: 5, KeepDir: keepDir, Timeout: 5 * time.Second, ProbeWait: 300 * time.Millisecond})
	if perr := <-planted; perr != nil {
		t.Logf("the forger could not even plant its link: %v", perr)
	}
	if b, _ := os.ReadFile(victim); string(b) != "the user's own bytes" {
		t.Fatalf("the victim file now holds %q", b)
	}
	if err == nil || !errors.Is(err, os.ErrExist) {
		t.Errorf("the planted link was not refused with a clear error: %v", err)
	}
	entries, _ := os.ReadDir(keepDir)
	if len(entries) != 1 {
		t.Fatalf("keep dir holds %v", entries)
	}
	fi, _ := os.Lstat(filepath.Join(keepDir, entries[0].Name()))
	if !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Errorf("the capture folder is %v %04o, want a 0700 folder", fi.Mode().Type(), fi.Mode().Perm())
	}
}

// The capture folder is the CLI's own even when its name is taken first
// or its path is swapped for a link after it was made: a folder of that
// name already there is refused, and the traces go into the folder the
// CLI holds, never through the link.
func TestKeptTraceFolderSwapped(t *testing.T) {
	keepDir, elsewhere := t.TempDir(), t.TempDir()
	cli, _ := startForger(t, "job", func(req Request, reply func([]byte, nats.Header)) {
		switch req.Op {
		case "probe":
			reply(ackOf(RankState{Rank: 0, WorldSize: 1, Step: 3}), nil)
		case "start":
			// move the CLI's folder away and put a link to another folder in its place
			p := filepath.Join(keepDir, req.ID)
			os.Rename(p, p+".moved")
			os.Symlink(elsewhere, p)
			reply(ackOf(RankState{Rank: 0, WorldSize: 1, Step: 3}), nil)
			r, _ := json.Marshal(Report{ID: req.ID, Node: "n0", Rank: 0, State: StateTraced, Step: req.AtStep, Chunks: 1})
			reply(r, nats.Header{"X": []string{"report"}})
			reply(gzipped(t, `{"traceEvents": []}`), nats.Header{HeaderChunk: []string{fmt.Sprintf("0/%d/0", req.AtStep)}, HeaderID: []string{req.ID}})
		}
	})
	if _, err := Run(context.Background(), cli, Options{Job: "job", Steps: 1, AtStep: 5, KeepDir: keepDir, Timeout: 5 * time.Second, ProbeWait: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
		t.Errorf("a trace was written through the link: %v", entries)
	}
	moved, _ := filepath.Glob(filepath.Join(keepDir, "*.moved", "rank0.step5.pt.trace.json.gz"))
	if len(moved) != 1 {
		t.Errorf("the trace is not in the folder the CLI made: %v", moved)
	}
}

// Forged answers are bounded before anything is allocated for them: a
// probe answer claiming world size 2^62 (which OOM-killed tpsprof trace in
// 16 s), one listing a million ranks, reports with more calls than a
// report carries and pieces of traces nobody asked to keep: the capture
// ends in a refusal or a bounded view, the heap grows by little.
func TestForgedAnswersBounded(t *testing.T) {
	t.Run("world 2^62", func(t *testing.T) {
		cli, _ := startForger(t, "job", func(req Request, reply func([]byte, nats.Header)) {
			reply(ackOf(RankState{Rank: 1 << 61, WorldSize: 1 << 62, Step: 3}), nil)
		})
		before := heap()
		_, err := Run(context.Background(), cli, Options{Job: "job", Steps: 1, Timeout: 5 * time.Second, ProbeWait: 300 * time.Millisecond})
		if !errors.Is(err, ErrNoJob) {
			t.Errorf("a forged world of 2^62 ranks: %v, want no agent serves the job", err)
		}
		if grew := heap() - before; grew > 64<<20 {
			t.Errorf("heap grew %d MiB", grew>>20)
		}
	})
	t.Run("a million ranks, pieces and calls", func(t *testing.T) {
		// seven agents answering for 16,384 ranks each of a world of 2^20
		// (a NATS message holds 1 MiB): 114,688 ranks
		const n, per = 1 << 20, 1 << 14
		var acks [][]byte
		for a := range 7 {
			ranks := make([]RankState, per)
			for i := range ranks {
				ranks[i] = RankState{Rank: int64(a*per + i), WorldSize: n, Step: 3}
			}
			acks = append(acks, ackOf(ranks...))
		}
		reportsBudget = 2 << 20
		t.Cleanup(func() { reportsBudget = MaxReportsBytes })
		cli, f := startForger(t, "job", func(req Request, reply func([]byte, nats.Header)) {
			for _, a := range acks {
				reply(a, nil)
			}
			if req.Op != "start" {
				return
			}
			// pieces of traces nobody asked to keep, and fat reports
			for i := range 64 {
				reply(make([]byte, 512<<10), nats.Header{HeaderChunk: []string{fmt.Sprintf("%d/%d/0", i, req.AtStep)}, HeaderID: []string{req.ID}})
			}
			calls := strings.Repeat(`{"name":"allreduce","start_us":1,"dur_us":1},`, 6000)
			for i := range 16 {
				r := fmt.Sprintf(`{"id":%q,"node":"n0","rank":%d,"state":"traced","step":%d,"calls":[%s{"name":"x"}]}`, req.ID, i, req.AtStep, calls)
				reply([]byte(r), nats.Header{"X": []string{"report"}})
			}
		})
		f.nc.SetErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})
		v, err := Run(context.Background(), cli, Options{Job: "job", Steps: 1, AtStep: 5, Timeout: 8 * time.Second, ProbeWait: 500 * time.Millisecond, AcceptWait: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if len(v.Kept) != 0 {
			t.Errorf("pieces nobody asked for were kept: %v", v.Kept)
		}
		if len(v.Missing) > MaxCaptureRanks {
			t.Errorf("%d ranks taken part, more than %d", len(v.Missing), MaxCaptureRanks)
		}
		if !strings.Contains(strings.Join(v.Notes, "\n"), "the answers passed 2 MiB") {
			t.Errorf("no note that the answers passed their budget: %v", v.Notes)
		}
	})
}

// An automatic capture of two ranks (a collector's --auto-capture, whose
// embedded NATS server shares its process: it grew from 118 to 2,870 MiB
// and was OOM-killed in 27 s) takes answers only for the ranks it asked,
// and reads at most its own budget of them.
func TestAutoCaptureAnswersBounded(t *testing.T) {
	ranks := make([]RankState, 16384)
	for i := range ranks {
		ranks[i] = RankState{Rank: int64(i), WorldSize: 16384, Step: 3}
	}
	ack := ackOf(ranks...)
	cli, _ := startForger(t, "job", func(req Request, reply func([]byte, nats.Header)) {
		reply(ack, nil)
		if req.Op != "start" {
			return
		}
		why := strings.Repeat("x", 200000)
		for range 16 {
			r := fmt.Sprintf(`{"id":%q,"node":"n0","rank":0,"state":"accepted","step":%d,"why":"%s"}`, req.ID, req.AtStep, why)
			reply([]byte(r), nats.Header{"X": []string{"report"}})
		}
	})
	v, err := Run(context.Background(), cli, Options{Job: "job", Steps: 1, AtStep: -1, Ranks: []int64{0, 1}, Timeout: 3 * time.Second, ProbeWait: 300 * time.Millisecond,
		AcceptWait: time.Second, MaxReportsBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Missing) != 2 {
		t.Errorf("%d ranks taken part, asked for 2: %v", len(v.Missing), v.Missing)
	}
	if !strings.Contains(strings.Join(v.Notes, "\n"), "the answers passed 1 MiB") {
		t.Errorf("no note that the answers passed their budget: %v", v.Notes)
	}
}

func heap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
