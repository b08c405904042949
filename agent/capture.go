package agent

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tpsprof/tpsprof/capture"
	"github.com/tpsprof/tpsprof/internal/safefs"
	"github.com/tpsprof/tpsprof/kineto"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/wire"
)

// On-demand captures (`tpsprof trace`; package capture says the path).
// The agent answers a capture request for the ranks it serves, writes the
// request on their intake connections (the only thing the agent ever
// writes to a training process), relays what the ranks say back, and
// publishes each captured trace's figures and calls to the request's reply
// subject.

// captureRegistry is the agent's on-demand captures: those in progress,
// when each job's last one ended here, and the jobs' capture
// subscriptions, bounded per user.
type captureRegistry struct {
	captureMu sync.Mutex
	captures  map[string]*liveCapture // on-demand captures in progress, by id
	capEnded  map[string]time.Time    // job → when its last capture ended here
	capSubs   sync.Map                // job → *capSub: the job's capture requests, subscribed once it has a rank here
	capSubN   atomic.Int64
	capUIDMu  sync.Mutex
	capSubsOf map[int64]int // uid → capture subscriptions its ranks made (capUIDMu)
	figuresAt sync.Map      // job → unix ns its cluster figures last went to its rank 0 (one a second)
}

// liveCapture is a capture this agent handed to some of its ranks.
type liveCapture struct {
	req   capture.Request
	until time.Time
	// the ranks it was handed to, and how many steps each has traced (-1:
	// it failed); when every one is through, the capture is over here
	ranks map[int64]int64
}

// captureLine is the line written to a rank for a start request.
type captureLine struct {
	Type   string `json:"type"`
	ID     string `json:"id"`
	AtStep int64  `json:"at_step"`
	Steps  int64  `json:"steps"`
}

// captureState is a rank's intake line about a capture (type "capture"):
// accepted, or failed (the step was already past, tracing unavailable).
type captureState struct {
	ID    string `json:"id"`
	Job   string `json:"job"`
	Rank  int64  `json:"rank"`
	State string `json:"state"`
	Step  int64  `json:"step"`
	Why   string `json:"why"`
}

// capSub is an agent's subscription to one job's capture requests: taken
// when a rank of the job first sends a step record on a connection (so an
// agent whose NATS user may only touch its own job's subjects subscribes
// to nothing else), dropped once no connection carries the job.
type capSub struct {
	sub     atomic.Pointer[nats.Subscription]
	figs    atomic.Pointer[nats.Subscription] // the job's cluster figures, for its rank 0
	created time.Time
	uid     int64 // the user whose rank's record made it
}

// capSubGrace keeps a new subscription through the forgetting tick that
// may run between a connection's first record and its noting the job.
const capSubGrace = 10 * time.Second

// maxCapSubs bounds the jobs an agent takes capture requests for;
// maxCapSubsPerUID those of one user's ranks (root's and the agent's own
// user's are not counted against it), so no user's connections use them
// all up.
const (
	maxCapSubs       = 1024
	maxCapSubsPerUID = maxCapSubs / 8
)

func (a *Agent) watchCaptures(job string, uid int64) {
	if _, ok := a.capSubs.Load(job); ok || a.nc == nil || a.capSubN.Load() >= maxCapSubs {
		return
	}
	limited := uid > 0 && uid != int64(os.Geteuid())
	a.capUIDMu.Lock()
	if limited && a.capSubsOf[uid] >= maxCapSubsPerUID {
		a.capUIDMu.Unlock()
		a.reject("capture:uid_limit")
		return
	}
	s := &capSub{created: time.Now(), uid: uid}
	if _, loaded := a.capSubs.LoadOrStore(job, s); loaded {
		a.capUIDMu.Unlock()
		return
	}
	if a.capSubsOf == nil {
		a.capSubsOf = map[int64]int{}
	}
	a.capSubsOf[uid]++
	a.capUIDMu.Unlock()
	a.capSubN.Add(1)
	sub, err := a.nc.Subscribe(wire.CaptureSubject(job), a.handleCapture)
	if err != nil {
		a.log.Warn("capture", "capture requests: subscribe failed", "job", job, "err", err)
		return
	}
	s.sub.Store(sub)
	// the job's cluster figures, for its rank 0's tracker run: a user
	// without the permission still gets captures
	figs, err := a.nc.Subscribe(wire.FiguresSubject(job), func(m *nats.Msg) { a.handleFigures(job, m) })
	if err != nil {
		a.log.Warn("capture", "cluster figures: subscribe failed (captures work; rank 0 logs no cluster figures)", "job", job, "err", err)
	} else {
		s.figs.Store(figs)
	}
	if v, ok := a.capSubs.Load(job); !ok || v != s {
		sub.Unsubscribe() // forgotten meanwhile
		if figs != nil {
			figs.Unsubscribe()
		}
	}
}

