package capture

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tpsprof/tpsprof/kineto"
)

// The capture's phases, each from hand-built answers: the probe's, the
// step chosen, the start's, and the gathering of the ranks' reports.

func TestProbePhase(t *testing.T) {
	acks := []Ack{
		{Node: "a", Ranks: []RankState{{Rank: 0, WorldSize: 4, Step: 10, StepsPerSec: 5}, {Rank: 1, WorldSize: 4, Step: 12, StepsPerSec: 2}}},
		{Node: "b", Ranks: []RankState{{Rank: 2, WorldSize: 4, Step: 11, StepsPerSec: 1e6}}}, // an absurd pace is not taken
	}
	p, err := probed(acks, "j")
	if err != nil {
		t.Fatal(err)
	}
	if p.world != 4 || p.maxStep != 12 || p.rate != 5 || len(p.served) != 3 {
		t.Errorf("probe %+v: want world 4, step 12, 5 steps/s, 3 ranks", p)
	}
	// The package sends records in batches: a rank whose latest record came
	// 600 ms ago at 5 steps/s is 3 steps past it; one silent longer than a
	// second is paused, not stepping (at most a second's steps are added)
	acks[0].Ranks[0].SinceMs = 600
	if p, _ := probed(acks, "j"); p.maxStep != 13 {
		t.Errorf("600 ms after step 10 at 5 steps/s: step %d, want 13", p.maxStep)
	}
	acks[0].Ranks[0].SinceMs = 60_000
	if p, _ := probed(acks, "j"); p.maxStep != 15 {
		t.Errorf("a minute after step 10 at 5 steps/s: step %d, want 15 (a second's steps at most)", p.maxStep)
	}
	acks[1].Ranks[0].SinceMs = 60_000 // an absurd pace adds nothing
	if got := (RankState{Step: 11, StepsPerSec: 1e6, SinceMs: 500}).Now(); got != 11 {
		t.Errorf("absurd pace: step %d, want 11", got)
	}
	acks[0].Ranks[0].SinceMs, acks[1].Ranks[0].SinceMs = 0, 0
	if _, err := probed(nil, "j"); !errors.Is(err, ErrNoJob) {
		t.Errorf("no answer: %v, want ErrNoJob", err)
	}
	if _, err := probed([]Ack{{Node: "a", Err: "busy"}}, "j"); err == nil || !strings.Contains(err.Error(), "agent on a: busy") {
		t.Errorf("an agent's error: %v", err)
	}
	o := Options{Steps: 1}
	if o.allRanks(acks) {
		t.Error("3 of 4 ranks answered for: not all")
	}
	acks[1].Ranks = append(acks[1].Ranks, RankState{Rank: 3, WorldSize: 4})
	if !o.allRanks(acks) {
		t.Error("4 of 4 ranks answered for: all")
	}
	o.Ranks = []int64{1}
	if !o.allRanks(acks[:1]) {
		t.Error("the one rank asked for answered for: all")
	}
}

func TestChooseStep(t *testing.T) {
	p := probe{maxStep: 100, rate: 4}
	o := Options{AtStep: -1, Lead: time.Second, ProbeWait: 500 * time.Millisecond}
	// 4 steps/s over 1.5 s: 6 steps past the next one
	if at, err := p.chooseStep(o); err != nil || at != 107 {
		t.Errorf("automatic: %d, %v; want 107", at, err)
	}
	o.AtStep = 150
	if at, err := p.chooseStep(o); err != nil || at != 150 {
		t.Errorf("given ahead: %d, %v", at, err)
	}
	o.AtStep = 100
	if _, err := p.chooseStep(o); err == nil || !strings.Contains(err.Error(), "already past") {
		t.Errorf("a step the ranks are at: %v", err)
	}
	o.AtStep = 100 + MaxStepsAhead + 1
	if _, err := p.chooseStep(o); err == nil || !strings.Contains(err.Error(), "beyond") {
		t.Errorf("too far ahead: %v", err)
	}
}

func TestStartPhase(t *testing.T) {
	p := probe{served: map[int64]bool{0: true, 1: true, 2: true}}
	acks := []Ack{{Node: "a", Ranks: []RankState{{Rank: 0}, {Rank: 1}}}}
	if p.allStarted(acks) {
		t.Error("2 of 3 ranks started: not all")
	}
	if !p.allStarted(append(acks, Ack{Node: "b", Err: "refused"})) {
		t.Error("a refusal ends the wait")
	}
	expect, err := started(append(acks, Ack{Node: "b", Ranks: []RankState{{Rank: 2}}}), Options{Ranks: []int64{0, 2}})
	if err != nil || len(expect) != 2 || expect[0] != "a" || expect[2] != "b" {
		t.Errorf("started %v, %v: want ranks 0 on a and 2 on b (1 was not asked for)", expect, err)
	}
	if _, err := started([]Ack{{Node: "b", Err: "no"}}, Options{}); err == nil || !strings.Contains(err.Error(), "refused by the agent on b") {
		t.Errorf("refusal: %v", err)
	}
	if _, err := started(nil, Options{Job: "j"}); !errors.Is(err, ErrNoJob) {
		t.Errorf("none left: %v", err)
	}
	if s := unserved(map[int64]string{0: "a", 2: "a"}, 4); s != "no agent answered for ranks 1,3 of 4" {
		t.Errorf("unserved: %q", s)
	}
	if s := unserved(map[int64]string{0: "a"}, 1); s != "" {
		t.Errorf("all served: %q", s)
	}
	many := map[int64]string{}
	if s := unserved(many, 100); !strings.HasSuffix(s, " and 36 more of 100") {
		t.Errorf("100 unserved: %q", s)
	}
}

