package tps

import (
	"fmt"
	"reflect"
	"strings"
	"unsafe"
)

// Measure is one int64 figure a rank record carries about its step, past
// the record's identity (job, attempt, step, rank, world size, parallel
// coordinates, node, GPU) and its float figures (flops, loss). Measures is
// the one list of them: the wire encoding (wire.AppendSteps and
// DecodeSteps walk it), the validation of the bounds a Kind names, what a
// step's accumulator and node partials keep of it over ranks (Over: their
// sums, the partials' binary layout and JSON walk it), the rank_windows
// spans (Windowed), and the measure tables of docs/intake.md and
// docs/wire.md (TestMeasuresDocumented compares them with it) all come
// from it. Adding a measure is an entry here and its StepRecord field
// (and RankWindow Span, if Windowed), bound at init: a field without an
// entry, or an entry without its field, stops the program. The cluster
// row's columns are formulas over what is kept (StepAccumulator.ResultIn):
// TestMeasuresCombineAsDocumented checks that every column a measure's
// Combine names moves with it, and that a rank-rows measure moves none.
type Measure struct {
	// Name is the JSON key, the Parquet column and the wire name.
	Name string
	// Field is the StepRecord field that holds it.
	Field string
	Unit  string
	Kind  MeasureKind
	// Wire is the group it travels in on the step batch (docs/wire.md).
	Wire WireGroup
	// Over says what is kept of it over a step's ranks for the cluster
	// row (0: nothing; it is in the rank rows, or combined per replica).
	// Measures kept over ranks travel in node partials in this table's
	// order: add new ones after the last of them (docs/wire.md).
	Over Over
	// Combine says what the cluster row makes of it, in words.
	Combine string
	// Windowed says rank_windows keeps its span over each window's rows
	// (Σ, smallest, largest): the RankWindow Span field whose Parquet
	// column is its name (bound at init, as the StepRecord field is).
	Windowed bool
	// Doc is its line in docs/intake.md; Required says the record must
	// carry it.
	Doc      string
	Required bool
	// Max bounds a KindOwn measure from above (0: bounds of its own in
	// Validate); MaxWords says it in words.
	Max      int64
	MaxWords string
	// Split names the breakdown part (a tps.ShareParts key) whose time
	// this measure splits out, shown as "compute 67.6% (Python GC 1.2%)"
	// in every view (at most the part's share); Label is its words;
	// Column the ClusterStep field of its mean fraction (OverSum).
	Split, Label, Column string
	// Own says a blocking measure is the rank's own time, with its
	// compute: what the other ranks wait for in a synchronous step (its
	// data wait, its host work before the forward), not a wait for them.
	// A rank's own time (StepRecord.OwnNs) picks the critical rank, is
	// what waiting for it is measured against and what straggler scores
	// and node health compare.
	Own bool

	off, winOff, colOff uintptr
	part                func(*Shares) *float64 // the part a split measure splits (bindSplits)
}

// MeasureKind says which bounds Validate applies to a measure.
type MeasureKind int

const (
	// KindOwn: bounds of its own, written out in Validate (times, the
	// duration, token counts, the generation phase).
	KindOwn MeasureKind = iota
	// KindBlocking: a part of the step's wall time: ≥ 0, ≤ duration_ns,
	// ≤ 24 h.
	KindBlocking
	// KindPhase: a phase that may overlap others: ≥ 0, ≤ 24 h.
	KindPhase
	// KindTrace: measured from a profiler trace: ≥ 0, ≤ 24 h.
	KindTrace
)

// Over is what a step's accumulator and its node partials keep of a
// measure over ranks: its sum, its largest value, its smallest, or
// several of them. Each merges exactly (sums add, extremes compare), so a
// step's partials merge to what its records give.
type Over uint8

const (
	OverSum Over = 1 << iota
	OverMax
	OverMin
)

