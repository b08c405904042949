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
	var v violations
	v.summary(r)
	if s := r.Summary; s.MFU != nil {
		v.frac("MFU", *s.MFU)
		v.frac("HFU", *s.HFU)
	}
	v.goodput(r.Goodput)
	if err := ledgerAddsUp(r.MFULedger); err != nil {
		v.add(err.Error())
	}
	if l := r.MFULedger.Ledger; l != nil && (r.Summary.MFU == nil || math.Abs(l.MFU-100**r.Summary.MFU) > 0.05) {
		v.add(fmt.Sprintf("MFU ledger from %.2f points, the summary's MFU %v", l.MFU, r.Summary.MFU))
	}
	for _, x := range []*float64{r.MFULedger.TensorActivity, r.MFULedger.SMActivity, r.MFULedger.DRAMBandwidth} {
		if x != nil {
			v.frac("GPU activity", *x)
		}
	}
	if r.Meta != nil && r.Meta.Steps == tps.StepsLoop {
		v.attempts(r.Attempts)
	}
	v.fractions(r)
	v.printed(r)
	return v.bad
}

// violations are what Invariants found.
type violations struct{ bad []string }

func (v *violations) add(s string) { v.bad = append(v.bad, s) }

// frac checks a fraction.
func (v *violations) frac(name string, x float64) {
	if math.IsNaN(x) || x < 0 || x > 1 {
		v.add(fmt.Sprintf("%s = %v, outside [0, 1]", name, x))
	}
}

// summary checks the breakdown and the headline.
func (v *violations) summary(r *Report) {
	s := r.Summary
	if s.SteadySteps <= 0 {
		return
	}
	var sum float64
	for _, p := range tps.ShareParts() {
		x := *p.Of(&r.Breakdown.Shares)
		v.frac("breakdown "+p.Key, x)
		sum += x
	}
	if math.Abs(sum-1) > 1e-3 {
		v.add(fmt.Sprintf("breakdown parts add up to %.4f, not 1", sum))
	}
	v.frac("breakdown comm_overlap", r.Breakdown.CommOverlap)
	v.frac("worst step's exposed communication", s.CommFractionMax)
	if s.TPSUnknown == "" {
		secs := s.StepTimeS.Mean * float64(s.SteadySteps)
		if want := float64(s.Tokens) / secs; secs <= 0 || math.Abs(s.AggregateTPS-want) > 0.005*want {
			v.add(fmt.Sprintf("headline %v tokens/s is not tokens ÷ step time (%d / %.6g s = %v)", s.AggregateTPS, s.Tokens, secs, want))
		}
		if s.Tokens <= 0 {
			v.add("a throughput without tokens")
		}
	} else if s.AggregateTPS != 0 || s.WallTPS != 0 || s.TPSPerGPU != 0 {
		v.add("throughput figures beside " + s.TPSUnknown)
	}
}

// goodput checks goodput and its parts.
func (v *violations) goodput(g Goodput) {
	if g.ElapsedS <= 0 {
		return
	}
	v.frac("goodput", g.Goodput)
	parts := g.ProductiveS + g.UnmonitoredS
	keys := make([]string, 0, len(g.BadputS))
	for k := range g.BadputS {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		x := g.BadputS[k]
		v.frac("badput "+k+" share", x/g.ElapsedS)
		parts += x
	}
	if math.Abs(parts-g.ElapsedS) > max(1e-3, 1e-6*g.ElapsedS) {
		v.add(fmt.Sprintf("goodput parts add up to %.3f s, elapsed %.3f s", parts, g.ElapsedS))
	}
}

// attempts checks that each attempt's wall time, from its first step's
// start to its last step's end, is its steps' step time and its named
// gaps within 1%, for a job whose producer says its steps are the loop's
// period (tps.StepsLoop: docs/report.md). (An older producer's steps
// left the time between them out: that time is idle badput there.)
func (v *violations) attempts(rows []AttemptRow) {
	for i := range rows {
		t := rows[i].Time
		if t.SpanS <= 0 {
			continue
		}
		if math.Abs(t.UnaccountedS) > max(0.01*t.SpanS, 1e-3) {
			v.add(fmt.Sprintf("attempt %d: Σ step time %.3f s + named gaps %.3f s leave %.3f s of its %.3f s unaccounted",
				rows[i].Attempt, t.StepsS, t.GapsS, t.UnaccountedS, t.SpanS))
		}
	}
}

// fractions checks the other fractions.
func (v *violations) fractions(r *Report) {
	if p := r.Padding; p != nil {
		v.frac("padding real fraction", p.RealFraction)
	}
	if g := r.Generation; g != nil {
		v.frac("generation share", g.GenShare)
		v.frac("training share", g.TrainingShare)
		v.frac("waiting share", g.WaitingShare)
	}
	for _, e := range r.Episodes {
		v.frac("episode cost fraction", e.CostFraction)
	}
	if c := r.CaptureCost; c != nil && c.StepFraction != nil {
		v.frac("capture cost share", *c.StepFraction)
	}
	if f := r.CountedFLOPs; f != nil {
		if f.MFU != nil {
			v.frac("MFU from counted FLOPs", *f.MFU)
		}
		if f.HFU != nil {
			v.frac("HFU from counted FLOPs", *f.HFU)
		}
	}
	if m := r.Memory; m != nil {
		for _, x := range m.Fullest {
			if x.Headroom != nil {
				v.frac(fmt.Sprintf("rank %d memory headroom", x.Rank), *x.Headroom)
			}
		}
	}
}

// printed checks that no figure prints as not a number.
func (v *violations) printed(r *Report) {
	if b, err := json.Marshal(r); err != nil {
		v.add("the report does not encode as JSON: " + err.Error())
	} else if nonNumber.Match(b) {
		v.add("the JSON holds NaN or Inf")
	}
	var text bytes.Buffer
	WriteText(&text, r)
	if m := nonNumber.Find(text.Bytes()); m != nil {
		v.add(fmt.Sprintf("the text holds %q", m))
	}
}

// nonNumber is how a figure that is not a number prints (fmt's NaN,
// +Inf, -Inf).
var nonNumber = regexp.MustCompile(`\bNaN\b|[+-]Inf\b`)
