package tps

import (
	"encoding/json"
	"fmt"
)

// RankWindowSteps is how many steps a rank window covers: window w of an
// attempt holds steps [w*RankWindowSteps, (w+1)*RankWindowSteps). A run of
// 1e10 rank rows has ~1e8 rank windows.
const RankWindowSteps = 100

// RankWindow summarises one rank's rows over a window of steps (the
// rank_windows table, docs/parquet.md): per measure its sum, minimum and
// maximum, and a mergeable quantile sketch of the rank's compute time, so
// that a report over a very long run reads one row per rank and window
// instead of one per rank and step. Several rows may share a key (job,
// attempt, rank, window): a record that came after its window was written,
// or rank writers that each saw part of a rank's rows; readers merge them
// (Merge).
type RankWindow struct {
	Job       string `json:"job" parquet:"job,dict"`
	Attempt   int64  `json:"attempt" parquet:"attempt"`
	Rank      int64  `json:"rank" parquet:"rank"`
	Node      string `json:"node,omitempty" parquet:"node,dict"`
	WorldSize int64  `json:"world_size" parquet:"world_size"`
	// Window is the window's number: its steps are [Window*RankWindowSteps,
	// (Window+1)*RankWindowSteps); FirstStep and LastStep are the lowest
	// and highest steps of the rows it holds, Steps how many rows.
	Window    int64 `json:"window_index" parquet:"window_index"`
	FirstStep int64 `json:"first_step" parquet:"first_step"`
	LastStep  int64 `json:"last_step" parquet:"last_step"`
	Steps     int64 `json:"steps" parquet:"steps"`
	// StartUnixNs and EndUnixNs bound the rows' steps on the rank's clock.
	StartUnixNs int64 `json:"start_unix_ns" parquet:"start_unix_ns"`
	EndUnixNs   int64 `json:"end_unix_ns" parquet:"end_unix_ns"`

	Duration    Span `json:"duration_ns" parquet:"duration_ns"`
	Compute     Span `json:"compute_ns" parquet:"compute_ns"` // StepRecord.ComputeNs
	DataWait    Span `json:"data_wait_ns" parquet:"data_wait_ns"`
	Comm        Span `json:"comm_ns" parquet:"comm_ns"`
	ExposedComm Span `json:"exposed_comm_ns" parquet:"exposed_comm_ns"`
	PPWait      Span `json:"pp_wait_ns" parquet:"pp_wait_ns"`
	Ckpt        Span `json:"ckpt_ns" parquet:"ckpt_ns"`
	Fwd         Span `json:"fwd_ns" parquet:"fwd_ns"`
	Bwd         Span `json:"bwd_ns" parquet:"bwd_ns"`
	Optim       Span `json:"optim_ns" parquet:"optim_ns"`
	// what measuring cost, and the device memory (the report's capture
	// cost and memory per rank; zero spans where the rows had none)
	Capture        Span `json:"capture_ns" parquet:"capture_ns"`
	CaptureCPU     Span `json:"capture_cpu_ns" parquet:"capture_cpu_ns"`
	MemAllocated   Span `json:"mem_peak_allocated_bytes" parquet:"mem_peak_allocated_bytes"`
	MemReserved    Span `json:"mem_peak_reserved_bytes" parquet:"mem_peak_reserved_bytes"`
	MemCapacity    Span `json:"mem_capacity_bytes" parquet:"mem_capacity_bytes"`
	Host           Span `json:"host_ns" parquet:"host_ns"`
	CaptureComm    Span `json:"capture_comm_ns" parquet:"capture_comm_ns"`
	CaptureCommCPU Span `json:"capture_comm_cpu_ns" parquet:"capture_comm_cpu_ns"`

	Tokens       int64 `json:"tokens" parquet:"tokens"`
	PaddedTokens int64 `json:"padded_tokens" parquet:"padded_tokens"`
	// TokensPadded is the tokens of the rows that named their padded
	// tokens (for the real/padded ratio over the same rows).
	TokensPadded int64 `json:"tokens_padded" parquet:"tokens_padded"`

	// ComputeSketch is a Sketch of the rows' compute times (ns) as JSON:
	// per-rank quantiles (the straggler scores' medians) over any set of
	// windows, within the sketch's 1% relative accuracy.
	ComputeSketch []byte `json:"compute_sketch,omitempty" parquet:"compute_sketch"`

	sketch *Sketch // while accumulating (Add); encoded by Seal
}

// Span is a measure's sum, minimum and maximum over a window's rows.
type Span struct {
	Sum int64 `json:"sum" parquet:"sum"`
	Min int64 `json:"min" parquet:"min"`
	Max int64 `json:"max" parquet:"max"`
}

func (s *Span) add(v int64, first bool) {
	if first {
		*s = Span{Sum: v, Min: v, Max: v}
		return
	}
	s.Sum += v
	s.Min = min(s.Min, v)
	s.Max = max(s.Max, v)
}