// handleFigures hands a job's cluster figures, checked and written anew,
// to the job's rank 0 on this node (latest attempt) as one line
// {"type":"cluster",...}; a forged or broken message is counted, never
// passed on.
func (a *Agent) handleFigures(job string, m *nats.Msg) {
	f, err := wire.DecodeClusterFigures(job, m.Data)
	if err != nil {
		a.reject("figures:invalid")
		return
	}
	var to net.Conn
	var attempt int64 = -1
	var seen *rankSeen
	var step int64
	a.mu.Lock()
	for c, info := range a.conns {
		if s := info.rank.Load(); s != nil && s.job == job && s.rank == 0 && s.attempt > attempt {
			to, attempt, seen, step = c, s.attempt, s, info.step.Load()
		}
	}
	a.mu.Unlock()
	if to == nil {
		return // rank 0 runs on another node
	}
	if why := implausibleFigures(&f, seen.world, step); why != "" {
		a.reject("figures:implausible")
		a.log.Warn("figures:implausible", "cluster figures refused: "+why, "job", job)
		return
	}
	// at most one a second per job: forged figures at 20,000/s filled a
	// job's TensorBoard and took 60% more of its CPU
	now := time.Now().UnixNano()
	if last, ok := a.figuresAt.Load(job); ok && now-last.(int64) < int64(time.Second) {
		a.reject("figures:rate")
		return
	}
	a.figuresAt.Store(job, now)
	line, err := json.Marshal(struct {
		Type string `json:"type"`
		wire.ClusterFigures
	}{"cluster", f})
	if err != nil {
		return
	}
	line = append(line, '\n')
	// outside any lock; net.Conn writes are safe beside the reader and
	// beside a capture request's (one Write each)
	to.SetWriteDeadline(time.Now().Add(writeTimeout))
	if _, err := to.Write(line); err != nil {
		a.reject("figures:write")
	}
}

// MaxTPSPerGPU bounds the tokens a second a cluster figure may claim per
// GPU of the job: far above any training (an H100 trains a 125M-parameter
// model at about 10^6), so that only forged figures exceed it.
const MaxTPSPerGPU = 1e8

// figuresStepSlack is how far a cluster figure's step may be from rank 0's
// own last step on this node: the collector's figures trail the ranks by
// a few steps; a step 2^40 is forged.
const figuresStepSlack = 100_000

// implausibleFigures says why cluster figures cannot be the job's (""
// when they can be): TPS beyond its world size times MaxTPSPerGPU, counts
// beyond its world size, a step far from rank 0's own.
func implausibleFigures(f *wire.ClusterFigures, world, step int64) string {
	world = max(world, 1)
	switch {
	case f.TPS != nil && *f.TPS > float64(world)*MaxTPSPerGPU:
		return fmt.Sprintf("%g tokens/s from %d GPUs", *f.TPS, world)
	case int64(f.Stragglers) > world || int64(f.EpisodesOpen) > world:
		return fmt.Sprintf("%d stragglers and %d open episodes among %d ranks", f.Stragglers, f.EpisodesOpen, world)
	case f.Step > step+figuresStepSlack || f.Step < step-figuresStepSlack:
		return fmt.Sprintf("step %d, rank 0 at step %d", f.Step, step)
	}
	return ""
}

