package agent

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/wire"
)

// A record or event cannot name another node or a GPU the node lacks
// (three 10-step jobs whose rank 1 named healthy-17 got it drained): the
// agent stamps its own node, replaces a foreign GPU by its local rank's,
// and counts each claim it replaced.
func TestRecordsCarryTheAgentsIdentity(t *testing.T) {
	a, nc := startWithNATS(t, Config{Node: "n0", GPUUUIDs: map[int32]string{0: "GPU-own0", 1: "GPU-own1"}, FlushInterval: 5 * time.Millisecond})
	sub, err := nc.SubscribeSync(wire.StepsSubject("idj", "*"))
	if err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	now := time.Now().UnixNano()
	lr0, lr1 := int32(0), int32(1)
	recs := []tps.StepRecord{
		{Job: "idj", Rank: 0, WorldSize: 3, Node: "healthy-17", GPUUUID: "GPU-victim", LocalRank: &lr0}, // both forged
		{Job: "idj", Rank: 1, WorldSize: 3, GPUUUID: "GPU-own0", LocalRank: &lr1},                       // another of this node's GPUs: kept
		{Job: "idj", Rank: 2, WorldSize: 3, Node: "n0"},                                                 // its own node: nothing replaced
	}
	for i := range recs {
		r := &recs[i]
		r.Tokens, r.StartUnixNs, r.EndUnixNs, r.DurationNs = 10, now-1e6, now, 1e6
		if err := a.SubmitStep(*r); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.SubmitEvent(tps.Event{Job: "idj", Kind: tps.EventEval, Node: "victim-9", StartUnixNs: now - 1e6, EndUnixNs: now}); err != nil {
		t.Fatal(err)
	}
	got := map[int64]tps.StepRecord{}
	for len(got) < 3 {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("published %d of 3 records: %v", len(got), err)
		}
		if m.Subject != wire.StepsSubject("idj", "n0") {
			t.Errorf("published on %s", m.Subject)
		}
		rs, err := wire.DecodeSteps(m.Data, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			got[r.Rank] = r
		}
	}
	for rank, want := range map[int64][2]string{0: {"n0", "GPU-own0"}, 1: {"n0", "GPU-own0"}, 2: {"n0", ""}} {
		if r := got[rank]; r.Node != want[0] || r.GPUUUID != want[1] {
			t.Errorf("rank %d published node %q GPU %q, want %q %q", rank, r.Node, r.GPUUUID, want[0], want[1])
		}
	}
	if n := a.Stats().ClaimsReplaced; n != 2 {
		t.Errorf("%d claims replaced, want 2 (rank 0's record, the event)", n)
	}
}

// Two processes reporting one rank of one attempt (two srun tasks with
// the rank not set: each rank 0 of world 1) are said once, as a
// rank_conflict event naming the rank and what it means; a process that
// reconnects (its old connection closed) is no conflict.
func TestTwoProcessesClaimingOneRank(t *testing.T) {
	a, nc := startWithNATS(t, Config{Node: "n0", FlushInterval: 5 * time.Millisecond})
	sub, err := nc.SubscribeSync(wire.EventsSubject("rc"))
	if err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	line := func(step int) string {
		now := time.Now().UnixNano()
		return fmt.Sprintf(`{"job":"rc","step":%d,"rank":0,"world_size":1,"tokens":10,"start_unix_ns":%d,"end_unix_ns":%d,"duration_ns":1000000}`+"\n", step, now-1e6, now)
	}
	dial := func() net.Conn {
		c, err := net.Dial("unix", a.Socket())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	waitLines := func(n int64) {
		for deadline := time.Now().Add(5 * time.Second); a.Stats().Lines < n; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d lines read, want %d", a.Stats().Lines, n)
			}
		}
	}
	first := dial()
	fmt.Fprint(first, line(0))
	waitLines(1)
	first.Close() // the process reconnects: no conflict
	time.Sleep(50 * time.Millisecond)
	again := dial()
	defer again.Close()
	fmt.Fprint(again, line(1))
	waitLines(2)
	other := dial() // a second process, the first still connected
	defer other.Close()
	fmt.Fprint(other, line(1))
	fmt.Fprint(other, line(2))
	waitLines(4)
	var got []tps.Event
	for _, e := range eventsUntilQuiet(sub) {
		if e.Kind == tps.EventRankConflict {
			got = append(got, e)
		}
	}
	if len(got) != 1 || got[0].Rank != 0 || !strings.Contains(got[0].Detail, "two processes on node n0 report rank 0 of job rc") {
		t.Errorf("rank_conflict events %+v, want one naming rank 0", got)
	}
}

// The agent says whose process reported a job's ranks (rank_user, the
// connection's user), once a job; a line claiming an agent's event kind
// is refused (a job could name another user, or a conflict that was not).
func TestAgentSaysTheRanksUser(t *testing.T) {
	a, nc := startWithNATS(t, Config{Node: "n0", FlushInterval: 5 * time.Millisecond})
	sub, err := nc.SubscribeSync(wire.EventsSubject("ru"))
	if err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	c, err := net.Dial("unix", a.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	now := time.Now().UnixNano()
	for rank := range 2 {
		for step := range 3 {
			fmt.Fprintf(c, `{"job":"ru","step":%d,"rank":%d,"world_size":2,"tokens":10,"start_unix_ns":%d,"end_unix_ns":%d,"duration_ns":1000000}`+"\n", step, rank, now-1e6, now)
		}
	}
	fmt.Fprintf(c, `{"type":"event","job":"ru","kind":"rank_user","start_unix_ns":%d,"detail":"uid=4242"}`+"\n", now)
	fmt.Fprintf(c, `{"type":"event","job":"ru","kind":"rank_conflict","start_unix_ns":%d,"detail":"forged"}`+"\n", now)
	for deadline := time.Now().Add(5 * time.Second); a.Stats().Lines < 8; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d lines read, want 8", a.Stats().Lines)
		}
	}
	got := eventsUntilQuiet(sub)
	want := tps.RankUserDetail(int64(os.Getuid()))
	if len(got) != 1 || got[0].Kind != tps.EventRankUser || got[0].Detail != want || got[0].Node != "n0" {
		t.Errorf("events %+v, want one rank_user %q of node n0", got, want)
	}
	if r := a.Stats().Rejected["event:agent_kind"]; r != 2 {
		t.Errorf("%d lines of an agent's event kind refused, want 2", r)
	}
}

// eventsUntilQuiet reads the events sub receives until none comes for
// half a second.
func eventsUntilQuiet(sub *nats.Subscription) []tps.Event {
	var got []tps.Event
	for {
		m, err := sub.NextMsg(500 * time.Millisecond)
		if err != nil {
			return got
		}
		var e tps.Event
		if json.Unmarshal(m.Data, &e) == nil {
			got = append(got, e)
		}
	}
}
