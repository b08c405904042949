package collector

import (
	"encoding/json"
	"fmt"
	"math"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/wire"
)

// The state machine alone: no collector, no NATS, no lock, no disk. Each
// case feeds records and checks the tally (what the collector counts and
// says) and the rows it hands out.

func stateRec(step, rank, world int64) tps.StepRecord {
	start := int64(1_700_000_000_000_000_000) + step*int64(time.Second)
	r := tps.StepRecord{Job: "s", Step: step, Rank: rank, WorldSize: world, Tokens: 100, Node: "n0",
		StartUnixNs: start, EndUnixNs: start + int64(500*time.Millisecond), FwdNs: int64(200 * time.Millisecond)}
	r.Normalize()
	return r
}

func newTestState(maxOpen int) (*jobState, *tally) {
	s := newJobState("s", limits{maxOpenSteps: maxOpen, gpuJoinWait: time.Second, quietAfter: time.Second}, nil, nil)
	return &s, &tally{now: time.Unix(100, 0)}
}

func TestStateClosesFullStepOnce(t *testing.T) {
	s, tl := newTestState(8)
	for rank := range int64(4) {
		r := stateRec(1, rank, 4)
		if _, open, keep := s.add(&r, tl); !open || !keep {
			t.Fatalf("rank %d: open %v keep %v", rank, open, keep)
		}
	}
	if tl.records != 4 || tl.stepsClosed != 1 || len(tl.closed) != 1 || tl.closed[0].Tokens != 400 || tl.closed[0].RanksReported != 4 {
		t.Fatalf("tally %+v", tl)
	}
	rows := s.readyRows(false, tl) // no GPU series: ready at once
	if len(rows) != 1 || rows[0].Step != 1 || len(s.open) != 0 {
		t.Fatalf("rows %+v, open %d", rows, len(s.open))
	}
	if again := s.readyRows(true, tl); len(again) != 0 {
		t.Fatalf("a row handed out twice: %+v", again)
	}
	// The same rank again: a duplicate, said as a possible rerun.
	tl.warnings = nil // the first record said MFU is not computed (no model)
	r := stateRec(1, 2, 4)
	if _, open, keep := s.add(&r, tl); open || keep || tl.duplicates != 1 || len(tl.warnings) != 1 || tl.warnings[0].key != "rerun" {
		t.Fatalf("duplicate: open %v keep %v tally %+v", open, keep, tl)
	}
}

func TestStateLateAndStale(t *testing.T) {
	s, tl := newTestState(2)
	// Three open steps with a bound of two: the oldest closes early.
	for step := int64(1); step <= 3; step++ {
		r := stateRec(step, 0, 2)
		s.add(&r, tl)
	}
	if tl.stepsClosed != 1 || tl.closed[0].Step != 1 || tl.incomplete != 1 || len(s.open) != 2 {
		t.Fatalf("after 3 steps with 2 open at most: %+v, open %d", tl, len(s.open))
	}
	// Rank 1 of the closed step: late, its row kept, not aggregated.
	tl.warnings = nil
	r := stateRec(1, 1, 2)
	if _, open, keep := s.add(&r, tl); open || !keep || tl.late != 1 || len(tl.warnings) != 0 {
		t.Fatalf("late: open %v keep %v tally %+v", open, keep, tl)
	}
	// Forget step 1 (64 closed steps remembered), then it is stale: late,
	// and said as a possible rerun.
	for step := int64(4); step < 80; step++ {
		for rank := range int64(2) {
			r := stateRec(step, rank, 2)
			s.add(&r, tl)
		}
	}
	r = stateRec(1, 1, 2)
	tl.warnings = nil
	if _, _, keep := s.add(&r, tl); !keep || tl.late != 2 || len(tl.warnings) != 1 || tl.warnings[0].key != "rerun" {
		t.Fatalf("stale: keep %v tally late %d warnings %+v", keep, tl.late, tl.warnings)
	}
}

