package report

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tpsprof/tpsprof/mfu"
	"github.com/tpsprof/tpsprof/tps"
)

// DDPHiddenEstimated is what the text report says of a run whose DDP
// models were measured from their reducers on PyTorch 2 (RunMeta.Hooks
// ddp_buckets "reducer", communication not said unmeasured): the exposed
// part is measured every step, the part the backward hides only on
// sampled backward passes (docs/capture.md, "DDP's buckets on CPU").
const DDPHiddenEstimated = "DDP's communication hidden by the backward: measured on sampled backward passes " +
	"(the first 10, then at each power of two and 1 in 50) and carried to the steps between them (the median of the last 5); " +
	"the exposed part is measured every step"

// FunctionalHiddenEstimated is what the text report says of a run whose
// functional collectives (tensor parallelism's, on CPU) were timed by their
// waits between sampled steps (RunMeta.Hooks sync_collectives naming a
// _c10d_functional operator): the exposed part is measured every step, the
// part the host's work hid before each wait only on sampled steps
// (docs/capture.md, "Synchronous and functional collectives between
// samples").
const FunctionalHiddenEstimated = "functional collectives' communication hidden by the host's work before their waits: " +
	"measured on sampled steps (the first 10, then at each power of two and 1 in 50) and carried to the steps between them " +
	"(the median of the last 256 calls); the exposed part is measured every step"

// windowsText says how many rank_windows rows stood for the rank rows.
func windowsText(r *Report) string {
	if r.RankWindows == 0 {
		return ""
	}
	return fmt.Sprintf(" summarised in %d rank_windows rows", r.RankWindows)
}

// sizeText writes a byte count in B, KiB, MiB or GiB.
func sizeText(n int64) string {
	x, unit := float64(n), "B"
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB"} {
		if x < 1024 {
			break
		}
		x, unit = x/1024, u
	}
	if unit == "B" {
		return fmt.Sprintf("%d B", n)
	}
	return fmt.Sprintf("%.1f %s", x, unit)
}

func pct(x float64) string { return fmt.Sprintf("%.1f%%", 100*x) }

// Line is one figure of the report as text, Markdown and HTML show it:
// what (Key) and its value in words.
type Line struct {
	Key, Value string
}

// Lines are the report's figures as WriteText prints them, the one row
// model of the text, the Markdown table and the HTML page's figures
// (which show some of them as tables of their own instead). A report
// without steady steps ends at the warm-up, with a line keyed "".
func (r *Report) Lines() []Line {
	l := &lines{}
	l.head(r)
	if r.Summary.SteadySteps == 0 {
		return append(l.out, Line{"", "no steady steps to summarise"})
	}
	for _, section := range []func(*lines, *Report){(*lines).rates, (*lines).breakdown, (*lines).goodput, (*lines).traces,
		(*lines).flops, (*lines).own, (*lines).stragglers, (*lines).tail} {
		section(l, r)
	}
	return l.out
}

// lines builds Lines, a section at a time.
type lines struct{ out []Line }

func (l *lines) row(k, format string, a ...any) {
	l.out = append(l.out, Line{k, fmt.Sprintf(format, a...)})
}

