package agent

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tpsprof/tpsprof/internal/safefs"
	"github.com/tpsprof/tpsprof/kineto"
	"github.com/tpsprof/tpsprof/tps"
)

// EnvTraceDir is where ranks write sampled profiler traces for the agent.
const EnvTraceDir = "TPSPROF_TRACE_DIR"

// MaxTraceBytes bounds a trace the agent analyses.
const MaxTraceBytes = 2 << 30

// DefaultTraceDir is the trace folder of the agent serving socket: beside
// it, so that launch and the Python package find it from the socket path.
func DefaultTraceDir(socket string) string { return socket + ".traces" }

// TraceNote announces a profiler trace of one step that a rank wrote
// (intake line type "trace").
type TraceNote struct {
	Job     string `json:"job"`
	Attempt int64  `json:"attempt"`
	Step    int64  `json:"step"`
	Rank    int64  `json:"rank"`
	Path    string `json:"path"`
	// Capture is the on-demand capture the trace was taken for ("" for a
	// sampled trace); Coords and WorldSize go into its kept copy.
	Capture   string           `json:"capture,omitempty"`
	Coords    map[string]int64 `json:"coords,omitempty"`
	WorldSize int64            `json:"world_size,omitempty"`
	// ProcessGroups is how many process groups the rank belongs to, as
	// the package counted them (a CPU trace does not name each call's).
	ProcessGroups int `json:"process_groups,omitempty"`
}

// SubmitTrace queues a trace for analysis off the training process. The
// path must be a regular file inside the agent's trace folder; a full queue
// drops the trace (counted as trace:queue_full) rather than wait.
func (a *Agent) SubmitTrace(n TraceNote) error {
	if !tps.ValidJobID(n.Job) || n.Step < 0 || n.Rank < 0 || n.Attempt < 0 {
		a.reject("trace:invalid")
		return fmt.Errorf("agent: trace note: invalid job, step, rank or attempt")
	}
	path, err := a.tracePath(n.Path)
	if err != nil {
		a.reject("trace:path")
		a.log.Warn("trace", "trace refused", "err", err)
		return err
	}
	n.Path = path
	// The wait is registered before the worker can see the note: a worker
	// that analyses the trace at once would otherwise settle a wait not
	// yet there, and the step's record would then be held for traceHold
	// and go without its figures (seen under load).
	a.expectTrace(n)
	select {
	case a.traces <- n:
		if testHookTraceQueued != nil {
			testHookTraceQueued()
		}
		return nil
	default:
		a.unexpectTrace(n)
		a.reject("trace:queue_full")
		a.removeTrace(path)
		return fmt.Errorf("agent: trace queue full; %s dropped", path)
	}
}

// tracePath accepts only regular files (no links) in the trace folder.
func (a *Agent) tracePath(p string) (string, error) {
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("agent: trace path %q is not absolute", p)
	}
	p = filepath.Clean(p)
	dir := filepath.Clean(a.cfg.TraceDir)
	if filepath.Dir(p) != dir {
		return "", fmt.Errorf("agent: trace %q is not in the trace folder %s", p, dir)
	}
	if a.traceDirErr != nil {
		return "", fmt.Errorf("agent: trace folder refused: %w", a.traceDirErr)
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return "", fmt.Errorf("agent: trace: %w", err)
	}
	if !fi.Mode().IsRegular() {
		// a link, FIFO or device in our own folder: removed (the entry
		// itself, never what a link points to), so none piles up
		os.Remove(p)
		return "", fmt.Errorf("agent: trace %q is not a regular file (removed)", p)
	}
	if fi.Size() > MaxTraceBytes {
		a.removeTrace(p)
		return "", fmt.Errorf("agent: trace %q is larger than %d bytes", p, MaxTraceBytes)
	}
	return p, nil
}

// Bounds of one trace analysis in the agent: its memory follows the events
// of the trace's densest step (Config.TraceMaxEvents), and a small gzip
// can unpack to gigabytes. A trace past either is not analysed (counted as
// trace:unreadable) and its step's record is released at once.
const (
	MaxTraceUncompressedBytes = 4 << 30
	DefaultTraceMaxEvents     = 2_000_000
)

// analyseFile analyses a trace that was checked to be a regular file when
// it was announced; it is opened again without following a link and
// without blocking, so that a FIFO or device swapped in since is refused
// instead of hanging the trace worker. Closing stop ends the analysis at
// its next read (an agent told to stop does not wait for a trace that
// takes a minute to unpack).
func analyseFile(path string, calls bool, maxEvents int64, stop <-chan struct{}) (*kineto.Result, error) {
	f, err := safefs.OpenRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r, err := kineto.AnalyzeWith(f, kineto.Options{MaxBytes: MaxTraceUncompressedBytes, MaxEvents: maxEvents, Calls: calls, Stop: stop})
	if err != nil {
		return nil, fmt.Errorf("%s: %s", path, strings.TrimPrefix(err.Error(), "kineto: "))
	}
	r.File = path
	return r, nil
}

func (a *Agent) removeTrace(p string) {
	if !a.cfg.KeepTraces {
		os.Remove(p)
	}
}