// reportMsg is a rank's report as the reply subject carries it.
func reportMsg(t *testing.T, r Report) *nats.Msg {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return &nats.Msg{Data: b, Header: nats.Header{}}
}

func pieceMsg(id, header string, data []byte) *nats.Msg {
	h := nats.Header{}
	h.Set(HeaderChunk, header)
	h.Set(HeaderID, id)
	return &nats.Msg{Data: data, Header: h}
}

func TestGatheringPhase(t *testing.T) {
	var said []string
	o := Options{Job: "j", Steps: 2, Timeout: time.Second, AcceptWait: time.Second, Progress: func(s string) { said = append(said, s) }}
	g := newGathering("id1", 10, o, map[int64]string{0: "a", 1: "a", 2: "b"}, true)
	traced := func(rank, step int64, chunks int) Report {
		return Report{ID: "id1", Node: "a", Rank: rank, State: StateTraced, Step: step, Chunks: chunks}
	}
	g.take(reportMsg(t, Report{ID: "id1", Rank: 0, State: StateAccepted}))
	g.take(reportMsg(t, traced(0, 10, 1)))
	g.take(reportMsg(t, traced(0, 10, 1)))                                           // again: once
	g.take(reportMsg(t, traced(0, 12, 0)))                                           // outside the capture's steps
	g.take(reportMsg(t, Report{ID: "other", Rank: 0, State: StateTraced, Step: 11})) // another capture's
	g.take(reportMsg(t, traced(9, 10, 0)))                                           // a rank not expected
	g.take(pieceMsg("id1", "0/10/0", gzipped(t, `{"traceEvents": []}`)))
	g.take(pieceMsg("id1", "0/10/5", []byte("x")))   // out of order: not held
	g.take(pieceMsg("other", "0/10/0", []byte("x"))) // another capture's
	g.take(reportMsg(t, traced(0, 11, 0)))
	g.take(reportMsg(t, Report{ID: "id1", Rank: 1, State: StateFailed, Why: "busy"}))
	if g.done() {
		t.Fatal("rank 2 has said nothing: not done")
	}
	g.acceptExpired() // rank 2 never accepted
	if !g.done() {
		t.Fatalf("every rank traced or failed: done (%+v)", g.state)
	}
	if len(g.reports) != 2 || len(g.chunks[traceKey{0, 10}]) != 1 {
		t.Errorf("%d reports and %d pieces held: want 2 and 1", len(g.reports), len(g.chunks[traceKey{0, 10}]))
	}
	v := g.view()
	if len(v.Missing) != 2 || v.Missing[0].Rank != 1 || v.Missing[0].Why != "busy" || v.Missing[1].Rank != 2 || !strings.Contains(v.Missing[1].Why, "did not accept") {
		t.Errorf("missing %+v: want rank 1 (busy) and rank 2 (did not accept)", v.Missing)
	}
	dir := t.TempDir()
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if err := g.keep(v, root, dir); err != nil {
		t.Fatal(err)
	}
	if len(v.Kept) != 1 || !strings.HasSuffix(v.Kept[0], "rank0.step10.pt.trace.json.gz") {
		t.Errorf("kept %v", v.Kept)
	}
	if len(said) == 0 {
		t.Error("nothing said of the ranks' answers")
	}

	// the answers' budget: past it nothing more is read, and the view says so
	o.MaxReportsBytes = 10
	g = newGathering("id1", 10, o, map[int64]string{0: "a"}, false)
	g.take(reportMsg(t, traced(0, 10, 0)))
	if len(g.reports) != 0 || !g.overReports || !strings.Contains(strings.Join(g.view().Notes, " "), "were not read") {
		t.Errorf("over the budget: %d reports, notes %v", len(g.reports), g.view().Notes)
	}

	// run ends when ctx does
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	g = newGathering("id1", 10, o, map[int64]string{0: "a"}, false)
	g.run(ctx, make(chan *nats.Msg))
	if !g.timedOut {
		t.Error("run did not end with its context")
	}
}