// head adds the run, its notes, the steps and what was read.
func (l *lines) head(r *Report) {
	s := r.Summary
	for _, n := range r.Notes {
		l.row("note", "%s", n)
	}
	if m := r.Meta; m != nil {
		model := m.ModelPreset
		if model == "" && m.Model != nil {
			model = "custom model"
		}
		l.row("run", "%s, %s, %s %s, %d ranks", LayoutText(*m, s.WorldSize), orDash(model), orDash(m.GPU), orDash(m.DType), s.WorldSize)
		if src, ok := tps.TokenSourceText(m.TokenSource); ok {
			l.row("tokens from", "%s", src)
		}
		if src, ok := tps.DataSourceText(m.DataSource); ok {
			l.row("data wait", "%s", src)
		}
		for _, k := range slices.Sorted(maps.Keys(m.Unmeasured)) {
			if what, ok := tps.UnmeasuredText(k); ok {
				l.row("not measured", "%s: %s", what, m.Unmeasured[k])
			}
		}
		if m.Hooks["ddp_buckets"] == "reducer" && m.Unmeasured["communication"] == "" {
			// (PyTorch 2 on CPU: on 1.13 that part is not measured, and
			// the run says so above)
			l.row("estimated", "%s", DDPHiddenEstimated)
		}
		if strings.Contains(m.Hooks["sync_collectives"], "_c10d_functional::") {
			l.row("estimated", "%s", FunctionalHiddenEstimated)
		}
		if off := m.HooksOff(); len(off) > 0 {
			l.row("hooks off", "%s", strings.Join(off, "; "))
		}
	}
	if s.CompleteNote != "" {
		l.row("note", "%s", s.CompleteNote)
	}
	if c := ClockOffsetsText(r.ClockOffsetsNs); c != "" {
		l.row("clock offsets", "%s", c)
	}
	l.row("steps", "%d (%d warm-up excluded, %d steady, %s, %d attempts)", s.Steps, s.WarmupSteps, s.SteadySteps, incompleteText(s), s.Attempts)
	if len(r.TablesRead) > 0 {
		l.row("read", "%s (%d rank rows%s; %s of %s)", strings.Join(r.TablesRead, ", "), r.RankRows, windowsText(r), sizeText(r.BytesRead), sizeText(r.BytesInTables))
	}
	if s.WarmupSteps > 0 && s.WarmupRule != "" {
		l.row("warm-up", "%d steps excluded: %s", s.WarmupSteps, s.WarmupRule)
	}
}

// rates adds throughput, step time, MFU and HFU.
func (l *lines) rates(r *Report) {
	s := r.Summary
	l.row("TPS", "%s", headlineText(s))
	if s.TPSUnknown == "" {
		l.row("TPS per GPU", "%s tokens/s", tps.SI(s.TPSPerGPU))
		l.row("wall TPS", "%s", wallText(s))
		l.row("step TPS", "p50 %s  p95 %s  p99 %s  (min %s, max %s) tokens/s: the steps' own rates, not the run's throughput",
			tps.SI(s.TPS.P50), tps.SI(s.TPS.P95), tps.SI(s.TPS.P99), tps.SI(s.TPS.Min), tps.SI(s.TPS.Max))
	}
	l.row("step time", "mean %.3fs  p50 %.3fs  p95 %.3fs  p99 %.3fs", s.StepTimeS.Mean, s.StepTimeS.P50, s.StepTimeS.P95, s.StepTimeS.P99)
	if x := r.Loss; x != nil {
		l.row("loss", "%.4g at the first steady step, %.4g at the last (mean %.4g, lowest %.4g, over %d steps)", x.First, x.Last, x.Mean, x.Lowest, x.Steps)
	}
	if f := r.CountedFLOPs; s.MFU == nil && f != nil && f.HFU != nil {
		// no analytic model: PyTorch's own count gives them
		m := "n/a (activations recomputed)"
		if f.MFU != nil {
			m = pct(*f.MFU)
		}
		l.row("MFU / HFU", "%s / %s from the FLOPs PyTorch counted (no model in the run metadata)", m, pct(*f.HFU))
	} else {
		l.row("MFU / HFU", "%s", mfuText(s))
	}
	if s.MFU != nil {
		dt := mfu.BF16
		if r.Meta != nil && r.Meta.DType != "" {
			if d, err := mfu.ParseDType(r.Meta.DType); err == nil {
				dt = d
			}
		}
		l.row("peak convention", "%s", mfu.PeakConvention(dt))
	}
}

