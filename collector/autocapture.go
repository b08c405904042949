package collector

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tpsprof/tpsprof/capture"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/wire"
)

// Automatic capture (Config.AutoCapture): once a live straggler episode
// has stayed flagged autoCaptureAfter closed steps after it opened, the
// collector captures one step on the episode's slowest rank and
// on the fastest rank (package capture, as `tpsprof trace --ranks` does),
// at most once per job every AutoCaptureEvery. The outcome goes out as a
// capture event of the job (tps.EventCapture), so it reaches the events
// Parquet and the report like any event, and the live episode links to it
// (/api/summary, the live page).

// autoCaptureReportBytes bounds what an automatic capture reads of the
// agents' answers.
const autoCaptureReportBytes = 16 << 20

// captureAsk is an automatic capture the job state asked for.
type captureAsk struct {
	job       string
	attempt   int64
	key       string // the episode's node key
	startStep int64
	ranks     []int64
}

// CaptureLink is an episode's automatic capture, as /api/summary shows it.
type CaptureLink struct {
	ID    string `json:"id,omitempty"`
	State string `json:"state"` // running, done, failed
	// Culprit is the rank the others waited for (nil: none, or failed).
	Culprit      *int64  `json:"culprit,omitempty"`
	OthersWaitUs float64 `json:"others_wait_us,omitempty"`
	Steps        []int64 `json:"steps,omitempty"`
	Error        string  `json:"error,omitempty"`
}

// askCapture is called under the job's lock for an open episode still
// flagged autoCaptureAfter steps after it opened.
func (j *jobState) askCapture(cfg *Config, t *tally, e *LiveEpisode, key string) {
	if !cfg.AutoCapture || len(e.Ranks) == 0 {
		return
	}
	if !j.lastAutoCapture.IsZero() && t.now.Sub(j.lastAutoCapture) < cfg.AutoCaptureEvery {
		return
	}
	ranks := j.withPeer(e)
	j.lastAutoCapture = t.now
	e.Capture = &CaptureLink{State: "running"}
	t.captures = append(t.captures, captureAsk{job: j.id, attempt: e.Attempt, key: key, startStep: e.StartStep, ranks: ranks})
}

// withPeer is the episode's slowest rank (the highest recent own time:
// a node's episode holds every flagged rank of the node) and the
// fastest rank outside the episode, or else the fastest other rank; job
// lock held.
func (j *jobState) withPeer(e *LiveEpisode) []int64 {
	slow, worst := e.Ranks[0], -1.0
	for _, r := range e.Ranks {
		if r >= 0 && r < int64(len(j.ownEWMA)) && j.ownEWMA[r] > worst {
			slow, worst = r, j.ownEWMA[r]
		}
	}
	pick := func(skip func(int64) bool) int64 {
		peer, best := int64(-1), 0.0
		for r, v := range j.ownEWMA {
			if v > 0 && (peer < 0 || v < best) && !skip(int64(r)) {
				peer, best = int64(r), v
			}
		}
		return peer
	}
	peer := pick(func(r int64) bool { return slices.Contains(e.Ranks, r) })
	if peer < 0 {
		peer = pick(func(r int64) bool { return r == slow })
	}
	ranks := []int64{slow}
	if peer >= 0 {
		ranks = append(ranks, peer)
	}
	return ranks
}

// StragglerReply answers `tpsprof trace --straggler` on
// wire.StragglerSubject: the ranks to capture for the job's worst open
// straggler episode (withPeer: its slowest rank and the fastest rank), or
// why none.
type StragglerReply struct {
	Ranks []int64 `json:"ranks,omitempty"`
	Node  string  `json:"node,omitempty"`
	Score float64 `json:"score,omitempty"`
	Err   string  `json:"error,omitempty"`
}

func (c *Collector) handleStraggler(m *nats.Msg) {
	var rep StragglerReply
	job, _, err := wire.ParseCtlSubject(m.Subject)
	c.mu.Lock()
	j := c.jobs[job]
	c.mu.Unlock()
	switch {
	case err != nil:
		rep.Err = err.Error()
	case j == nil:
		rep.Err = fmt.Sprintf("the collector has no job %q", job)
	default:
		j.mu.Lock()
		var worst *LiveEpisode
		for _, e := range j.st.openEpisodes {
			if len(e.Ranks) > 0 && (worst == nil || e.Score < worst.Score) {
				worst = e
			}
		}
		if worst == nil {
			rep.Err = fmt.Sprintf("no straggler episode is open in job %s", job)
		} else {
			rep.Ranks, rep.Node, rep.Score = j.st.withPeer(worst), worst.Node, worst.Score
		}
		j.mu.Unlock()
	}
	b, _ := json.Marshal(rep)
	m.Respond(b)
}