// forgetCaptures drops the subscriptions of jobs no connection carries
// any more (the trace worker's tick).
func (a *Agent) forgetCaptures() {
	if a.capSubN.Load() == 0 {
		return
	}
	carried := a.carriedJobs()
	old := time.Now().Add(-capSubGrace)
	a.capSubs.Range(func(k, v any) bool {
		s := v.(*capSub)
		if !carried[k.(string)] && s.created.Before(old) {
			a.capSubs.Delete(k)
			a.figuresAt.Delete(k)
			a.capSubN.Add(-1)
			a.capUIDMu.Lock()
			if a.capSubsOf[s.uid]--; a.capSubsOf[s.uid] <= 0 {
				delete(a.capSubsOf, s.uid)
			}
			a.capUIDMu.Unlock()
			if sub := s.sub.Load(); sub != nil {
				sub.Unsubscribe()
			}
			if sub := s.figs.Load(); sub != nil {
				sub.Unsubscribe()
			}
		}
		return true
	})
}

// writeTimeout bounds the write of a request line to a rank: a process
// that stopped reading its socket does not hold the capture up.
const writeTimeout = 200 * time.Millisecond

func (a *Agent) handleCapture(m *nats.Msg) {
	var req capture.Request
	if err := json.Unmarshal(m.Data, &req); err != nil {
		a.reject("capture:invalid")
		return
	}
	if err := req.Validate(); err != nil {
		a.reject("capture:invalid")
		a.log.Warn("capture", "capture request refused", "err", err)
		a.respond(m, capture.Ack{Node: a.cfg.Node, Err: err.Error()})
		return
	}
	ts := a.captureTargets(req)
	if len(ts) == 0 {
		return // another agent's ranks, or an unknown job: the others answer
	}
	ack := capture.Ack{Node: a.cfg.Node}
	if req.Op == "probe" {
		for _, t := range ts {
			ack.Ranks = append(ack.Ranks, t.state())
		}
		a.respond(m, ack)
		return
	}
	if why := unreachable(req, ts); why != "" {
		a.reject("capture:invalid")
		a.respond(m, capture.Ack{Node: a.cfg.Node, Err: why})
		return
	}
	if busy := a.startCapture(req, ts); busy != "" {
		a.reject("capture:busy")
		a.respond(m, capture.Ack{Node: a.cfg.Node, Err: busy})
		return
	}
	line, _ := json.Marshal(captureLine{Type: "capture", ID: req.ID, AtStep: req.AtStep, Steps: req.Steps})
	line = append(line, '\n')
	for _, t := range ts {
		// outside any lock; net.Conn writes are safe beside the reader
		t.c.SetWriteDeadline(time.Now().Add(writeTimeout))
		if _, err := t.c.Write(line); err != nil {
			a.reject("capture:write")
			a.captureReport(req.ID, capture.Report{Rank: t.seen.rank, State: capture.StateFailed, Step: t.info.step.Load(),
				Why: "the request could not be written to the rank's connection: " + err.Error()})
			continue
		}
		ack.Ranks = append(ack.Ranks, t.state())
	}
	a.respond(m, ack)
}

// captureTarget is a rank's connection a capture request goes to.
type captureTarget struct {
	c    net.Conn
	seen *rankSeen
	info *connInfo
}

// state is what the agent knows of the rank: where it is, at what pace.
func (t captureTarget) state() capture.RankState {
	s, step, at := t.seen, t.info.step.Load(), t.info.at.Load()
	rs := capture.RankState{Rank: s.rank, WorldSize: s.world, Step: step, SinceMs: max(time.Now().UnixNano()-at, 0) / 1e6}
	if d := float64(at-s.firstAt) / 1e9; d > 0 && step > s.firstStep {
		rs.StepsPerSec = float64(step-s.firstStep) / d
	}
	return rs
}

