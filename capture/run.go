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
// View.Missing; the error is for a capture that could not start. Its
// phases: probe (which ranks the agents serve, where they are), choose
// the step, start (the request, the ranks that take it), gather (the
// ranks' reports and kept traces), then the view (Merge, what is
// missing, the kept files).
func Run(ctx context.Context, nc *nats.Conn, o Options) (*View, error) {
	if err := o.defaults(); err != nil {
		return nil, err
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
	acks, err := gather(ctx, nc, subj, Request{Op: "probe", ID: id, Job: o.Job, Ranks: o.Ranks, Node: o.Node}, o.ProbeWait, o.allRanks)
	if err != nil {
		return nil, err
	}
	p, err := probed(acks, o.Job)
	if err != nil {
		return nil, err
	}
	at, err := p.chooseStep(o)
	if err != nil {
		return nil, err
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
	if acks, err = gather(ctx, nc, subj, req, o.ProbeWait, p.allStarted); err != nil {
		return nil, err
	}
	expect, err := started(acks, o)
	if err != nil {
		return nil, err
	}
	o.say(fmt.Sprintf("capture %s of job %s: steps %d-%d on %d ranks (%d nodes); the ranks are at step %d", id, o.Job, at, at+o.Steps-1, len(expect), countNodes(expect), p.maxStep))
	if len(o.Ranks) == 0 && o.Node == "" {
		if line := unserved(expect, p.world); line != "" {
			o.say(line)
		}
	}
	g := newGathering(id, at, o, expect, keep != nil)
	g.run(ctx, ch)
	v := g.view()
	if keep != nil {
		return v, g.keep(v, keep, filepath.Join(o.KeepDir, id))
	}
	return v, nil
}

// defaults checks o and fills in its defaults.
func (o *Options) defaults() error {
	if o.Steps < 1 || o.Steps > MaxSteps {
		return fmt.Errorf("capture: --steps %d: give 1 to %d", o.Steps, MaxSteps)
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
	if o.Progress == nil {
		o.Progress = func(string) {}
	}
	return nil
}

func (o *Options) say(s string) { o.Progress(s) }

// allRanks is whether the probe's answers account for every rank asked
// for (or of the job): no need to wait longer.
func (o *Options) allRanks(acks []Ack) bool {
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

// probe is what the agents said of the job's ranks.
type probe struct {
	world, maxStep int64
	rate           float64 // the fastest rank's steps a second
	served         map[int64]bool
}

// probed reads the probe's answers: an agent's error, or no rank served,
// ends the capture.
func probed(acks []Ack, job string) (probe, error) {
	p := probe{maxStep: -1, served: map[int64]bool{}}
	for _, a := range acks {
		if a.Err != "" {
			return p, fmt.Errorf("capture: agent on %s: %s", a.Node, a.Err)
		}
		for _, r := range a.Ranks {
			p.served[r.Rank] = true
			p.world = max(p.world, r.WorldSize)
			p.maxStep = max(p.maxStep, r.Now())
			if r.StepsPerSec > 0 && r.StepsPerSec <= maxStepsPerSec {
				p.rate = max(p.rate, r.StepsPerSec)
			}
		}
	}
	if len(p.served) == 0 {
		return p, fmt.Errorf("%w %q (unknown job, not running now, or its ranks do not send step records through tpsprof's Python package)", ErrNoJob, job)
	}
	return p, nil
}

// chooseStep is the capture's first step: o.AtStep when it is ahead of
// the ranks and not too far, else (none given) far enough ahead that the
// request reaches every rank first.
func (p probe) chooseStep(o Options) (int64, error) {
	at := o.AtStep
	switch {
	case at < 0:
		// the request reaches the ranks at most a probe's wait later
		return p.maxStep + 1 + int64(math.Ceil(p.rate*(o.Lead+o.ProbeWait).Seconds())), nil
	case at > p.maxStep+MaxStepsAhead:
		return 0, fmt.Errorf("capture: step %d is %d steps beyond where the job's ranks are (%d): give a step at most %d ahead", at, at-p.maxStep, p.maxStep, MaxStepsAhead)
	case at <= p.maxStep:
		return 0, fmt.Errorf("capture: step %d is already past: the job's ranks are at step %d (give a later --at-step, or none)", at, p.maxStep)
	}
	return at, nil
}

// allStarted is whether the start's answers cover the ranks the probe
// found (or one refused).
func (p probe) allStarted(acks []Ack) bool {
	n := 0
	for _, a := range acks {
		if a.Err != "" {
			return true
		}
		n += len(a.Ranks)
	}
	return n >= len(p.served)
}

// started is the ranks that took the request, by their node; an agent's
// refusal, or none left, ends the capture.
func started(acks []Ack, o Options) (map[int64]string, error) {
	expect := map[int64]string{}
	for _, a := range acks {
		if a.Err != "" {
			return nil, fmt.Errorf("capture refused by the agent on %s: %s", a.Node, a.Err)
		}
		for _, r := range a.Ranks {
			if len(o.Ranks) > 0 && !slices.Contains(o.Ranks, r.Rank) {
				continue // an answer for a rank not asked for
			}
			expect[r.Rank] = a.Node
		}
	}
	if len(expect) == 0 {
		return nil, fmt.Errorf("%w %q any more (its ranks went away between the probe and the request)", ErrNoJob, o.Job)
	}
	return expect, nil
}

func countNodes(expect map[int64]string) int {
	nodes := map[string]bool{}
	for _, n := range expect {
		nodes[n] = true
	}
	return len(nodes)
}

// unserved says which ranks of the world no agent answered for: counted
// over the world, listed up to 64 (the world is at most tps.MaxWorldSize:
// answers beyond it were not taken); "" when none.
func unserved(expect map[int64]string, world int64) string {
	if world <= 0 {
		return ""
	}
	var list []string
	missing := world
	for r := range expect {
		if r < world {
			missing--
		}
	}
	for r := int64(0); r < world && len(list) < 64; r++ {
		if _, ok := expect[r]; !ok {
			list = append(list, strconv.FormatInt(r, 10))
		}
	}
	if missing <= 0 {
		return ""
	}
	s := strings.Join(list, ",")
	if more := missing - int64(len(list)); more > 0 {
		s += fmt.Sprintf(" and %d more", more)
	}
	return fmt.Sprintf("no agent answered for ranks %s of %d", s, world)
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
