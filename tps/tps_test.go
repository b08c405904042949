package tps

import (
	"errors"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

const t0 = int64(1_760_000_000_000_000_000) // 2025-10-09, a plausible wall clock

func rec(job string, step, rank, world, tokens, durNs int64) StepRecord {
	return StepRecord{Job: job, Step: step, Rank: rank, WorldSize: world, Tokens: tokens,
		StartUnixNs: t0 + step*durNs, EndUnixNs: t0 + step*durNs + durNs, DurationNs: durNs}
}

func i32(v int32) *int32 { return &v }

func TestValidateRejects(t *testing.T) {
	good := rec("job-1", 3, 2, 8, 4096, int64(time.Second))
	if err := good.Validate(); err != nil {
		t.Fatalf("good record rejected: %v", err)
	}
	nan := math.NaN()
	tests := []struct {
		name   string
		mutate func(*StepRecord)
		field  string
		reason string
	}{
		{"missing job", func(r *StepRecord) { r.Job = "" }, "job", ReasonMissing},
		{"job with a dot", func(r *StepRecord) { r.Job = "a.b" }, "job", ReasonInvalid},
		{"job too long", func(r *StepRecord) { r.Job = strings.Repeat("x", 65) }, "job", ReasonInvalid},
		{"negative step", func(r *StepRecord) { r.Step = -1 }, "step", ReasonNegative},
		{"no world", func(r *StepRecord) { r.WorldSize = 0 }, "world_size", ReasonMissing},
		{"absurd world", func(r *StepRecord) { r.WorldSize = MaxWorldSize + 1 }, "world_size", ReasonOutOfRange},
		{"rank = world", func(r *StepRecord) { r.Rank = 8 }, "rank", ReasonOutOfRange},
		{"tp_rank out of world", func(r *StepRecord) { r.TPRank = i32(9) }, "tp_rank", ReasonOutOfRange},
		{"negative tokens", func(r *StepRecord) { r.Tokens = -5 }, "tokens", ReasonNegative},
		{"absurd tokens", func(r *StepRecord) { r.Tokens = MaxTokens + 1 }, "tokens", ReasonOutOfRange},
		{"2^40 tokens in 1 ns", func(r *StepRecord) { r.Tokens, r.EndUnixNs, r.DurationNs = 1<<40, r.StartUnixNs+1, 1 }, "tokens", ReasonOutOfRange},
		{"1970 timestamp", func(r *StepRecord) { r.StartUnixNs, r.EndUnixNs = 1000, 2000 }, "start_unix_ns", ReasonOutOfRange},
		{"end before start", func(r *StepRecord) { r.EndUnixNs = r.StartUnixNs - 1 }, "end_unix_ns", ReasonOutOfRange},
		{"day-long step", func(r *StepRecord) { r.DurationNs = MaxStepNs + 1 }, "duration_ns", ReasonOutOfRange},
		{"exposed longer than step", func(r *StepRecord) { r.ExposedCommNs = r.DurationNs + 1 }, "exposed_comm_ns", ReasonOutOfRange},
		{"exposed above comm", func(r *StepRecord) { r.CommNs = 10; r.ExposedCommNs = 11 }, "exposed_comm_ns", ReasonOutOfRange},
		{"negative data wait", func(r *StepRecord) { r.DataWaitNs = -1 }, "data_wait_ns", ReasonNegative},
		{"NaN flops", func(r *StepRecord) { r.FLOPs = nan }, "flops", ReasonOutOfRange},
		{"NaN loss", func(r *StepRecord) { r.Loss = &nan }, "loss", ReasonInvalid},
		{"control char in node", func(r *StepRecord) { r.Node = "n\x00de" }, "node", ReasonInvalid},
		{"huge node", func(r *StepRecord) { r.Node = strings.Repeat("n", 10000) }, "node", ReasonInvalid},
		{"day-long capture", func(r *StepRecord) { r.CaptureNs = MaxStepNs + 1 }, "capture_ns", ReasonOutOfRange},
		{"negative capture CPU", func(r *StepRecord) { r.CaptureCPUNs = -1 }, "capture_cpu_ns", ReasonNegative},
		{"2 PiB device", func(r *StepRecord) { r.MemCapacityBytes = 2 << 50 }, "mem_capacity_bytes", ReasonOutOfRange},
		{"negative peak", func(r *StepRecord) { r.MemPeakReservedBytes = -1 }, "mem_peak_reserved_bytes", ReasonOutOfRange},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := good
			tc.mutate(&r)
			err := r.Validate()
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("got %v, want a *FieldError", err)
			}
			if !errors.Is(err, ErrInvalidRecord) {
				t.Errorf("error does not wrap ErrInvalidRecord")
			}
			if fe.Field != tc.field || fe.Reason != tc.reason {
				t.Errorf("got %s, want %s:%s (%v)", fe.Code(), tc.field, tc.reason, err)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Errorf("message %q does not name the field", err)
			}
			if len(err.Error()) > 400 {
				t.Errorf("message is %d bytes; bad values must be truncated", len(err.Error()))
			}
		})
	}
}