// captureTargets is the request's job's ranks on this node, of its latest
// attempt only.
func (a *Agent) captureTargets(req capture.Request) []captureTarget {
	var ts []captureTarget
	var attempt int64 = -1
	a.mu.Lock()
	defer a.mu.Unlock()
	for c, info := range a.conns {
		s := info.rank.Load()
		if s == nil || s.job != req.Job || !req.Targets(a.cfg.Node, s.rank) {
			continue
		}
		if s.attempt > attempt {
			attempt, ts = s.attempt, ts[:0]
		}
		if s.attempt == attempt {
			ts = append(ts, captureTarget{c, s, info})
		}
	}
	return ts
}

// unreachable says why a start cannot be reached ("" when it can): it
// must be within MaxStepsAhead of the ranks, and, at their pace, within
// its timeout (one start at step 2^40 with a 1 h timeout held every other
// capture of the job for the hour).
func unreachable(req capture.Request, ts []captureTarget) string {
	var latest int64
	var pace float64
	for _, t := range ts {
		rs := t.state()
		latest, pace = max(latest, rs.Step), max(pace, rs.StepsPerSec)
	}
	switch ahead := req.AtStep - latest; {
	case ahead > capture.MaxStepsAhead:
		return fmt.Sprintf("capture: step %d is more than %d steps past where the job's ranks are (%d)", req.AtStep, capture.MaxStepsAhead, latest)
	case pace > 0 && float64(ahead)/pace > capture.MaxSecondsAhead:
		return fmt.Sprintf("capture: the job's ranks, at step %d and %.2f steps/s, reach step %d in about %.0f s: a start at most %d s ahead is taken (one further holds every other capture of the job); ask for a nearer step", latest, pace, req.AtStep, float64(ahead)/pace, capture.MaxSecondsAhead)
	case pace > 0 && float64(ahead)/pace > float64(req.TimeoutMs)/1e3:
		return fmt.Sprintf("capture: the job's ranks, at step %d and %.2f steps/s, reach step %d in about %.0f s, past the capture's %d s timeout", latest, pace, req.AtStep, float64(ahead)/pace, req.TimeoutMs/1000)
	}
	return ""
}

// startCapture registers the capture, or says why the job is busy: one
// capture at a time per job, and CaptureGap between them.
func (a *Agent) startCapture(req capture.Request, ts []captureTarget) (busy string) {
	now := time.Now()
	a.captureMu.Lock()
	defer a.captureMu.Unlock()
	for id, c := range a.captures {
		if now.After(c.until) {
			a.endCapture(id, c.until)
		}
	}
	for id, c := range a.captures {
		if c.req.Job == req.Job && id != req.ID {
			busy = fmt.Sprintf("capture %s of job %s is in progress on node %s; one at a time per job", id, req.Job, a.cfg.Node)
		}
	}
	if end, ok := a.capEnded[req.Job]; ok && busy == "" && now.Sub(end) < a.cfg.CaptureGap {
		busy = fmt.Sprintf("the last capture of job %s on node %s ended %s ago; the next may start %s after it",
			req.Job, a.cfg.Node, now.Sub(end).Round(time.Millisecond), a.cfg.CaptureGap)
	}
	if busy != "" {
		return busy
	}
	live := &liveCapture{req: req, until: now.Add(time.Duration(req.TimeoutMs) * time.Millisecond), ranks: map[int64]int64{}}
	for _, t := range ts {
		live.ranks[t.seen.rank] = 0
	}
	a.captures[req.ID] = live
	return ""
}

// endCapture forgets capture id, ended at end; captureMu held.
func (a *Agent) endCapture(id string, end time.Time) {
	c := a.captures[id]
	delete(a.captures, id)
	if c == nil {
		return
	}
	if a.capEnded == nil || len(a.capEnded) > 4096 {
		a.capEnded = map[string]time.Time{}
	}
	a.capEnded[c.req.Job] = end
}

func (a *Agent) respond(m *nats.Msg, ack capture.Ack) {
	if m.Reply == "" {
		return
	}
	b, _ := json.Marshal(ack)
	if err := m.Respond(b); err != nil {
		a.log.Warn("capture", "capture reply failed", "err", err)
	}
}

