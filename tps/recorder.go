package tps

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Sink receives finished step records. RecordStep must not block the
// training loop: an implementation that ships records elsewhere queues or
// drops, it never waits. The record is passed by value; a sink that keeps
// it must copy what the pointers point to if the caller may reuse them.
type Sink interface {
	RecordStep(StepRecord)
}

// SinkFunc adapts a function to a Sink.
type SinkFunc func(StepRecord)

// RecordStep calls f.
func (f SinkFunc) RecordStep(r StepRecord) { f(r) }

// Phase names a part of a step whose duration a Recorder accumulates.
type Phase uint8

// The phases of a step, matching the StepRecord fields of the same names.
const (
	PhaseDataWait Phase = iota
	PhaseFwd
	PhaseBwd
	PhaseOptim
	PhaseComm
	PhaseExposedComm
	PhasePPWait
	PhaseCkpt
	numPhases
)

// RecorderConfig identifies the rank a Recorder speaks for.
type RecorderConfig struct {
	Job       string
	Attempt   int64
	Rank      int64
	WorldSize int64
	// Topology, when set, fills the rank's parallel coordinates.
	Topology  Topology
	Node      string
	GPUUUID   string
	LocalRank *int32
}

// Recorder errors.
var (
	ErrNotStarted = errors.New("tps: End called without Start")
	ErrNilSink    = errors.New("tps: nil sink")
)

// Recorder times the steps of one rank and hands a StepRecord per step to a
// Sink. It is safe for concurrent use and allocates nothing per step.
type Recorder struct {
	mu      sync.Mutex
	sink    Sink
	base    StepRecord
	coords  [5]int32
	started bool
	step    int64
	start   time.Time
	phases  [numPhases]int64
	// where the last step ended, and whether the next one begins there
	lastEnd time.Time
	chained bool

	sent, rejected atomic.Int64
}

// NewRecorder checks cfg and returns a Recorder sending to sink.
func NewRecorder(cfg RecorderConfig, sink Sink) (*Recorder, error) {
	if sink == nil {
		return nil, ErrNilSink
	}
	r := &Recorder{sink: sink}
	r.base = StepRecord{
		Job: cfg.Job, Attempt: cfg.Attempt, Rank: cfg.Rank, WorldSize: cfg.WorldSize,
		Node: cfg.Node, GPUUUID: cfg.GPUUUID, LocalRank: cfg.LocalRank,
		// Placeholders that make the static checks pass; End sets real values.
		StartUnixNs: MinUnixNs, EndUnixNs: MinUnixNs + 1, DurationNs: 1,
	}
	if err := r.base.Validate(); err != nil {
		return nil, err
	}
	if cfg.Topology != (Topology{}) {
		if err := cfg.Topology.Validate(int(cfg.WorldSize)); err != nil {
			return nil, err
		}
		c := cfg.Topology.Coords(int(cfg.Rank))
		r.coords = [5]int32{int32(c.DP), int32(c.TP), int32(c.PP), int32(c.CP), int32(c.EP)}
		r.base.DPRank, r.base.TPRank, r.base.PPRank = &r.coords[0], &r.coords[1], &r.coords[2]
		r.base.CPRank, r.base.EPRank = &r.coords[3], &r.coords[4]
	}
	return r, nil
}

// Start marks the beginning of step. A step is the loop's period: it
// begins where the previous step ended (its End), so the time between an
// End and the next Start (fetching the next batch, logging) is the step's
// and lands in its host/other share, never between steps. The first Start,
// and one after Gap, begin at their own call. A Start without End of the
// previous step discards the previous one (and begins at its own call).
func (r *Recorder) Start(step int64) {
	now := time.Now()
	r.mu.Lock()
	start := now
	if r.chained && !r.started {
		start = r.lastEnd
	}
	r.started, r.step, r.start, r.chained = true, step, start, false
	r.phases = [numPhases]int64{}
	r.mu.Unlock()
}

// Gap says the time since the last End is no step's (an evaluation, a
// checkpoint, a pause: send its event, e.g. EventEval, so that the report
// names it): the next Start begins at its own call.
func (r *Recorder) Gap() {
	r.mu.Lock()
	r.chained = false
	r.mu.Unlock()
}

// AddPhase adds d to a phase of the current step.
func (r *Recorder) AddPhase(p Phase, d time.Duration) {
	if p >= numPhases || d <= 0 {
		return
	}
	r.mu.Lock()
	r.phases[p] += int64(d)
	r.mu.Unlock()
}

// End closes the current step with the tokens the rank's data-parallel
// replica consumed in it and sends the record. It returns the validation
// error of a bad record (which is then counted and not sent).
func (r *Recorder) End(tokens int64) error {
	end := time.Now()
	r.mu.Lock()
	if !r.started {
		r.mu.Unlock()
		return ErrNotStarted
	}
	r.started, r.lastEnd, r.chained = false, end, true
	rec := r.base
	rec.Step = r.step
	rec.StartUnixNs = r.start.UnixNano()
	rec.EndUnixNs = end.UnixNano()
	rec.DurationNs = int64(end.Sub(r.start)) // monotonic
	if rec.DurationNs <= 0 {
		rec.DurationNs = 1
	}
	rec.Tokens = tokens
	setPhases(&rec, &r.phases)
	r.mu.Unlock()
	return r.send(&rec)
}

// Phases holds optional phase durations for Record.
type Phases struct {
	DataWait, Fwd, Bwd, Optim, Comm, ExposedComm, PPWait, Ckpt time.Duration
}

// Record sends a step timed by the caller (a launcher that parses a
// framework's log, say). end−start is used as the duration.
func (r *Recorder) Record(step int64, start, end time.Time, tokens int64, p Phases) error {
	rec := r.base
	rec.Step = step
	rec.StartUnixNs, rec.EndUnixNs = start.UnixNano(), end.UnixNano()
	rec.DurationNs = int64(end.Sub(start))
	rec.Tokens = tokens
	ph := [numPhases]int64{int64(p.DataWait), int64(p.Fwd), int64(p.Bwd), int64(p.Optim), int64(p.Comm), int64(p.ExposedComm), int64(p.PPWait), int64(p.Ckpt)}
	setPhases(&rec, &ph)
	return r.send(&rec)
}

func setPhases(rec *StepRecord, p *[numPhases]int64) {
	rec.DataWaitNs, rec.FwdNs, rec.BwdNs, rec.OptimNs = p[PhaseDataWait], p[PhaseFwd], p[PhaseBwd], p[PhaseOptim]
	rec.CommNs, rec.ExposedCommNs, rec.PPWaitNs, rec.CkptNs = p[PhaseComm], p[PhaseExposedComm], p[PhasePPWait], p[PhaseCkpt]
}

func (r *Recorder) send(rec *StepRecord) error {
	if err := rec.Validate(); err != nil {
		r.rejected.Add(1)
		return err
	}
	r.sink.RecordStep(*rec)
	r.sent.Add(1)
	return nil
}

// Counts returns how many records were sent to the sink and how many were
// rejected by validation.
func (r *Recorder) Counts() (sent, rejected int64) { return r.sent.Load(), r.rejected.Load() }