func TestNormalizeDefaultsDuration(t *testing.T) {
	r := rec("j", 0, 0, 1, 1, 5)
	r.DurationNs = 0
	r.Normalize()
	if r.DurationNs != 5 {
		t.Fatalf("got duration %d, want 5", r.DurationNs)
	}
}

func TestCheckClock(t *testing.T) {
	now := time.Unix(0, t0)
	r := rec("j", 0, 0, 1, 1, int64(time.Second))
	if err := r.CheckClock(now, time.Minute); err != nil {
		t.Fatalf("in-range record rejected: %v", err)
	}
	r.EndUnixNs = now.Add(2 * time.Hour).UnixNano()
	if err := r.CheckClock(now, time.Minute); err == nil {
		t.Fatal("record two hours in the future accepted")
	}
}

func TestTopologyRoundTrip(t *testing.T) {
	topo := Topology{DP: 4, TP: 8, PP: 2, CP: 2, EP: 2}
	if err := topo.Validate(128); err != nil {
		t.Fatal(err)
	}
	seen := map[Coords]bool{}
	for r := 0; r < 128; r++ {
		c := topo.Coords(r)
		if seen[c] {
			t.Fatalf("rank %d: coordinates %+v taken twice", r, c)
		}
		seen[c] = true
		if back := topo.Rank(c); back != r {
			t.Fatalf("rank %d → %+v → %d", r, c, back)
		}
	}
	// Megatron order: TP fastest, then CP, then DP, then PP.
	if c := topo.Coords(8); c != (Coords{TP: 0, CP: 1}) {
		t.Errorf("rank 8: got %+v, want cp=1", c)
	}
	if c := topo.Coords(16); c != (Coords{DP: 1, EP: 1}) {
		t.Errorf("rank 16: got %+v, want dp=1 ep=1", c)
	}
	if c := topo.Coords(64); c != (Coords{PP: 1}) {
		t.Errorf("rank 64: got %+v, want pp=1", c)
	}
}

func TestTopologyValidate(t *testing.T) {
	tests := []struct {
		name  string
		topo  Topology
		world int
		want  string
	}{
		{"product mismatch", Topology{DP: 4, TP: 8}, 64, "= 32, but world_size = 64"},
		{"ep does not divide dp", Topology{DP: 6, EP: 4}, 6, "ep=4 must divide dp=6"},
		{"negative", Topology{DP: -1}, 0, "dp=-1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.topo.Validate(tc.world)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want error containing %q", err, tc.want)
			}
		})
	}
}

// The token rule: one replica's TP/PP/CP peers report the same tokens and
// they count once.
func TestAggregateTokensOncePerReplica(t *testing.T) {
	topo := Topology{DP: 2, TP: 4, PP: 2, CP: 2}
	world := int64(topo.WorldSize()) // 32
	var recs []StepRecord
	for r := int64(0); r < world; r++ {
		dp := topo.Coords(int(r)).DP
		recs = append(recs, rec("j", 7, r, world, 1000*int64(dp+1), int64(time.Second)))
	}
	recs[5].DurationNs = 2 * int64(time.Second) // slowest rank
	recs[5].EndUnixNs = recs[5].StartUnixNs + recs[5].DurationNs
	c, err := Aggregate(recs, AccumulatorConfig{Topology: topo})
	if err != nil {
		t.Fatal(err)
	}
	if c.Tokens != 3000 {
		t.Errorf("got tokens %d, want 3000 (1000 + 2000, once per replica, not ×16)", c.Tokens)
	}
	if c.StepTimeNs != 2e9 || c.SlowestRank != 5 {
		t.Errorf("got step time %d at rank %d, want 2e9 at rank 5", c.StepTimeNs, c.SlowestRank)
	}
	if c.TPS != 1500 || c.TPSPerGPU != 1500.0/32 {
		t.Errorf("got TPS %g (%g/GPU), want 1500 (%g/GPU)", c.TPS, c.TPSPerGPU, 1500.0/32)
	}
	if c.TokenMismatchReplicas != 0 || c.RanksMissing != 0 || c.ReplicasReported != 2 {
		t.Errorf("got mismatch=%d missing=%d replicas=%d", c.TokenMismatchReplicas, c.RanksMissing, c.ReplicasReported)
	}
}