func (a *Agent) liveCapture(id string) *liveCapture {
	a.captureMu.Lock()
	defer a.captureMu.Unlock()
	c := a.captures[id]
	if c != nil && time.Now().After(c.until) {
		a.endCapture(id, c.until)
		return nil
	}
	return c
}

// captureStateLine relays a rank's word on a capture to the command.
func (a *Agent) captureStateLine(s captureState) error {
	c := a.liveCapture(s.ID)
	if c == nil || c.req.Job != s.Job {
		a.reject("capture:unknown")
		return errors.New("agent: capture line for no capture in progress")
	}
	if s.State != capture.StateAccepted && s.State != capture.StateFailed {
		a.reject("capture:invalid")
		return fmt.Errorf("agent: capture state %q", s.State)
	}
	if len(s.Why) > 500 {
		s.Why = s.Why[:500]
	}
	return a.captureReport(s.ID, capture.Report{Rank: s.Rank, State: s.State, Step: s.Step, Why: s.Why})
}

func (a *Agent) captureReport(id string, r capture.Report) error {
	a.captureMu.Lock()
	c := a.captures[id]
	if c == nil || time.Now().After(c.until) {
		if c != nil {
			a.endCapture(id, c.until)
		}
		a.captureMu.Unlock()
		return errors.New("agent: capture over")
	}
	if n, ok := c.ranks[r.Rank]; ok && n >= 0 {
		switch r.State {
		case capture.StateFailed:
			c.ranks[r.Rank] = -1
		case capture.StateTraced:
			c.ranks[r.Rank] = n + 1
		}
	}
	over := true
	for _, n := range c.ranks {
		if n >= 0 && n < c.req.Steps {
			over = false
		}
	}
	if over {
		// every rank through: a next capture of the job may start after
		// the gap (the kept trace's chunks still go to this one's reply)
		a.endCapture(id, time.Now())
	}
	a.captureMu.Unlock()
	r.ID, r.Node = id, a.cfg.Node
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return a.nc.Publish(c.req.Reply, b)
}

// captureTrace reports an analysed capture trace (r nil: why says what
// failed) with the rank's record of the step (nil: none) and, when the
// capture keeps traces, sends the trace in chunks.
func (a *Agent) captureTrace(n TraceNote, r *kineto.Result, s *kineto.StepStats, why string, rec *tps.StepRecord) {
	if send := a.prepareCapture(n, r, s, why); send != nil {
		send(rec)
	}
}

// prepareCapture builds the report of an analysed capture trace (reading
// the trace to keep now, while it is in the trace folder) and returns
// what sends it with the step's record, which may come later; nil when
// the capture is over.
func (a *Agent) prepareCapture(n TraceNote, r *kineto.Result, s *kineto.StepStats, why string) func(*tps.StepRecord) {
	c := a.liveCapture(n.Capture)
	if c == nil || c.req.Job != n.Job {
		return nil // over (timed out) or not ours: the figures went to the record only
	}
	rep := capture.Report{Rank: n.Rank, Step: n.Step, State: capture.StateTraced, Coords: n.Coords}
	if s == nil {
		rep.State, rep.Why = capture.StateFailed, why
		return func(*tps.StepRecord) { a.captureReport(n.Capture, rep) }
	}
	rep.Device, rep.Figures, rep.CallsDropped = r.Device, *s, r.CallsDropped
	rep.ProcessGroups = max(r.ProcessGroups, min(max(n.ProcessGroups, 0), maxProcessGroups))
	for _, call := range r.Calls {
		if call.Step != n.Step {
			continue
		}
		if len(rep.Calls) == capture.MaxReportCalls {
			rep.CallsDropped++ // a NATS message holds 1 MiB
			continue
		}
		rep.Calls = append(rep.Calls, call)
	}
	var chunks [][]byte
	if c.req.Keep {
		kept, err := keptTrace(n, r)
		if err != nil {
			rep.Why = "trace not kept: " + err.Error()
		} else {
			rep.TraceBytes = int64(len(kept))
			for len(kept) > 0 {
				k := min(len(kept), capture.ChunkBytes)
				chunks = append(chunks, kept[:k])
				kept = kept[k:]
			}
			rep.Chunks = len(chunks)
		}
	}
	return func(rec *tps.StepRecord) {
		if rec != nil {
			// the rank's own record of the step, for the verdict's cross-check
			rep.Record = &capture.RecordFigures{DurationNs: rec.DurationNs, ComputeNs: rec.ComputeNs(), DataWaitNs: rec.DataWaitNs,
				ExposedCommNs: rec.ExposedCommNs, FwdNs: rec.FwdNs, BwdNs: rec.BwdNs, OptimNs: rec.OptimNs}
		}
		if err := a.captureReport(n.Capture, rep); err != nil {
			return
		}
		for i, ch := range chunks {
			m := nats.NewMsg(c.req.Reply)
			m.Header.Set(capture.HeaderID, n.Capture)
			m.Header.Set(capture.HeaderChunk, strconv.FormatInt(n.Rank, 10)+"/"+strconv.FormatInt(n.Step, 10)+"/"+strconv.Itoa(i))
			m.Data = ch
			if err := a.nc.PublishMsg(m); err != nil {
				a.log.Warn("capture", "kept trace not sent", "err", err)
				return
			}
		}
	}
}