// breakdown adds where the time went: the breakdown, the waiting, communication, generation.
func (l *lines) breakdown(r *Report) {
	s := r.Summary
	l.row("time breakdown", "%s", BreakdownText(r.Breakdown))
	l.row("MFU ledger", "%s", LedgerText(r.MFULedger))
	for i, f := range r.Findings {
		if i < 3 {
			l.row(fmt.Sprintf("finding %d", i+1), "%s", FindingText(f))
		}
	}
	if len(r.WaitCharged) > 0 {
		var parts []string
		for _, w := range r.WaitCharged {
			p := fmt.Sprintf("%s %s (ranks %s, critical in %d steps", w.Node, pct(w.Share), rankList(w.Ranks), w.Steps)
			if w.ByRank { // one node: the rank is who the others waited for
				p = fmt.Sprintf("rank %s %s (on %s, critical in %d steps", rankList(w.Ranks), pct(w.Share), orDash(w.Node), w.Steps)
			}
			if w.Cause != "" {
				p += "; " + w.Cause
			}
			parts = append(parts, p+")")
		}
		l.row("waiting caused by", "%s", strings.Join(parts, "; "))
	}
	if b := r.Breakdown; b.CommOverlap > 0 {
		l.row("comm overlap", "%s of communication hidden behind compute (worst rank-step: %s of its step time exposed)", pct(b.CommOverlap), pct(s.CommFractionMax))
	}
	if f := r.CommFit; f.Slope != 0 && !f.Related() {
		l.row("TPS vs comm", "no relation found between step TPS and exposed communication (R² %.2f)", f.R2)
	} else if f.Related() {
		l.row("TPS vs comm", "each point of exposed communication costs %s tokens/s (least squares, R² %.2f)", tps.SI(-f.Slope/100), f.R2)
	}
	for _, g := range generationLines(r) {
		l.row(g[0], "%s", g[1])
	}
}

// goodput adds goodput, badput, restarts and the attempts.
func (l *lines) goodput(r *Report) {
	if g := r.Goodput; g.ElapsedS > 0 {
		var bad []string
		for _, k := range slices.Sorted(maps.Keys(g.BadputS)) {
			bad = append(bad, fmt.Sprintf("%s %s", k, pct(g.BadputS[k]/g.ElapsedS)))
		}
		l.row("goodput", "%s of %.0fs elapsed; badput: %s", pct(g.Goodput), g.ElapsedS, strings.Join(bad, ", "))
		if nc := g.NotCountedText(); nc != "" {
			l.row("not counted", "%s", nc)
		}
		if g.Restarts > 0 {
			l.row("restarts", "%d (%s), %d steps redone", g.Restarts, restartKinds(g), g.RedoneSteps)
		}
		if c := r.Checkpoint; c != nil && c.Saves > 0 {
			l.row("checkpoints", "%s", CheckpointText(c))
		}
		if g.FailedLaunches > 0 {
			l.row("failed launches", "%s before their first step (badput launch_failed: %s)", plural(g.FailedLaunches, "launch ended", "launches ended"), dur(g.BadputS[BadLaunchFailed]))
		}
	}
	if crashed := slices.ContainsFunc(r.Attempts, func(a AttemptRow) bool { return a.ExitCode != nil && *a.ExitCode != 0 }); len(r.Attempts) > 1 || crashed {
		for _, a := range attemptLines(r.Attempts) {
			l.row("attempt", "%s", a)
		}
	}
}

// traces adds what the profiled steps' traces showed.
func (l *lines) traces(r *Report) {
	if t := r.Traces; t != nil {
		line := fmt.Sprintf("%d profiled rank-steps (%s timeline): comm %.2f ms, exposed %.2f ms, overlap %s per step",
			t.Profiled, t.Device, t.CommUs/1e3, t.ExposedCommUs/1e3, pctPtr(t.OverlapPct))
		if t.EventTimedExposedUs != nil {
			line += fmt.Sprintf("; event-timed on the same steps: comm %.2f ms, exposed %.2f ms", *t.EventTimedCommUs/1e3, *t.EventTimedExposedUs/1e3)
		}
		l.row("from traces", "%s", line)
		var cs []string
		for _, c := range t.Collectives {
			cs = append(cs, fmt.Sprintf("%s ×%d %.2f ms", c.Kind, c.Count, c.TimeUs/1e3))
		}
		if len(cs) > 0 {
			l.row("collectives", "%s (over the profiled steps)", strings.Join(cs, ", "))
		}
	}
}

