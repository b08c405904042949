package report

import (
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
	"github.com/tpsprof/tpsprof/trace/tracetest"
)

// FLOPs PyTorch counted on sampled steps (flop_count events, one a rank):
// per token, Σ the ranks' counts over the steps' tokens; beside the
// analytic FLOPs of the same steps' cluster rows, flagged beyond 5%; the
// sampled steps out of the figures (they ran under the counter, 3×
// slower here: the headline is the other steps'); a step not every rank
// counted left out; a malformed detail is no sample. Without a GPU peak,
// no MFU from the count, and the text says why.
func TestCountedFLOPs(t *testing.T) {
	for _, c := range []struct {
		name    string
		counted float64 // a rank's FLOPs per token of its share
		flagged bool
		peak    bool // the run metadata names a peak (no model): MFU from the count
	}{{"close", 6.1e9, false, false}, {"far", 7.0e9, true, false}, {"peak", 6.1e9, false, true}} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			const job, world, steps = "fl", 4, int64(60)
			const s, tokens, analytic = int64(1e9), int64(4000), 6.0e9 // analytic FLOPs a token
			copt := trace.WriterOptions{WriterID: "f"}
			if c.peak {
				copt.Metadata = func() map[string]string {
					return map[string]string{trace.MetaRun: `{"job":"fl","peak_tflops":10}`} // 1e13 FLOP/s a GPU
				}
			}
			w, _ := trace.NewPartWriter[tps.ClusterStep](root, job, trace.ClusterSteps, copt)
			rw, _ := trace.NewPartWriter[tps.StepRecord](root, job, trace.RankSteps, trace.WriterOptions{WriterID: "f"})
			ew, _ := trace.NewPartWriter[tps.Event](root, job, trace.Events, trace.WriterOptions{WriterID: "f"})
			sampled := map[int64]bool{20: true, 40: true}
			at := tracetest.T0
			for i := range steps {
				d := s
				if sampled[i] {
					d = 3 * s
				}
				w.Write([]tps.ClusterStep{{Job: job, Step: i, WorldSize: world, RanksReported: world, Replicas: world, Tokens: tokens,
					FLOPs: analytic * float64(tokens), StepTimeNs: d, StartUnixNs: at, EndUnixNs: at + d, TPS: float64(tokens) / (float64(d) / 1e9)}})
				for r := range int64(world) {
					rw.Write([]tps.StepRecord{{Job: job, Step: i, Rank: r, WorldSize: world, StartUnixNs: at, EndUnixNs: at + d, DurationNs: d, Tokens: tokens / world}})
					if sampled[i] || (i == 50 && r < 3) { // step 50: rank 3's count lost
						ew.Write([]tps.Event{{Job: job, Kind: tps.EventFlopCount, Rank: r, Step: i, StartUnixNs: at, EndUnixNs: at + d,
							Detail: fmt.Sprintf(`{"flops":%.0f}`, c.counted*float64(tokens/world))}})
					}
				}
				at += d
			}
			ew.Write([]tps.Event{{Job: job, Kind: tps.EventFlopCount, Rank: 0, Step: 30, StartUnixNs: tracetest.T0, Detail: `{"flops":-1}`}})
			for _, x := range []interface{ Close() error }{w, rw, ew} {
				if err := x.Close(); err != nil {
					t.Fatal(err)
				}
			}
			rep, err := analyzeChecked(filepath.Join(root, job), Options{Warmup: 0})
			if err != nil {
				t.Fatal(err)
			}
			f := rep.CountedFLOPs
			if f == nil || f.Samples != 2 || f.Partial != 1 {
				t.Fatalf("counted %+v: want steps 20 and 40, step 50 left out", f)
			}
			if math.Abs(f.PerToken-c.counted) > 1e-6*c.counted || f.AnalyticPerToken == nil || math.Abs(*f.AnalyticPerToken-analytic) > 1 {
				t.Errorf("per token %g against %v; want %g against %g", f.PerToken, f.AnalyticPerToken, c.counted, analytic)
			}
			if gap := c.counted/analytic - 1; f.Gap == nil || math.Abs(*f.Gap-gap) > 1e-9 || f.Flagged != c.flagged {
				t.Errorf("gap %v flagged %v; want %.4f, %v", f.Gap, f.Flagged, gap, c.flagged)
			}
			if math.Abs(f.Slowdown-3) > 1e-9 {
				t.Errorf("slowdown %v: the counted steps took 3 s against 1 s", f.Slowdown)
			}
			// 6.1e9 FLOPs a token × 4,000 tokens/s over 4 GPUs of 1e13 FLOP/s: 61%
			if want := c.counted * 4000 / (4 * 1e13); c.peak && (f.MFU == nil || f.HFU == nil || math.Abs(*f.MFU-want) > 1e-9 || *f.HFU != *f.MFU) {
				t.Errorf("peak known: MFU %v HFU %v from the count, want %.4f (%s)", f.MFU, f.HFU, want, f.Unknown)
			} else if !c.peak && (f.MFU != nil || f.HFU != nil || !strings.Contains(f.Unknown, "peak")) {
				t.Errorf("no GPU: MFU %v HFU %v, unknown %q", f.MFU, f.HFU, f.Unknown)
			}
			// the sampled steps (3 s each) are out of the figures: 4,000
			// tokens a second; step 50 too (three ranks ran it counted)
			if math.Abs(rep.Summary.AggregateTPS-4000) > 1e-6 || rep.Summary.SteadySteps != int(steps)-3 {
				t.Errorf("TPS %v over %d steady steps: want 4000 over %d (the samples left out)", rep.Summary.AggregateTPS, rep.Summary.SteadySteps, steps-3)
			}
			var text string
			for _, l := range rep.Lines() {
				text += l.Key + "  " + l.Value + "\n"
			}
			want := "FLOPs counted  " + flopsText(c.counted) + " a token on 2 sampled steps"
			if !strings.Contains(text, want) || strings.Contains(text, "more than 5% apart") != c.flagged {
				t.Errorf("the text lacks %q or flags wrongly (%v):\n%s", want, c.flagged, text)
			}
			if c.peak && !strings.Contains(text, "MFU / HFU  61.0% / 61.0% from the FLOPs PyTorch counted") {
				t.Errorf("the MFU line does not give the counted MFU:\n%s", text)
			}
		})
	}
}
