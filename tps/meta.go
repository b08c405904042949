package tps

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/tpsprof/tpsprof/mfu"
)

// Event kinds. Custom kinds are allowed; these are the ones goodput reads.
const (
	EventJobStart          = "job_start"
	EventJobEnd            = "job_end"
	EventAttemptStart      = "attempt_start"
	EventAttemptEnd        = "attempt_end"
	EventCheckpointSave    = "checkpoint_save"
	EventCheckpointRestore = "checkpoint_restore"
	EventEval              = "eval"
	// EventTraceAnalysis carries what the node agent measured in a
	// profiler trace a rank wrote of one step (Detail: a TraceFigures
	// JSON object; docs/kineto.md, "Live").
	EventTraceAnalysis = "trace_analysis"
	// EventCapture is an automatic on-demand capture the collector ran
	// when a straggler episode opened (Detail: the episode, the rank the
	// others waited for and the ranks' figures; docs/capture.md).
	EventCapture = "capture"
	// EventTopologyWarning: what the ranks show contradicts the layout the
	// job declared (Detail says what), e.g. identical batches on ranks
	// counted as separate replicas (agent/batches.go).
	EventTopologyWarning = "topology_warning"
	// EventFlopCount carries the FLOPs PyTorch counted on one rank over a
	// sampled step (torch.utils.flop_counter.FlopCounterMode; Detail: a
	// FlopCount JSON object). The step ran under the counter, slower: it
	// is left out of the figures as a profiled step is.
	EventFlopCount = "flop_count"
	// EventTraceStop is the profiler's stop after a step it traced (a
	// tpsprof trace capture, trace_every): 0.3-1 s that is no step's, a
	// gap between steps named as such (badput "profiling").
	EventTraceStop = "trace_stop"
	// EventRankConflict: two processes on one node report the same rank of
	// one attempt (a task a rank under srun with the rank not set, so
	// each is rank 0 of world 1): the collector keeps one's steps and drops
	// the other's as duplicates (Detail says so; agent/ranks.go).
	EventRankConflict = "rank_conflict"
	// EventRankUser: the user whose process reported a job's first rank
	// to a node's agent (Detail "uid=N", the connection's SO_PEERCRED),
	// once a job and node: the fleet view counts a host's slow jobs by
	// user (one user's jobs alone do not drain a host others ran on
	// well; fleet.Health). Bookkeeping, not something that happened to
	// the run: reports do not list it.
	EventRankUser = "rank_user"
)

// AgentEvent reports whether kind is written by a node's agent alone: a
// line of it from a connection is refused (a job could otherwise claim
// another user, or a rank conflict that did not happen).
func AgentEvent(kind string) bool {
	return kind == EventRankConflict || kind == EventRankUser
}

// RankUserDetail is a rank_user event's Detail for a user id.
func RankUserDetail(uid int64) string { return fmt.Sprintf("uid=%d", uid) }

// ParseRankUser reads a rank_user event's Detail back: the user id, or
// false when it is not one.
func ParseRankUser(detail string) (string, bool) {
	v, ok := strings.CutPrefix(detail, "uid=")
	if !ok || v == "" || len(v) > 10 || strings.Trim(v, "0123456789") != "" {
		return "", false
	}
	return v, true
}

// StoppedPrefix begins an attempt_end's detail when its launcher stopped
// the command on a signal it was sent (the rest says whose and what it
// means: "preempted or requeued by Slurm"): the attempt is named so, not
// "crashed".
const StoppedPrefix = "stopped: "

// StepsLoop is RunMeta.Steps of a producer whose steps are the loop's
// period: each rank's step runs from the end of its previous step (or
// of the gap before it) to its own end, so an attempt's steps and its
// named gaps account for all its time (report.Invariants holds them to
// it). The Python package sends it; tps.Recorder's steps are such too.
const StepsLoop = "loop"

// FlopCount is the Detail of a flop_count event: the FLOPs one rank's
// step executed as PyTorch counts them (forward and backward; matrix
// products, convolutions and attention), and whether activations were
// recomputed in it (checkpointing: the count is then hardware FLOPs,
// not model FLOPs).
type FlopCount struct {
	FLOPs     float64 `json:"flops"`
	Recompute bool    `json:"recompute,omitempty"`
	// Generation: the step had a generation phase (RL rollouts), whose
	// forwards the count holds beside the update's: no FLOPs a trained
	// token (the step is still left out of the figures).
	Generation bool `json:"generation,omitempty"`
}