// String is the words docs/intake.md gives: "Σ and largest over ranks".
func (o Over) String() string {
	var w []string
	for _, x := range []struct {
		bit  Over
		word string
	}{{OverSum, "Σ"}, {OverMax, "largest"}, {OverMin, "smallest"}} {
		if o&x.bit != 0 {
			w = append(w, x.word)
		}
	}
	if len(w) == 0 {
		return "kept over no rank"
	}
	return strings.Join(w, " and ") + " over ranks"
}

// WireGroup is the part of a step batch record a measure travels in: the
// core varints every record has, or an optional group with a presence
// bit, sent when one of its measures is not zero.
type WireGroup int

const (
	WireCore WireGroup = iota
	WireTrace
	WireSeqSq
	WireBytes
	WireGen
	WireCost
	WireMem
	WireHost
	WireHostWork
	WireCostParts
	// NumWireGroups is one past the last group.
	NumWireGroups
)

// measures in wire order within each group (the step batch's layout 1:
// reordering a group changes the wire format). Read through Measures:
// nothing outside the package can change the table.
var measures = [...]Measure{
	{Name: "start_unix_ns", Field: "StartUnixNs", Unit: "ns since 1970", Wire: WireCore, Over: OverMin, Combine: "`start_unix_ns` (each node's clock offset removed)",
		Doc: "wall-clock start of the step on the rank's host", Required: true},
	{Name: "end_unix_ns", Field: "EndUnixNs", Unit: "ns since 1970", Wire: WireCore, Over: OverMax, Combine: "`end_unix_ns`; `step_time_ns` runs to it from the previous step's end (the critical path's period)",
		Doc: "wall-clock end of the step on the rank's host", Required: true},
	{Name: "duration_ns", Field: "DurationNs", Unit: "ns", Wire: WireCore, Windowed: true, Over: OverMax, Combine: "`rank_time_max_ns` (the slowest rank's own duration; the step time without the previous step's end); with the blocking measures, each rank's busy time: `compute_ns_mean` and the critical rank",
		Doc: "monotonic duration; defaults to end − start"},
	{Name: "tokens", Field: "Tokens", Unit: "tokens", Wire: WireCore, Combine: "summed once per data-parallel replica: `tokens`, `tps`, `tps_per_gpu`, and with the model `flops`, `mfu` and `hfu`",
		Required: true, Doc: "real tokens (not padding) consumed by this rank's data-parallel replica in the step, all micro-batches; the same on every rank of a replica"},
	{Name: "padded_tokens", Field: "PaddedTokens", Unit: "tokens", Wire: WireCore, Combine: "rank rows (the report compares it with tokens)",
		Doc: "optional: tokens including padding"},
	{Name: "samples", Field: "Samples", Unit: "samples", Wire: WireCore, Combine: "rank rows only",
		Doc: "optional: samples (sequences) in the step"},
	{Name: "data_wait_ns", Field: "DataWaitNs", Unit: "ns", Kind: KindBlocking, Own: true, Wire: WireCore, Windowed: true, Over: OverSum | OverMax, Combine: "`data_stall_fraction_mean` and `data_stall_fraction_max` (mean and largest fraction of the step)",
		Doc: "blocking: waiting for the data loader"},
	{Name: "fwd_ns", Field: "FwdNs", Unit: "ns", Kind: KindPhase, Wire: WireCore, Windowed: true, Combine: "rank rows (in rank_windows, a straggler episode's work)",
		Doc: "compute phase: forward, less the time blocked inside it on collectives (the Python package)"},
	{Name: "bwd_ns", Field: "BwdNs", Unit: "ns", Kind: KindPhase, Wire: WireCore, Windowed: true, Combine: "rank rows (in rank_windows, a straggler episode's work)",
		Doc: "compute phase: backward, likewise"},
	{Name: "optim_ns", Field: "OptimNs", Unit: "ns", Kind: KindPhase, Wire: WireCore, Windowed: true, Combine: "rank rows (in rank_windows, a straggler episode's work)",
		Doc: "compute phase: optimizer, likewise"},
	{Name: "comm_ns", Field: "CommNs", Unit: "ns", Kind: KindPhase, Wire: WireCore, Windowed: true, Over: OverSum, Combine: "`comm_overlap` (1 − Σ exposed / Σ comm)",
		Doc: "all collective time, overlapped or not; ≥ exposed_comm_ns"},
	{Name: "exposed_comm_ns", Field: "ExposedCommNs", Unit: "ns", Kind: KindBlocking, Wire: WireCore, Windowed: true, Over: OverSum | OverMax, Combine: "its mean is split into waiting for the critical rank (wait_fraction_mean) and transfer, `comm_fraction_mean`; `comm_fraction_max`",
		Doc: "blocking: communication no computation overlapped"},
	{Name: "pp_wait_ns", Field: "PPWaitNs", Unit: "ns", Kind: KindBlocking, Wire: WireCore, Windowed: true, Over: OverSum | OverMax, Combine: "`bubble_fraction_mean` and `bubble_fraction_max` (the pipeline bubble)",
		Doc: "blocking: waiting for another pipeline stage"},
	{Name: "ckpt_ns", Field: "CkptNs", Unit: "ns", Kind: KindBlocking, Wire: WireCore, Windowed: true, Over: OverSum, Combine: "`ckpt_fraction_mean`",
		Doc: "blocking: saving a checkpoint within the step"},
	{Name: "trace_compute_ns", Field: "TraceComputeNs", Unit: "ns", Kind: KindTrace, Wire: WireTrace, Combine: "rank rows only",
		Doc: "from a profiler trace of the step: the union of computation kernels (the agent fills it)"},
	{Name: "trace_comm_ns", Field: "TraceCommNs", Unit: "ns", Kind: KindTrace, Wire: WireTrace, Combine: "rank rows only",
		Doc: "from a profiler trace: the union of communication kernels"},
	{Name: "trace_exposed_comm_ns", Field: "TraceExposedCommNs", Unit: "ns", Kind: KindTrace, Wire: WireTrace, Combine: "rank rows only",
		Doc: "from a profiler trace: communication no computation overlaps; ≤ trace_comm_ns"},
	{Name: "seq_sq_sum", Field: "SeqSqSum", Unit: "tokens²", Wire: WireSeqSq, Combine: "the replica's `flops` (tokens × dense + seq_sq_sum × attention FLOPs), `mfu`, `hfu`",
		Doc: "optional: Σ over the batch's documents of their length², between tokens and its square (packed or variable-length batches: attention FLOPs counted exactly, docs/flops.md)"},
	{Name: "bytes", Field: "Bytes", Unit: "bytes", Wire: WireBytes, Combine: "summed once per replica: `bytes`, `bytes_per_second`",
		Doc: "optional: UTF-8 length of the text behind tokens: bytes/s compares runs whose tokenizers differ"},
	{Name: "gen_ns", Field: "GenNs", Unit: "ns", Wire: WireGen, Over: OverSum | OverMax, Combine: "`gen_ns_max` (the slowest rank's), `gen_fraction_mean`, `gen_output_tps`",
		Doc: "optional: the step's generation phase on this rank (RL rollouts before the update); ≤ duration"},
	{Name: "gen_requests", Field: "GenRequests", Unit: "requests", Wire: WireGen, Over: OverSum, Combine: "`gen_requests`",
		Doc: "optional: requests this rank generated in the step (with tensor-parallel generation, one rank of the group)"},
	{Name: "gen_prompt_tokens", Field: "GenPromptTokens", Unit: "tokens", Wire: WireGen, Over: OverSum, Combine: "`gen_prompt_tokens`, `gen_total_tps`",
		Doc: "optional: their prompt tokens"},
	{Name: "gen_output_tokens", Field: "GenOutputTokens", Unit: "tokens", Wire: WireGen, Over: OverSum, Combine: "`gen_output_tokens`, `gen_output_tps`, `gen_total_tps`",
		Doc: "optional: their generated tokens"},
	{Name: "capture_ns", Field: "CaptureNs", Unit: "ns", Kind: KindPhase, Windowed: true, Wire: WireCost, Combine: "rank rows (the report's capture cost)",
		Doc: "optional: time the training thread spent in tpsprof's own code for the step (the Python package's hooks, timed by themselves; finishing the step after its last optimizer step included, so it may exceed a short step's duration)"},
	{Name: "capture_cpu_ns", Field: "CaptureCPUNs", Unit: "ns", Kind: KindPhase, Windowed: true, Wire: WireCost, Combine: "rank rows (the report's capture cost)",
		Doc: "optional: CPU time of the package's own threads (sender, poller) since the rank's previous record"},
	{Name: "mem_peak_allocated_bytes", Field: "MemPeakAllocatedBytes", Unit: "bytes", Windowed: true, Wire: WireMem, Combine: "rank rows (the report's memory per rank)",
		Doc: "optional: peak bytes allocated by PyTorch's CUDA caching allocator during the step", Max: MaxMemBytes, MaxWords: "1 PiB"},
	{Name: "mem_peak_reserved_bytes", Field: "MemPeakReservedBytes", Unit: "bytes", Windowed: true, Wire: WireMem, Combine: "rank rows (the report's memory per rank)",
		Doc: "optional: peak bytes the allocator reserved from the device during the step", Max: MaxMemBytes, MaxWords: "1 PiB"},
	{Name: "mem_capacity_bytes", Field: "MemCapacityBytes", Unit: "bytes", Windowed: true, Wire: WireMem, Combine: "rank rows (the report's headroom)",
		Doc: "optional: the device's total memory", Max: MaxMemBytes, MaxWords: "1 PiB"},
	{Name: "gc_ns", Field: "GCNs", Unit: "ns", Kind: KindPhase, Wire: WireHost, Over: OverSum, Combine: "`gc_fraction_mean`: compute's split \"Python GC\" (at most compute's share)",
		Doc:   "optional: the training thread's time in Python's garbage collector during the step (the Python package: gc.callbacks; it sends at most the step's duration). Part of compute (the rank's own time: a rank slowed by its collector is a straggler); on CPU taken out of the forward, backward and optimizer phases it fell in. On a GPU it is host time, an upper bound on the device time it cost (queued kernels may hide it)",
		Split: "compute", Label: "Python GC", Column: "GCFractionMean"},
	{Name: "host_ns", Field: "HostNs", Unit: "ns", Kind: KindBlocking, Own: true, Wire: WireHostWork, Windowed: true, Over: OverSum, Combine: "`host_fraction_mean`: host/other's split \"host work before the forward\" (at most its share)",
		Doc:   "optional: of a step that runs from the previous step's end with no timed fetch (a loop with no DataLoader), the training thread's CPU time before its first forward (host work: Python between the optimizer step and the next forward, batch preparation on the training thread), taken out of the data wait, which keeps the time the thread did not run (waiting for I/O, a sleep, another process). The Python package measures it on CPU (host marks) by the thread's CPU clock; not part of compute, but of the rank's own time (with compute and the data wait: what the others wait for)",
		Split: "host_other", Label: "host work before the forward", Column: "HostFractionMean"},
	{Name: "capture_comm_ns", Field: "CaptureCommNs", Unit: "ns", Kind: KindPhase, Windowed: true, Wire: WireCostParts, Combine: "rank rows (the report's capture cost by component)",
		Doc: "optional: of capture_ns, the communication component's part (the marks around each collective: on the training thread, per collective)"},
	{Name: "capture_comm_cpu_ns", Field: "CaptureCommCPUNs", Unit: "ns", Kind: KindPhase, Windowed: true, Wire: WireCostParts, Combine: "rank rows (the report's capture cost by component)",
		Doc: "optional: of capture_cpu_ns, the communication component's thread (the poller that notes when collectives complete on CPU); the rest is the sender's"},
}