func TestStateRejects(t *testing.T) {
	s, tl := newTestState(8)
	r := stateRec(10, 0, 4)
	s.add(&r, tl)
	// Another world size within the same attempt: rejected, nothing closed.
	odd := stateRec(10, 1, 8)
	if _, open, keep := s.add(&odd, tl); open || keep || tl.rejected["world_size:mismatch"] != 1 || tl.stepsClosed != 0 {
		t.Fatalf("world mismatch: tally %+v", tl)
	}
	// A step ten million past the window: rejected, the window stays.
	far := stateRec(10+maxStepJump+1, 1, 4)
	if _, open, _ := s.add(&far, tl); open || tl.rejected["step:jump"] != 1 || len(s.open) != 1 {
		t.Fatalf("step jump: tally %+v open %d", tl, len(s.open))
	}
	// A new attempt may change the world: the old one's open step closes.
	next := stateRec(10, 0, 8)
	next.Attempt = 1
	if _, open, _ := s.add(&next, tl); !open || tl.stepsClosed != 1 || s.world != 8 {
		t.Fatalf("new attempt: tally %+v world %d", tl, s.world)
	}
}

func TestStatePartialsShareAdmission(t *testing.T) {
	s, tl := newTestState(8)
	recs := []tps.StepRecord{stateRec(5, 0, 4), stateRec(5, 1, 4)}
	p, err := tps.NewPartial(recs, tps.Topology{})
	if err != nil {
		t.Fatal(err)
	}
	if _, open := s.addPartial(&p, tl); !open || tl.records != 2 {
		t.Fatalf("first partial: %+v", tl)
	}
	if _, open := s.addPartial(&p, tl); open || tl.duplicates != 2 {
		t.Fatalf("the same partial again: %+v", tl)
	}
	overlap, _ := tps.NewPartial([]tps.StepRecord{stateRec(5, 1, 4), stateRec(5, 2, 4)}, tps.Topology{})
	if _, open := s.addPartial(&overlap, tl); open || tl.rejected["partial:overlap"] != 1 {
		t.Fatalf("overlapping partial: %+v", tl)
	}
	rest, _ := tps.NewPartial([]tps.StepRecord{stateRec(5, 2, 4), stateRec(5, 3, 4)}, tps.Topology{})
	if _, open := s.addPartial(&rest, tl); !open || tl.stepsClosed != 1 || tl.closed[0].Tokens != 400 {
		t.Fatalf("completing partial: %+v", tl)
	}
	// After the step closed: late, counted per rank (the path records take).
	if _, open := s.addPartial(&rest, tl); open || tl.late != 2 {
		t.Fatalf("late partial: %+v", tl)
	}
	far, _ := tps.NewPartial([]tps.StepRecord{stateRec(5+maxStepJump+1, 0, 4)}, tps.Topology{})
	if _, open := s.addPartial(&far, tl); open || tl.rejected["step:jump"] != 1 {
		t.Fatalf("far partial: %+v", tl)
	}
}

// Closed rows wait for the GPU samples that cover them, up to gpuJoinWait.
func TestStateRowsWaitForGPUs(t *testing.T) {
	s, tl := newTestState(8)
	power := 500.0
	s.addGPU([]tps.GPUSample{{Node: "n0", UUID: "GPU-0", UnixNs: 1, PowerW: &power, Name: "NVIDIA H100 80GB HBM3"}}, tl)
	if !tl.metaChanged {
		t.Error("the GPU model did not mark the parts' metadata stale")
	}
	r := stateRec(1, 0, 1)
	s.add(&r, tl)
	if rows := s.readyRows(false, tl); len(rows) != 0 {
		t.Fatalf("row written before the GPU samples covering it: %+v", rows)
	}
	s.addGPU([]tps.GPUSample{{Node: "n0", UUID: "GPU-0", UnixNs: r.EndUnixNs + 1, PowerW: &power}}, tl)
	rows := s.readyRows(false, tl)
	if len(rows) != 1 || rows[0].GPUsJoined != 1 || rows[0].PowerWMean != 500 {
		t.Fatalf("rows once covered: %+v", rows)
	}
	r = stateRec(2, 0, 1)
	s.add(&r, tl)
	tl.now = tl.now.Add(2 * time.Second) // past gpuJoinWait
	if rows := s.readyRows(false, tl); len(rows) != 1 || rows[0].Step != 2 {
		t.Fatalf("row not written after the wait: %+v", rows)
	}
}

