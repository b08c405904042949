package collector

import (
	"cmp"
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tpsprof/tpsprof/tps"
)

//go:embed live.html
var liveHTML []byte

// LiveStep is one step on the live page.
type LiveStep struct {
	// Seq is the ordinal of the (first) closed step, Steps how many closed
	// steps a whole-run bucket holds (1 for the recent steps).
	Seq       int64    `json:"seq"`
	Steps     int      `json:"steps"`
	Step      int64    `json:"step"`
	TPS       float64  `json:"tps"`
	MFU       *float64 `json:"mfu"` // null while unknown
	Comm      float64  `json:"comm"`
	StepTimeS float64  `json:"step_time_s"`
}

// LiveSplit is a share of step time a measure splits out of a part of
// the breakdown (at most the part's share; not a part of its own).
type LiveSplit struct {
	Name  string  `json:"name"`
	Part  string  `json:"part"`
	Label string  `json:"label"`
	Share float64 `json:"share"`
}

// LiveFinding is a part of step time that could go, with the
// throughput's gain (percent) without it.
type LiveFinding struct {
	Key         string  `json:"key"`
	Label       string  `json:"label"`
	Share       float64 `json:"share"`
	HeadroomPct float64 `json:"headroom_pct"`
	// Who is whom the waiting is for, where one rank or node explains
	// it (its headroom then the waiters' share, as the report's).
	Who string `json:"who,omitempty"`
}

// LiveJob is one job's current state, as /api/summary serves it.
type LiveJob struct {
	Job       string `json:"job"`
	WorldSize int64  `json:"world_size"`
	// Duplicates are the job's records dropped as repeats of a rank's step
	// already taken (Note says what they may mean).
	Duplicates int64 `json:"records_duplicate,omitempty"`
	LastStep   int64 `json:"last_step"`
	// TPS is the headline: tokens over step time of the last
	// WindowSteps closed steps (null, with TPSUnknown saying why, when
	// they counted no token); TPSPerGPU is it over the world size.
	TPS        *float64 `json:"tps"`
	TPSPerGPU  *float64 `json:"tps_per_gpu"`
	TPSUnknown string   `json:"tps_unknown,omitempty"`
	// TPSLast is the last closed step's own rate.
	TPSLast     *float64 `json:"tps_last"`
	WindowSteps int      `json:"window_steps"`
	// MFU is over the same steps, each weighted by its step time.
	MFU        *float64 `json:"mfu"`                   // null while unknown
	MFUUnknown string   `json:"mfu_unknown,omitempty"` // why
	// MFUSource is "counted" where MFU is from the FLOPs PyTorch counted
	// on sampled steps (the job declares no model), as the report's
	// counted MFU; absent for the analytic model's.
	MFUSource string `json:"mfu_source,omitempty"`
	// MFULedger is where that MFU went (tps.Ledger: each lost point in
	// one bucket, adding up to 100); null with MFULedgerUnknown saying why.
	MFULedger        *tps.Ledger `json:"mfu_ledger"`
	MFULedgerUnknown string      `json:"mfu_ledger_unknown,omitempty"`
	// Findings are the parts of the same steps' time that could go,
	// largest headroom first (tps.TimeLosses; the report names causes).
	Findings []LiveFinding `json:"findings,omitempty"`
	// Breakdown is where the same steps' time went: every part of
	// tps.ShareParts by its key, adding up to 1.
	Breakdown map[string]float64 `json:"breakdown"`
	// BreakdownSplits are the shares measures split out of a part
	// (tps.ShareSplits: gc_ns out of compute), the measured ones.
	BreakdownSplits []LiveSplit     `json:"breakdown_splits,omitempty"`
	Steps           []LiveStep      `json:"steps"`   // the last 200 closed steps
	History         []LiveStep      `json:"history"` // the whole run, at most 512 buckets
	SlowestRanks    []tps.RankScore `json:"slowest_ranks"`
	// StragglerEpisodes are the recent and current straggler episodes.
	StragglerEpisodes []LiveEpisode `json:"straggler_episodes"`
	StepsClosed       int64         `json:"steps_closed"`
	Incomplete        int64         `json:"steps_incomplete"`
	TokensTotal       int64         `json:"tokens_total"`
	// Generation (RL post-training), when the last step had one: its
	// generated tokens per second and share of step time, and the p95
	// time to first token and inter-token latency over recent rollouts.
	Generation *LiveGeneration `json:"generation,omitempty"`
	// CaptureCost is what measuring costs the ranks by their own records;
	// Memory the fullest rank's device memory over the last steps (CUDA
	// ranks of the Python package): absent where no record carried them.
	CaptureCost *LiveCost   `json:"capture_cost,omitempty"`
	Memory      *LiveMemory `json:"memory,omitempty"`
	// ClockOffsetsNs are the nodes' clock offsets from rank 0's node that
	// cluster rows are corrected by (docs/report.md, "Clocks"); absent
	// while every node's clock agrees within a millisecond.
	ClockOffsetsNs map[string]int64 `json:"clock_offsets_ns,omitempty"`
	// State is "running" (a step closed within StaleAfter), "silent"
	// (none since: hung, or its records stopped), "ended" (its last
	// attempt ended) or "empty" (no step closed yet); jobs come running
	// first, most recent step first.
	State          string `json:"state"`
	LastStepUnixMs int64  `json:"last_step_unix_ms,omitempty"` // when the last step closed (collector's clock)
	// Note is shown at the top of the job: no closed step had every
	// declared rank (their figures count only the ranks that reported).
	Note string `json:"note,omitempty"`
}