// NumMeasures is how many measures a record has.
const NumMeasures = len(measures)

// Measures is the table of measures, a copy.
func Measures() [NumMeasures]Measure { return measures }

// Of is the field of r that holds m.
func (m *Measure) Of(r *StepRecord) *int64 {
	return (*int64)(unsafe.Add(unsafe.Pointer(r), m.off))
}

// MeasuresIn lists the measures of a wire group, in wire order: copies,
// so that nothing outside the package changes the table.
func MeasuresIn(g WireGroup) []*Measure {
	var out []*Measure
	for i := range measures {
		if measures[i].Wire == g {
			m := measures[i]
			out = append(out, &m)
		}
	}
	return out
}

// boundedMeasures are those whose Kind names their bounds (Validate
// walks them for every record); cappedMeasures those with a Max.
var boundedMeasures, cappedMeasures []*Measure

// blockingMeasures are those of KindBlocking: compute is the step's
// duration less them (StepRecord.ComputeNs).
var blockingMeasures []*Measure

// BlockingMeasures are the names of the measures compute leaves out of a
// rank's duration, and whether each is in every record (the core wire
// group: a column every rank_steps file has).
func BlockingMeasures() (names []string, core []bool) {
	for _, m := range blockingMeasures {
		names, core = append(names, m.Name), append(core, m.Wire == WireCore)
	}
	return names, core
}