// The merge's phases from hand-built calls: rank 2 shares no group with
// rank 0 and its trace's clock starts 5 ms later; align finds its offset
// through rank 1, match pairs its calls, and attribute names rank 2,
// which arrives 3 ms after the others at each of group b's calls.
func TestMergePhases(t *testing.T) {
	calls := func(group string, ends []int64, shift, late int64) []kineto.Call {
		var cs []kineto.Call
		for _, e := range ends {
			cs = append(cs, kineto.Call{Group: group, Kind: "all_reduce", StartNs: e - 4e6 + shift + late, EndNs: e + shift})
		}
		return cs
	}
	a := []int64{10e6, 30e6, 50e6}
	b := []int64{20e6, 40e6, 60e6}
	rep := func(rank int64, cs ...[]kineto.Call) Report {
		return Report{Rank: rank, State: StateTraced, Step: 7, Node: "n", Calls: slices.Concat(cs...)}
	}
	results := []Report{
		rep(0, calls("a", a, 0, 0)),
		rep(1, calls("a", a, 1e6, 0), calls("b", b, 1e6, 0)),
		rep(2, calls("b", b, -5e6, 3e6)),
	}
	m := newMerger("c", "j", results)
	m.sequences()
	gs := m.groupsOf(7)
	if !slices.Equal(gs, []string{"a", "b"}) {
		t.Fatalf("groups %v", gs)
	}
	off := m.align(7, gs)
	if off[0] != 0 || off[1] != 1e6 || off[2] != -5e6 {
		t.Fatalf("offsets %v: want 0, 1 ms, -5 ms", off)
	}
	for _, g := range gs {
		m.match(7, g, off)
	}
	if m.unmatched != 0 || len(m.v.Collectives) != 6 {
		t.Fatalf("%d unmatched, %d collectives: want 0 and 6", m.unmatched, len(m.v.Collectives))
	}
	m.attribute()
	cu := m.v.Culprit
	if cu == nil || cu.Rank != 2 || cu.LastArrivals != 3 || math.Abs(cu.HeldBackUs-9000) > 1 {
		t.Fatalf("culprit %+v: want rank 2, last at 3 calls, 9 ms held back", cu)
	}
	// the others' wait averaged over the two other ranks: rank 1 waited
	// 3 ms at each of 3 calls, rank 0 shares none
	if math.Abs(cu.OthersWaitUs-4500) > 1 {
		t.Errorf("others' wait %.1f µs, want 4500", cu.OthersWaitUs)
	}
}

// A wait the step records do not bear out is said to be in doubt: the
// FSDP2 capture of a CI run read 183.3 ms where rank 3's records gave
// 115.7 ms (its delay was 120 ms); one within 25% is not.
func TestWaitDoubtFromRecords(t *testing.T) {
	for _, c := range []struct {
		waitUs, excessUs float64
		doubt            bool
	}{{183.3e3, 115.7e3, true}, {126.4e3, 120e3, false}, {126.4e3, 80.5e3, true}, {90e3, 120e3, false}, {80e3, 120e3, true}} {
		v := &View{Steps: []int64{34}, Culprit: &Culprit{Rank: 3, OthersWaitUs: c.waitUs}}
		v.verdict(&RecordsCritical{Rank: 3, ExcessUs: c.excessUs}, 0, nil)
		if got := v.Culprit.WaitDoubt != ""; got != c.doubt {
			t.Errorf("wait %.1f ms against records' %.1f ms: doubt %q, want one: %v", c.waitUs/1e3, c.excessUs/1e3, v.Culprit.WaitDoubt, c.doubt)
		}
	}
	// calls lost in matching say so first
	v := &View{Steps: []int64{1}, Culprit: &Culprit{Rank: 3, OthersWaitUs: 200e3, WaitDoubt: "2 calls lost in matching"}}
	v.verdict(&RecordsCritical{Rank: 3, ExcessUs: 100e3}, 2, nil)
	if v.Culprit.WaitDoubt != "2 calls lost in matching" {
		t.Errorf("doubt %q", v.Culprit.WaitDoubt)
	}
}

func gzipped(t *testing.T, s string) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write([]byte(s))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// A kept piece that does not decompress to a trace is not written (26
// bytes of text were kept as a .json.gz): not gzip, a truncated stream,
// gzip of something that is not a trace's JSON.
func TestKeptPieceIsATrace(t *testing.T) {
	good := gzipped(t, `{"traceEvents": [{"ph": "X"}]}`)
	if why := notATrace(good); why != "" {
		t.Errorf("a trace refused: %s", why)
	}
	for name, data := range map[string][]byte{
		"text":      []byte("this is not a trace at all"),
		"truncated": good[:len(good)-6],
		"not json":  gzipped(t, "hello, world"),
		"empty":     gzipped(t, ""),
	} {
		if why := notATrace(data); why == "" {
			t.Errorf("%s: taken for a trace", name)
		}
	}
}
