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
// DecodeSteps walk it), the validation of the bounds a Kind names, and the
// measure tables of docs/intake.md and docs/wire.md (TestMeasuresDocumented
// compares them with it) all come from it. The StepRecord field itself,
// how the cluster row combines it (Combine, in words here) and the
// rank_windows spans are still written out by hand.
type Measure struct {
	// Name is the JSON key, the Parquet column and the wire name.
	Name string
	// Field is the StepRecord field that holds it.
	Field string
	Unit  string
	Kind  MeasureKind
	// Wire is the group it travels in on the step batch (docs/wire.md).
	Wire WireGroup
	// Combine says how the cluster row combines it over ranks.
	Combine string
	// Doc is its line in docs/intake.md; Required says the record must
	// carry it.
	Doc      string
	Required bool

	off uintptr
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
)

// Measures in wire order within each group (the step batch's layout 1:
// reordering a group changes the wire format).
var Measures = []Measure{
	{Name: "start_unix_ns", Field: "StartUnixNs", Unit: "ns since 1970", Wire: WireCore, Combine: "earliest over ranks",
		Doc: "wall-clock start of the step on the rank's host", Required: true},
	{Name: "end_unix_ns", Field: "EndUnixNs", Unit: "ns since 1970", Wire: WireCore, Combine: "latest over ranks",
		Doc: "wall-clock end of the step on the rank's host", Required: true},
	{Name: "duration_ns", Field: "DurationNs", Unit: "ns", Wire: WireCore, Combine: "slowest rank (rank_time_max_ns); the step time is the critical path's period",
		Doc: "monotonic duration; defaults to end − start"},
	{Name: "tokens", Field: "Tokens", Unit: "tokens", Wire: WireCore, Combine: "summed once per data-parallel replica",
		Required: true, Doc: "real tokens (not padding) consumed by this rank's data-parallel replica in the step, all micro-batches; the same on every rank of a replica"},
	{Name: "padded_tokens", Field: "PaddedTokens", Unit: "tokens", Wire: WireCore, Combine: "rank rows (the report compares it with tokens)",
		Doc: "optional: tokens including padding"},
	{Name: "samples", Field: "Samples", Unit: "samples", Wire: WireCore, Combine: "rank rows only",
		Doc: "optional: samples (sequences) in the step"},
	{Name: "data_wait_ns", Field: "DataWaitNs", Unit: "ns", Kind: KindBlocking, Wire: WireCore, Combine: "mean and largest fraction of the step",
		Doc: "blocking: waiting for the data loader"},
	{Name: "fwd_ns", Field: "FwdNs", Unit: "ns", Kind: KindPhase, Wire: WireCore, Combine: "rank rows and rank_windows (a straggler episode's work)",
		Doc: "compute phase: forward"},
	{Name: "bwd_ns", Field: "BwdNs", Unit: "ns", Kind: KindPhase, Wire: WireCore, Combine: "rank rows and rank_windows (a straggler episode's work)",
		Doc: "compute phase: backward"},
	{Name: "optim_ns", Field: "OptimNs", Unit: "ns", Kind: KindPhase, Wire: WireCore, Combine: "rank rows and rank_windows (a straggler episode's work)",
		Doc: "compute phase: optimizer"},
	{Name: "comm_ns", Field: "CommNs", Unit: "ns", Kind: KindPhase, Wire: WireCore, Combine: "mean, for the overlap (comm_overlap)",
		Doc: "all collective time, overlapped or not; ≥ exposed_comm_ns"},
	{Name: "exposed_comm_ns", Field: "ExposedCommNs", Unit: "ns", Kind: KindBlocking, Wire: WireCore, Combine: "mean and largest fraction; split into waiting for peers and transfer",
		Doc: "blocking: communication no computation overlapped"},
	{Name: "pp_wait_ns", Field: "PPWaitNs", Unit: "ns", Kind: KindBlocking, Wire: WireCore, Combine: "mean and largest fraction (the pipeline bubble)",
		Doc: "blocking: waiting for another pipeline stage"},
	{Name: "ckpt_ns", Field: "CkptNs", Unit: "ns", Kind: KindBlocking, Wire: WireCore, Combine: "mean fraction",
		Doc: "blocking: saving a checkpoint within the step"},
	{Name: "trace_compute_ns", Field: "TraceComputeNs", Unit: "ns", Kind: KindTrace, Wire: WireTrace, Combine: "rank rows only",
		Doc: "from a profiler trace of the step: the union of computation kernels (the agent fills it)"},
	{Name: "trace_comm_ns", Field: "TraceCommNs", Unit: "ns", Kind: KindTrace, Wire: WireTrace, Combine: "rank rows only",
		Doc: "from a profiler trace: the union of communication kernels"},
	{Name: "trace_exposed_comm_ns", Field: "TraceExposedCommNs", Unit: "ns", Kind: KindTrace, Wire: WireTrace, Combine: "rank rows only",
		Doc: "from a profiler trace: communication no computation overlaps; ≤ trace_comm_ns"},
	{Name: "seq_sq_sum", Field: "SeqSqSum", Unit: "tokens²", Wire: WireSeqSq, Combine: "the replica's FLOPs: tokens × dense + seq_sq_sum × attention FLOPs",
		Doc: "optional: Σ over the batch's documents of their length², between tokens and its square (packed or variable-length batches: attention FLOPs counted exactly, docs/flops.md)"},
	{Name: "bytes", Field: "Bytes", Unit: "bytes", Wire: WireBytes, Combine: "summed once per replica (bytes_per_second)",
		Doc: "optional: UTF-8 length of the text behind tokens: bytes/s compares runs whose tokenizers differ"},
	{Name: "gen_ns", Field: "GenNs", Unit: "ns", Wire: WireGen, Combine: "slowest rank",
		Doc: "optional: the step's generation phase on this rank (RL rollouts before the update); ≤ duration"},
	{Name: "gen_requests", Field: "GenRequests", Unit: "requests", Wire: WireGen, Combine: "summed over ranks",
		Doc: "optional: requests this rank generated in the step (with tensor-parallel generation, one rank of the group)"},
	{Name: "gen_prompt_tokens", Field: "GenPromptTokens", Unit: "tokens", Wire: WireGen, Combine: "summed over ranks",
		Doc: "optional: their prompt tokens"},
	{Name: "gen_output_tokens", Field: "GenOutputTokens", Unit: "tokens", Wire: WireGen, Combine: "summed over ranks",
		Doc: "optional: their generated tokens"},
}