// ownMeasures are the blocking measures that are a rank's own time
// (Measure.Own).
var ownMeasures []*Measure

// OwnMeasures are the names of the measures a rank's own time adds to its
// compute (Measure.Own), and whether each is in every record, as
// BlockingMeasures.
func OwnMeasures() (names []string, core []bool) {
	for _, m := range ownMeasures {
		names, core = append(names, m.Name), append(core, m.Wire == WireCore)
	}
	return names, core
}

// splitMeasures are the indexes of the measures that split out a
// breakdown part's time (Measure.Split), at most maxSplits.
var splitMeasures []int

// maxSplits bounds the split measures (ShareSum keeps their sums in an
// array: nothing allocated a step).
const maxSplits = 4

func init() {
	if err := bindMeasures(); err != nil {
		panic(err)
	}
	for i := range measures {
		if measures[i].Kind != KindOwn {
			boundedMeasures = append(boundedMeasures, &measures[i])
		}
		if measures[i].Kind == KindBlocking {
			blockingMeasures = append(blockingMeasures, &measures[i])
			if measures[i].Own {
				ownMeasures = append(ownMeasures, &measures[i])
			}
		}
		if measures[i].Max > 0 {
			cappedMeasures = append(cappedMeasures, &measures[i])
		}
		if measures[i].Split != "" {
			splitMeasures = append(splitMeasures, i)
		}
		if len(splitMeasures) > maxSplits {
			panic("tps: more split measures than maxSplits")
		}
		for _, k := range []struct {
			bit  Over
			list *[]int
		}{{OverSum, &keptSum}, {OverMax, &keptMax}, {OverMin, &keptMin}} {
			if measures[i].Over&k.bit != 0 {
				*k.list = append(*k.list, i)
			}
		}
	}
}

