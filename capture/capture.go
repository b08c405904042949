// Package capture profiles the same steps on every rank of a running job at
// once, on demand (`tpsprof trace`), and merges what the ranks saw: per
// rank, computation, communication, exposed communication and idle time;
// per collective, matched across ranks, who arrived last and how long the
// others waited for it.
//
// It owns the capture's protocol (probe, choose the step, start, gather:
// run.go, gathering.go) and the merge (align, match, attribute:
// merge.go). It never touches a training process itself: the agents ask
// the ranks and analyse their traces.
//
// The path of a capture (docs/capture.md, "On-demand capture"):
//
//  1. The command asks every agent, on wire.CaptureSubject(job) ("probe"),
//     which ranks of the job it serves and at which step they are.
//  2. It picks the first step to capture (far enough ahead that the request
//     reaches every rank first) and sends "start"; each agent writes the
//     request as one line on the intake connection of each targeted rank.
//     The training process reads it on its sender thread, never on the
//     training thread, and looks at it only where a step begins.
//  3. Every targeted rank profiles the same step numbers with
//     torch.profiler and hands the traces to its agent, which analyses them
//     off the training process and publishes each rank's figures and
//     collective calls (Report) to the command's reply subject, with the
//     trace itself in chunks when asked to keep it.
//  4. The command merges the reports as they come (Merge), bounded by its
//     timeout, naming the ranks that never answered.
package capture

import (
	"fmt"
	"regexp"

	"github.com/tpsprof/tpsprof/kineto"
	"github.com/tpsprof/tpsprof/tps"
)

// Request is what `tpsprof trace` publishes on wire.CaptureSubject(Job).
type Request struct {
	Op  string `json:"op"` // "probe" or "start"
	ID  string `json:"id"`
	Job string `json:"job"`
	// AtStep is the first step to profile; Steps how many (start only).
	AtStep int64 `json:"at_step,omitempty"`
	Steps  int64 `json:"steps,omitempty"`
	// Ranks restricts the capture to these ranks; Node to that node's.
	Ranks []int64 `json:"ranks,omitempty"`
	Node  string  `json:"node,omitempty"`
	// Keep sends each trace back (in chunks) besides its figures.
	Keep bool `json:"keep,omitempty"`
	// Reply is where the agents publish their Reports; TimeoutMs how long
	// the agents keep the capture open.
	Reply     string `json:"reply,omitempty"`
	TimeoutMs int64  `json:"timeout_ms,omitempty"`
}

// Bounds of a request.
const (
	MaxSteps = 8
	// MaxKeepBytes caps one kept trace (compressed); a larger one is not
	// sent back, and its figures still are.
	MaxKeepBytes = 64 << 20
	// ChunkBytes is the size of the pieces a kept trace travels in.
	ChunkBytes = 256 << 10
	// MaxReportCalls bounds the calls of one step a report carries (about
	// 120 bytes each: a NATS message holds 1 MiB by default).
	MaxReportCalls = 6000
	// MaxViewCollectives bounds the matched calls a View lists (those the
	// ranks waited longest at are kept).
	MaxViewCollectives = 2000
	// What the command side takes of the answers to one capture, checked
	// before anything is allocated for them (a forged answer can claim
	// any world size, rank list or number of pieces): agents answering,
	// ranks taken part, reports' bytes, and the kept traces' bytes held
	// until they are written.
	// MaxStepsAhead: a capture starts at most this many steps past where
	// the job's ranks are (agents refuse a start further ahead: every other
	// capture of the job would wait for it).
	MaxStepsAhead = 100_000
	// MaxSecondsAhead: nor further than this at the ranks' pace (a start
	// 3,000 steps ahead with a 10-minute timeout held the job's capture
	// slot for 300 s, and again when asked again).
	MaxSecondsAhead = 60
	MaxAcks         = 4096
	MaxCaptureRanks = 1 << 16
	MaxReportsBytes = 256 << 20
	MaxKeptBytes    = 1 << 30
	maxPiecesATrace = MaxKeepBytes/ChunkBytes + 1
)

// The bounds Run applies (the tests lower them).
var reportsBudget, keptBudget int64 = MaxReportsBytes, MaxKeptBytes

var idRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Validate checks a request as an agent receives it.
func (r *Request) Validate() error {
	switch {
	case r.Op != "probe" && r.Op != "start":
		return fmt.Errorf("capture: unknown op %q", r.Op)
	case !tps.ValidJobID(r.Job):
		return fmt.Errorf("capture: invalid job id")
	case !idRE.MatchString(r.ID):
		return fmt.Errorf("capture: invalid capture id")
	case len(r.Ranks) > 1<<16:
		return fmt.Errorf("capture: too many ranks")
	}
	if r.Op == "start" {
		switch {
		case r.AtStep < 0:
			return fmt.Errorf("capture: negative step")
		case r.Steps < 1 || r.Steps > MaxSteps:
			return fmt.Errorf("capture: steps must be 1 to %d", MaxSteps)
		case r.Reply == "":
			return fmt.Errorf("capture: no reply subject")
		case r.TimeoutMs <= 0 || r.TimeoutMs > 3_600_000:
			return fmt.Errorf("capture: timeout out of range")
		}
	}
	return nil
}