// flops adds padding and the FLOPs PyTorch counted.
func (l *lines) flops(r *Report) {
	if p := r.Padding; p != nil {
		l.row("padding", "real tokens are %s of the padded batch (%s on padding); TPS and MFU count real tokens", pct(p.RealFraction), pct(1-p.RealFraction))
	}
	if f := r.CountedFLOPs; f != nil {
		line := fmt.Sprintf("%s a token on %d sampled steps (PyTorch's FlopCounterMode)", flopsText(f.PerToken), f.Samples)
		if f.Samples == 0 {
			line = f.Unknown
		}
		if f.Slowdown > 0 {
			line += fmt.Sprintf(", steps %.1f× as long while counted, left out of the figures", f.Slowdown)
		}
		if f.Recompute {
			line += ", activations recomputed: hardware FLOPs"
		}
		if f.AnalyticPerToken != nil {
			line += fmt.Sprintf("; analytic %s: %+.1f%%", flopsText(*f.AnalyticPerToken), 100**f.Gap)
			if f.Flagged {
				line += fmt.Sprintf(", more than %.0f%% apart: the model in the run metadata may not be the job's", 100*countedGapFlag)
			}
		}
		l.row("FLOPs counted", "%s", line)
		if f.HFU != nil {
			m := "n/a with recomputation"
			if f.MFU != nil {
				m = pct(*f.MFU)
			}
			l.row("MFU counted", "%s, HFU %s (from the counted FLOPs at the run's TPS)", m, pct(*f.HFU))
		} else if f.Samples > 0 && f.Unknown != "" {
			l.row("MFU counted", "n/a: %s", f.Unknown)
		}
		if f.Partial > 0 {
			l.row("FLOPs samples", "%d left out: not every rank counted them, no tokens, or a generation phase", f.Partial)
		}
	}
}

// own adds the capture's own cost, device memory, token mismatches.
func (l *lines) own(r *Report) {
	s := r.Summary
	if c := r.CaptureCost; c != nil && c.Rows > 0 {
		share := "more than the steps' own time: mostly outside their spans"
		if c.StepFraction != nil {
			share = pct(*c.StepFraction) + " of step time"
		}
		l.row("capture cost", "%s a step on the training thread (%s), its threads' CPU %s a step (%d rank rows; the ranks' own clocks; profiled steps apart)",
			secs(c.PerStepNs/1e9), share, secs(c.CPUPerStepNs/1e9), c.Rows)
		if len(c.ByComponent) > 0 {
			parts := make([]string, len(c.ByComponent))
			for i, p := range c.ByComponent {
				parts[i] = fmt.Sprintf("%s %s + %s CPU", p.Component, secs(p.PerStepNs/1e9), secs(p.CPUPerStepNs/1e9))
			}
			l.row("cost by component", "%s a step (training thread + own threads)", strings.Join(parts, "; "))
		}
	}
	if c := r.CaptureCost; c != nil && c.Profiled != nil {
		l.row("profiling cost", "%s a profiled step on the training thread (%d rank rows traced or FLOP-counted, out of the figures; the profiler's stop between steps is badput profiling)",
			secs(c.Profiled.PerStepNs/1e9), c.Profiled.Rows)
	}
	if m := r.Memory; m != nil && len(m.Fullest) > 0 {
		f := m.Fullest[0]
		line := fmt.Sprintf("peak %s reserved, %s allocated on rank %d", gib(f.PeakReservedBytes), gib(f.PeakAllocatedBytes), f.Rank)
		if f.Headroom != nil {
			line += fmt.Sprintf(" of %s: headroom %s", gib(f.CapacityBytes), pct(*f.Headroom))
		}
		l.row("device memory", "%s (the fullest of %d ranks)", line, m.Ranks)
	}
	if s.TokenMismatch > 0 {
		l.row("token mismatch", "%d replica-steps whose ranks disagreed on tokens (counted once, from the lowest rank)", s.TokenMismatch)
	}
}

// stragglers adds straggler ranks, nodes and episodes.
func (l *lines) stragglers(r *Report) {
	kind, flagged := r.flaggedStragglers()
	if len(flagged) > 0 {
		var names []string
		for _, f := range flagged {
			names = append(names, fmt.Sprintf("%s (%.2f, %s)", f.name, f.score, f.where))
		}
		l.row("straggler "+kind+"s", "%s (own time: compute, data wait and host work)", strings.Join(names, ", "))
	} else {
		l.row("straggler "+kind+"s", "none below %.2f over the whole run", tps.StragglerThreshold)
	}
	if len(r.Episodes) == 0 {
		l.row("straggler episodes", "none (windows of %d steps)", r.EpisodeWindow)
	}
	for _, e := range r.Episodes {
		l.row("straggler episode", "%s", episodeText(e, r.EpisodeWindow, r.Running))
	}
	var ranks []string
	for _, x := range r.Stragglers {
		mark := ""
		if x.Straggler {
			mark = "!"
		}
		ranks = append(ranks, fmt.Sprintf("%d@%s %.2f%s", x.Rank, orDash(x.Node), x.Score, mark))
	}
	l.row("slowest ranks", "%s  (score = fastest median own time / rank's, own time = compute + data wait + host work; ! below 0.75)", strings.Join(ranks, ", "))
}