// bindMeasures finds each measure's field: an int64 whose JSON key and
// Parquet column are the measure's name; every int64 field of StepRecord
// besides the identity is a measure.
func bindMeasures() error {
	t := reflect.TypeFor[StepRecord]()
	seen := map[string]bool{}
	for i := range measures {
		m := &measures[i]
		f, ok := t.FieldByName(m.Field)
		if !ok || f.Type.Kind() != reflect.Int64 {
			return fmt.Errorf("tps: measure %s: no int64 field StepRecord.%s", m.Name, m.Field)
		}
		json, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		pq, _, _ := strings.Cut(f.Tag.Get("parquet"), ",")
		if json != m.Name || pq != m.Name {
			return fmt.Errorf("tps: measure %s: StepRecord.%s is %q in JSON and %q in Parquet", m.Name, m.Field, json, pq)
		}
		if seen[m.Name] {
			return fmt.Errorf("tps: measure %s listed twice", m.Name)
		}
		seen[m.Name] = true
		m.off = f.Offset
	}
	if err := bindWindows(); err != nil {
		return err
	}
	if err := bindSplits(); err != nil {
		return err
	}
	identity := map[string]bool{"Attempt": true, "Step": true, "Rank": true, "WorldSize": true}
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Type.Kind() == reflect.Int64 && !identity[f.Name] {
			if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); !seen[name] {
				return fmt.Errorf("tps: StepRecord.%s is not in Measures", f.Name)
			}
		}
	}
	return nil
}

