package capture

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tpsprof/tpsprof/internal/safefs"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/wire"
)

// Bounds the command side applies to what agents say of the job's ranks.
const (
	// maxStepsPerSec: a pace faster than this is not a training job's
	// (the first step would be chosen absurdly far ahead).
	maxStepsPerSec = 1000
)

// Options of one capture from the command side.
type Options struct {
	Job   string
	Steps int64
	// AtStep is the first step to profile; negative: chosen so that the
	// request reaches every rank first (Lead ahead of the fastest rank).
	AtStep int64
	Ranks  []int64
	Node   string
	// KeepDir receives the traces, one folder per capture ("": not kept).
	KeepDir string
	// Timeout bounds the whole capture; ProbeWait how long agents have to
	// answer; Lead how far ahead the first step is chosen.
	Timeout, ProbeWait, Lead time.Duration
	// AcceptWait is how long a rank has to accept the request (default
	// 10 s; a rank running the package does within about 50 ms).
	AcceptWait time.Duration
	// Progress, when set, is told what happens as it happens.
	Progress func(string)
	// MaxReportsBytes bounds what is read of the answers (0: the default,
	// MaxReportsBytes; a collector's automatic captures take less).
	MaxReportsBytes int64
}

// ErrNoJob means no agent serves a rank of the job.
var ErrNoJob = errors.New("capture: no agent serves a rank of the job")

