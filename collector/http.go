package collector

import (
	_ "embed"
	"encoding/json"
	"net/http"
	"path/filepath"
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

// LiveJob is one job's current state, as /api/summary serves it.
type LiveJob struct {
	Job          string             `json:"job"`
	WorldSize    int64              `json:"world_size"`
	LastStep     int64              `json:"last_step"`
	TPS          float64            `json:"tps"`
	TPSPerGPU    float64            `json:"tps_per_gpu"`
	MFU          *float64           `json:"mfu"`                   // null while unknown
	MFUUnknown   string             `json:"mfu_unknown,omitempty"` // why
	Breakdown    map[string]float64 `json:"breakdown"`
	Steps        []LiveStep         `json:"steps"`   // the last 200 closed steps
	History      []LiveStep         `json:"history"` // the whole run, at most 512 buckets
	TPSMean10    float64            `json:"tps_mean10"`
	SlowestRanks []tps.RankScore    `json:"slowest_ranks"`
	// StragglerEpisodes are the recent and current straggler episodes.
	StragglerEpisodes []LiveEpisode `json:"straggler_episodes"`
	StepsClosed       int64         `json:"steps_closed"`
	Incomplete        int64         `json:"steps_incomplete"`
	TokensTotal       int64         `json:"tokens_total"`
	// Generation (RL post-training), when the last step had one: its
	// generated tokens per second and share of step time, and the p95
	// time to first token and inter-token latency over recent rollouts.
	Generation *LiveGeneration `json:"generation,omitempty"`
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
	Stats         Stats     `json:"stats"`
}

// Summary returns the live state of every job: the last 200 steps, the
// breakdown over the last 10, and the slowest ranks by recent compute time.
func (c *Collector) Summary() LiveSummary {
	st := c.Stats()
	out := LiveSummary{OutDir: filepath.Base(c.cfg.OutDir), GeneratedUnix: time.Now().UnixMilli(), Stats: st}
	for _, j := range c.jobList() {
		j.mu.Lock()
		lj := LiveJob{Job: j.id, WorldSize: j.world, StepsClosed: j.closedSteps, Incomplete: j.incompleteSteps, TokensTotal: j.tokens,
			Breakdown: map[string]float64{}, SlowestRanks: j.slowRanks(5), StragglerEpisodes: j.liveEpisodes()}
		steps := j.recentSteps()
		if n := len(steps); n > 0 {
			last := steps[n-1]
			lj.LastStep, lj.TPS, lj.TPSPerGPU, lj.MFU, lj.MFUUnknown = last.Step, last.TPS, last.TPSPerGPU, knownMFU(last), last.MFUUnknown
			if lj.MFU == nil && lj.MFUUnknown == "" {
				lj.MFUUnknown = "no model or GPU in the run metadata"
			}
			k := min(n, 10)
			for _, s := range steps[n-k:] {
				if s.StepTimeNs > 0 {
					lj.Breakdown["compute"] += s.ComputeNsMean / float64(s.StepTimeNs) / float64(k)
				}
				lj.Breakdown["exposed_comm"] += s.CommFractionMean / float64(k)
				lj.Breakdown["waiting_for_peers"] += s.WaitFractionMean / float64(k)
				lj.Breakdown["bubble"] += s.BubbleFractionMean / float64(k)
				lj.Breakdown["data_stall"] += s.DataStallFractionMean / float64(k)
				lj.Breakdown["checkpoint"] += s.CkptFractionMean / float64(k)
			}
			lj.History = j.history.series()
			for _, s := range steps[n-k:] {
				lj.TPSMean10 += s.TPS / float64(k)
			}
			for _, s := range steps[max(0, n-200):] {
				lj.Steps = append(lj.Steps, LiveStep{Steps: 1, Step: s.Step, TPS: s.TPS, MFU: knownMFU(s), Comm: s.CommFractionMean, StepTimeS: float64(s.StepTimeNs) / 1e9})
			}
		}
		if n := len(steps); n > 0 && steps[n-1].GenNsMax > 0 {
			last := steps[n-1]
			g := &LiveGeneration{OutputTPS: last.GenOutputTPS, Share: last.GenFractionMean}
			ttft, itl := j.rolloutSketches()
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

// Handler serves /metrics (Prometheus), /api/summary (JSON) and / (the
// live page, self-contained: no CDN, refreshes itself).
func (c *Collector) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(c.Registry(), promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /api/summary", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		json.NewEncoder(w).Encode(c.Summary())
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'")
		w.Write(liveHTML)
	})
	return mux
}

func knownMFU(s tps.ClusterStep) *float64 {
	if s.MFUUnknown != "" || s.MFU <= 0 {
		return nil
	}
	m := s.MFU
	return &m
}
