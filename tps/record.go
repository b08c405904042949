package tps

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strings"
	"time"
)

// StepRecord is what one rank reports about one optimizer step. Units are in
// the field names: nanoseconds (Ns), tokens, FLOPs. The JSON and Parquet names
// are the wire and file names documented in docs/intake.md and docs/parquet.md.
//
// The parallel coordinates and LocalRank are pointers because "absent" and
// "zero" differ: an absent coordinate is derived from the rank and the job's
// Topology, a zero one is rank 0 of that dimension.
type StepRecord struct {
	Job       string `json:"job" parquet:"job,dict"`
	Attempt   int64  `json:"attempt,omitempty" parquet:"attempt,delta"`
	Step      int64  `json:"step" parquet:"step,delta"`
	Rank      int64  `json:"rank" parquet:"rank,delta"`
	WorldSize int64  `json:"world_size" parquet:"world_size,delta"`

	DPRank *int32 `json:"dp_rank,omitempty" parquet:"dp_rank,optional"`
	TPRank *int32 `json:"tp_rank,omitempty" parquet:"tp_rank,optional"`
	PPRank *int32 `json:"pp_rank,omitempty" parquet:"pp_rank,optional"`
	CPRank *int32 `json:"cp_rank,omitempty" parquet:"cp_rank,optional"`
	EPRank *int32 `json:"ep_rank,omitempty" parquet:"ep_rank,optional"`

	Node      string `json:"node,omitempty" parquet:"node,dict"`
	LocalRank *int32 `json:"local_rank,omitempty" parquet:"local_rank,optional"`
	GPUUUID   string `json:"gpu_uuid,omitempty" parquet:"gpu_uuid,dict"`

	StartUnixNs int64 `json:"start_unix_ns" parquet:"start_unix_ns,delta"`
	EndUnixNs   int64 `json:"end_unix_ns" parquet:"end_unix_ns,delta"`
	DurationNs  int64 `json:"duration_ns,omitempty" parquet:"duration_ns,delta"`

	Tokens       int64 `json:"tokens" parquet:"tokens,delta"`
	PaddedTokens int64 `json:"padded_tokens,omitempty" parquet:"padded_tokens,delta"`
	Samples      int64 `json:"samples,omitempty" parquet:"samples,delta"`
	// SeqSqSum is Σ over the documents of the batch of their length in
	// tokens, squared: with packed or variable-length batches (document
	// masking) it makes the attention term of the FLOPs exact instead of
	// charging every token the whole training sequence. Zero: not given.
	SeqSqSum int64 `json:"seq_sq_sum,omitempty" parquet:"seq_sq_sum,delta"`
	// Bytes is the UTF-8 length of the text behind Tokens: throughput in
	// bytes/s compares runs whose tokenizers differ (the same text is a
	// different number of tokens). Zero: not given. Counted once per
	// replica, like Tokens.
	Bytes int64 `json:"bytes,omitempty" parquet:"bytes,delta"`

	// The generation phase of the step (RL post-training: rollouts before
	// the update), as this rank saw it: its wall time within the step,
	// the requests it generated, their prompt and generated tokens. Each
	// rank reports the requests it generated (with tensor-parallel
	// generation, one rank of the group: docs/capture.md). Per-request
	// latencies (time to first token, inter-token) go in a rollout event
	// as mergeable sketches. Zero: no generation phase.
	GenNs           int64 `json:"gen_ns,omitempty" parquet:"gen_ns,delta"`
	GenRequests     int64 `json:"gen_requests,omitempty" parquet:"gen_requests,delta"`
	GenPromptTokens int64 `json:"gen_prompt_tokens,omitempty" parquet:"gen_prompt_tokens,delta"`
	GenOutputTokens int64 `json:"gen_output_tokens,omitempty" parquet:"gen_output_tokens,delta"`

	DataWaitNs    int64 `json:"data_wait_ns,omitempty" parquet:"data_wait_ns,delta"`
	FwdNs         int64 `json:"fwd_ns,omitempty" parquet:"fwd_ns,delta"`
	BwdNs         int64 `json:"bwd_ns,omitempty" parquet:"bwd_ns,delta"`
	OptimNs       int64 `json:"optim_ns,omitempty" parquet:"optim_ns,delta"`
	CommNs        int64 `json:"comm_ns,omitempty" parquet:"comm_ns,delta"`
	ExposedCommNs int64 `json:"exposed_comm_ns,omitempty" parquet:"exposed_comm_ns,delta"`
	PPWaitNs      int64 `json:"pp_wait_ns,omitempty" parquet:"pp_wait_ns,delta"`
	CkptNs        int64 `json:"ckpt_ns,omitempty" parquet:"ckpt_ns,delta"`

	// Trace* are measured from a profiler trace of this step (sampled by
	// the Python package, analysed by the node agent; docs/kineto.md): the
	// union of computation and of communication kernels, and the
	// communication no computation overlaps. Zero when the step was not
	// traced. Where the rank measured no communication itself, the agent
	// also fills CommNs and ExposedCommNs from them.
	TraceComputeNs     int64 `json:"trace_compute_ns,omitempty" parquet:"trace_compute_ns,delta"`
	TraceCommNs        int64 `json:"trace_comm_ns,omitempty" parquet:"trace_comm_ns,delta"`
	TraceExposedCommNs int64 `json:"trace_exposed_comm_ns,omitempty" parquet:"trace_exposed_comm_ns,delta"`

	// CaptureNs is the time the rank's training thread spent in tpsprof's
	// own code during the step (its hooks, measured by themselves);
	// CaptureCPUNs the CPU time of the package's own threads (sender,
	// poller) since the rank's previous record: summed over a run, what
	// measuring cost the process. Zero: not measured.
	CaptureNs    int64 `json:"capture_ns,omitempty" parquet:"capture_ns,delta"`
	CaptureCPUNs int64 `json:"capture_cpu_ns,omitempty" parquet:"capture_cpu_ns,delta"`
	// CaptureCommNs and CaptureCommCPUNs are the communication component's
	// parts of them: its marks around each collective on the training
	// thread, and its poller thread's CPU (the rest is the step's hooks
	// and the sender's).
	CaptureCommNs    int64 `json:"capture_comm_ns,omitempty" parquet:"capture_comm_ns,delta"`
	CaptureCommCPUNs int64 `json:"capture_comm_cpu_ns,omitempty" parquet:"capture_comm_cpu_ns,delta"`

	// The accelerator memory of the step (PyTorch's CUDA caching
	// allocator): the peaks of allocated and reserved bytes since the
	// previous step ended, and the device's capacity. Zero: not measured
	// (CPU, or switched off).
	MemPeakAllocatedBytes int64 `json:"mem_peak_allocated_bytes,omitempty" parquet:"mem_peak_allocated_bytes,delta"`
	MemPeakReservedBytes  int64 `json:"mem_peak_reserved_bytes,omitempty" parquet:"mem_peak_reserved_bytes,delta"`
	MemCapacityBytes      int64 `json:"mem_capacity_bytes,omitempty" parquet:"mem_capacity_bytes,delta"`

	// GCNs is the training thread's time in Python's garbage collector
	// during the step (Measures: gc_ns). Zero: none, or not measured.
	GCNs int64 `json:"gc_ns,omitempty" parquet:"gc_ns,delta"`
	// HostNs is the training thread's CPU time before the step's first
	// forward, out of its data wait (Measures: host_ns). Zero: none, or
	// not measured.
	HostNs int64 `json:"host_ns,omitempty" parquet:"host_ns,delta"`

	// FLOPs are the model FLOPs of the step for this rank's data-parallel
	// replica, when the training code computes them itself (variable-length
	// batches). Like Tokens, they are counted once per replica.
	FLOPs   float64  `json:"flops,omitempty" parquet:"flops"`
	Loss    *float64 `json:"loss,omitempty" parquet:"loss,optional"`
	Skipped bool     `json:"skipped,omitempty" parquet:"skipped"`
}