// analyseTraces is the agent's trace worker: one trace at a time, so the
// node's training processes never compete with more than one core of it.
func (a *Agent) analyseTraces() {
	defer a.wg.Done()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-a.done:
			return
		case n := <-a.traces:
			a.analyseTrace(n)
		case <-tick.C:
			a.releaseWaits(traceHold)
			a.forgetCaptures()
			a.forgetOwners()
		}
	}
}

func (a *Agent) analyseTrace(n TraceNote) {
	defer a.removeTrace(n.Path)
	start := time.Now()
	r, err := analyseFile(n.Path, n.Capture != "", a.cfg.TraceMaxEvents, a.done)
	select {
	case <-a.done:
		if err != nil { // abandoned: Close releases the held record
			return
		}
	default:
	}
	if err != nil {
		a.reject("trace:unreadable")
		a.log.Warn("trace", "profiler trace not analysed", "err", err)
		a.settle(n, nil, nil)
		if n.Capture != "" {
			a.captureTrace(n, nil, nil, "trace not analysed: "+err.Error(), nil)
		}
		return
	}
	// The noted step's figures; a trace without that ProfilerStep gives
	// none (its totals would be another span of time than the step's).
	var s *kineto.StepStats
	for i := range r.Steps {
		if r.Steps[i].Step == n.Step {
			s = &r.Steps[i]
		}
	}
	if s == nil {
		a.reject("trace:no_step")
		a.log.Warn("trace", "profiler trace has no ProfilerStep of the noted step", "path", n.Path, "step", n.Step)
		a.settle(n, nil, nil)
		if n.Capture != "" {
			a.captureTrace(n, nil, nil, "the trace has no ProfilerStep of the step", nil)
		}
		return
	}
	f := tps.TraceFigures{Device: r.Device, DurationUs: s.DurationUs, ComputeUs: s.ComputeUs, CommUs: s.CommUs,
		ExposedCommUs: s.ExposedCommUs, MemoryUs: s.MemoryUs, OverlapPct: s.OverlapPct}
	if !plausibleFigures(f) {
		a.reject("trace:implausible")
		a.log.Warn("trace", "profiler trace figures out of range: not attached", "path", n.Path, "duration_us", f.DurationUs)
		a.settle(n, nil, nil)
		if n.Capture != "" {
			a.captureTrace(n, nil, nil, "the trace's figures are out of range", nil)
		}
		return
	}
	for _, c := range r.Collectives {
		if len(f.Collectives) == 6 {
			break
		}
		f.Collectives = append(f.Collectives, tps.TraceCollective{Kind: c.Kind, Count: c.Count, TimeUs: c.TimeUs, Bytes: c.Bytes})
	}
	detail, _ := json.Marshal(f)
	for len(detail) > 1000 && len(f.Collectives) > 0 {
		f.Collectives = f.Collectives[:len(f.Collectives)-1]
		detail, _ = json.Marshal(f)
	}
	_ = a.SubmitEvent(tps.Event{Job: n.Job, Attempt: n.Attempt, Kind: tps.EventTraceAnalysis, Rank: n.Rank, Step: n.Step,
		Name: strings.TrimSuffix(filepath.Base(n.Path), ".json"), StartUnixNs: start.UnixNano(), EndUnixNs: time.Now().UnixNano(),
		Detail: string(detail)})
	a.tracesDone.Add(1)
	var send func(*tps.StepRecord)
	if n.Capture != "" {
		send = a.prepareCapture(n, r, s, "")
	}
	if rec, deferred := a.settle(n, &f, send); send != nil && !deferred {
		send(rec)
	}
}

// Attaching trace figures to the rank record of the traced step. The rank
// sends the trace note before the step's record (same connection, same
// order), so the record is held until the analysis is done, at most
// traceHold; figures that arrive first wait for their record as long.
const traceHold = 30 * time.Second

type traceKey struct {
	job                 string
	attempt, step, rank int64
}

// traceJobs are the agent's trace analyses: the traces the ranks wrote,
// queued for the analysing goroutine, and the step records held for
// their step's trace figures.
type traceJobs struct {
	traces      chan TraceNote
	tracesDone  atomic.Int64
	traceMu     sync.Mutex
	waits       map[traceKey]*traceWait // records held for their step's trace figures
	waiting     atomic.Int64            // len(waits), read without the lock
	traceDirErr error                   // why the trace folder was refused (nil: usable)
}

type traceWait struct {
	since time.Time
	rec   *tps.StepRecord   // held record, once it arrived
	figs  *tps.TraceFigures // figures, once analysed (nil if the trace could not be read)
	done  bool              // analysed
	// report sends a capture's analysed trace with the record (nil: none
	// came within captureRecordWait of the analysis, doneAt): the
	// capture's verdict checks the arrivals against the records, and a
	// record that came after the analysis (a rank's record leaves once
	// its collectives complete, or two steps on) was missing from it
	report func(*tps.StepRecord)
	doneAt time.Time
}

// captureRecordWait is how long a capture's analysed trace waits for its
// step's record before it is reported without.
const captureRecordWait = 3 * time.Second