// MaxCountedFLOPs bounds one rank's step (1e21: a thousand H100-hours).
const MaxCountedFLOPs = 1e21

// ParseFlopCount decodes and checks a flop_count event's Detail.
func ParseFlopCount(detail string) (FlopCount, error) {
	var f FlopCount
	if err := json.Unmarshal([]byte(detail), &f); err != nil {
		return f, fmt.Errorf("flop_count detail: %v", err)
	}
	if math.IsNaN(f.FLOPs) || f.FLOPs < 0 || f.FLOPs > MaxCountedFLOPs {
		return f, fmt.Errorf("flop_count detail: flops %g outside 0 to %g", f.FLOPs, MaxCountedFLOPs)
	}
	return f, nil
}

// Event is something that happened to a run outside the step loop: a
// restart, a checkpoint, an evaluation. EndUnixNs equals StartUnixNs for an
// instant.
type Event struct {
	Job         string `json:"job" parquet:"job,dict"`
	Attempt     int64  `json:"attempt" parquet:"attempt"`
	Kind        string `json:"kind" parquet:"kind,dict"`
	Name        string `json:"name,omitempty" parquet:"name"`
	Rank        int64  `json:"rank" parquet:"rank"`
	Node        string `json:"node,omitempty" parquet:"node,dict"`
	Step        int64  `json:"step" parquet:"step"`
	StartUnixNs int64  `json:"start_unix_ns" parquet:"start_unix_ns"`
	EndUnixNs   int64  `json:"end_unix_ns" parquet:"end_unix_ns"`
	ExitCode    int64  `json:"exit_code,omitempty" parquet:"exit_code"`
	Detail      string `json:"detail,omitempty" parquet:"detail"`
}

// Validate checks an event.
func (e *Event) Validate() error {
	_, err := e.ValidateRollout()
	return err
}

// ValidateRollout checks an event like Validate and returns, for a
// rollout event, its decoded detail (the zero value for other kinds), so
// that the detail is parsed once.
func (e *Event) ValidateRollout() (RolloutDetail, error) {
	if err := e.validateText(); err != nil {
		return RolloutDetail{}, err
	}
	d, err := e.validateDetail()
	if err != nil {
		return d, err
	}
	return d, e.validatePlace()
}

// validateText checks the event's job, kind, name and node.
func (e *Event) validateText() error {
	if !ValidJobID(e.Job) {
		return fieldErr("job", truncate(e.Job, 80), ReasonInvalid, "must be 1-64 characters of [A-Za-z0-9_-]")
	}
	if e.Kind == "" || len(e.Kind) > 64 || !printable(e.Kind) {
		return fieldErr("kind", truncate(e.Kind, 80), ReasonInvalid, "must be 1-64 printable characters")
	}
	if len(e.Name) > MaxStringLen || !printable(e.Name) {
		return fieldErr("name", truncate(e.Name, 80), ReasonInvalid, "must be at most %d printable characters", MaxStringLen)
	}
	return nil
}

// validateDetail checks the detail, and decodes a rollout's (the zero
// value for other kinds).
func (e *Event) validateDetail() (RolloutDetail, error) {
	var d RolloutDetail
	maxDetail := 4 * MaxStringLen
	if e.Kind == EventRollout {
		maxDetail = MaxRolloutDetail // two sketches
	}
	if len(e.Detail) > maxDetail || !printable(e.Detail) {
		return d, fieldErr("detail", truncate(e.Detail, 80), ReasonInvalid, "must be at most %d printable characters", maxDetail)
	}
	var err error
	switch e.Kind {
	case EventRollout:
		d, err = ParseRollout(e.Detail)
	case EventFlopCount:
		_, err = ParseFlopCount(e.Detail)
	}
	if err != nil {
		return d, fieldErr("detail", truncate(e.Detail, 80), ReasonInvalid, "%v", err)
	}
	return d, nil
}

