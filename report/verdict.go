package report

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/tpsprof/tpsprof/tps"
)

// NoiseSigmas is how many standard errors of the two runs' own
// step-to-step noise a change must exceed to be a verdict (two: a
// difference this large between two runs of one job is rare).
const NoiseSigmas = 2

// Verdict says whether run B is slower or faster than run A, by their
// throughput (tokens over step time; per GPU when their world sizes
// differ), beyond the two runs' own step-to-step noise, and what changed
// in their time: the parts of the breakdown that moved most, in points of
// step time.
type Verdict struct {
	// ChangePct is B's throughput against A's, in percent (−6.1: B is 6.1%
	// slower); nil when either has none.
	ChangePct *float64 `json:"change_pct"`
	// NoisePct is NoiseSigmas standard errors of the difference from the
	// runs' own noise (tps.Summary.StepTimeRelSE), in percent.
	NoisePct float64 `json:"noise_pct"`
	// Beyond is true when |ChangePct| > NoisePct: a verdict, not noise.
	Beyond bool `json:"beyond_noise"`
	// Moved are the breakdown's parts whose share of step time changed by
	// half a point or more, the largest change in the direction of the
	// verdict first.
	Moved []Moved `json:"moved,omitempty"`
	// Text is the verdict in words.
	Text string `json:"text"`
	// By says which throughput was compared.
	By string `json:"by,omitempty"`
}

// Moved is a part of the breakdown that changed between the runs.
type Moved struct {
	Key         string  `json:"key"`
	Label       string  `json:"label"`
	DeltaPoints float64 `json:"delta_points"`
}

// CompareVerdict is the verdict of B against A.
func CompareVerdict(a, b *Report) Verdict {
	var v Verdict
	sa, sb := a.Summary, b.Summary
	if !hasTPS(sa) || !hasTPS(sb) {
		v.Text = "no verdict: a run has no throughput (no steady step counted a token)"
		return v
	}
	ta, tb, by := sa.AggregateTPS, sb.AggregateTPS, "tokens/s"
	if sa.WorldSize != sb.WorldSize {
		ta, tb, by = sa.TPSPerGPU, sb.TPSPerGPU, "tokens/s per GPU (the world sizes differ)"
	}
	change := 100 * (tb - ta) / ta
	v.ChangePct, v.By = &change, by
	v.NoisePct = 100 * NoiseSigmas * math.Hypot(sa.StepTimeRelSE, sb.StepTimeRelSE)
	v.Beyond = math.Abs(change) > v.NoisePct
	for _, p := range tps.ShareParts() {
		d := 100 * (*p.Of(&b.Breakdown.Shares) - *p.Of(&a.Breakdown.Shares))
		if math.Abs(d) >= 0.5 {
			v.Moved = append(v.Moved, Moved{p.Key, p.Label, d})
		}
	}
	// slower: the parts that grew first (compute shrinking is their
	// consequence); faster: those that shrank first
	sign := 1.0
	if change > 0 {
		sign = -1
	}
	sort.SliceStable(v.Moved, func(i, j int) bool { return sign*v.Moved[i].DeltaPoints > sign*v.Moved[j].DeltaPoints })
	var w []string
	for _, m := range v.Moved {
		if sign*m.DeltaPoints > 0 && len(w) < 3 {
			w = append(w, fmt.Sprintf("%s %+.1f points", m.Label, m.DeltaPoints))
		}
	}
	why := "; no part of the breakdown moved half a point (the same shares of a longer step)"
	if change > 0 {
		why = "; no part of the breakdown moved half a point (the same shares of a shorter step)"
	}
	if len(w) > 0 {
		why = ": " + strings.Join(w, ", ")
	}
	switch {
	case !v.Beyond:
		v.Text = fmt.Sprintf("no difference beyond the runs' own noise: %s %+.1f%% (noise ±%.1f%%)", b.Job, change, v.NoisePct)
	case change < 0:
		v.Text = fmt.Sprintf("%s is %.1f%% slower than %s%s", b.Job, -change, a.Job, why)
	default:
		v.Text = fmt.Sprintf("%s is %.1f%% faster than %s%s", b.Job, change, a.Job, why)
	}
	return v
}

// Fails says whether the verdict fails a gate that allows B to be at
// most pct percent slower: B slower by more than pct, beyond the noise.
func (v Verdict) Fails(pct float64) bool {
	return v.ChangePct != nil && v.Beyond && -*v.ChangePct > pct
}