func TestAggregateFlagsMismatchDuplicatesMissing(t *testing.T) {
	topo := Topology{DP: 2, TP: 2}
	recs := []StepRecord{
		rec("j", 1, 0, 4, 100, 1e9), rec("j", 1, 1, 4, 100, 1e9), // replica 0
		rec("j", 1, 2, 4, 300, 1e9), rec("j", 1, 3, 4, 999, 1e9), // replica 1 disagrees
		rec("j", 1, 1, 4, 100, 1e9), // duplicate of rank 1
	}
	c, err := Aggregate(recs, AccumulatorConfig{Topology: topo})
	if err != nil {
		t.Fatal(err)
	}
	if c.TokenMismatchReplicas != 1 {
		t.Errorf("got %d mismatching replicas, want 1", c.TokenMismatchReplicas)
	}
	if c.Tokens != 400 {
		t.Errorf("got tokens %d, want 400 (replica 1 taken from its lowest rank, 2)", c.Tokens)
	}
	if c.DuplicateRecords != 1 || c.RanksReported != 4 {
		t.Errorf("got %d duplicates, %d ranks, want 1 and 4", c.DuplicateRecords, c.RanksReported)
	}
	// Order of arrival must not change the result.
	rev := []StepRecord{recs[3], recs[2], recs[1], recs[0]}
	c2, _ := Aggregate(rev, AccumulatorConfig{Topology: topo})
	if c2.Tokens != c.Tokens {
		t.Errorf("reversed arrival gives tokens %d, want %d", c2.Tokens, c.Tokens)
	}
	// A missing rank is reported, not hidden.
	c3, _ := Aggregate(recs[:3], AccumulatorConfig{Topology: topo})
	if c3.RanksMissing != 1 || c3.Complete() {
		t.Errorf("got %d missing, want 1", c3.RanksMissing)
	}
}

func TestAggregateFractionsAndMFU(t *testing.T) {
	a := rec("j", 0, 0, 2, 1000, 1e9)
	a.CommNs, a.ExposedCommNs, a.PPWaitNs, a.DataWaitNs = 400e6, 100e6, 200e6, 50e6
	b := rec("j", 0, 1, 2, 1000, 1e9)
	b.CommNs, b.ExposedCommNs = 400e6, 300e6
	c, err := Aggregate([]StepRecord{a, b}, AccumulatorConfig{FLOPsPerToken: 0.5e9, HWFLOPsPerToken: 0.75e9, PeakFLOPSPerGPU: 1e12})
	if err != nil {
		t.Fatal(err)
	}
	near := func(name string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-12 {
			t.Errorf("%s: got %g, want %g", name, got, want)
		}
	}
	near("comm mean", c.CommFractionMean, 0.2)
	near("comm max", c.CommFractionMax, 0.3)
	near("overlap", c.CommOverlap, 0.5)
	near("bubble mean", c.BubbleFractionMean, 0.1)
	near("data stall max", c.DataStallFractionMax, 0.05)
	// pure DP of 2: tokens 2000 in 1 s; 1e12 FLOP/s over 2 GPUs of 1e12 peak.
	near("mfu", c.MFU, 0.5)
	near("hfu", c.HFU, 0.75)
}

