package report

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"slices"

	"github.com/tpsprof/tpsprof/tps"
)

// CheckpointAdvice is how often the job should checkpoint given how long
// a save takes and how often it is interrupted (Young's interval, the
// first-order optimum LLNL's SCR and Daly's work use: τ = √(2·C·M) for a
// save of C seconds and a mean time between interruptions M). The time a
// checkpoint interval τ wastes, to first order, is C/τ (saving) + τ/(2M)
// (the work since the last save, redone after an interruption): at
// Llama 3's reported rate (an interruption every 3.1 h) and a 60 s save
// that is every 19 min, 10.4% wasted, against 17.8% hourly. An estimate:
// its inputs are shown, and it is absent (Unknown says why) where one is
// missing.
type CheckpointAdvice struct {
	Unknown string `json:"unknown,omitempty"`
	// Saves are the checkpoint saves seen (checkpoint_save events, one a
	// step however many ranks sent it); SaveS their median length (the
	// slowest rank's each); IntervalS the median time from one save's
	// start to the next's within an attempt (the run's own interval; the
	// elapsed time over the saves where no two are in one attempt).
	Saves     int     `json:"saves"`
	SaveS     float64 `json:"save_s"`
	IntervalS float64 `json:"interval_s"`
	// Interruptions are the attempts that did not finish (crashed, or
	// ended with no end recorded before a later attempt); MTBFS the
	// elapsed time over them.
	Interruptions int     `json:"interruptions"`
	ElapsedS      float64 `json:"elapsed_s"`
	MTBFS         float64 `json:"mtbf_s"`
	// Where the run had fewer than 2 interruptions of its own, the rate
	// pools the fleet's: FleetJobs other jobs of the same output folder
	// (the collector's history, the newest FleetJobsRead), with
	// FleetInterruptions in FleetElapsedS of their attempts.
	FleetJobs          int     `json:"fleet_jobs,omitempty"`
	FleetInterruptions int     `json:"fleet_interruptions,omitempty"`
	FleetElapsedS      float64 `json:"fleet_elapsed_s,omitempty"`
	// OptimalS is Young's interval; WasteNow and WasteOptimal the first
	// order waste (fractions of the time) at the run's interval and at
	// it; GainPoints their difference in points of goodput.
	OptimalS     float64 `json:"optimal_s"`
	WasteNow     float64 `json:"waste_now"`
	WasteOptimal float64 `json:"waste_optimal"`
	GainPoints   float64 `json:"gain_points"`
}

// YoungInterval is the checkpoint interval that minimises CheckpointWaste
// for a save of c seconds and a mean time between interruptions m
// (seconds): √(2cm), at most m.
func YoungInterval(c, m float64) float64 { return min(math.Sqrt(2*c*m), m) }

// CheckpointWaste is the first-order fraction of the time a checkpoint
// every tau seconds wastes: saving (c/τ) and redoing the work since the
// last save after an interruption (τ/2m).
func CheckpointWaste(tau, c, m float64) float64 { return c/tau + tau/(2*m) }