// tail adds events, energy, cost and time to train.
func (l *lines) tail(r *Report) {
	s := r.Summary
	if len(r.Events) > 0 {
		var ev []string
		for _, k := range sortedKeys(r.Events) {
			ev = append(ev, fmt.Sprintf("%s %d", k, r.Events[k]))
		}
		l.row("events", "%s", strings.Join(ev, ", "))
	}
	if e := r.Energy; e != nil {
		src := "joined live"
		if e.FromSamples {
			src = "from the GPUs' energy counters"
		}
		if s.TPSUnknown != "" {
			l.row("energy", "tokens/J %s; %.0f W and %.0f MHz SM clock per GPU on average over %d steady steps (%s)", s.TPSUnknown, e.PowerWMean, e.SMClockMHzMean, e.Steps, src)
		} else {
			l.row("energy", "%.2f tokens/J (%.3f J/token) over %d steady steps (%s), %.0f W and %.0f MHz SM clock per GPU on average, %d steady steps throttled",
				e.TokensPerJoule, e.JoulesPerToken, e.Steps, src, e.PowerWMean, e.SMClockMHzMean, e.ThrottledSteps)
		}
	}
	if r.CostPerMTok != nil {
		l.row("cost", "$%.4f per million tokens at wall TPS", *r.CostPerMTok)
	}
	if r.TimeToTrainS != nil {
		d := time.Duration(*r.TimeToTrainS * 1e9)
		l.row("time to train", "%.1f days at wall TPS", d.Hours()/24)
	}
}