// LiveGeneration is a job's generation phase on the live page.
type LiveGeneration struct {
	OutputTPS float64  `json:"output_tps"`
	Share     float64  `json:"share"`
	TTFTP95   *float64 `json:"ttft_p95_s"`
	ITLP95    *float64 `json:"itl_p95_s"`
}

// LiveSummary is the /api/summary document.
type LiveSummary struct {
	OutDir        string    `json:"out_dir"` // the folder's name, not its path
	GeneratedUnix int64     `json:"generated_unix_ms"`
	Jobs          []LiveJob `json:"jobs"`
	// JobsTotal is how many jobs the collector has; Jobs holds those from
	// Offset on, at most the page's limit (/api/summary?offset=&limit=).
	JobsTotal int   `json:"jobs_total"`
	Offset    int   `json:"offset"`
	Stats     Stats `json:"stats"`
}

// SummaryPageJobs is /api/summary's default page: at most this many jobs
// (about 40 KB each), ?limit= up to MaxSummaryPageJobs.
const (
	SummaryPageJobs    = 50
	MaxSummaryPageJobs = 500
)

// Summary returns the live state of every job: the last 200 steps, the
// throughput, MFU and breakdown over the last LiveWindowSteps, and the slowest ranks by recent compute time.
func (c *Collector) Summary() LiveSummary { return c.SummaryPage(0, -1) }

// SummaryPage is Summary for the jobs from offset on (running jobs first,
// then by their last step, most recent first; by name on ties), at most
// limit of them (all when limit < 0).
func (c *Collector) SummaryPage(offset, limit int) LiveSummary {
	st := c.Stats()
	out := LiveSummary{OutDir: filepath.Base(c.cfg.OutDir), GeneratedUnix: time.Now().UnixMilli(), Stats: st}
	now := time.Now()
	type ranked struct {
		j     *job
		state string
		at    time.Time // when its last step closed
	}
	jobs := c.jobList()
	rs := make([]ranked, len(jobs))
	for i, j := range jobs {
		f := j.live.Load() // published figures: no job lock
		r := ranked{j, "running", f.lastClosedAt}
		switch {
		case f.last == nil:
			r.state, r.at = "empty", time.Time{}
		case f.ended:
			r.state = "ended"
		case now.Sub(f.lastClosedAt) > c.cfg.StaleAfter:
			r.state = "silent"
		}
		rs[i] = r
	}
	sort.SliceStable(rs, func(a, b int) bool {
		if ra, rb := rs[a].state == "running", rs[b].state == "running"; ra != rb {
			return ra
		}
		return rs[a].at.After(rs[b].at)
	})
	out.JobsTotal, out.Offset = len(rs), offset
	rs = rs[min(max(offset, 0), len(rs)):]
	if limit >= 0 && len(rs) > limit {
		rs = rs[:limit]
	}
	for _, r := range rs {
		j := r.j
		j.mu.Lock()
		lj := LiveJob{Job: j.st.id, WorldSize: j.st.world, StepsClosed: j.st.closedSteps, Incomplete: j.st.incompleteSteps, TokensTotal: j.st.tokens,
			Breakdown: map[string]float64{}, SlowestRanks: j.st.slowRanks(5), StragglerEpisodes: j.st.liveEpisodes(), ClockOffsetsNs: j.st.clocks.offsets(),
			State: r.state}
		if !r.at.IsZero() {
			lj.LastStepUnixMs = r.at.UnixMilli()
		}
		lj.CaptureCost, lj.Memory = j.st.own.live()
		if j.st.closedSteps > 0 && j.st.incompleteSteps == j.st.closedSteps {
			lj.Note = fmt.Sprintf("no step has had all %d declared ranks (at most %d reported): the figures count only the ranks that reported", j.st.world, j.st.mostRanks)
		}
		if d := j.st.duplicates; d > 0 {
			lj.Duplicates = d
			dup := fmt.Sprintf("%d step records repeated a rank's step already taken and were dropped: two processes may report one rank (rank and world size not set), one's steps and tokens not counted", d)
			lj.Note = strings.TrimPrefix(lj.Note+"; "+dup, "; ")
		}
		steps := j.st.recentSteps()
		if n := len(steps); n > 0 {
			last := steps[n-1]
			f := j.live.Load().win // as settle published it for /metrics
			lj.LastStep, lj.WindowSteps, lj.MFU = last.Step, f.steps, f.mfu
			if f.counted && f.mfu != nil {
				lj.MFUSource = "counted"
			}
			if f.tpsUnknown == "" {
				lj.TPS, lj.TPSPerGPU = &f.tps, &f.perGPU
				if last.StepTimeNs > 0 {
					lj.TPSLast = &last.TPS
				}
			} else {
				lj.TPSUnknown = f.tpsUnknown
			}
			if lj.MFU == nil {
				lj.MFUUnknown = cmp.Or(last.MFUUnknown, f.tpsUnknown, "no model or GPU in the run metadata")
			}
			lj.MFULedger, lj.MFULedgerUnknown = f.ledger()
			lj.Findings = f.findings()
			for _, p := range tps.ShareParts() {
				lj.Breakdown[p.Key] = *p.Of(&f.shares)
			}
			for _, sp := range tps.ShareSplits() {
				if v, ok := f.shares.Splits[sp.Name]; ok {
					lj.BreakdownSplits = append(lj.BreakdownSplits, LiveSplit{Name: sp.Name, Part: sp.Part, Label: sp.Label, Share: v})
				}
			}
			lj.History = j.st.history.series()
			for _, s := range steps[max(0, n-200):] {
				lj.Steps = append(lj.Steps, LiveStep{Steps: 1, Step: s.Step, TPS: s.TPS, MFU: knownMFU(s), Comm: s.CommFractionMean, StepTimeS: float64(s.StepTimeNs) / 1e9})
			}
		}
		if n := len(steps); n > 0 && steps[n-1].GenNsMax > 0 {
			last := steps[n-1]
			g := &LiveGeneration{OutputTPS: last.GenOutputTPS, Share: last.GenFractionMean}
			ttft, itl := j.st.rolloutSketches()
			if ttft.Count > 0 {
				v := ttft.Quantile(0.95)
				g.TTFTP95 = &v
			}
			if itl.Count > 0 {
				v := itl.Quantile(0.95)
				g.ITLP95 = &v
			}
			lj.Generation = g
		}
		j.mu.Unlock()
		out.Jobs = append(out.Jobs, lj)
	}
	return out
}