// startCaptures starts the goroutine of automatic captures when they are
// on; stopCaptures (always set) stops it.
func (c *Collector) startCaptures() {
	ctx, cancel := context.WithCancel(context.Background())
	c.stopCaptures = cancel
	if c.cfg.AutoCapture && c.cfg.Role != "rank-writer" {
		c.wg.Add(1)
		go c.captures(ctx)
	}
}

// captures runs the automatic captures one at a time (the collector's
// goroutine for them; it stops with the collector).
func (c *Collector) captures(ctx context.Context) {
	defer c.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case ask := <-c.captureCh:
			c.runCapture(ctx, ask)
		}
	}
}

func (c *Collector) runCapture(ctx context.Context, ask captureAsk) {
	start := time.Now()
	// two ranks, one step: 16 MiB of answers is plenty, and what a forged
	// agent can make the collector hold (its embedded NATS server shares
	// the process)
	v, err := capture.Run(ctx, c.nc, capture.Options{Job: ask.job, Steps: 1, AtStep: -1, Ranks: ask.ranks, Timeout: c.cfg.AutoCaptureTimeout,
		MaxReportsBytes: autoCaptureReportBytes})
	link := CaptureLink{State: "done"}
	detail := map[string]any{"episode_node": ask.key, "episode_start_step": ask.startStep, "ranks": ask.ranks}
	if err != nil {
		link.State, link.Error = "failed", err.Error()
		detail["error"] = err.Error()
	} else {
		link.ID, link.Steps = v.ID, v.Steps
		detail["id"] = v.ID
		if v.Culprit != nil {
			r := v.Culprit.Rank
			link.Culprit, link.OthersWaitUs = &r, v.Culprit.OthersWaitUs
			detail["culprit"], detail["others_wait_us"] = r, v.Culprit.OthersWaitUs
		}
		if len(v.Missing) > 0 {
			link.Error = fmt.Sprintf("%d of %d ranks not traced: %s", len(v.Missing), len(ask.ranks), v.Missing[0].Why)
			detail["missing"] = v.Missing
		}
		var ranks []map[string]any
		for _, r := range v.Ranks {
			ranks = append(ranks, map[string]any{"rank": r.Rank, "compute_us": r.ComputeUs, "comm_us": r.CommUs, "exposed_comm_us": r.ExposedCommUs,
				"wait_us": r.WaitUs, "transfer_us": r.TransferUs})
		}
		detail["figures"] = ranks
	}
	c.linkCapture(ask, link)
	b, _ := json.Marshal(detail)
	if len(b) > 4*tps.MaxStringLen {
		delete(detail, "figures")
		delete(detail, "missing")
		b, _ = json.Marshal(detail)
	}
	ev := tps.Event{Job: ask.job, Attempt: ask.attempt, Kind: tps.EventCapture, Name: link.ID,
		StartUnixNs: start.UnixNano(), EndUnixNs: time.Now().UnixNano(), Detail: string(b)}
	if len(link.Steps) > 0 {
		ev.Step = link.Steps[0]
	} else {
		ev.Step = ask.startStep
	}
	eb, _ := json.Marshal(ev)
	if err := c.nc.Publish(wire.EventsSubject(ask.job), eb); err != nil {
		c.log.Warn("capture", "capture event not published", "err", err)
	}
}

// linkCapture sets the outcome on the episode that asked for it, open or
// closed since.
func (c *Collector) linkCapture(ask captureAsk, link CaptureLink) {
	c.mu.Lock()
	j := c.jobs[ask.job]
	c.mu.Unlock()
	if j == nil {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if e := j.st.openEpisodes[ask.key]; e != nil && e.Attempt == ask.attempt && e.StartStep == ask.startStep {
		e.Capture = &link
		return
	}
	for i := range j.st.episodes {
		e := &j.st.episodes[i]
		if e.Node == ask.key && e.Attempt == ask.attempt && e.StartStep == ask.startStep {
			e.Capture = &link
		}
	}
}