func TestSummarizeWarmupAndStats(t *testing.T) {
	var steps []ClusterStep
	for i := int64(0); i < 20; i++ {
		d := int64(1e9)
		if i < 3 {
			d = 5e9 // slow warm-up steps
		}
		if i == 10 {
			d = 6e9 // a slow step in the middle is not warm-up
		}
		steps = append(steps, ClusterStep{Step: i, WorldSize: 8, Tokens: 8000, StepTimeNs: d, TPS: 8000 / (float64(d) / 1e9),
			StartUnixNs: t0 + i*2e9, EndUnixNs: t0 + i*2e9 + d})
	}
	s := Summarize(steps, WindowOptions{Warmup: AutoWarmup})
	if s.WarmupSteps != 3 || s.SteadySteps != 17 {
		t.Fatalf("got %d warm-up, %d steady, want 3 and 17", s.WarmupSteps, s.SteadySteps)
	}
	if s.TPS.P50 != 8000 || s.TPS.Min != 8000.0/6 || s.StepTimeS.Max != 6 {
		t.Errorf("got %+v", s.TPS)
	}
	// 17 steps of 8000 tokens over the wall from step 3's start to step 19's end
	wall := float64((t0+19*2e9+1e9)-(t0+3*2e9)) / 1e9
	if want := 17 * 8000 / wall; math.Abs(s.WallTPS-want) > 1e-9 {
		t.Errorf("wall TPS %g, want %g", s.WallTPS, want)
	}
	if want := 17 * 8000 / 22.0; math.Abs(s.AggregateTPS-want) > 1e-9 {
		t.Errorf("aggregate TPS %g, want %g", s.AggregateTPS, want)
	}
	s2 := Summarize(steps, WindowOptions{Warmup: 5})
	if s2.WarmupSteps != 5 {
		t.Errorf("override: got %d warm-up steps, want 5", s2.WarmupSteps)
	}
	// A restart: the first step of attempt 1 is warm-up again.
	steps = append(steps, ClusterStep{Attempt: 1, Step: 15, WorldSize: 8, Tokens: 8000, StepTimeNs: 1e9, TPS: 8000})
	s3 := Summarize(steps, WindowOptions{Warmup: AutoWarmup})
	if s3.WarmupSteps != 4 || s3.Attempts != 2 {
		t.Errorf("with restart: got %d warm-up steps over %d attempts, want 4 over 2", s3.WarmupSteps, s3.Attempts)
	}
}

func TestQuantile(t *testing.T) {
	xs := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, tc := range []struct{ q, want float64 }{{0, 1}, {0.5, 5.5}, {0.9, 9.1}, {1, 10}} {
		if got := Quantile(xs, tc.q); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("q=%g: got %g, want %g", tc.q, got, tc.want)
		}
	}
	med, mad := MedianMAD([]float64{1, 1, 2, 2, 4, 6, 9})
	if med != 2 || mad != 1 {
		t.Errorf("got median %g MAD %g, want 2 and 1", med, mad)
	}
}

func TestBudget(t *testing.T) {
	d, err := TimeToTrain(1e12, 1e6)
	if err != nil || d != 1e6*time.Second {
		t.Errorf("got %v %v, want 1e6 s", d, err)
	}
	// 1024 GPUs at $2/h and 1e6 tokens/s: $2048/h = $0.5689/s → $0.5689 per 1M tokens
	c, err := CostPerMillionTokens(1e6, 1024, 2)
	if err != nil || math.Abs(c-2048.0/3600) > 1e-12 {
		t.Errorf("got %g %v, want %g", c, err, 2048.0/3600)
	}
	if _, err := TimeToTrain(1e12, 0); err == nil {
		t.Error("zero TPS accepted")
	}
	if _, err := CostPerMillionTokens(1, 0, 1); err == nil {
		t.Error("zero GPUs accepted")
	}
}

func TestRecorder(t *testing.T) {
	var got []StepRecord
	r, err := NewRecorder(RecorderConfig{Job: "j", Rank: 9, WorldSize: 16, Topology: Topology{DP: 2, TP: 8}}, SinkFunc(func(s StepRecord) { got = append(got, s) }))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.End(1); !errors.Is(err, ErrNotStarted) {
		t.Errorf("End before Start: got %v", err)
	}
	r.Start(42)
	r.AddPhase(PhaseDataWait, time.Microsecond)
	r.AddPhase(PhaseDataWait, time.Microsecond)
	time.Sleep(3 * time.Millisecond)
	if err := r.End(2048); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("got %d records, want 1", len(got))
	}
	g := got[0]
	if g.Step != 42 || g.Tokens != 2048 || g.DataWaitNs != 2000 || g.DurationNs < int64(3*time.Millisecond) {
		t.Errorf("got %+v", g)
	}
	if *g.DPRank != 1 || *g.TPRank != 1 {
		t.Errorf("coordinates of rank 9 in dp=2 tp=8: got dp=%d tp=%d, want 1 and 1", *g.DPRank, *g.TPRank)
	}
	r.Start(43)
	if err := r.End(-1); err == nil {
		t.Error("negative tokens sent")
	}
	if sent, rej := r.Counts(); sent != 1 || rej != 1 {
		t.Errorf("counts: got %d sent %d rejected", sent, rej)
	}
	if _, err := NewRecorder(RecorderConfig{Job: "bad job"}, SinkFunc(func(StepRecord) {})); err == nil {
		t.Error("invalid config accepted")
	}
}

