package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"sort"

	"github.com/tpsprof/tpsprof/tps"
)

// Invariants lists what is wrong with a report's figures, none when they
// hold: every fraction in [0, 1] (the breakdown's parts, the worst step's
// exposed share, MFU and HFU, goodput and its badput shares, overlap,
// padding, generation shares), the breakdown adding up to 1 within 0.1%,
// the headline equal to the steady steps' tokens over their step time
// within 0.5%, the goodput parts adding up to the elapsed time, and no
// figure that is not a number. A violation is a bug to find, not a number
// to clamp: the tests run it over every report they make (the demo, the
// generated traces, the real PyTorch jobs).
func Invariants(r *Report) []string {
	var bad []string
	frac := func(name string, v float64) {
		if math.IsNaN(v) || v < 0 || v > 1 {
			bad = append(bad, fmt.Sprintf("%s = %v, outside [0, 1]", name, v))
		}
	}
	s := r.Summary
	if s.SteadySteps > 0 {
		var sum float64
		for _, p := range tps.ShareParts {
			v := *p.Of(&r.Breakdown.Shares)
			frac("breakdown "+p.Key, v)
			sum += v
		}
		if math.Abs(sum-1) > 1e-3 {
			bad = append(bad, fmt.Sprintf("breakdown parts add up to %.4f, not 1", sum))
		}
		frac("breakdown comm_overlap", r.Breakdown.CommOverlap)
		frac("worst step's exposed communication", s.CommFractionMax)
		if s.TPSUnknown == "" {
			secs := s.StepTimeS.Mean * float64(s.SteadySteps)
			if want := float64(s.Tokens) / secs; secs <= 0 || math.Abs(s.AggregateTPS-want) > 0.005*want {
				bad = append(bad, fmt.Sprintf("headline %v tokens/s is not tokens ÷ step time (%d / %.6g s = %v)", s.AggregateTPS, s.Tokens, secs, want))
			}
			if s.Tokens <= 0 {
				bad = append(bad, "a throughput without tokens")
			}
		} else if s.AggregateTPS != 0 || s.WallTPS != 0 || s.TPSPerGPU != 0 {
			bad = append(bad, "throughput figures beside "+s.TPSUnknown)
		}
	}
	if s.MFU != nil {
		frac("MFU", *s.MFU)
		frac("HFU", *s.HFU)
	}
	if g := r.Goodput; g.ElapsedS > 0 {
		frac("goodput", g.Goodput)
		parts := g.ProductiveS + g.UnmonitoredS
		keys := make([]string, 0, len(g.BadputS))
		for k := range g.BadputS {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			v := g.BadputS[k]
			frac("badput "+k+" share", v/g.ElapsedS)
			parts += v
		}
		if math.Abs(parts-g.ElapsedS) > max(1e-3, 1e-6*g.ElapsedS) {
			bad = append(bad, fmt.Sprintf("goodput parts add up to %.3f s, elapsed %.3f s", parts, g.ElapsedS))
		}
	}
	if p := r.Padding; p != nil {
		frac("padding real fraction", p.RealFraction)
	}
	if g := r.Generation; g != nil {
		frac("generation share", g.GenShare)
		frac("training share", g.TrainingShare)
		frac("waiting share", g.WaitingShare)
	}
	for _, e := range r.Episodes {
		frac("episode cost fraction", e.CostFraction)
	}
	if c := r.CaptureCost; c != nil && c.StepFraction != nil {
		frac("capture cost share", *c.StepFraction)
	}
	if f := r.CountedFLOPs; f != nil {
		if f.MFU != nil {
			frac("MFU from counted FLOPs", *f.MFU)
		}
		if f.HFU != nil {
			frac("HFU from counted FLOPs", *f.HFU)
		}
	}
	if m := r.Memory; m != nil {
		for _, x := range m.Fullest {
			if x.Headroom != nil {
				frac(fmt.Sprintf("rank %d memory headroom", x.Rank), *x.Headroom)
			}
		}
	}
	if b, err := json.Marshal(r); err != nil {
		bad = append(bad, "the report does not encode as JSON: "+err.Error())
	} else if nonNumber.Match(b) {
		bad = append(bad, "the JSON holds NaN or Inf")
	}
	var text bytes.Buffer
	WriteText(&text, r)
	if m := nonNumber.Find(text.Bytes()); m != nil {
		bad = append(bad, fmt.Sprintf("the text holds %q", m))
	}
	return bad
}

// nonNumber is how a figure that is not a number prints (fmt's NaN,
// +Inf, -Inf).
var nonNumber = regexp.MustCompile(`\bNaN\b|[+-]Inf\b`)