// Targets says whether the request is for rank on node.
func (r *Request) Targets(node string, rank int64) bool {
	if r.Node != "" && r.Node != node {
		return false
	}
	if len(r.Ranks) == 0 {
		return true
	}
	for _, x := range r.Ranks {
		if x == rank {
			return true
		}
	}
	return false
}

// Ack is an agent's answer to a probe or a start: the ranks of the job it
// serves (for a start, those it handed the request to).
type Ack struct {
	Node  string      `json:"node"`
	Ranks []RankState `json:"ranks"`
	Err   string      `json:"error,omitempty"`
}

// RankState is what an agent knows of one rank's connection.
type RankState struct {
	Rank      int64 `json:"rank"`
	WorldSize int64 `json:"world_size"`
	// Step is the latest step record received; StepsPerSec the rank's pace
	// over its connection's life so far (0 before two records), by the
	// records' own end times; SinceMs how long ago that step ended.
	Step        int64   `json:"step"`
	StepsPerSec float64 `json:"steps_per_sec"`
	SinceMs     int64   `json:"since_ms,omitempty"`
}

// maxExtrapolateMs bounds how far Now reaches past the latest record: the
// Python package sends a rank's records in batches, at most 0.3 s apart
// while it trains; a rank silent longer is paused (an evaluation, a
// checkpoint), not stepping at its pace.
const maxExtrapolateMs = 1000

// Now is where the rank most likely is: its latest record's step, plus its
// pace times the time since that step ended (at most a second). The
// package sends records in batches (up to 16 steps or 0.25 s), so the
// latest record lags the rank.
func (r RankState) Now() int64 {
	ms := min(max(r.SinceMs, 0), maxExtrapolateMs)
	if r.StepsPerSec <= 0 || r.StepsPerSec > maxStepsPerSec {
		return r.Step
	}
	return r.Step + int64(r.StepsPerSec*float64(ms)/1000)
}

// Report is what an agent publishes to a capture's reply subject for a
// rank: that it accepted the request, each traced step's figures and
// calls, or why it cannot take part.
type Report struct {
	ID    string `json:"id"`
	Node  string `json:"node"`
	Rank  int64  `json:"rank"`
	State string `json:"state"` // accepted, traced, failed
	Step  int64  `json:"step"`
	Why   string `json:"why,omitempty"`
	// traced:
	Device  string           `json:"device,omitempty"`
	Figures kineto.StepStats `json:"figures"`
	Calls   []kineto.Call    `json:"calls,omitempty"`
	// ProcessGroups is how many process groups the rank's trace says the
	// job had (0: not said).
	ProcessGroups int              `json:"process_groups,omitempty"`
	CallsDropped  int64            `json:"calls_dropped,omitempty"`
	Coords        map[string]int64 `json:"coords,omitempty"`
	Chunks        int              `json:"chunks,omitempty"` // kept trace pieces that follow
	TraceBytes    int64            `json:"trace_bytes,omitempty"`
	// Record is the rank's own step record of the step, when the agent
	// held it for the trace's figures: what the verdict is checked against.
	Record *RecordFigures `json:"record,omitempty"`
}

// RecordFigures are a rank's step record's own times (ns): its duration,
// compute (the duration less exposed communication, data, pipeline and
// checkpoint waits), data wait, exposed communication, and the measured
// forward, backward and optimizer (0 when not measured).
type RecordFigures struct {
	DurationNs    int64 `json:"duration_ns"`
	ComputeNs     int64 `json:"compute_ns"`
	DataWaitNs    int64 `json:"data_wait_ns"`
	ExposedCommNs int64 `json:"exposed_comm_ns"`
	FwdNs         int64 `json:"fwd_ns,omitempty"`
	BwdNs         int64 `json:"bwd_ns,omitempty"`
	OptimNs       int64 `json:"optim_ns,omitempty"`
}

// Report states.
const (
	StateAccepted = "accepted"
	StateTraced   = "traced"
	StateFailed   = "failed"
)

// Chunk headers: a kept trace's pieces carry these instead of a Report.
const (
	HeaderChunk = "Tpsprof-Chunk" // "rank/step/seq"
	HeaderID    = "Tpsprof-Capture"
)