// Handler serves /metrics (Prometheus), /api/summary (JSON), /api/nodes
// (the fleet's node health, JSON) and / (the live page, self-contained: no
// CDN, refreshes itself).
func (c *Collector) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(c.Registry(), promhttp.HandlerOpts{}))
	cache := &c.summaryCache
	mux.HandleFunc("GET /api/summary", func(w http.ResponseWriter, r *http.Request) {
		offset, limit := 0, SummaryPageJobs
		if v := r.URL.Query().Get("offset"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				http.Error(w, "offset: a number of jobs to skip, 0 or more", http.StatusBadRequest)
				return
			}
			offset = n
		}
		if v := r.URL.Query().Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > MaxSummaryPageJobs {
				http.Error(w, fmt.Sprintf("limit: 1 to %d jobs", MaxSummaryPageJobs), http.StatusBadRequest)
				return
			}
			limit = n
		}
		body := cache.get(offset, limit, func() []byte {
			b, _ := json.Marshal(c.SummaryPage(offset, limit))
			return append(b, '\n')
		})
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Write(body)
	})
	mux.HandleFunc("GET /api/nodes", func(w http.ResponseWriter, r *http.Request) {
		v := c.Nodes()
		if v == nil {
			http.Error(w, "no node pass yet (or node passes are off: --nodes-every)", http.StatusNotFound)
			return
		}
		b, err := json.Marshal(v)
		if err != nil { // (a figure JSON cannot carry: an error, not an empty 200)
			http.Error(w, "the node view cannot be encoded: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.Write(append(b, '\n'))
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'")
		w.Write(liveHTML)
	})
	return mux
}

// summaryCache shares one encoding of a page among the requests of the
// same second: clients that are slow to read hold the same bytes, not a
// copy each (60 of them used to take a collector from 2.3 to 9 GB), and
// requests that arrive while a page is being built wait for that build
// instead of starting their own.
type summaryCache struct {
	mu      sync.Mutex
	entries map[[2]int]*summaryEntry
	builds  atomic.Int64 // pages built (tests: shared, not one per request)
}

type summaryEntry struct {
	ready chan struct{} // closed once body is set
	body  []byte
	at    time.Time // when body was built (under the cache's lock)
	done  bool
}

const summaryCacheFor = time.Second

func (sc *summaryCache) get(offset, limit int, build func() []byte) []byte {
	k := [2]int{offset, limit}
	sc.mu.Lock()
	e := sc.entries[k]
	if e != nil && (!e.done || time.Since(e.at) < summaryCacheFor) {
		sc.mu.Unlock()
		<-e.ready
		return e.body
	}
	if sc.entries == nil || len(sc.entries) >= 16 {
		sc.entries = map[[2]int]*summaryEntry{}
	}
	e = &summaryEntry{ready: make(chan struct{})}
	sc.entries[k] = e
	sc.mu.Unlock()
	sc.builds.Add(1)
	body := build() // outside the lock: building takes every job's lock in turn
	sc.mu.Lock()
	e.body, e.at, e.done = body, time.Now(), true
	sc.mu.Unlock()
	close(e.ready)
	return body
}

func knownMFU(s tps.ClusterStep) *float64 {
	if s.MFUUnknown != "" || s.MFU <= 0 {
		return nil
	}
	m := s.MFU
	return &m
}