func keyOf(n TraceNote) traceKey { return traceKey{n.Job, n.Attempt, n.Step, n.Rank} }

func (a *Agent) expectTrace(n TraceNote) {
	a.traceMu.Lock()
	if a.waits == nil {
		a.waits = map[traceKey]*traceWait{}
	}
	if len(a.waits) < 4096 {
		a.waits[keyOf(n)] = &traceWait{since: time.Now()}
		a.waiting.Store(int64(len(a.waits)))
	}
	a.traceMu.Unlock()
}

// testHookTraceQueued, when set by a test, runs once a note is queued
// (the worker may analyse it before SubmitTrace returns).
var testHookTraceQueued func()

// unexpectTrace forgets the wait of a note that was not queued.
func (a *Agent) unexpectTrace(n TraceNote) {
	a.traceMu.Lock()
	if w := a.waits[keyOf(n)]; w != nil && w.rec == nil && !w.done {
		a.dropWait(keyOf(n))
	}
	a.traceMu.Unlock()
}

// holdForTrace keeps r while its step's trace is analysed; false when the
// record should go on now.
func (a *Agent) holdForTrace(r *tps.StepRecord) bool {
	if a.waiting.Load() == 0 {
		return false
	}
	k := traceKey{r.Job, r.Attempt, r.Step, r.Rank}
	a.traceMu.Lock()
	w := a.waits[k]
	if w == nil {
		a.traceMu.Unlock()
		return false
	}
	if w.done {
		attachTrace(r, w.figs)
		a.dropWait(k)
		report := w.report
		a.traceMu.Unlock()
		if report != nil {
			cp := *r
			report(&cp)
		}
		return false
	}
	cp := *r
	w.rec = &cp
	a.traceMu.Unlock()
	return true
}

// settle receives the outcome of an analysis (f nil: the trace could not
// be read): a held record goes on, with the figures when there are any;
// otherwise the figures wait for their record.
//
// later, for a capture's trace, is kept to be called with the record
// when it comes (deferred: true), else the caller reports at once.
func (a *Agent) settle(n TraceNote, f *tps.TraceFigures, later func(*tps.StepRecord)) (rec *tps.StepRecord, deferred bool) {
	k := keyOf(n)
	a.traceMu.Lock()
	w := a.waits[k]
	if w != nil {
		if w.rec != nil {
			rec = w.rec
			attachTrace(rec, f)
			a.dropWait(k)
		} else {
			w.figs, w.done = f, true
			if later != nil {
				w.report, w.doneAt, deferred = later, time.Now(), true
			}
		}
	}
	a.traceMu.Unlock()
	if rec != nil {
		a.pub.addStep(*rec)
	}
	return rec, deferred
}

func (a *Agent) dropWait(k traceKey) {
	delete(a.waits, k)
	a.waiting.Store(int64(len(a.waits)))
}

// releaseWaits sends held records older than age (all with age 0) without
// trace figures and forgets stale waits.
func (a *Agent) releaseWaits(age time.Duration) {
	now := time.Now()
	var out []tps.StepRecord
	var reports []func(*tps.StepRecord)
	a.traceMu.Lock()
	for k, w := range a.waits {
		if w.report != nil && (now.Sub(w.doneAt) >= captureRecordWait || now.Sub(w.since) >= age) {
			// the capture hears of the trace without the record; the
			// figures still wait for it
			reports = append(reports, w.report)
			w.report = nil
		}
		if now.Sub(w.since) < age {
			continue
		}
		if w.rec != nil {
			out = append(out, *w.rec)
		}
		a.dropWait(k)
	}
	a.traceMu.Unlock()
	for _, r := range out {
		a.pub.addStep(r)
	}
	for _, report := range reports {
		report(nil)
	}
}

// attachTrace writes trace figures into a record; where the rank measured
// no communication itself, its comm and exposed comm come from the trace.
func attachTrace(r *tps.StepRecord, f *tps.TraceFigures) {
	if f == nil {
		return
	}
	r.TraceComputeNs = int64(f.ComputeUs * 1e3)
	r.TraceCommNs = int64(f.CommUs * 1e3)
	r.TraceExposedCommNs = min(int64(f.ExposedCommUs*1e3), r.TraceCommNs)
	if r.CommNs == 0 && r.TraceCommNs > 0 {
		r.CommNs = r.TraceCommNs
		r.ExposedCommNs = min(r.TraceExposedCommNs, r.DurationNs)
	}
}

// plausibleFigures: finite, not negative, within a day (what the collector
// accepts for a step), an overlap a percentage. Figures past these would
// make the collector reject the whole step record they ride on.
func plausibleFigures(f tps.TraceFigures) bool {
	const day = 86400e6 // µs
	for _, v := range []float64{f.DurationUs, f.ComputeUs, f.CommUs, f.ExposedCommUs, f.MemoryUs} {
		if math.IsNaN(v) || v < 0 || v > day {
			return false
		}
	}
	return f.OverlapPct == nil || (!math.IsNaN(*f.OverlapPct) && *f.OverlapPct >= 0 && *f.OverlapPct <= 100)
}
