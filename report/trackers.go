package report

import (
	"math"
	"strings"

	"github.com/tpsprof/tpsprof/tps"
)

// TrackerPrefix begins every name the report writes into a tracker's run
// (tpsprof report --wandb/--tensorboard/--mlflow; docs/trackers.md).
const TrackerPrefix = "tpsprof/report/"

// TrackerFigures are the whole-run figures a tracker's run gets, by name:
// the headline (tokens ÷ time), its distribution, MFU and HFU, where the
// time went, goodput, energy and cost. A figure the report does not know
// (no token counted, no model for MFU, no GPU samples) is left out, never
// written as 0.
func (r *Report) TrackerFigures() map[string]float64 {
	out := map[string]float64{}
	put := func(name string, v float64) {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			out[TrackerPrefix+name] = v
		}
	}
	s := &r.Summary
	put("steady_steps", float64(s.SteadySteps))
	put("world_size", float64(s.WorldSize))
	put("step_time_p50_s", s.StepTimeS.P50)
	put("step_time_p95_s", s.StepTimeS.P95)
	if s.TPSUnknown == "" && s.Tokens > 0 {
		put("tokens", float64(s.Tokens))
		put("aggregate_tps", s.AggregateTPS)
		put("tps_per_gpu", s.TPSPerGPU)
		if s.WallTPS > 0 {
			put("wall_tps", s.WallTPS)
		}
		put("step_tps_p50", s.TPS.P50)
		put("step_tps_p95", s.TPS.P95)
	}
	if s.MFU != nil {
		put("mfu", *s.MFU)
	}
	if s.HFU != nil {
		put("hfu", *s.HFU)
	}
	// where the MFU went, in points of the peak (with 100 × mfu they add
	// up to 100), and the GPUs' own activity over the same steps
	if l := r.MFULedger.Ledger; l != nil {
		for _, b := range l.Lost {
			put("mfu_lost/"+b.Key, b.Points)
		}
	}
	if v := r.MFULedger.TensorActivity; v != nil {
		put("tensor_activity", *v)
	}
	if v := r.MFULedger.SMActivity; v != nil {
		put("sm_activity", *v)
	}
	if s.SteadySteps > 0 {
		for _, p := range tps.ShareParts() {
			put("share/"+p.Key, *p.Of(&s.Breakdown))
		}
		for k, v := range s.Breakdown.Splits {
			put("split/"+strings.TrimSuffix(k, "_ns"), v) // (a split of its part: not under share/, whose figures add up to 1)
		}
	}
	if r.Goodput.ElapsedS > 0 {
		put("goodput", r.Goodput.Goodput)
		put("elapsed_s", r.Goodput.ElapsedS)
		put("restarts", float64(r.Goodput.Restarts))
	}
	put("straggler_episodes", float64(len(r.Episodes)))
	if e := r.Energy; e != nil && e.TokensPerJoule > 0 {
		put("tokens_per_joule", e.TokensPerJoule)
		put("power_w_mean", e.PowerWMean)
	}
	if r.CostPerMTok != nil {
		put("cost_per_million_tokens_usd", *r.CostPerMTok)
	}
	return out
}