// validatePlace checks the event's node, attempt, step and period (an end
// left out is its start).
func (e *Event) validatePlace() error {
	if len(e.Node) > MaxStringLen || !printable(e.Node) {
		return fieldErr("node", truncate(e.Node, 80), ReasonInvalid, "must be at most %d printable characters", MaxStringLen)
	}
	if e.Attempt < 0 {
		return fieldErr("attempt", e.Attempt, ReasonNegative, "must not be negative")
	}
	if e.Attempt > MaxAttempt {
		return fieldErr("attempt", e.Attempt, ReasonOutOfRange, "above the limit of %d", MaxAttempt)
	}
	if e.Step < 0 || e.Step > MaxStep {
		return fieldErr("step", e.Step, ReasonOutOfRange, "must be 0 to %d", MaxStep)
	}
	if e.StartUnixNs < MinUnixNs {
		return fieldErr("start_unix_ns", e.StartUnixNs, ReasonOutOfRange, "before 2000-01-01: not a Unix time in nanoseconds")
	}
	if e.EndUnixNs == 0 {
		e.EndUnixNs = e.StartUnixNs
	}
	if e.EndUnixNs < e.StartUnixNs {
		return fieldErr("end_unix_ns", e.EndUnixNs, ReasonOutOfRange, "before start_unix_ns=%d", e.StartUnixNs)
	}
	return nil
}

// RunMeta describes a job: topology, model, hardware and price. It comes from
// the launcher, from rank 0, or from a file given to the collector; later
// fields override earlier ones field by field (see Merge).
type RunMeta struct {
	Job          string     `json:"job"`
	Topology     Topology   `json:"topology"`
	MicroBatches int        `json:"micro_batches,omitempty"`
	Interleave   int        `json:"interleave,omitempty"` // virtual pipeline stages per rank
	ModelPreset  string     `json:"model_preset,omitempty"`
	Model        *mfu.Model `json:"model,omitempty"`
	Seq          int        `json:"seq,omitempty"` // overrides the model's
	DType        string     `json:"dtype,omitempty"`
	// Tokenizer names the tokenizer (free text, e.g. "llama3"): report
	// --compare says when two runs' differ.
	Tokenizer  string  `json:"tokenizer,omitempty"`
	GPU        string  `json:"gpu,omitempty"` // table key or NVML name
	PeakTFLOPS float64 `json:"peak_tflops,omitempty"`
	Attention  string  `json:"attention,omitempty"`
	Recompute  string  `json:"recompute,omitempty"`
	GPUHourUSD float64 `json:"gpu_hour_usd,omitempty"`
	// TokenSource says what counted the job's tokens (a key of
	// TokenSourceText), as the Python package sends it once it knows.
	TokenSource string `json:"token_source,omitempty"`
	// DataSource says what the steps' data wait is (a key of
	// DataSourceText): a timed fetch's wait, or the time before each
	// step's first forward when batches come from elsewhere.
	DataSource string `json:"data_source,omitempty"`
	// Steps says where the job's steps begin: StepsLoop, or "" (unsaid:
	// an older producer's steps, which began at their first measured
	// activity and left the time between steps out).
	Steps string `json:"steps,omitempty"`
	// Unmeasured are the measures the Python package could not take in
	// this job (its torch lacks the hook, the model is compiled…), by a
	// key of UnmeasuredText, each with why: the report says so instead of
	// showing a silent zero.
	Unmeasured map[string]string `json:"unmeasured,omitempty"`
	// Hooks are the Python package's hook families (communication, loss,
	// checkpoints, pipelining, ddp_buckets) and how each is hooked
	// ("dispatcher", "functions", "reducer", "comm hook", "on") or why it
	// is not ("off: …"), as rank 0 installed
	// them: the report lists those that are off.
	Hooks map[string]string `json:"hooks,omitempty"`
}

// unmeasured are the measures RunMeta.Unmeasured can name, with the words
// the report says them in.
var unmeasured = map[string]string{
	"counted_flops": "FLOPs counted by PyTorch",
	"communication": "communication",
	"backward":      "the backward pass",
	"memory":        "device memory",
}

// UnmeasuredText is the report's words for a measure key; false for a
// key no measure has.
func UnmeasuredText(key string) (string, bool) {
	t, ok := unmeasured[key]
	return t, ok
}

// MaxUnmeasuredWhy bounds the reason given for a measure not taken.
const MaxUnmeasuredWhy = 200