// windowedMeasures are those rank_windows keeps a span of.
var windowedMeasures []*Measure

// bindWindows finds each windowed measure's Span in RankWindow (the field
// whose Parquet column is its name); every Span there is a windowed
// measure's, or compute's (derived from them: StepRecord.ComputeNs).
func bindWindows() error {
	t := reflect.TypeFor[RankWindow]()
	spans := map[string]reflect.StructField{}
	for i := range t.NumField() {
		if f := t.Field(i); f.Type == reflect.TypeFor[Span]() {
			name, _, _ := strings.Cut(f.Tag.Get("parquet"), ",")
			spans[name] = f
		}
	}
	windowedMeasures = windowedMeasures[:0]
	for i := range measures {
		m := &measures[i]
		f, ok := spans[m.Name]
		if ok != m.Windowed {
			return fmt.Errorf("tps: measure %s: Windowed is %v, and RankWindow has a Span for it: %v", m.Name, m.Windowed, ok)
		}
		if ok {
			m.winOff = f.Offset
			windowedMeasures = append(windowedMeasures, m)
			delete(spans, m.Name)
		}
	}
	delete(spans, "compute_ns")
	for name := range spans {
		return fmt.Errorf("tps: RankWindow's span %s is no measure's", name)
	}
	return nil
}

// bindSplits checks each split measure against the breakdown's parts and
// binds its ClusterStep column: a float64 field whose Parquet column is
// its name less _ns plus _fraction_mean.
func bindSplits() error {
	t := reflect.TypeFor[ClusterStep]()
	for i := range measures {
		m := &measures[i]
		if m.Split == "" {
			if m.Column != "" || m.Label != "" {
				return fmt.Errorf("tps: measure %s has a column or label and splits no part", m.Name)
			}
			continue
		}
		m.part = nil
		for _, p := range shareParts {
			if p.Key == m.Split {
				m.part = p.Of
			}
		}
		f, ok := t.FieldByName(m.Column)
		want := strings.TrimSuffix(m.Name, "_ns") + "_fraction_mean"
		pq, _, _ := strings.Cut(f.Tag.Get("parquet"), ",")
		switch {
		case m.part == nil:
			return fmt.Errorf("tps: measure %s splits %q, no part of the breakdown", m.Name, m.Split)
		case m.Label == "" || m.Over&OverSum == 0:
			return fmt.Errorf("tps: measure %s splits a part: it needs a label and OverSum", m.Name)
		case !ok || f.Type.Kind() != reflect.Float64 || pq != want:
			return fmt.Errorf("tps: measure %s: ClusterStep.%s is not a float64 column %s", m.Name, m.Column, want)
		}
		m.colOff = f.Offset
	}
	return nil
}

// columnOf is the ClusterStep field of a split measure's mean fraction.
func (m *Measure) columnOf(c *ClusterStep) *float64 {
	return (*float64)(unsafe.Add(unsafe.Pointer(c), m.colOff))
}

// ShareSplit is a measure that splits out a breakdown part's time.
type ShareSplit struct {
	// Name is the measure's (the key of Shares.Splits); Part the
	// ShareParts key it splits; Label its words.
	Name, Part, Label string
}

// ShareSplits are the splits of the breakdown's parts, in Measures order.
func ShareSplits() []ShareSplit {
	out := make([]ShareSplit, 0, len(splitMeasures))
	for _, i := range splitMeasures {
		out = append(out, ShareSplit{measures[i].Name, measures[i].Split, measures[i].Label})
	}
	return out
}

// spanOf is the Span of w that holds m (m.Windowed).
func (m *Measure) spanOf(w *RankWindow) *Span {
	return (*Span)(unsafe.Add(unsafe.Pointer(w), m.winOff))
}