// keptTrace is the trace as kept for the user: gzipped, with the rank,
// world size and parallel coordinates in its metadata (Holistic Trace
// Analysis and Perfetto merge traces by distributedInfo; PyTorch builds
// without Kineto write none, nor an object to hold it), at most
// capture.MaxKeepBytes.
func keptTrace(n TraceNote, r *kineto.Result) ([]byte, error) {
	f, err := safefs.OpenRegular(n.Path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 1<<16)
	var src io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return nil, err
		}
		defer gz.Close()
		src = bufio.NewReaderSize(gz, 1<<16)
	}
	in := src.(interface {
		io.Reader
		io.ByteScanner
	})
	var buf bytes.Buffer
	out := &capWriter{w: &buf, left: capture.MaxKeepBytes}
	zw := gzip.NewWriter(out)
	meta := map[string]any{"id": n.Capture, "job": n.Job, "attempt": n.Attempt, "rank": n.Rank, "step": n.Step}
	if len(n.Coords) > 0 {
		meta["coords"] = n.Coords
	}
	head := map[string]any{"tpsprofCapture": meta}
	if r.Rank == nil {
		di := map[string]any{"rank": n.Rank}
		if n.WorldSize > 0 {
			di["world_size"] = n.WorldSize
		}
		if r.Backend != "" {
			di["backend"] = r.Backend
		}
		head["distributedInfo"] = di
	}
	hb, _ := json.Marshal(head)
	first, err := firstByte(in)
	if err != nil {
		return nil, err
	}
	switch first {
	case '[': // a bare event array: wrapped in an object
		in.UnreadByte()
		zw.Write(hb[:len(hb)-1])
		zw.Write([]byte(`,"traceEvents":`))
		if _, err := io.Copy(zw, in); err != nil {
			return nil, err
		}
		zw.Write([]byte("}"))
	case '{':
		zw.Write(hb[:len(hb)-1])
		next, err := firstByte(in)
		if err != nil {
			return nil, err
		}
		in.UnreadByte()
		if next != '}' {
			zw.Write([]byte(","))
		}
		if _, err := io.Copy(zw, in); err != nil {
			return nil, err
		}
	default:
		return nil, errors.New("not a JSON trace")
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func firstByte(r io.ByteScanner) (byte, error) {
	for {
		b, err := r.ReadByte()
		if err != nil {
			return 0, err
		}
		if b != ' ' && b != '\n' && b != '\r' && b != '\t' {
			return b, nil
		}
	}
}

// capWriter fails past its bound.
type capWriter struct {
	w    io.Writer
	left int64
}

func (c *capWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > c.left {
		return 0, fmt.Errorf("larger than %d bytes compressed", capture.MaxKeepBytes)
	}
	c.left -= int64(len(p))
	return c.w.Write(p)
}

// maxProcessGroups bounds the process groups a trace note may claim.
const maxProcessGroups = 1 << 16