// Limits that separate a plausible record from a broken one. They are wide on
// purpose: a rejection must mean the producer is wrong, not that the job is big.
const (
	MaxWorldSize = 1 << 22 // 4,194,304 ranks
	// MaxAttempt bounds attempt numbers (a million launches and restarts of
	// one job): a record with attempt 2^63-1 would otherwise make the next
	// launch's attempt overflow.
	MaxAttempt = int64(1) << 20
	// MaxStep bounds step numbers (a trillion steps).
	MaxStep   = int64(1) << 40
	MaxStepNs = int64(24 * time.Hour)
	MaxTokens = int64(1) << 40 // per replica per step
	// MaxTokensPerNs bounds a replica's rate: 1e9 tokens/s, beyond any
	// GPU (a 10M-parameter model at 100% of an H100 does ~1.6e7).
	MaxTokensPerNs = 1
	// MaxMemBytes bounds a device's memory figures (1 PiB).
	MaxMemBytes  = int64(1) << 50
	MaxStringLen = 256                                   // node, gpu_uuid
	MinUnixNs    = int64(946684800) * int64(time.Second) // 2000-01-01T00:00:00Z
	maxJobLen    = 64
)

// ErrInvalidRecord is wrapped by every validation error of this package.
var ErrInvalidRecord = errors.New("tps: invalid record")