// MeasuresMarkdown is docs/intake.md's table of the measures (key, unit,
// required, bounds, meaning, how the cluster row combines it).
func MeasuresMarkdown() string {
	var b strings.Builder
	b.WriteString("| key | unit | required | bounds | meaning | cluster row | rank_windows |\n|---|---|---|---|---|---|---|\n")
	for _, m := range measures {
		req := ""
		if m.Required {
			req = "yes"
		}
		bounds := map[MeasureKind]string{KindBlocking: "0 to duration_ns", KindPhase: "0 to 24 h", KindTrace: "0 to 24 h"}[m.Kind]
		if m.Max > 0 {
			bounds = "0 to " + m.MaxWords
		}
		combine := m.Combine
		if m.Over != 0 {
			combine = m.Over.String() + " → " + combine
		}
		win := ""
		if m.Windowed {
			win = "Σ, min, max"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s | %s |\n", m.Name, m.Unit, req, bounds, m.Doc, combine, win)
	}
	return b.String()
}

// The measures a step keeps over its ranks, by index into Measures, for
// each of Over's bits: stepSums walks them.
var keptSum, keptMax, keptMin []int

// MeasureIndex is the index in Measures of the named measure, -1 if none.
func MeasureIndex(name string) int {
	for i := range measures {
		if measures[i].Name == name {
			return i
		}
	}
	return -1
}

// measureIndex is MeasureIndex of a measure that must exist.
func measureIndex(name string) int {
	if i := MeasureIndex(name); i >= 0 {
		return i
	}
	panic("tps: no measure " + name)
}

// The measures the cluster row's formulas read (StepAccumulator.ResultIn).
var (
	mStart     = measureIndex("start_unix_ns")
	mEnd       = measureIndex("end_unix_ns")
	mDuration  = measureIndex("duration_ns")
	mData      = measureIndex("data_wait_ns")
	mComm      = measureIndex("comm_ns")
	mExposed   = measureIndex("exposed_comm_ns")
	mPP        = measureIndex("pp_wait_ns")
	mCkpt      = measureIndex("ckpt_ns")
	mGen       = measureIndex("gen_ns")
	mGenReqs   = measureIndex("gen_requests")
	mGenPrompt = measureIndex("gen_prompt_tokens")
	mGenOutput = measureIndex("gen_output_tokens")
)

// MeasuresPython is python/tpsprof/_measures.py: the measures' names,
// bounds and splits as the Python package sends them, from this table
// (TestMeasuresPython compares the file with it; -update-docs rewrites it).
func MeasuresPython() string {
	var b strings.Builder
	b.WriteString(`"""The step record's measures, as tps.Measures declares them (generated from
tps/measures.go by ` + "`go test ./tps -run TestMeasuresPython -update-docs`" + `: do not edit).

MEASURES maps a measure's key to its bounds: ("blocking", None) a part of the
step's wall time (0 to duration_ns), ("phase"|"trace", None) 0 to 24 h,
("own", MAX) 0 to MAX, ("own", None) bounds of its own (client.send_step).
SPLITS maps a measure that splits out a part of the breakdown to that
part's key, its words and its tracker name.
"""

from types import MappingProxyType

MAX_STEP_NS = ` + fmt.Sprint(MaxStepNs) + `

MEASURES = MappingProxyType({
`)
	kinds := map[MeasureKind]string{KindOwn: "own", KindBlocking: "blocking", KindPhase: "phase", KindTrace: "trace"}
	for _, m := range measures {
		hi := "None"
		if m.Max > 0 {
			hi = fmt.Sprint(m.Max)
		}
		fmt.Fprintf(&b, "    %q: (%q, %s),\n", m.Name, kinds[m.Kind], hi)
	}
	b.WriteString("})\n\nSPLITS = MappingProxyType({\n")
	for _, i := range splitMeasures {
		m := measures[i]
		fmt.Fprintf(&b, "    %q: (%q, %q, %q),\n", m.Name, m.Split, m.Label, "split/"+strings.TrimSuffix(m.Name, "_ns"))
	}
	b.WriteString("})\n")
	return b.String()
}