// WriteText prints the report as a readable summary.
func WriteText(w io.Writer, r *Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "job %s (%s)\n", r.Job, r.Dir)
	for _, l := range r.Lines() {
		if l.Key == "" {
			tw.Flush()
			fmt.Fprintf(w, "  %s\n", l.Value)
			continue
		}
		fmt.Fprintf(tw, "  %s\t%s\n", l.Key, l.Value)
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func sortedKeys(m map[string]int64) []string { return slices.Sorted(maps.Keys(m)) }

// restartKinds says which restarts were new launches and which restarted
// inside a launch (torchrun elastic restarts).
func restartKinds(g Goodput) string {
	var parts []string
	if g.Launches > 0 {
		parts = append(parts, plural(g.Launches, "new launch", "new launches"))
	}
	if in := g.Restarts - g.Launches; in > 0 {
		parts = append(parts, plural(in, "inside a launch", "inside a launch"))
	}
	return strings.Join(parts, ", ")
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

func pctPtr(p *float64) string {
	if p == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.1f%%", *p)
}

// mfuText is MFU / HFU as a person reads it: the figures, over which steps,
// or n/a with the reason.
func mfuText(s tps.Summary) string {
	if s.MFU == nil {
		return "n/a: " + s.MFUUnknown
	}
	t := pct(*s.MFU) + " / " + pct(*s.HFU)
	if s.MFUSteps < s.SteadySteps {
		t += fmt.Sprintf(" (over %d of %d steady steps; the others: %s)", s.MFUSteps, s.SteadySteps, s.MFUUnknown)
	}
	return t
}

// episodeText is one straggler episode on a line.
func episodeText(e StragglerEpisode, window int, running bool) string {
	who := e.Node
	if who == "" {
		who = fmt.Sprintf("rank %d", e.Ranks[0])
	}
	span := fmt.Sprintf("steps %d-%d", e.StartStep, e.EndStep)
	if e.StartAttempt != e.EndAttempt {
		span = fmt.Sprintf("attempt %d step %d to attempt %d step %d", e.StartAttempt, e.StartStep, e.EndAttempt, e.EndStep)
	}
	switch {
	case e.Ongoing && running:
		span += " (ongoing at the last step written so far)"
	case e.Ongoing:
		span += " (to the end)"
	}
	cost := "cost in throughput n/a (no tokens counted)"
	if e.TPSWithout > 0 {
		cost = fmt.Sprintf("cost %s tokens/s (%s: %s instead of about %s)", tps.SI(e.CostTPS), pct(e.CostFraction), tps.SI(e.TPSDuring), tps.SI(e.TPSWithout))
	}
	out := fmt.Sprintf("%s %s (±%d), ranks %s: score %.2f worst, %.2f mean; %s",
		who, span, window, rankList(e.Ranks), e.WorstScore, e.MeanScore, cost)
	if e.GPUHoursLost > 0 {
		out += fmt.Sprintf(", %.2f GPU-hours lost", e.GPUHoursLost)
	}
	if e.Cause != "" {
		out += "; cause: " + e.Cause
	}
	for _, c := range e.Captures {
		switch {
		case c.Error != "" && c.ID == "":
			out += fmt.Sprintf("; automatic capture at step %d failed: %s", c.Step, c.Error)
		case c.Culprit != nil:
			out += fmt.Sprintf("; captured at step %d (%s): the others waited %.1f ms for rank %d", c.Step, c.ID, c.OthersWaitUs/1e3, *c.Culprit)
		default:
			out += fmt.Sprintf("; captured at step %d (%s): no rank waited for", c.Step, c.ID)
		}
	}
	return out
}

func rankList(rs []int64) string {
	var parts []string
	for i := 0; i < len(rs); {
		j := i
		for j+1 < len(rs) && rs[j+1] == rs[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", rs[i], rs[j]))
		} else {
			parts = append(parts, fmt.Sprint(rs[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// generationLines are the generation and text-rate figures, as label and
// text, for the text, Markdown and HTML reports.
func generationLines(r *Report) [][2]string {
	var out [][2]string
	if g := r.Generation; g != nil {
		out = append(out, [2]string{"generation", fmt.Sprintf("%d steps with a generation phase: %s generated tokens/s (%s with prompts), %d requests",
			g.Steps, tps.SI(g.OutputTPS), tps.SI(g.TotalTPS), g.Requests)})
		out = append(out, [2]string{"step phases", fmt.Sprintf("generation %s | training %s | waiting %s (exposed comm, bubble, data, checkpoint)",
			pct(g.GenShare), pct(g.TrainingShare), pct(g.WaitingShare))})
		if g.MFUTraining != nil {
			out = append(out, [2]string{"training MFU", fmt.Sprintf("%.1f%% (the update alone: its FLOPs over the step time less the generation)", 100**g.MFUTraining)})
		}
		lat := func(l *Latency) string {
			return fmt.Sprintf("p50 %s  p95 %s  p99 %s  (mean %s, %d)", secs(l.P50), secs(l.P95), secs(l.P99), secs(l.Mean), l.Count)
		}
		if g.TTFT != nil {
			out = append(out, [2]string{"time to first token", lat(g.TTFT) + " requests"})
		}
		if g.ITL != nil {
			out = append(out, [2]string{"inter-token latency", lat(g.ITL) + " gaps"})
		}
	}
	if t := r.Text; t != nil {
		out = append(out, [2]string{"text rate", fmt.Sprintf("%s bytes/s, %.3f tokens per byte (%d steps with bytes): compares across tokenizers", tps.SI(t.BytesPerSecond), t.TokensPerByte, t.Steps)})
	}
	return out
}

// secs formats seconds with a unit that keeps three digits.
func secs(s float64) string {
	switch {
	case s >= 1:
		return fmt.Sprintf("%.2fs", s)
	case s >= 1e-3:
		return fmt.Sprintf("%.1fms", s*1e3)
	default:
		return fmt.Sprintf("%.0fµs", s*1e6)
	}
}

// incompleteText says how many steps missed ranks and what was done with them.
func incompleteText(s tps.Summary) string {
	if s.ProfiledLeftOut > 0 {
		s2 := s
		s2.ProfiledLeftOut = 0
		return incompleteText(s2) + fmt.Sprintf(", %d profiled or FLOP-counted (slowed by the profiler or counter) left out of the figures", s.ProfiledLeftOut)
	}
	if s.CutLeftOut > 0 {
		s2 := s
		s2.CutLeftOut = 0
		return incompleteText(s2) + fmt.Sprintf(", %d a save or evaluation between steps ran into (its time the gap's) left out of the figures", s.CutLeftOut)
	}
	switch {
	case s.IncompleteSteps == 0:
		return "0 incomplete"
	case s.IncompleteLeftOut > 0:
		return fmt.Sprintf("%d incomplete, %d of them left out of the figures", s.IncompleteSteps, s.IncompleteLeftOut)
	default:
		return fmt.Sprintf("%d incomplete", s.IncompleteSteps)
	}
}

// flagged is a straggler as the views name it.
type flagged struct {
	name  string
	score float64
	where string // "whole-run median", or the steps of the episode that flagged it
}

// flaggedStragglers are the whole run's stragglers, slowest first, and what
// they are: nodes, or ranks when the ranks named one node (or none): one
// node is no straggler among nodes (text, HTML card, --compare).
func (r *Report) flaggedStragglers() (kind string, out []flagged) {
	// One verdict on own time (compute, data wait and host work): the whole run's
	// medians, then the spans the episodes flagged (worst window score),
	// each node or rank once. Nodes where there are several, else ranks.
	seen := map[string]bool{}
	add := func(name string, score float64, where string) {
		if !seen[name] {
			seen[name] = true
			out = append(out, flagged{name, score, where})
		}
	}
	if r.NodeCount > 1 {
		for _, n := range r.Nodes {
			if n.Straggler {
				add(n.Node, n.Score, "whole-run median")
			}
		}
		for _, e := range r.Episodes {
			if e.Node != "" {
				add(e.Node, e.WorstScore, fmt.Sprintf("steps %d-%d", e.StartStep, e.EndStep))
			}
		}
		return "node", out
	}
	for _, x := range r.Stragglers {
		if x.Straggler {
			add(fmt.Sprintf("rank %d", x.Rank), x.Score, "whole-run median")
		}
	}
	for _, e := range r.Episodes {
		for _, rk := range e.Ranks {
			add(fmt.Sprintf("rank %d", rk), e.WorstScore, fmt.Sprintf("steps %d-%d", e.StartStep, e.EndStep))
		}
	}
	return "rank", out
}

// headlineText is the run's throughput as every view leads with it: tokens
// over step time of the steady steps, or why there is none.
func headlineText(s tps.Summary) string {
	if s.TPSUnknown != "" {
		return s.TPSUnknown
	}
	return fmt.Sprintf("%s tokens/s (%s tokens over %.1f s of %d steady steps)", tps.SI(s.AggregateTPS), tps.SI(float64(s.Tokens)), s.StepTimeS.Mean*float64(s.SteadySteps), s.SteadySteps)
}

// wallText is wall TPS against the headline, naming both.
func wallText(s tps.Summary) string {
	if s.WallTPS <= 0 {
		return "n/a: the steady steps span no wall time"
	}
	rel := "the same as"
	switch d := 1 - s.WallTPS/s.AggregateTPS; {
	case d > 0.0005:
		rel = fmt.Sprintf("%.1f%% below", 100*d)
	case d < -0.0005:
		rel = fmt.Sprintf("%.1f%% above", -100*d)
	}
	return fmt.Sprintf("%s tokens/s, %s the %s tokens/s of step time (wall time counts the gaps between steps, not the time between launches)", tps.SI(s.WallTPS), rel, tps.SI(s.AggregateTPS))
}

// BreakdownText is the time breakdown on a line, every part named.
func BreakdownText(b Breakdown) string {
	parts := make([]string, 0, len(tps.ShareParts()))
	for _, p := range tps.ShareParts() {
		v := pct(*p.Of(&b.Shares))
		if p.Key == "bubble" && b.BubbleTheoretical > 0 {
			v += fmt.Sprintf(" (theory %s)", pct(b.BubbleTheoretical))
		}
		v += b.SplitsText(p.Key, pct)
		parts = append(parts, p.Label+" "+v)
	}
	return strings.Join(parts, " | ")
}

// flopsText writes a FLOP count with an SI prefix ("6.19 GFLOP").
func flopsText(f float64) string {
	for _, u := range []struct {
		scale float64
		name  string
	}{{1e15, "PFLOP"}, {1e12, "TFLOP"}, {1e9, "GFLOP"}, {1e6, "MFLOP"}, {1e3, "kFLOP"}} {
		if f >= u.scale {
			return fmt.Sprintf("%.3g %s", f/u.scale, u.name)
		}
	}
	return fmt.Sprintf("%.3g FLOP", f)
}