// Run captures steps on the ranks of a running job through the agents on
// nc and returns the merged view. A rank that never answers is named in
// View.Missing; the error is for a capture that could not start.
func Run(ctx context.Context, nc *nats.Conn, o Options) (*View, error) {
	if o.Steps < 1 || o.Steps > MaxSteps {
		return nil, fmt.Errorf("capture: --steps %d: give 1 to %d", o.Steps, MaxSteps)
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Minute
	}
	if o.ProbeWait <= 0 {
		o.ProbeWait = time.Second
	}
	if o.Lead <= 0 {
		o.Lead = time.Second
	}
	if o.AcceptWait <= 0 {
		o.AcceptWait = 10 * time.Second
	}
	say := o.Progress
	if say == nil {
		say = func(string) {}
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	id := newID()
	subj := wire.CaptureSubject(o.Job)
	// The kept traces' folder is made fresh, owner-only, before the id
	// goes out (anyone who sees the request learns it): nothing another
	// user plants under KeepDir is followed or overwritten.
	var keep *os.Root
	if o.KeepDir != "" {
		var err error
		if keep, err = safefs.NewPrivateDir(filepath.Join(o.KeepDir, id)); err != nil {
			return nil, fmt.Errorf("capture: keep traces: %w", err)
		}
		defer keep.Close()
	}

	// every rank of the job answered for: no need to wait longer
	allRanks := func(acks []Ack) bool {
		seen := map[int64]bool{}
		var world int64
		for _, a := range acks {
			for _, r := range a.Ranks {
				seen[r.Rank] = true
				world = max(world, r.WorldSize)
			}
		}
		if len(o.Ranks) > 0 {
			for _, r := range o.Ranks {
				if !seen[r] {
					return false
				}
			}
			return true
		}
		return o.Node == "" && world > 0 && int64(len(seen)) >= world
	}
	acks, err := gather(ctx, nc, subj, Request{Op: "probe", ID: id, Job: o.Job, Ranks: o.Ranks, Node: o.Node}, o.ProbeWait, allRanks)
	if err != nil {
		return nil, err
	}
	var world, maxStep int64 = 0, -1
	var rate float64
	served := map[int64]bool{}
	for _, a := range acks {
		if a.Err != "" {
			return nil, fmt.Errorf("capture: agent on %s: %s", a.Node, a.Err)
		}
		for _, r := range a.Ranks {
			served[r.Rank] = true
			world = max(world, r.WorldSize)
			maxStep = max(maxStep, r.Step)
			if r.StepsPerSec > 0 && r.StepsPerSec <= maxStepsPerSec {
				rate = max(rate, r.StepsPerSec)
			}
		}
	}
	if len(served) == 0 {
		return nil, fmt.Errorf("%w %q (unknown job, not running now, or its ranks do not send step records through tpsprof's Python package)", ErrNoJob, o.Job)
	}
	at := o.AtStep
	if at < 0 {
		// the request reaches the ranks at most a probe's wait later
		at = maxStep + 1 + int64(math.Ceil(rate*(o.Lead+o.ProbeWait).Seconds()))
	} else if at > maxStep+MaxStepsAhead {
		return nil, fmt.Errorf("capture: step %d is %d steps beyond where the job's ranks are (%d): give a step at most %d ahead", at, at-maxStep, maxStep, MaxStepsAhead)
	} else if at <= maxStep {
		return nil, fmt.Errorf("capture: step %d is already past: the job's ranks are at step %d (give a later --at-step, or none)", at, maxStep)
	}

	// reports first, then the request: none is missed
	reply := nc.NewInbox()
	// room for the reports and the kept traces' pieces of a large capture
	// (a channel subscription drops what does not fit)
	ch := make(chan *nats.Msg, 1<<16)
	sub, err := nc.ChanSubscribe(reply, ch)
	if err != nil {
		return nil, fmt.Errorf("capture: subscribe: %w", err)
	}
	defer sub.Unsubscribe()
	req := Request{Op: "start", ID: id, Job: o.Job, AtStep: at, Steps: o.Steps, Ranks: o.Ranks, Node: o.Node,
		Keep: o.KeepDir != "", Reply: reply, TimeoutMs: o.Timeout.Milliseconds()}
	acks, err = gather(ctx, nc, subj, req, o.ProbeWait, func(acks []Ack) bool {
		n := 0
		for _, a := range acks {
			if a.Err != "" {
				return true
			}
			n += len(a.Ranks)
		}
		return n >= len(served)
	})
	if err != nil {
		return nil, err
	}
	expect := map[int64]string{}
	nodes := map[string]bool{}
	for _, a := range acks {
		if a.Err != "" {
			return nil, fmt.Errorf("capture refused by the agent on %s: %s", a.Node, a.Err)
		}
		for _, r := range a.Ranks {
			if len(o.Ranks) > 0 && !slices.Contains(o.Ranks, r.Rank) {
				continue // an answer for a rank not asked for
			}
			expect[r.Rank] = a.Node
			nodes[a.Node] = true
		}
	}
	if len(expect) == 0 {
		return nil, fmt.Errorf("%w %q any more (its ranks went away between the probe and the request)", ErrNoJob, o.Job)
	}
	say(fmt.Sprintf("capture %s of job %s: steps %d-%d on %d ranks (%d nodes); the ranks are at step %d", id, o.Job, at, at+o.Steps-1, len(expect), len(nodes), maxStep))
	if world > 0 && len(o.Ranks) == 0 && o.Node == "" {
		// counted over the world, listed up to 64 (the world is at most
		// tps.MaxWorldSize: answers beyond it were not taken)
		var unserved []string
		missing := world
		for r := range expect {
			if r < world {
				missing--
			}
		}
		for r := int64(0); r < world && len(unserved) < 64; r++ {
			if _, ok := expect[r]; !ok {
				unserved = append(unserved, strconv.FormatInt(r, 10))
			}
		}
		if missing > 0 {
			list := strings.Join(unserved, ",")
			if more := missing - int64(len(unserved)); more > 0 {
				list += fmt.Sprintf(" and %d more", more)
			}
			say(fmt.Sprintf("no agent answered for ranks %s of %d", list, world))
		}
	}

	type rs struct {
		accepted bool
		failed   string
		traced   map[int64]bool
	}
	state := map[int64]*rs{}
	for r := range expect {
		state[r] = &rs{traced: map[int64]bool{}}
	}
	var reports []Report
	type tkey struct{ rank, step int64 }
	chunks := map[tkey][][]byte{}
	want := map[tkey]int{}
	var reportBytes, keptBytes int64
	overReports, overKept := false, false
	budget := reportsBudget
	if o.MaxReportsBytes > 0 {
		budget = min(budget, o.MaxReportsBytes)
	}
	done := func() bool {
		for r, s := range state {
			if s.failed != "" {
				continue
			}
			if int64(len(s.traced)) < o.Steps {
				return false
			}
			for st := range s.traced {
				k := tkey{r, st}
				if n := want[k]; n > 0 && len(chunks[k]) < n {
					return false
				}
			}
		}
		return true
	}
	// A rank running the package accepts within about one 50 ms batch of
	// its sender thread, whatever its step time: one silent after
	// AcceptWait does not take requests, and is not waited for.
	acceptBy := time.NewTimer(o.AcceptWait)
	defer acceptBy.Stop()
	timedOut := false
	for !done() && !timedOut {
		select {
		case <-ctx.Done():
			timedOut = true
		case <-acceptBy.C:
			for r, s := range state {
				if !s.accepted && s.failed == "" && len(s.traced) == 0 {
					s.failed = fmt.Sprintf("did not accept the request within %s: the rank does not take capture requests (a process without tpsprof's Python package, or an older one)", o.AcceptWait)
					say(fmt.Sprintf("rank %d (%s): %s", r, expect[r], s.failed))
				}
			}
		case m := <-ch:
			if c := m.Header.Get(HeaderChunk); c != "" {
				var k tkey
				var seq int
				if _, err := fmt.Sscanf(c, "%d/%d/%d", &k.rank, &k.step, &seq); err != nil || m.Header.Get(HeaderID) != id || keep == nil {
					continue // pieces nobody asked for are not held
				}
				if state[k.rank] == nil || k.step < at || k.step >= at+o.Steps || seq >= maxPiecesATrace || len(m.Data) > ChunkBytes {
					continue
				}
				if keptBytes+int64(len(m.Data)) > keptBudget {
					overKept = true
					continue
				}
				if seq == len(chunks[k]) {
					chunks[k] = append(chunks[k], m.Data)
					keptBytes += int64(len(m.Data))
				}
				continue
			}
			if reportBytes+int64(len(m.Data)) > budget {
				overReports = true
				continue
			}
			var r Report
			if json.Unmarshal(m.Data, &r) != nil || r.ID != id {
				continue
			}
			reportBytes += int64(len(m.Data))
			if len(r.Calls) > MaxReportCalls {
				r.CallsDropped += int64(len(r.Calls) - MaxReportCalls)
				r.Calls = r.Calls[:MaxReportCalls]
			}
			s := state[r.Rank]
			if s == nil {
				continue
			}
			switch r.State {
			case StateAccepted:
				s.accepted = true
			case StateFailed:
				s.failed = r.Why
				say(fmt.Sprintf("rank %d (%s): %s", r.Rank, r.Node, r.Why))
			case StateTraced:
				if r.Step < at || r.Step >= at+o.Steps || s.traced[r.Step] {
					continue
				}
				s.traced[r.Step] = true
				reports = append(reports, r)
				if r.Chunks > 0 && keep != nil {
					want[tkey{r.Rank, r.Step}] = min(r.Chunks, maxPiecesATrace)
				}
				if r.Why != "" {
					say(fmt.Sprintf("rank %d step %d: %s", r.Rank, r.Step, r.Why))
				}
				say(fmt.Sprintf("rank %d step %d traced on %s: %.1f ms, communication %.1f ms", r.Rank, r.Step, r.Node, r.Figures.DurationUs/1e3, r.Figures.CommUs/1e3))
			}
		}
	}
	v := Merge(id, o.Job, reports)
	for r, s := range state {
		switch {
		case s.failed != "":
			v.Missing = append(v.Missing, Missing{Rank: r, Why: s.failed})
		case int64(len(s.traced)) < o.Steps && !s.accepted:
			v.Missing = append(v.Missing, Missing{Rank: r, Why: fmt.Sprintf("no answer within %s: the rank does not take capture requests (a process without tpsprof.torch, or an older one)", o.Timeout)})
		case int64(len(s.traced)) < o.Steps:
			v.Missing = append(v.Missing, Missing{Rank: r, Why: fmt.Sprintf("traced %d of %d steps within %s (the rank did not reach step %d, or its traces were not analysed)", len(s.traced), o.Steps, o.Timeout, at+o.Steps-1)})
		}
	}
	slices.SortFunc(v.Missing, func(a, b Missing) int { return int(a.Rank - b.Rank) })
	v.withholdForMissing()
	if overReports {
		v.Notes = append(v.Notes, fmt.Sprintf("the answers passed %d MiB: the rest were not read (a capture this large, or forged answers)", budget>>20))
	}
	if overKept {
		v.Notes = append(v.Notes, fmt.Sprintf("the kept traces passed %d MiB: the rest were not kept", keptBudget>>20))
	}
	if keep != nil {
		dir := filepath.Join(o.KeepDir, id)
		for k, n := range want {
			parts := chunks[k]
			if len(parts) < n {
				v.Notes = append(v.Notes, fmt.Sprintf("rank %d step %d: the trace arrived incomplete (%d of %d pieces): not kept", k.rank, k.step, len(parts), n))
				continue
			}
			// the name is made here from two numbers, never the sender's
			name := fmt.Sprintf("rank%d.step%d.pt.trace.json.gz", k.rank, k.step)
			if err := safefs.CreateNew(keep, name, slices.Concat(parts...)); err != nil {
				return v, fmt.Errorf("capture: keep traces: %w", err)
			}
			v.Kept = append(v.Kept, filepath.Join(dir, name))
		}
		// the ranks' reports as analysed, so the capture can be merged
		// again (capture.Merge) without the ranks
		if b, err := json.Marshal(reports); err == nil {
			if err := safefs.CreateNew(keep, ReportsFile, b); err != nil {
				return v, fmt.Errorf("capture: keep reports: %w", err)
			}
		}
		slices.Sort(v.Kept)
	}
	return v, nil
}

// ReportsFile is the kept capture's file of the ranks' reports (a JSON
// array of Report, as Merge takes them).
const ReportsFile = "reports.json"

// Probe asks the agents which ranks of job they serve (waiting at most
// wait for their answers).
func Probe(ctx context.Context, nc *nats.Conn, job string, wait time.Duration) ([]Ack, error) {
	return gather(ctx, nc, wire.CaptureSubject(job), Request{Op: "probe", ID: newID(), Job: job}, wait, func([]Ack) bool { return false })
}

// gather publishes req with an inbox and collects the agents' acks for
// wait, or until enough says they are all in.
func gather(ctx context.Context, nc *nats.Conn, subj string, req Request, wait time.Duration, enough func([]Ack) bool) ([]Ack, error) {
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("capture: subscribe: %w", err)
	}
	defer sub.Unsubscribe()
	b, _ := json.Marshal(req)
	if err := nc.PublishRequest(subj, inbox, b); err != nil {
		return nil, fmt.Errorf("capture: request: %w", err)
	}
	fctx, fcancel := context.WithTimeout(ctx, max(wait, 5*time.Second)) // (a flush needs a deadline)
	defer fcancel()
	if err := nc.FlushWithContext(fctx); err != nil {
		return nil, fmt.Errorf("capture: NATS: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var acks []Ack
	ranks := 0
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return acks, nil // the wait is over
		}
		var a Ack
		if json.Unmarshal(m.Data, &a) == nil {
			// an answer's ranks are taken only within bounds: a world size
			// a job can have, a rank of it, and at most MaxCaptureRanks in
			// all (a forged answer claiming 2^62 ranks is not a plan)
			keep := a.Ranks[:0]
			for _, r := range a.Ranks {
				if r.WorldSize > 0 && r.WorldSize <= tps.MaxWorldSize && r.Rank >= 0 && r.Rank < r.WorldSize && ranks < MaxCaptureRanks {
					keep = append(keep, r)
					ranks++
				}
			}
			a.Ranks = keep
			acks = append(acks, a)
			if enough(acks) || len(acks) >= MaxAcks {
				return acks, nil
			}
		}
	}
}

func newID() string {
	b := make([]byte, 6)
	rand.Read(b)
	return time.Now().UTC().Format("20060102T150405") + "-" + hex.EncodeToString(b)
}