// TestRecorderStepIsTheLoop: a step begins where the previous one ended
// (the time between End and the next Start is the step's), except the
// first and one after Gap, which begin at their own Start.
func TestRecorderStepIsTheLoop(t *testing.T) {
	var got []StepRecord
	r, err := NewRecorder(RecorderConfig{Job: "j", WorldSize: 1}, SinkFunc(func(s StepRecord) { got = append(got, s) }))
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	time.Sleep(2 * time.Millisecond)
	var ticks []time.Time
	for i := range 4 {
		if i == 3 {
			r.Gap() // an evaluation between steps 2 and 3
		}
		time.Sleep(4 * time.Millisecond) // the loop fetching its batch, outside Start..End
		ticks = append(ticks, time.Now())
		r.Start(int64(i))
		time.Sleep(time.Millisecond)
		if err := r.End(1); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 4 {
		t.Fatalf("%d records", len(got))
	}
	if got[0].StartUnixNs < before.UnixNano()+int64(4*time.Millisecond) {
		t.Errorf("the first step begins at its Start, not before: %d", got[0].StartUnixNs-before.UnixNano())
	}
	for i := 1; i < 4; i++ {
		meet := got[i].StartUnixNs == got[i-1].EndUnixNs
		if want := i != 3; meet != want {
			t.Errorf("step %d begins at the previous end: %v, want %v", i, meet, want)
		}
		if i < 3 && got[i].DurationNs < int64(5*time.Millisecond) {
			t.Errorf("step %d lasts %v: the fetch before its Start left out", i, time.Duration(got[i].DurationNs))
		}
	}
	if got[3].StartUnixNs < ticks[3].UnixNano() {
		t.Error("the step after a gap begins before its Start")
	}
}

func TestRecorderConcurrent(t *testing.T) {
	var n int64
	var mu = make(chan struct{}, 1)
	r, _ := NewRecorder(RecorderConfig{Job: "j", WorldSize: 1}, SinkFunc(func(StepRecord) { mu <- struct{}{}; n++; <-mu }))
	done := make(chan bool)
	for g := 0; g < 4; g++ {
		go func() {
			for i := 0; i < 200; i++ {
				r.Start(int64(i))
				r.AddPhase(PhaseComm, time.Nanosecond)
				_ = r.End(1)
			}
			done <- true
		}()
	}
	for g := 0; g < 4; g++ {
		<-done
	}
	sent, _ := r.Counts()
	if sent != n || n == 0 {
		t.Errorf("sent %d, sink saw %d", sent, n)
	}
}

func BenchmarkRecorderStep(b *testing.B) {
	var sink discard
	r, err := NewRecorder(RecorderConfig{Job: "bench", Rank: 3, WorldSize: 64, Topology: Topology{DP: 4, TP: 8, PP: 2}}, &sink)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		r.Start(int64(i))
		r.AddPhase(PhaseExposedComm, time.Nanosecond)
		// One token: a step of a few hundred nanoseconds cannot have
		// trained 8,192 (the recorder rejects more than one a nanosecond).
		if err := r.End(1); err != nil {
			b.Fatal(err)
		}
	}
	if sink.n == 0 {
		b.Fatal("sink saw nothing")
	}
}

type discard struct{ n int64 }

func (d *discard) RecordStep(r StepRecord) { d.n += r.Tokens }

