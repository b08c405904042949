// Package report analyses a job's Parquet traces after the fact: steady-state
// throughput, MFU, the time breakdown, stragglers and cost. It streams the
// part files, so memory follows the number of ranks and steps kept for
// medians, not the size of the trace.
package report

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// Options tune the analysis.
type Options struct {
	// Warmup excludes that many leading steps of each attempt; negative
	// (tps.AutoWarmup) applies the automatic rule.
	Warmup int
	// TrainTokens, when set, asks for the time to finish that budget.
	TrainTokens float64
	// GPUHourUSD overrides the price in the run metadata.
	GPUHourUSD float64
	// TopStragglers is how many ranks and nodes to list (default 5).
	TopStragglers int
}

// Breakdown is where a steady step's time goes, as fractions of step time
// (means over steady steps of the per-step means over ranks).
type Breakdown struct {
	Compute           float64 `json:"compute"`
	ExposedComm       float64 `json:"exposed_comm"`
	Bubble            float64 `json:"bubble"`
	BubbleTheoretical float64 `json:"bubble_theoretical"`
	DataStall         float64 `json:"data_stall"`
	Checkpoint        float64 `json:"checkpoint"`
	CommOverlap       float64 `json:"comm_overlap"`
}

// Energy sums up the GPU samples joined to steady steps.
type Energy struct {
	TokensPerJoule float64 `json:"tokens_per_joule"`
	JoulesPerToken float64 `json:"joules_per_token"`
	PowerWMean     float64 `json:"power_w_mean"` // per GPU
	SMClockMHzMean float64 `json:"sm_clock_mhz_mean"`
	// ThrottledSteps are steady steps during which some GPU reported a
	// clock-event reason other than idle or application clocks.
	ThrottledSteps int `json:"throttled_steps"`
}

// Report is the analysis of one job. Its JSON form is documented in
// docs/report.md; keys are stable.
type Report struct {
	Job          string           `json:"job"`
	Dir          string           `json:"dir"`
	Meta         *tps.RunMeta     `json:"meta,omitempty"`
	Summary      tps.Summary      `json:"summary"`
	Breakdown    Breakdown        `json:"breakdown"`
	Stragglers   []tps.RankScore  `json:"straggler_ranks"`
	Nodes        []tps.NodeScore  `json:"straggler_nodes"`
	RankRows     int64            `json:"rank_rows"`
	Events       map[string]int64 `json:"events"`
	Energy       *Energy          `json:"energy,omitempty"`
	CostPerMTok  *float64         `json:"cost_per_million_tokens_usd,omitempty"`
	TimeToTrainS *float64         `json:"time_to_train_s,omitempty"`
}