// CheckUnmeasured rejects unknown measures and reasons that are too long
// or not printable, and hook records that are too many, too long or not
// printable.
func (m *RunMeta) CheckUnmeasured() error {
	for k, why := range m.Unmeasured {
		if _, ok := unmeasured[k]; !ok {
			return fmt.Errorf("unmeasured: unknown measure %.40q", k)
		}
		if len(why) > MaxUnmeasuredWhy || !printable(why) {
			return fmt.Errorf("unmeasured %s: the reason must be printable and at most %d bytes", k, MaxUnmeasuredWhy)
		}
	}
	if len(m.Hooks) > maxHookFamilies {
		return fmt.Errorf("hooks: %d families (at most %d)", len(m.Hooks), maxHookFamilies)
	}
	for k, how := range m.Hooks {
		if k == "" || len(k) > 32 || !printable(k) || len(how) > MaxUnmeasuredWhy || !printable(how) {
			return fmt.Errorf("hooks: family %.40q: its name (1-32 bytes) and state (at most %d bytes) must be printable", k, MaxUnmeasuredWhy)
		}
	}
	return nil
}

// maxHookFamilies bounds RunMeta.Hooks.
const maxHookFamilies = 16

// HooksOff are the hook families that are off, each with why, sorted.
func (m *RunMeta) HooksOff() []string {
	var out []string
	for k, how := range m.Hooks {
		if why, ok := strings.CutPrefix(how, "off"); ok {
			out = append(out, k+": "+cmp.Or(strings.TrimSpace(strings.TrimPrefix(why, ":")), "off"))
		}
	}
	slices.Sort(out)
	return out
}

// tokenSources are what can count a job's tokens, by the key RunMeta's
// TokenSource holds, with the words the report says them in.
var tokenSources = map[string]string{
	"loader":   "the batches of the job's DataLoaders",
	"forward":  "the watched model's forward inputs (no DataLoader batch in the step)",
	"function": "the job's tokens= function",
	"declared": "what the job or its framework callback declared (add_tokens, add_batch)",
	"per_step": "a declared count per step (--tokens-per-step, TPSPROF_TOKENS_PER_STEP)",
	"none":     "nothing: no DataLoader batch, forward input or declaration held token ids",
}

// dataSources are what a step's data wait measures, by the key RunMeta's
// DataSource holds, with the words the report says them in.
var dataSources = map[string]string{
	"loader":         "the waits of the job's DataLoaders (or wrapped iterables) for each batch",
	"before_forward": "the time from each step's start to its first forward, less the training thread's CPU work there (host work; batches from no DataLoader, e.g. a get_batch)",
}

// DataSourceText is the report's words for a data source key; false for
// a key no source has.
func DataSourceText(key string) (string, bool) {
	t, ok := dataSources[key]
	return t, ok
}

// TokenSourceText is the report's words for a token source key; false
// for a key no source has.
func TokenSourceText(key string) (string, bool) {
	t, ok := tokenSources[key]
	return t, ok
}

// Merge overlays the fields o sets onto m.
func (m *RunMeta) Merge(o RunMeta) {
	if o.Job != "" {
		m.Job = o.Job
	}
	if o.Topology != (Topology{}) {
		m.Topology = o.Topology
	}
	if o.MicroBatches > 0 {
		m.MicroBatches = o.MicroBatches
	}
	if o.Interleave > 0 {
		m.Interleave = o.Interleave
	}
	if o.ModelPreset != "" {
		m.ModelPreset, m.Model = o.ModelPreset, nil
	}
	if o.Model != nil {
		m.Model, m.ModelPreset = o.Model, ""
	}
	if o.Seq > 0 {
		m.Seq = o.Seq
	}
	for _, f := range []struct{ dst, src *string }{{&m.DType, &o.DType}, {&m.GPU, &o.GPU}, {&m.Attention, &o.Attention}, {&m.Recompute, &o.Recompute}, {&m.Tokenizer, &o.Tokenizer}, {&m.TokenSource, &o.TokenSource}, {&m.DataSource, &o.DataSource}, {&m.Steps, &o.Steps}} {
		if *f.src != "" {
			*f.dst = *f.src
		}
	}
	if o.PeakTFLOPS > 0 {
		m.PeakTFLOPS = o.PeakTFLOPS
	}
	if o.GPUHourUSD > 0 {
		m.GPUHourUSD = o.GPUHourUSD
	}
	for k, why := range o.Unmeasured { // each measure said once, as it is found
		if m.Unmeasured == nil {
			m.Unmeasured = map[string]string{}
		}
		m.Unmeasured[k] = why
	}
	if len(o.Hooks) > 0 {
		m.Hooks = maps.Clone(o.Hooks) // the latest install's record, whole
	}
}