func BenchmarkAccumulator(b *testing.B) {
	topo := Topology{DP: 128, TP: 8, PP: 8}
	world := int64(topo.WorldSize())
	recs := make([]StepRecord, world)
	for r := range recs {
		recs[r] = rec("j", 0, int64(r), world, 4096, 1e9)
	}
	b.ReportAllocs()
	for b.Loop() {
		a, _ := NewStepAccumulator("j", 0, 0, world, AccumulatorConfig{Topology: topo})
		for i := range recs {
			_, _ = a.Add(&recs[i])
		}
		_ = a.Result()
	}
	b.ReportMetric(float64(world)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

func TestStragglerScores(t *testing.T) {
	compute := map[int64][]float64{0: {10, 11, 10}, 1: {10, 10, 10}, 2: {14, 15, 30}, 3: {12, 12, 12}}
	nodes := map[int64]string{0: "a", 1: "a", 2: "b", 3: "b"}
	s := StragglerScores(compute, nodes)
	if s[0].Rank != 2 || math.Abs(s[0].Score-10.0/15) > 1e-12 || !s[0].Straggler {
		t.Errorf("slowest: got %+v, want rank 2 scored 0.667 and flagged", s[0])
	}
	if s[1].Rank != 3 || s[1].Straggler {
		t.Errorf("second: got %+v, want rank 3 not flagged (0.833)", s[1])
	}
	n := NodeScores(s)
	if n[0].Node != "b" || !n[0].Straggler || n[1].Straggler {
		t.Errorf("nodes: got %+v", n)
	}
}

// Narayanan et al. 2021, section 2.2: bubble (p−1)/(m+p−1) for 1F1B, and
// (p−1)/(v·m) ... of the ideal time with v interleaved stages.
func TestTheoreticalBubble(t *testing.T) {
	if got := TheoreticalBubble(4, 8, 1); math.Abs(got-3.0/11) > 1e-12 {
		t.Errorf("p=4 m=8: got %g, want 3/11", got)
	}
	if got := TheoreticalBubble(4, 8, 2); math.Abs(got-3.0/16) > 1e-12 {
		t.Errorf("interleaved: got %g, want 3/16", got)
	}
	if TheoreticalBubble(1, 8, 1) != 0 {
		t.Error("no pipeline, no bubble")
	}
}

func TestJoinGPU(t *testing.T) {
	s := int64(1e9)
	// 500 W, counter in mJ advancing 500 J per second, samples every second.
	var ps []GPUPoint
	for i := int64(0); i <= 10; i++ {
		ps = append(ps, GPUPoint{UnixNs: t0 + i*s, EnergyMJ: 1_000_000 + i*500_000, PowerW: 500, SMClock: 1980})
	}
	ps[4].Reasons = 0x8 // HW slowdown in one sample
	w, ok := JoinGPU(ps, t0+2*s+s/2, t0+5*s)
	if !ok || !w.HasEnergy || math.Abs(w.EnergyJ-1250) > 1e-9 || w.PowerW != 500 || w.Reasons != 0x8 {
		t.Errorf("counter join: %+v %v, want 1250 J from the counter", w, ok)
	}
	// The counter resets inside the window: fall back to power × time.
	reset := append([]GPUPoint(nil), ps...)
	for i := 4; i < len(reset); i++ {
		reset[i].EnergyMJ = (int64(i) - 4) * 500_000
	}
	w, ok = JoinGPU(reset, t0+2*s+s/2, t0+5*s)
	if !ok || w.HasEnergy || math.Abs(w.EnergyJ-1250) > 1e-9 {
		t.Errorf("reset: %+v, want 1250 J from mean power, not from the counter", w)
	}
	// No counter at all.
	noCounter := append([]GPUPoint(nil), ps...)
	for i := range noCounter {
		noCounter[i].EnergyMJ = -1
	}
	if w, _ = JoinGPU(noCounter, t0+s, t0+3*s); w.HasEnergy || math.Abs(w.EnergyJ-1000) > 1e-9 {
		t.Errorf("no counter: %+v", w)
	}
	if _, ok := JoinGPU(nil, t0, t0+s); ok {
		t.Error("join with no points succeeded")
	}
	// Without a counter, the energy between two readings is the mean of
	// their power (EnergyRate), the rule the report's join integrates
	// too: 100, 300 and 100 W at 0, 1 and 2 s give [0.5 s, 1.5 s] 200 J
	// (the live join once read 300 J, the one reading inside × 1 s).
	varying := []GPUPoint{{UnixNs: t0, EnergyMJ: -1, PowerW: 100}, {UnixNs: t0 + s, EnergyMJ: -1, PowerW: 300}, {UnixNs: t0 + 2*s, EnergyMJ: -1, PowerW: 100}}
	if w, ok := JoinGPU(varying, t0+s/2, t0+s+s/2); !ok || w.HasEnergy || math.Abs(w.EnergyJ-200) > 1e-9 || w.PowerW != 300 {
		t.Errorf("varying power: %+v, want 200 J over the readings' intervals (power 300 W, the reading inside)", w)
	}
	// a reading with no power says nothing of it; readings more than
	// MaxReadingGap apart speak for no window between them
	if r, _, ok := EnergyRate(GPUPoint{UnixNs: 0, EnergyMJ: -1, PowerW: math.NaN()}, GPUPoint{UnixNs: s, EnergyMJ: -1, PowerW: 400}); !ok || r != 400/1e9 {
		t.Errorf("one power: rate %v, %v", r, ok)
	}
	if _, _, ok := EnergyRate(GPUPoint{UnixNs: 0, EnergyMJ: 0}, GPUPoint{UnixNs: MaxReadingGap + 1, EnergyMJ: 1}); ok {
		t.Error("a rate across more than MaxReadingGap")
	}
}

func TestStreamingMedian(t *testing.T) {
	for _, n := range []int{1, 4, 5, 101, 1024, 10000, 100000} {
		var e Median
		xs := make([]float64, n)
		for i := range xs {
			// a skewed, shuffled stream
			v := float64((i*7919)%n) + 1
			xs[i] = v * v
			e.Add(xs[i])
		}
		slices.Sort(xs)
		// exact below the reservoir size; beyond it, within the 45th-55th percentiles
		lo, hi := Quantile(xs, 0.45), Quantile(xs, 0.55)
		if n <= 1024 {
			lo, hi = Quantile(xs, 0.5), Quantile(xs, 0.5)
		}
		if got := e.Value(); got < lo || got > hi {
			t.Errorf("n=%d: streaming median %g, want in [%g, %g]", n, got, lo, hi)
		}
	}
}

// Clock skew between nodes moves start and end times but not durations:
// no throughput figure changes.
func TestClockSkewChangesNoTPS(t *testing.T) {
	var base, skewed []StepRecord
	for r := int64(0); r < 8; r++ {
		x := rec("j", 3, r, 8, 1000, 1e9+r*1e6)
		base = append(base, x)
		x.StartUnixNs += (r - 4) * 30e9 // nodes ±2 minutes apart
		x.EndUnixNs += (r - 4) * 30e9
		skewed = append(skewed, x)
	}
	a, _ := Aggregate(base, AccumulatorConfig{})
	b, _ := Aggregate(skewed, AccumulatorConfig{})
	if a.TPS != b.TPS || a.StepTimeNs != b.StepTimeNs || a.SlowestRank != b.SlowestRank {
		t.Errorf("skew changed the step: %+v vs %+v", a, b)
	}
}

// Merging node partials gives exactly the cluster step of the records.
func TestPartialsMergeExactly(t *testing.T) {
	topo := Topology{DP: 4, TP: 4, PP: 2}
	world := int64(topo.WorldSize())
	var recs []StepRecord
	for r := int64(0); r < world; r++ {
		x := rec("j", 9, r, world, 1000+int64(topo.Coords(int(r)).DP), 1e9+r*1e5)
		x.ExposedCommNs, x.CommNs, x.PPWaitNs, x.DataWaitNs = 1e8+r*1e3, 3e8, 5e7, r*1e4
		x.Bytes = 4 * x.Tokens
		x.GenNs, x.GenRequests, x.GenPromptTokens, x.GenOutputTokens = 2e8+r*1e4, 3, 96, 300+r // RL rollouts
		l := float64(r)
		x.Loss = &l
		recs = append(recs, x)
	}
	recs[17].Tokens = 5 // a disagreeing rank in replica 0 of pipeline stage 1
	cfg := AccumulatorConfig{Topology: topo, FLOPsPerToken: 1e9, PeakFLOPSPerGPU: 1e15}
	want, _ := Aggregate(recs, cfg)
	acc, _ := NewStepAccumulator("j", 0, 9, world, cfg)
	for n := int64(0); n < world; n += 8 { // nodes of 8 ranks, merged out of order
		node := recs[world-n-8 : world-n]
		p, err := NewPartial(node, topo)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := acc.AddPartial(&p); !ok || err != nil {
			t.Fatalf("node at %d: %v %v", n, ok, err)
		}
	}
	got := acc.Result()
	if got != want {
		t.Errorf("merged partials:\n got %+v\nwant %+v", got, want)
	}
	if want.GenNsMax == 0 || want.GenOutputTPS <= 0 || want.Bytes == 0 || want.MFUTraining <= want.MFU {
		t.Errorf("the generation phase and bytes did not reach the cluster step: %+v", want)
	}
	// a resent node is a duplicate; an overlapping partial is refused
	p, _ := NewPartial(recs[:8], topo)
	if ok, err := acc.AddPartial(&p); ok || err != nil {
		t.Errorf("duplicate partial: %v %v", ok, err)
	}
	acc2, _ := NewStepAccumulator("j", 0, 9, world, cfg)
	a, _ := NewPartial(recs[:8], topo)
	b, _ := NewPartial(recs[4:12], topo)
	acc2.AddPartial(&a)
	if _, err := acc2.AddPartial(&b); !errors.Is(err, ErrPartialOverlap) {
		t.Errorf("overlap: %v", err)
	}
}

// The reservoir is a uniform sample of the stream however long it runs
// (algorithm L draws the gaps between kept values; a wrong draw keeps
// too many early or late ones): a stream of its own positions, 200,000
// and 2,000,000 long, leaves about a tenth of the kept values in each
// tenth of the stream (binomial, σ ≈ 9.6 of 102.4; 4σ allowed).
func TestStreamingMedianUniformSample(t *testing.T) {
	for _, n := range []int{200_000, 2_000_000} {
		var e Median
		for i := range n {
			e.Add(float64(i))
		}
		if len(e.vals) != medianKeep || e.Count() != n {
			t.Fatalf("n=%d: holds %d values after %d", n, len(e.vals), e.Count())
		}
		var tenths [10]int
		for _, v := range e.vals {
			tenths[int(v)*10/n]++
		}
		for k, c := range tenths {
			if math.Abs(float64(c)-102.4) > 4*9.6 {
				t.Errorf("n=%d: %d of %d kept values in tenth %d of the stream, want about 102", n, c, medianKeep, k)
			}
		}
	}
}

// A smaller reservoir (as the report uses at 100K+ ranks) holds at most
// Keep values and stays within its wider error band: ±0.5/√128 ≈ 4.4% of
// rank at one standard deviation; 3σ is checked.
func TestStreamingMedianSmallReservoir(t *testing.T) {
	const n = 50000
	e := Median{Keep: 128}
	xs := make([]float64, n)
	for i := range xs {
		v := float64((i*7919)%n) + 1
		xs[i] = v * v
		e.Add(xs[i])
	}
	if len(e.vals) != 128 || e.Count() != n {
		t.Fatalf("holds %d values after %d", len(e.vals), e.Count())
	}
	slices.Sort(xs)
	if got, lo, hi := e.Value(), Quantile(xs, 0.5-0.133), Quantile(xs, 0.5+0.133); got < lo || got > hi {
		t.Errorf("median %g outside [%g, %g]", got, lo, hi)
	}
}

// OptionalFloats and OptionalInts cover every pointer field of GPUSample,
// in the order and with the names of gpuFloatFields and gpuIntFields (the
// wire layout and Validate's messages depend on it).
func TestGPUSampleOptionalFields(t *testing.T) {
	var s GPUSample
	fs, is := s.OptionalFloats(), s.OptionalInts()
	addr := map[uintptr]string{}
	for k, p := range fs {
		addr[reflect.ValueOf(p).Pointer()] = gpuFloatFields[k]
	}
	for k, p := range is {
		addr[reflect.ValueOf(p).Pointer()] = gpuIntFields[k]
	}
	v := reflect.ValueOf(&s).Elem()
	n := 0
	for i := 0; i < v.NumField(); i++ {
		if v.Field(i).Kind() != reflect.Pointer {
			continue
		}
		n++
		tag, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("parquet"), ",")
		if got := addr[v.Field(i).Addr().Pointer()]; got != tag {
			t.Errorf("field %s: accessor named %q, want %q", v.Type().Field(i).Name, got, tag)
		}
	}
	if n != len(fs)+len(is) {
		t.Errorf("%d pointer fields, %d accessors", n, len(fs)+len(is))
	}
	// Validate names the field it refuses.
	x := -1.0
	s = GPUSample{Node: "n", UUID: "u", Name: "g", UnixNs: 1_760_000_000_000_000_000}
	s.GPMTensorPct = &x
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "gpm_tensor_pct") {
		t.Errorf("negative gpm_tensor_pct: %v", err)
	}
}