// checkpointAdvice sets rep.Checkpoint from the events and attempts.
func (rep *Report) checkpointAdvice(events []tps.Event) {
	a := &CheckpointAdvice{ElapsedS: rep.Goodput.ElapsedS}
	rep.Checkpoint = a
	// one save a (attempt, step): the slowest rank's time
	type key struct{ attempt, step int64 }
	saves := map[key][2]int64{}
	for _, e := range events {
		if e.Kind != tps.EventCheckpointSave || e.EndUnixNs <= e.StartUnixNs {
			continue
		}
		k := key{e.Attempt, e.Step}
		s, ok := saves[k]
		if !ok {
			s = [2]int64{e.StartUnixNs, e.EndUnixNs}
		}
		saves[k] = [2]int64{min(s[0], e.StartUnixNs), max(s[1], e.EndUnixNs)}
	}
	keys := slices.SortedFunc(maps.Keys(saves), func(x, y key) int {
		return cmp.Or(cmp.Compare(x.attempt, y.attempt), cmp.Compare(x.step, y.step))
	})
	var lengths, gaps []float64
	for i, k := range keys {
		s := saves[k]
		lengths = append(lengths, float64(s[1]-s[0])/1e9)
		if i > 0 && keys[i-1].attempt == k.attempt {
			gaps = append(gaps, float64(s[0]-saves[keys[i-1]][0])/1e9)
		}
	}
	a.Saves = len(keys)
	for i, at := range rep.Attempts {
		if (at.ExitCode != nil && *at.ExitCode != 0) || (at.ExitCode == nil && i < len(rep.Attempts)-1) {
			a.Interruptions++
		}
	}
	switch {
	case a.Saves == 0:
		a.Unknown = "no checkpoint was saved (no checkpoint_save events: the PyTorch package sees torch.save and the frameworks' saves; a job can send them)"
		return
	case a.ElapsedS <= 0:
		a.Unknown = "no elapsed time"
		return
	}
	slices.Sort(lengths)
	a.SaveS = tps.Quantile(lengths, 0.5)
	if len(gaps) > 0 {
		slices.Sort(gaps)
		a.IntervalS = tps.Quantile(gaps, 0.5)
	} else {
		a.IntervalS = a.ElapsedS / float64(a.Saves)
	}
	n, elapsed := a.Interruptions, a.ElapsedS
	if n < 2 && rep.Dir != "" {
		// too few of its own for a rate: the fleet's history beside it
		if f := fleetInterruptions(filepath.Dir(rep.Dir), filepath.Base(rep.Dir)); f.interruptions >= 2 && f.elapsedS > 0 {
			a.FleetJobs, a.FleetInterruptions, a.FleetElapsedS = f.jobs, f.interruptions, f.elapsedS
			n, elapsed = n+f.interruptions, elapsed+f.elapsedS
		}
	}
	if n == 0 {
		a.Unknown = fmt.Sprintf("no interruption in this run's %s, nor 2 or more in the other jobs of its folder: the interruption rate is unknown", dur(a.ElapsedS))
		return
	}
	a.MTBFS = elapsed / float64(n)
	a.OptimalS = YoungInterval(a.SaveS, a.MTBFS)
	a.WasteNow = CheckpointWaste(a.IntervalS, a.SaveS, a.MTBFS)
	a.WasteOptimal = CheckpointWaste(a.OptimalS, a.SaveS, a.MTBFS)
	a.GainPoints = 100 * (a.WasteNow - a.WasteOptimal)
	if a.Unknown = adviceHolds(a); a.Unknown != "" {
		a.OptimalS, a.WasteNow, a.WasteOptimal, a.GainPoints = 0, 0, 0, 0
	}
}

// adviceHolds says why Young's first-order advice does not hold for a
// (empty when it does): it needs a positive interval, a save shorter than
// the run and well below the interruption interval (the model's C ≪ M: a
// tenth), and a waste below the whole time. Without these it printed
// "+Inf points", "every 949ms instead of -1s", "waste 100.0% now".
func adviceHolds(a *CheckpointAdvice) string {
	finite := func(v ...float64) bool {
		for _, x := range v {
			if math.IsNaN(x) || math.IsInf(x, 0) {
				return false
			}
		}
		return true
	}
	switch {
	case a.IntervalS <= 0:
		return fmt.Sprintf("the saves' interval is %s: not positive", dur(a.IntervalS))
	case !finite(a.SaveS, a.IntervalS, a.MTBFS, a.OptimalS, a.WasteNow, a.WasteOptimal, a.GainPoints):
		return "the saves' figures are not finite"
	case a.SaveS <= 0:
		return "the saves took no time"
	case a.SaveS > a.ElapsedS:
		return fmt.Sprintf("a save of %s is longer than the run's %s", dur(a.SaveS), dur(a.ElapsedS))
	case a.SaveS > a.MTBFS/10:
		return fmt.Sprintf("a %s save against an interruption every %s: Young's first-order interval needs the save well below that (a tenth or less)", dur(a.SaveS), dur(a.MTBFS))
	case a.WasteNow >= 1 || a.WasteOptimal >= 1:
		return fmt.Sprintf("the first-order waste is %s now, %s at Young's interval: past the whole time, the model does not hold", pct(a.WasteNow), pct(a.WasteOptimal))
	}
	return ""
}

// CheckpointText is the advice on a line.
func CheckpointText(a *CheckpointAdvice) string {
	if a == nil {
		return ""
	}
	if a.Unknown != "" {
		if a.Saves > 0 {
			return fmt.Sprintf("%s of %s every %s; advice n/a: %s", plural(a.Saves, "save", "saves"), dur(a.SaveS), dur(a.IntervalS), a.Unknown)
		}
		return "advice n/a: " + a.Unknown
	}
	rate := fmt.Sprintf("%d in %s", a.Interruptions, dur(a.ElapsedS))
	if a.FleetJobs > 0 {
		rate = fmt.Sprintf("%d in %s of this run and %d other jobs of its folder", a.Interruptions+a.FleetInterruptions, dur(a.ElapsedS+a.FleetElapsedS), a.FleetJobs)
	}
	return fmt.Sprintf("every %s instead of %s: %+.1f points of goodput (estimate: Young's interval for a %s save and an interruption every %s, %s; waste %s now, %s then)",
		dur(a.OptimalS), dur(a.IntervalS), a.GainPoints, dur(a.SaveS), dur(a.MTBFS), rate, pct(a.WasteNow), pct(a.WasteOptimal))
}