// ResolvedModel returns the model spec of the meta, with Seq applied.
func (m *RunMeta) ResolvedModel() (mfu.Model, bool, error) {
	var model mfu.Model
	switch {
	case m.Model != nil:
		model = *m.Model
	case m.ModelPreset != "":
		p, err := mfu.Preset(m.ModelPreset)
		if err != nil {
			return mfu.Model{}, false, err
		}
		model = p
	default:
		return mfu.Model{}, false, nil
	}
	if m.Seq > 0 {
		model.Seq = m.Seq
	}
	return model, true, nil
}

// Peak returns the dense peak FLOP/s per GPU: the explicit figure, or the
// table's for GPU at DType (bf16 by default). gpuSeen is the name NVML
// reported, used when the meta names none.
func (m *RunMeta) Peak(gpuSeen string) (float64, error) {
	if m.PeakTFLOPS > 0 {
		return m.PeakTFLOPS * 1e12, nil
	}
	name := m.GPU
	if name == "" {
		name = gpuSeen
	}
	if name == "" {
		return 0, fmt.Errorf("%w: no GPU named and none reported by NVML", mfu.ErrNoPeak)
	}
	g, err := mfu.LookupGPU(name)
	if err != nil {
		return 0, err
	}
	dt := mfu.BF16
	if m.DType != "" {
		if dt, err = mfu.ParseDType(m.DType); err != nil {
			return 0, err
		}
	}
	return g.Peak(dt)
}

// AccumulatorConfig derives the aggregation settings of the job: its
// topology for world, and FLOPs and peak when the meta allows. The error
// says why MFU cannot be computed; the config is usable regardless.
func (m *RunMeta) AccumulatorConfig(world int, gpuSeen string) (AccumulatorConfig, error) {
	cfg, err := m.accumulatorConfig(world, gpuSeen)
	if err != nil {
		cfg.MFUUnknown = err.Error()
	}
	return cfg, err
}

func (m *RunMeta) accumulatorConfig(world int, gpuSeen string) (AccumulatorConfig, error) {
	cfg := AccumulatorConfig{Topology: m.Topology}
	var mismatch error
	if cfg.Topology == (Topology{}) || cfg.Topology.Validate(world) != nil {
		if cfg.Topology != (Topology{}) {
			// Tokens are then counted per rank: MFU from them is not the
			// job's, whatever it comes to.
			mismatch = fmt.Errorf("the run's topology %s is %d GPUs but the ranks report a world of %d: tokens are counted once per rank, not per data-parallel replica, so MFU is not computed", cfg.Topology, cfg.Topology.WorldSize(), world)
		}
		cfg.Topology = DataParallel(world)
	}
	model, ok, err := m.ResolvedModel()
	if err != nil {
		return cfg, err
	}
	if !ok {
		return cfg, fmt.Errorf("no model in the run metadata: MFU is not computed")
	}
	c, err := model.Count(mfu.Attention(m.Attention), mfu.Recompute(m.Recompute))
	if err != nil {
		return cfg, err
	}
	cfg.FLOPsPerToken, cfg.HWFLOPsPerToken = c.FLOPsPerToken, c.HWFLOPsPerToken
	cfg.DenseFLOPsPerToken, cfg.AttnFLOPsPerSeqSq = c.DenseFLOPsPerToken, c.AttentionFLOPsPerSeqSq
	peak, err := m.Peak(gpuSeen)
	if err != nil {
		return cfg, err
	}
	if math.IsNaN(peak) || peak <= 0 {
		return cfg, fmt.Errorf("peak %g is not positive", peak)
	}
	cfg.PeakFLOPSPerGPU = peak
	return cfg, mismatch
}

// TraceFigures is the Detail of a trace_analysis event: one step's figures
// from its profiler trace (microseconds), measured on the GPU timeline
// (Device "gpu") or from CPU operators (Device "cpu").
type TraceFigures struct {
	Device        string            `json:"device"`
	DurationUs    float64           `json:"duration_us"`
	ComputeUs     float64           `json:"compute_us"`
	CommUs        float64           `json:"comm_us"`
	ExposedCommUs float64           `json:"exposed_comm_us"`
	MemoryUs      float64           `json:"memory_us"`
	OverlapPct    *float64          `json:"overlap_pct"`
	Collectives   []TraceCollective `json:"collectives,omitempty"`
}

// TraceCollective is one kind of collective in TraceFigures.
type TraceCollective struct {
	Kind   string  `json:"kind"`
	Count  int64   `json:"count"`
	TimeUs float64 `json:"time_us"`
	Bytes  int64   `json:"bytes,omitempty"`
}