// Analyze reads the traces of the job folder dir (OUT/<job>).
func Analyze(dir string, opt Options) (*Report, error) {
	if opt.TopStragglers <= 0 {
		opt.TopStragglers = 5
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("report: %s is not a job folder of Parquet traces", dir)
	}
	rep := &Report{Job: filepath.Base(dir), Dir: dir, Events: map[string]int64{}}
	clusterDir := filepath.Join(dir, trace.ClusterSteps)
	steps, err := trace.ReadAll[tps.ClusterStep](clusterDir)
	if err != nil {
		return nil, err
	}
	if len(steps) == 0 {
		return nil, fmt.Errorf("report: no cluster steps under %s", clusterDir)
	}
	rep.Meta = readMeta(clusterDir)
	rep.Summary = tps.Summarize(steps, tps.WindowOptions{Warmup: opt.Warmup})
	mask := tps.WarmupMask(steps, tps.WindowOptions{Warmup: opt.Warmup})
	steady := map[[2]int64]bool{}
	var n float64
	var energy Energy
	var eSteps, eTokens, eJoules float64
	for i, c := range steps {
		if mask[i] || c.StepTimeNs <= 0 {
			continue
		}
		steady[[2]int64{c.Attempt, c.Step}] = true
		n++
		rep.Breakdown.Compute += c.ComputeNsMean / float64(c.StepTimeNs)
		rep.Breakdown.CommOverlap += c.CommOverlap
		if c.GPUsJoined > 0 && c.EnergyJ > 0 {
			eSteps++
			eTokens += float64(c.Tokens)
			eJoules += c.EnergyJ
			energy.PowerWMean += c.PowerWMean
			energy.SMClockMHzMean += c.SMClockMHzMean
			// bits 0 (GPU idle) and 1 (application clocks) are not throttling
			if c.ClockEventReasons&^0x3 != 0 {
				energy.ThrottledSteps++
			}
		}
	}
	if eSteps > 0 {
		energy.TokensPerJoule, energy.JoulesPerToken = eTokens/eJoules, eJoules/eTokens
		energy.PowerWMean /= eSteps
		energy.SMClockMHzMean /= eSteps
		rep.Energy = &energy
	}
	s := rep.Summary
	if n > 0 {
		rep.Breakdown.Compute /= n
		rep.Breakdown.CommOverlap /= n
	}
	rep.Breakdown.ExposedComm, rep.Breakdown.Bubble = s.CommFraction, s.BubbleFraction
	rep.Breakdown.DataStall, rep.Breakdown.Checkpoint = s.DataStallFraction, s.CkptFraction
	if rep.Meta != nil {
		rep.Breakdown.BubbleTheoretical = tps.TheoreticalBubble(rep.Meta.Topology.PP, rep.Meta.MicroBatches, rep.Meta.Interleave)
	}

	// Straggler scores from the steady steps' per-rank compute times.
	compute := map[int64][]float64{}
	nodes := map[int64]string{}
	err = trace.Each(filepath.Join(dir, trace.RankSteps), func(rows []tps.StepRecord) error {
		for i := range rows {
			r := &rows[i]
			rep.RankRows++
			if !steady[[2]int64{r.Attempt, r.Step}] {
				continue
			}
			compute[r.Rank] = append(compute[r.Rank], float64(r.ComputeNs()))
			if r.Node != "" && nodes[r.Rank] == "" {
				nodes[r.Rank] = r.Node
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	scores := tps.StragglerScores(compute, nodes)
	rep.Nodes = tps.NodeScores(scores)
	rep.Stragglers = scores[:min(len(scores), opt.TopStragglers)]
	rep.Nodes = rep.Nodes[:min(len(rep.Nodes), opt.TopStragglers)]

	if err := trace.Each(filepath.Join(dir, trace.Events), func(rows []tps.Event) error {
		for _, e := range rows {
			rep.Events[e.Kind]++
		}
		return nil
	}); err != nil {
		return nil, err
	}

	price := opt.GPUHourUSD
	if price <= 0 && rep.Meta != nil {
		price = rep.Meta.GPUHourUSD
	}
	if price > 0 && s.AggregateTPS > 0 && s.WorldSize > 0 {
		if c, err := tps.CostPerMillionTokens(s.WallTPS, int(s.WorldSize), price); err == nil {
			rep.CostPerMTok = &c
		}
	}
	if opt.TrainTokens > 0 && s.WallTPS > 0 {
		if d, err := tps.TimeToTrain(opt.TrainTokens, s.WallTPS); err == nil {
			x := d.Seconds()
			rep.TimeToTrainS = &x
		}
	}
	return rep, nil
}

// readMeta takes the run metadata from the newest cluster_steps part.
func readMeta(dir string) *tps.RunMeta {
	files, _ := trace.PartFiles(dir)
	for i := len(files) - 1; i >= 0; i-- {
		md, err := trace.FileMetadata(files[i])
		if err != nil {
			continue
		}
		var m tps.RunMeta
		if raw, ok := md[trace.MetaRun]; ok && json.Unmarshal([]byte(raw), &m) == nil {
			return &m
		}
	}
	return nil
}