func (s *Span) merge(o Span) {
	s.Sum += o.Sum
	s.Min = min(s.Min, o.Min)
	s.Max = max(s.Max, o.Max)
}

// WindowOf is the rank window a step falls in.
func WindowOf(step int64) int64 { return step / RankWindowSteps }

// Add folds a rank row in (its window must be w's, unchecked).
func (w *RankWindow) Add(r *StepRecord) {
	first := w.Steps == 0
	if first {
		w.Job, w.Attempt, w.Rank, w.Window = r.Job, r.Attempt, r.Rank, WindowOf(r.Step)
		w.FirstStep, w.LastStep, w.StartUnixNs, w.EndUnixNs = r.Step, r.Step, r.StartUnixNs, r.EndUnixNs
	} else {
		w.FirstStep, w.LastStep = min(w.FirstStep, r.Step), max(w.LastStep, r.Step)
		w.StartUnixNs, w.EndUnixNs = min(w.StartUnixNs, r.StartUnixNs), max(w.EndUnixNs, r.EndUnixNs)
	}
	if r.Node != "" {
		w.Node = r.Node
	}
	w.WorldSize = r.WorldSize
	w.Steps++
	compute := r.ComputeNs()
	w.Compute.add(compute, first)
	for _, m := range windowedMeasures {
		m.spanOf(w).add(*m.Of(r), first)
	}
	w.Tokens += r.Tokens
	if r.PaddedTokens > 0 {
		w.PaddedTokens += r.PaddedTokens
		w.TokensPadded += r.Tokens
	}
	if w.sketch == nil {
		w.sketch = &Sketch{}
	}
	w.sketch.Add(float64(compute))
}

// Seal encodes the sketch Add built into ComputeSketch (before writing).
func (w *RankWindow) Seal() {
	if w.sketch != nil {
		w.ComputeSketch, _ = json.Marshal(w.sketch)
		w.sketch = nil
	}
}

// Sketch decodes ComputeSketch (nil when there is none).
func (w *RankWindow) Sketch() (*Sketch, error) {
	if w.sketch != nil {
		return w.sketch, nil
	}
	var s Sketch
	if ok, err := w.SketchInto(&s); !ok || err != nil {
		return nil, err
	}
	return &s, nil
}

// SketchInto decodes ComputeSketch into s, reusing its bins' memory (a
// report merging a million windows' sketches allocated one each), and
// reports whether there was one.
func (w *RankWindow) SketchInto(s *Sketch) (bool, error) {
	if w.sketch != nil {
		*s = *w.sketch
		s.Bins = append(s.Bins[:0:0], w.sketch.Bins...)
		return true, nil
	}
	ok, err := SketchFromJSON(w.ComputeSketch, s)
	if err != nil {
		return false, fmt.Errorf("tps: rank window %d of rank %d: %w", w.Window, w.Rank, err)
	}
	return ok, nil
}

// SketchFromJSON decodes a compute sketch's JSON (RankWindow's
// ComputeSketch) into s, reusing its bins' memory, and reports whether
// there was one (b empty: none). It does not keep b.
func SketchFromJSON(b []byte, s *Sketch) (bool, error) {
	if len(b) == 0 {
		return false, nil
	}
	if !decodeSketchJSON(b, s) {
		*s = Sketch{Bins: s.Bins[:0]} // keys the JSON leaves out are zero
		if err := json.Unmarshal(b, s); err != nil {
			return false, fmt.Errorf("compute sketch: %w", err)
		}
	}
	if err := s.Check(); err != nil {
		return false, fmt.Errorf("compute sketch: %w", err)
	}
	return true, nil
}

// Merge folds another row of the same key in (sketches included).
func (w *RankWindow) Merge(o *RankWindow) error {
	if o.Steps == 0 {
		return nil
	}
	if w.Steps == 0 {
		*w = *o
		return nil
	}
	a, err := w.Sketch()
	if err != nil {
		return err
	}
	b, err := o.Sketch()
	if err != nil {
		return err
	}
	switch {
	case a == nil:
		a = b
	case b != nil:
		m := *a
		m.Bins = append([]int64(nil), a.Bins...)
		m.Merge(b)
		a = &m
	}
	w.FirstStep, w.LastStep = min(w.FirstStep, o.FirstStep), max(w.LastStep, o.LastStep)
	w.StartUnixNs, w.EndUnixNs = min(w.StartUnixNs, o.StartUnixNs), max(w.EndUnixNs, o.EndUnixNs)
	if w.Node == "" {
		w.Node = o.Node
	}
	w.Steps += o.Steps
	w.Compute.merge(o.Compute)
	for _, m := range windowedMeasures {
		m.spanOf(w).merge(*m.spanOf(o))
	}
	w.Tokens += o.Tokens
	w.PaddedTokens += o.PaddedTokens
	w.TokensPadded += o.TokensPadded
	w.sketch, w.ComputeSketch = a, nil
	return nil
}