// Headroom is known only with a capacity at or above the peak; the
// fullest is the one with the least headroom, those with none after, by
// their reserved peak.
func TestMemHeadroomOrder(t *testing.T) {
	if h, ok := MemHeadroom(60<<30, 80<<30); !ok || h != 0.25 {
		t.Errorf("60 of 80 GiB: %v %v", h, ok)
	}
	for _, c := range [][2]int64{{1, 0}, {81 << 30, 80 << 30}, {-1, 80}} {
		if _, ok := MemHeadroom(c[0], c[1]); ok {
			t.Errorf("%v: a headroom", c)
		}
	}
	for _, c := range []struct {
		a, b [2]int64
		want int
	}{
		{[2]int64{70, 80}, [2]int64{10, 20}, -1}, // 12.5% left against 50%
		{[2]int64{10, 20}, [2]int64{70, 80}, 1},
		{[2]int64{10, 20}, [2]int64{90, 0}, -1}, // a known headroom first
		{[2]int64{90, 0}, [2]int64{50, 0}, -1},  // none known: the larger peak
		{[2]int64{50, 100}, [2]int64{50, 100}, 0},
	} {
		if got := MemFuller(c.a[0], c.a[1], c.b[0], c.b[1]); got != c.want {
			t.Errorf("MemFuller(%v, %v) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}