// Scrapes and Stats never wait for a job's lock: a job whose ingest is
// stuck (its lock held, as behind a full writer queue) leaves /metrics and
// Stats answering, with the figures of its last closed step. With one lock
// for every job and the scrape, they waited as long as the ingest did.
func TestScrapeWhileJobLocked(t *testing.T) {
	c, nc := startCollector(t)
	publishSteps(t, nc, "busy", 0, 3)
	nc.Flush()
	if err := c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	j := c.jobs["busy"]
	c.mu.Unlock()
	if j == nil {
		t.Fatal("no job")
	}
	j.mu.Lock() // the ingest path of the job, stuck
	done := make(chan string)
	go func() {
		st := c.Stats()
		body := get(t, c, "/metrics")
		done <- fmt.Sprintf("records %d\n%s", st.Records, body)
	}()
	select {
	case out := <-done:
		j.mu.Unlock()
		if !strings.Contains(out, "records 12") || !strings.Contains(out, `tpsprof_steps_closed_total{job="busy"}`) {
			t.Errorf("scrape while the job's lock is held:\n%.600s", out)
		}
	case <-time.After(5 * time.Second):
		j.mu.Unlock()
		<-done
		t.Fatal("Stats and /metrics waited for a job's lock")
	}
}

// Records claiming the largest world on distinct steps are rejected once
// the memory budget is spent, instead of each costing ~67 MB of heap
// (eight of them took 5 GiB before); closing and releasing the job gives
// the budget back.
func TestStateMemoryBudget(t *testing.T) {
	mem := &memBudget{max: 256 << 20}
	s := newJobState("s", limits{maxOpenSteps: 256, mem: mem}, nil, nil)
	tl := &tally{now: time.Unix(100, 0)}
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	opened := 0
	for step := range int64(64) {
		r := stateRec(step, 0, tps.MaxWorldSize)
		if _, open, _ := s.add(&r, tl); open {
			opened++
		}
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if opened == 0 || opened > 4 || tl.rejected["world_size:memory"] != int64(64-opened) {
		t.Fatalf("%d steps opened, rejected %v %v", opened, tl.rejected, tl.warnings)
	}
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 300<<20 {
		t.Errorf("heap grew %d MiB with a 256 MiB budget", grew>>20)
	}
	if used := mem.used.Load(); used > mem.max || used != s.held {
		t.Errorf("budget used %d, job holds %d, max %d", used, s.held, mem.max)
	}
	s.closeAll(tl)
	s.release()
	if used := mem.used.Load(); used != 0 {
		t.Errorf("budget used %d after the job was released", used)
	}
}

// Through NATS: records claiming the largest world fill the budget and
// are then rejected, counted; another job keeps working, and the claimed
// memory is in Stats and /metrics.
func TestHugeWorldsBounded(t *testing.T) {
	c, nc := startCollectorWith(t, Config{OutDir: t.TempDir(), Grace: time.Minute, MaxStateBytes: 512 << 20})
	now := time.Now().Add(-time.Minute).UnixNano()
	for step := range int64(20) {
		r := tps.StepRecord{Job: "huge", Step: step, Rank: step, WorldSize: tps.MaxWorldSize, Tokens: 1, StartUnixNs: now, EndUnixNs: now + 1e9}
		nc.Publish(wire.StepsSubject("huge", "n0"), wire.AppendSteps(nil, []tps.StepRecord{r}))
	}
	publishSteps(t, nc, "small", 0, 3)
	if err := c.Sync(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	if st.Rejected["world_size:memory"] < 10 || st.StateBytes > 512<<20 || st.StepsClosed != 3 {
		t.Errorf("stats %+v", st)
	}
	if m := get(t, c, "/metrics"); !strings.Contains(m, "tpsprof_collector_state_bytes ") || !strings.Contains(m, `reason="world_size:memory"`) {
		t.Errorf("/metrics lacks the state bytes or the rejection")
	}
}

// Steps arriving out of order (a failover reorders publishes) open and
// close with every rank when the later steps have closed already; only
// steps closed and forgotten count as late.
func TestStateOutOfOrderSteps(t *testing.T) {
	s, tl := newTestState(8)
	for _, step := range []int64{20, 21, 22, 10, 11} {
		for rank := range int64(2) {
			r := stateRec(step, rank, 2)
			if _, open, _ := s.add(&r, tl); !open {
				t.Fatalf("step %d rank %d not aggregated", step, rank)
			}
		}
	}
	if tl.stepsClosed != 5 || tl.incomplete != 0 || tl.late != 0 {
		t.Errorf("tally %+v", tl)
	}
}

// Generation through NATS: step records with a generation phase and two
// ranks' rollout events (time to first token 1-100 ms and 101-200 ms);
// /metrics gives the merged median (100 ms, within 1%), the generation TPS
// of the step and its generation share.
func TestGenerationMetrics(t *testing.T) {
	c, nc := startCollector(t)
	now := time.Now().Add(-time.Minute).UnixNano()
	var recs []tps.StepRecord
	for rank := range int64(2) {
		recs = append(recs, tps.StepRecord{Job: "rl", Step: 0, Rank: rank, WorldSize: 2, Tokens: 100, StartUnixNs: now, EndUnixNs: now + 2e9,
			GenNs: int64(1e9) + rank*int64(2e8), GenRequests: 4, GenPromptTokens: 32, GenOutputTokens: 600})
	}
	if err := nc.Publish(wire.StepsSubject("rl", "n0"), wire.AppendSteps(nil, recs)); err != nil {
		t.Fatal(err)
	}
	for rank := range 2 {
		var d tps.RolloutDetail
		for i := 1; i <= 100; i++ {
			d.TTFT.Add(float64(100*rank+i) / 1000)
			d.ITL.Add(0.02)
		}
		detail, _ := json.Marshal(d)
		ev, _ := json.Marshal(tps.Event{Job: "rl", Kind: tps.EventRollout, Rank: int64(rank), StartUnixNs: now, EndUnixNs: now, Detail: string(detail)})
		nc.Publish(wire.EventsSubject("rl"), ev)
	}
	nc.Flush()
	if err := c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	// The loop publishes rollout latencies (at most every tick), not each event.
	m := get(t, c, "/metrics")
	// (both ranks' events: a tick may publish after the first alone)
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(m, `tpsprof_generation_ttft_seconds_count{job="rl"} 200`) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		m = get(t, c, "/metrics")
	}
	value := func(prefix string) float64 {
		for _, l := range strings.Split(m, "\n") {
			if strings.HasPrefix(l, prefix+" ") {
				v, _ := strconv.ParseFloat(strings.TrimPrefix(l, prefix+" "), 64)
				return v
			}
		}
		t.Fatalf("no %s in /metrics", prefix)
		return 0
	}
	if v := value(`tpsprof_generation_ttft_seconds{job="rl",quantile="0.5"}`); math.Abs(v-0.100) > 0.001 {
		t.Errorf("TTFT median %v, want 0.100 within 1%%", v)
	}
	if v := value(`tpsprof_generation_itl_seconds{job="rl",quantile="0.99"}`); math.Abs(v-0.02) > 0.0002 {
		t.Errorf("ITL p99 %v, want 0.020", v)
	}
	// 1,200 tokens generated over the slowest rank's 1.2 s; 1.1 s of 2 s generating on average
	if v := value(`tpsprof_generation_output_tokens_per_second{job="rl"}`); math.Abs(v-1000) > 1e-6 {
		t.Errorf("generation TPS %v, want 1000", v)
	}
	if v := value(`tpsprof_generation_share_ratio{job="rl"}`); math.Abs(v-0.55) > 1e-9 {
		t.Errorf("generation share %v, want 0.55", v)
	}
	if v := value(`tpsprof_generation_ttft_seconds_count{job="rl"}`); v != 200 {
		t.Errorf("TTFT count %v, want 200", v)
	}
	var sum LiveSummary
	if err := json.Unmarshal([]byte(get(t, c, "/api/summary")), &sum); err != nil {
		t.Fatal(err)
	}
	if g := sum.Jobs[0].Generation; g == nil || g.OutputTPS != 1000 || g.TTFTP95 == nil || math.Abs(*g.TTFTP95-0.190) > 0.0019 {
		t.Errorf("/api/summary generation: %+v", g)
	}
	// the latencies are summaries, as promtool wants quantile labels to be
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool (Debian's prometheus package; .ci/run installs it) checks the exposition")
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(m)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}

// A row's energy is joined over its step's period, not its span: rank 0
// starts step 2 at 0.9 s while rank 1 ends step 1 at 1.2 s, so step 2's
// span (0.9-2.2 s) overlaps step 1's, but its period is 1.2-2.2 s. One GPU
// at a constant 500 W: 500 J over the period (650 J over the span).
func TestStateEnergyOverThePeriod(t *testing.T) {
	s, tl := newTestState(8)
	const t0 = int64(1_700_000_000_000_000_000)
	rec := func(step, rank, start, end int64) tps.StepRecord {
		r := stateRec(step, rank, 2)
		r.StartUnixNs, r.EndUnixNs = t0+start*1e6, t0+end*1e6 // ms from t0
		r.Normalize()
		return r
	}
	var samples []tps.GPUSample
	for ms := int64(-1000); ms <= 4000; ms += 100 {
		p, e := 500.0, 500*(ms+1000) // mJ: 500 W since -1 s
		samples = append(samples, tps.GPUSample{Node: "n0", UUID: "GPU-0", UnixNs: t0 + ms*1e6, PowerW: &p, EnergyMJ: &e})
	}
	s.addGPU(samples, tl)
	for _, r := range []tps.StepRecord{rec(1, 0, 0, 800), rec(1, 1, 100, 1200), rec(2, 0, 900, 2100), rec(2, 1, 1250, 2200)} {
		s.add(&r, tl)
	}
	rows := s.readyRows(true, tl)
	if len(rows) != 2 {
		t.Fatalf("%d rows, want 2", len(rows))
	}
	c := rows[1]
	if c.StepTimeNs != 1000e6 || c.StartUnixNs != t0+900e6 {
		t.Fatalf("step 2: step time %d, start %d ms; want the 1,000 ms period from step 1's end, the span from 900 ms", c.StepTimeNs, (c.StartUnixNs-t0)/1e6)
	}
	if math.Abs(c.EnergyJ-500) > 1e-6 {
		t.Errorf("step 2: %.3f J, want 500 J over its 1 s period (650 J over its 1.3 s span)", c.EnergyJ)
	}
}

// A step whose cluster row reached a finalised part while its rank rows'
// part did not (a full disk failed one table's rotation and not the
// other's): the redelivered records are late, and each rank's row is
// written once. Before, admitting the record marked its row as on disk
// and the same call then read that mark: the rows were never written
// (CI under load: steps 48 and 49 without rank rows).
func TestStateRedeliveredRowsOfStepClosedOnDisk(t *testing.T) {
	led := newLedger()
	led.disk = &diskKeys{closed: map[stepKey]bool{{0, 7}: true}, ranks: map[stepKey]map[int64]bool{{0, 8}: {0: true}}}
	s := newJobState("s", limits{maxOpenSteps: 8}, nil, led)
	tl := &tally{now: time.Unix(100, 0)}
	for rank := range int64(2) {
		r := stateRec(7, rank, 2)
		if _, open, keep := s.add(&r, tl); open || !keep {
			t.Fatalf("rank %d of a step closed on disk, its row not there: open %v keep %v (want its row written once)", rank, open, keep)
		}
		if _, open, keep := s.add(&r, tl); open || keep {
			t.Fatalf("rank %d again: open %v keep %v (want a duplicate)", rank, open, keep)
		}
	}
	if tl.late != 2 || tl.duplicates != 2 || tl.stepsClosed != 0 {
		t.Fatalf("tally %+v", tl)
	}
	// A step not closed on disk whose rank 0 row is: aggregated again,
	// rank 0's row not written twice, rank 1's written.
	for rank, want := range []bool{false, true} {
		r := stateRec(8, int64(rank), 2)
		if _, open, keep := s.add(&r, tl); !open || keep != want {
			t.Fatalf("step 8 rank %d: open %v keep %v (want open, keep %v)", rank, open, keep, want)
		}
	}
	if tl.stepsClosed != 1 {
		t.Fatalf("step 8 not closed: %+v", tl)
	}
}

// A job reset hands back the messages of a step it had reopened to redo
// (its rows never reached Parquet) while 70 later steps closed: the step
// sits below the closed window's floor but was never closed by this job,
// so the next job's close of it is its first and is counted. Before, it
// was taken for a forgotten closed step: 199 of 200 steps counted.
func TestResetCountsReopenedStepOnce(t *testing.T) {
	led := newLedger()
	led.redo = map[stepKey]bool{{0, 3}: true}
	led.reclose = map[stepKey]bool{{0, 1}: true}
	s := newJobState("s", limits{maxOpenSteps: 8}, nil, led)
	tl := &tally{now: time.Unix(100, 0)}
	for step := int64(2); step < 72; step++ {
		if step == 3 {
			continue
		}
		for rank := range int64(2) {
			r := stateRec(step, rank, 2)
			s.add(&r, tl)
		}
	}
	r := stateRec(3, 0, 2)
	if k, open, _ := s.add(&r, tl); !open || k.step != 3 {
		t.Fatalf("step 3 (to redo) not reopened below the closed floor: open %v", open)
	}
	if !s.closed.forgotten(stepKey{0, 3}) {
		t.Fatal("the test needs step 3 below the closed window's floor")
	}
	got := s.closedAndCounted([]ackItem{{steps: []stepKey{{0, 3}}}, {steps: []stepKey{{0, 71}, {0, 4}}}})
	want := map[stepKey]bool{{0, 1}: true, {0, 4}: true, {0, 71}: true}
	if len(got) != len(want) {
		t.Fatalf("closed and counted %v, want %v", got, want)
	}
	for k := range want {
		if !got[k] {
			t.Fatalf("closed and counted %v, want %v", got, want)
		}
	}
}

// A one-rank job's live line says it has no peer to wait for (it read
// "waiting for rank 0 0.0%").
func TestLiveLineOneRank(t *testing.T) {
	s, tl := newTestState(8)
	for step := range int64(3) {
		r := stateRec(step, 0, 1)
		s.add(&r, tl)
	}
	s.readyRows(false, tl)
	line := s.liveLine(time.Unix(200, 0))
	if !strings.Contains(line, "one rank: no peer to wait for") || strings.Contains(line, "waiting for rank 0") {
		t.Errorf("live line %q", line)
	}
}