// Of is the field of r that holds m.
func (m *Measure) Of(r *StepRecord) *int64 {
	return (*int64)(unsafe.Add(unsafe.Pointer(r), m.off))
}

// MeasuresIn lists the measures of a wire group, in wire order.
func MeasuresIn(g WireGroup) []*Measure {
	var out []*Measure
	for i := range Measures {
		if Measures[i].Wire == g {
			out = append(out, &Measures[i])
		}
	}
	return out
}

// boundedMeasures are those whose Kind names their bounds (Validate
// walks them for every record).
var boundedMeasures []*Measure

func init() {
	if err := bindMeasures(); err != nil {
		panic(err)
	}
	for i := range Measures {
		if Measures[i].Kind != KindOwn {
			boundedMeasures = append(boundedMeasures, &Measures[i])
		}
	}
}

// bindMeasures finds each measure's field: an int64 whose JSON key and
// Parquet column are the measure's name; every int64 field of StepRecord
// besides the identity is a measure.
func bindMeasures() error {
	t := reflect.TypeFor[StepRecord]()
	seen := map[string]bool{}
	for i := range Measures {
		m := &Measures[i]
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

// MeasuresMarkdown is docs/intake.md's table of the measures (key, unit,
// required, bounds, meaning, how the cluster row combines it).
func MeasuresMarkdown() string {
	var b strings.Builder
	b.WriteString("| key | unit | required | bounds | meaning | cluster row |\n|---|---|---|---|---|---|\n")
	for _, m := range Measures {
		req := ""
		if m.Required {
			req = "yes"
		}
		bounds := map[MeasureKind]string{KindBlocking: "0 to duration_ns", KindPhase: "0 to 24 h", KindTrace: "0 to 24 h"}[m.Kind]
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s |\n", m.Name, m.Unit, req, bounds, m.Doc, m.Combine)
	}
	return b.String()
}