// Reasons a field is rejected; with the field name they make the bounded set
// of labels that intake and collector count rejections by.
const (
	ReasonMissing    = "missing"
	ReasonNegative   = "negative"
	ReasonOutOfRange = "out_of_range"
	ReasonInvalid    = "invalid"
)

// FieldError names the field of a record that failed validation and why.
type FieldError struct {
	Field  string // wire name, e.g. "tokens"
	Value  any
	Reason string // one of the Reason constants
	Detail string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("tps: invalid record: %s = %v: %s", e.Field, e.Value, e.Detail)
}

// Unwrap makes errors.Is(err, ErrInvalidRecord) hold.
func (e *FieldError) Unwrap() error { return ErrInvalidRecord }

// Code is a short, bounded label for counting rejections: "field:reason".
func (e *FieldError) Code() string { return e.Field + ":" + e.Reason }

func fieldErr(field string, value any, reason, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Value: value, Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// ValidJobID reports whether s can be a job id: 1 to 64 characters of
// [A-Za-z0-9_-], so it is a single NATS subject token and a safe directory name.
func ValidJobID(s string) bool {
	if len(s) == 0 || len(s) > maxJobLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Normalize fills the fields that have defaults: DurationNs becomes
// EndUnixNs−StartUnixNs when it was left out.
func (r *StepRecord) Normalize() {
	if r.DurationNs == 0 && r.EndUnixNs > r.StartUnixNs {
		r.DurationNs = r.EndUnixNs - r.StartUnixNs
	}
}

// Validate checks a record on its own (not against a topology or a clock) and
// returns a *FieldError naming the first bad field. Call Normalize first.
func (r *StepRecord) Validate() error {
	for _, check := range [...]func() error{r.validateIdentity, r.validateTimes, r.validateCounts, r.validateMeasures} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// validateIdentity checks whose step it is: job, attempt and step, then
// the rank.
func (r *StepRecord) validateIdentity() error {
	if r.Job == "" {
		return fieldErr("job", r.Job, ReasonMissing, "required")
	}
	if !ValidJobID(r.Job) {
		return fieldErr("job", truncate(r.Job, 80), ReasonInvalid, "must be 1-64 characters of [A-Za-z0-9_-]")
	}
	if r.Attempt < 0 {
		return fieldErr("attempt", r.Attempt, ReasonNegative, "must not be negative")
	}
	if r.Attempt > MaxAttempt {
		return fieldErr("attempt", r.Attempt, ReasonOutOfRange, "above the limit of %d", MaxAttempt)
	}
	if r.Step < 0 {
		return fieldErr("step", r.Step, ReasonNegative, "must not be negative")
	}
	if r.Step > MaxStep {
		return fieldErr("step", r.Step, ReasonOutOfRange, "above the limit of %d", MaxStep)
	}
	return r.validateRank()
}

// validateRank checks the rank, its coordinates, node and GPU.
func (r *StepRecord) validateRank() error {
	if r.WorldSize <= 0 {
		return fieldErr("world_size", r.WorldSize, ReasonMissing, "required, at least 1")
	}
	if r.WorldSize > MaxWorldSize {
		return fieldErr("world_size", r.WorldSize, ReasonOutOfRange, "above the limit of %d ranks", MaxWorldSize)
	}
	if r.Rank < 0 || r.Rank >= r.WorldSize {
		return fieldErr("rank", r.Rank, ReasonOutOfRange, "must be in [0, world_size=%d)", r.WorldSize)
	}
	for _, c := range [...]struct {
		name string
		v    *int32
	}{{"dp_rank", r.DPRank}, {"tp_rank", r.TPRank}, {"pp_rank", r.PPRank}, {"cp_rank", r.CPRank}, {"ep_rank", r.EPRank}, {"local_rank", r.LocalRank}} {
		if c.v != nil && (*c.v < 0 || int64(*c.v) >= r.WorldSize) {
			return fieldErr(c.name, *c.v, ReasonOutOfRange, "must be in [0, world_size=%d)", r.WorldSize)
		}
	}
	if len(r.Node) > MaxStringLen || !printable(r.Node) {
		return fieldErr("node", truncate(r.Node, 80), ReasonInvalid, "must be at most %d printable characters", MaxStringLen)
	}
	if len(r.GPUUUID) > MaxStringLen || !printable(r.GPUUUID) {
		return fieldErr("gpu_uuid", truncate(r.GPUUUID, 80), ReasonInvalid, "must be at most %d printable characters", MaxStringLen)
	}
	return nil
}

// validateTimes checks the step's period and duration.
func (r *StepRecord) validateTimes() error {
	if r.StartUnixNs == 0 {
		return fieldErr("start_unix_ns", r.StartUnixNs, ReasonMissing, "required")
	}
	if r.EndUnixNs == 0 {
		return fieldErr("end_unix_ns", r.EndUnixNs, ReasonMissing, "required")
	}
	if r.StartUnixNs < MinUnixNs {
		return fieldErr("start_unix_ns", r.StartUnixNs, ReasonOutOfRange, "before 2000-01-01: not a Unix time in nanoseconds")
	}
	if r.EndUnixNs < r.StartUnixNs {
		return fieldErr("end_unix_ns", r.EndUnixNs, ReasonOutOfRange, "before start_unix_ns=%d", r.StartUnixNs)
	}
	if r.EndUnixNs-r.StartUnixNs > MaxStepNs {
		return fieldErr("end_unix_ns", r.EndUnixNs, ReasonOutOfRange, "step longer than 24h after start_unix_ns=%d", r.StartUnixNs)
	}
	if r.DurationNs <= 0 {
		return fieldErr("duration_ns", r.DurationNs, ReasonOutOfRange, "must be positive (or left out when end > start)")
	}
	if r.DurationNs > MaxStepNs {
		return fieldErr("duration_ns", r.DurationNs, ReasonOutOfRange, "longer than 24h")
	}
	return nil
}

// validateCounts checks what the step counted: tokens and bytes, then
// the generation phase, memory, sequences and samples.
func (r *StepRecord) validateCounts() error {
	if r.Tokens < 0 {
		return fieldErr("tokens", r.Tokens, ReasonNegative, "must not be negative")
	}
	if r.Tokens > MaxTokens {
		return fieldErr("tokens", r.Tokens, ReasonOutOfRange, "above %d per replica per step", MaxTokens)
	}
	if r.Tokens > r.DurationNs*MaxTokensPerNs {
		// 2^40 tokens in a 1 ns step passed the bounds above: TPS 1e21.
		return fieldErr("tokens", r.Tokens, ReasonOutOfRange, "more than %d per nanosecond of the step's duration_ns=%d (1e9 tokens/s per replica)", MaxTokensPerNs, r.DurationNs)
	}
	if r.PaddedTokens < 0 {
		return fieldErr("padded_tokens", r.PaddedTokens, ReasonNegative, "must not be negative")
	}
	if r.PaddedTokens > MaxTokens {
		return fieldErr("padded_tokens", r.PaddedTokens, ReasonOutOfRange, "above %d", MaxTokens)
	}
	if r.Bytes < 0 || r.Bytes > MaxTokens*64 {
		return fieldErr("bytes", r.Bytes, ReasonOutOfRange, "must lie between 0 and %d", MaxTokens*64)
	}
	return r.validateGeneration()
}

// validateGeneration checks the generation phase's figures and memory,
// then the sequences.
func (r *StepRecord) validateGeneration() error {
	if r.GenNs < 0 || r.GenNs > r.DurationNs {
		return fieldErr("gen_ns", r.GenNs, ReasonOutOfRange, "must lie between 0 and the step's duration_ns=%d", r.DurationNs)
	}
	for _, g := range [...]struct {
		name string
		v    int64
	}{{"gen_requests", r.GenRequests}, {"gen_prompt_tokens", r.GenPromptTokens}, {"gen_output_tokens", r.GenOutputTokens}} {
		if g.v < 0 || g.v > MaxTokens {
			return fieldErr(g.name, g.v, ReasonOutOfRange, "must lie between 0 and %d", MaxTokens)
		}
	}
	if r.GenOutputTokens > 0 && r.GenOutputTokens > r.GenNs*MaxTokensPerNs {
		return fieldErr("gen_output_tokens", r.GenOutputTokens, ReasonOutOfRange, "more than %d per nanosecond of gen_ns=%d", MaxTokensPerNs, r.GenNs)
	}
	for _, m := range cappedMeasures {
		if v := *m.Of(r); v < 0 || v > m.Max {
			return fieldErr(m.Name, v, ReasonOutOfRange, "must lie between 0 and %d (%s)", m.Max, m.MaxWords)
		}
	}
	return r.validateSequences()
}

// validateSequences checks the sequences' and samples' counts.
func (r *StepRecord) validateSequences() error {
	if r.SeqSqSum < 0 {
		return fieldErr("seq_sq_sum", r.SeqSqSum, ReasonNegative, "must not be negative")
	}
	// Σ len² lies between tokens (one-token documents) and tokens²
	if hi, lo := bits.Mul64(uint64(max(r.Tokens, 0)), uint64(max(r.Tokens, 0))); r.SeqSqSum > 0 && (r.SeqSqSum < r.Tokens || (hi == 0 && uint64(r.SeqSqSum) > lo)) {
		return fieldErr("seq_sq_sum", r.SeqSqSum, ReasonOutOfRange, "must lie between tokens=%d and its square", r.Tokens)
	}
	if r.Samples < 0 {
		return fieldErr("samples", r.Samples, ReasonNegative, "must not be negative")
	}
	return nil
}

// validateMeasures checks the step's measured times and FLOPs.
func (r *StepRecord) validateMeasures() error {
	// Phases that block the step are parts of its wall time; the others
	// (compute phases, total comm with its overlapped part, trace figures)
	// only need to be sane.
	for _, m := range boundedMeasures {
		v := *m.Of(r)
		if v < 0 {
			return fieldErr(m.Name, v, ReasonNegative, "must not be negative")
		}
		if m.Kind == KindBlocking && v > r.DurationNs {
			return fieldErr(m.Name, v, ReasonOutOfRange, "longer than the step's duration_ns=%d", r.DurationNs)
		}
		if v > MaxStepNs {
			return fieldErr(m.Name, v, ReasonOutOfRange, "longer than 24h")
		}
	}
	if r.TraceExposedCommNs > r.TraceCommNs {
		return fieldErr("trace_exposed_comm_ns", r.TraceExposedCommNs, ReasonOutOfRange, "above trace_comm_ns=%d", r.TraceCommNs)
	}
	if r.CommNs > 0 && r.ExposedCommNs > r.CommNs {
		return fieldErr("exposed_comm_ns", r.ExposedCommNs, ReasonOutOfRange, "above comm_ns=%d: exposed communication is part of all communication", r.CommNs)
	}
	if math.IsNaN(r.FLOPs) || math.IsInf(r.FLOPs, 0) || r.FLOPs < 0 {
		return fieldErr("flops", r.FLOPs, ReasonOutOfRange, "must be a finite, non-negative number")
	}
	if r.Loss != nil && (math.IsNaN(*r.Loss) || math.IsInf(*r.Loss, 0)) {
		return fieldErr("loss", *r.Loss, ReasonInvalid, "must be finite")
	}
	return nil
}

// CheckClock rejects a record whose timestamps lie further in the future than
// tolerance from now: a producer with a broken clock or unit (µs for ns).
// Steps already measured with durations stay valid under modest clock skew,
// because step time is taken from each rank's own DurationNs.
func (r *StepRecord) CheckClock(now time.Time, tolerance time.Duration) error {
	return checkFuture("end_unix_ns", r.EndUnixNs, now, tolerance)
}

// checkFuture rejects a time stamp further than tolerance ahead of now.
func checkFuture(field string, ns int64, now time.Time, tolerance time.Duration) error {
	if limit := now.Add(tolerance).UnixNano(); ns > limit {
		return fieldErr(field, ns, ReasonOutOfRange, "%s in the future", time.Duration(ns-now.UnixNano()).Round(time.Second))
	}
	return nil
}

// ComputeNs is the time the rank spent neither waiting for data, for
// pipeline peers, on exposed communication nor on a blocking checkpoint:
// the basis of straggler scores. (The starting design left checkpoints
// in; a checkpoint step then looks like every rank straggling.)
func (r *StepRecord) ComputeNs() int64 {
	d := r.DurationNs
	for _, m := range blockingMeasures {
		d -= *m.Of(r)
	}
	return max(d, 0)
}

// OwnNs is the rank's own time in the step: its compute and the blocking
// measures that are its own (Measure.Own: the data wait, the host work
// before the forward), what the others wait for in a synchronous step.
// The critical rank, the waiting for it, the straggler scores and node
// health all compare it.
func (r *StepRecord) OwnNs() int64 {
	o := r.ComputeNs()
	for _, m := range ownMeasures {
		o += *m.Of(r)
	}
	return o
}

// ComputeNs is a rank's compute in a step: its duration less the time it
// was blocked (each KindBlocking measure of Measures: exposed
// communication, data, pipeline and checkpoint waits, Python's garbage
// collector; BlockingMeasures names them), never negative. The one
// compute-time formula: the records, the rank windows, the live join and
// the report's rank pass (which reads the columns without building
// records) all take it.
func ComputeNs(duration int64, blocked ...int64) int64 {
	for _, b := range blocked {
		duration -= b
	}
	return max(duration, 0)
}

func printable(s string) bool {
	for _, c := range s {
		if c < 0x20 || c == 0x7f || c == 0xfffd {
			return false
		}
	}
	return true
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
