package report

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"unsafe"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// rankSource is the table the per-rank figures come from: what opt asks,
// or automatically rank_windows when rank_steps holds more than
// WindowsAbove rows (or has none) and rank_windows has parts.
func rankSource(dir, want string, rankRows int64) (string, error) {
	hasWindows := len(partsOf(filepath.Join(dir, trace.RankWindows))) > 0
	switch want {
	case RankSourceSteps:
		return trace.RankSteps, nil
	case RankSourceWindows:
		if !hasWindows {
			return "", fmt.Errorf("report: no rank_windows parts under %s (collectors before this version did not write them): read rank_steps instead", dir)
		}
		return trace.RankWindows, nil
	case RankSourceAuto:
		if hasWindows && (rankRows > WindowsAbove || rankRows == 0) {
			return trace.RankWindows, nil
		}
		return trace.RankSteps, nil
	}
	return "", fmt.Errorf("report: unknown rank source %q (%s or %s)", want, RankSourceSteps, RankSourceWindows)
}

func partsOf(dir string) []string {
	if _, err := os.Stat(dir); err != nil {
		return nil
	}
	files, _ := trace.PartFiles(dir)
	return files
}

// rankSink is what both rank passes feed: the nodes, the heatmap, the
// episode windows, the critical rank's own figures, padding, and each
// rank's median compute (the capture's cost and memory go to rep.own).
type rankSink struct {
	world           int64 // the summary's world size
	nodes           map[int64]string
	heat            *heatGrid
	wins            *windows
	crit            *critExcess // nil: not computed (rank_windows)
	med             map[int64]float64
	realTok, padTok int64
}

// stepPass reads rank_steps (the selected row groups, a few columns) into
// k: the per-rank compute medians, nodes, the heatmap, the episode
// windows, the critical rank's excess and padding.
func (a *analysis) stepPass(k *rankSink) error {
	rep, sp, heat, wins, nodes, crit := a.rep, a.sp, k.heat, k.wins, k.nodes, k.crit
	// Per rank, by index: a map access per row (medians, nodes) was a
	// tenth of the pass. Ranks past the declared world go to the map.
	world := max(k.world, 0)
	byRank := make([]*tps.Median, min(world, 1<<20))
	named := make([]bool, len(byRank))
	medians := map[int64]*tps.Median{}
	keep := medianKeepFor(k.world)
	var done int64
	kc := keyCursor{ks: &sp.keys}
	pruned, err := trace.EachColumnsIn(filepath.Join(a.dir, trace.RankSteps), rankColumns, "node", a.ranges, func(c *trace.Columns) error {
		attempt, step, rank := c.Int64[0], c.Int64[1], c.Int64[2]
		dur, exposed, data, pp, ckpt := c.Int64[3], c.Int64[4], c.Int64[5], c.Int64[6], c.Int64[7]
		tokens, padded, fwd, bwd, optim := c.Int64[8], c.Int64[9], c.Int64[10], c.Int64[11], c.Int64[12]
		capture, captureCPU, memAlloc, memResv, memCap := c.Int64[13], c.Int64[14], c.Int64[15], c.Int64[16], c.Int64[17]
		lastKey, si, ok, hc := [2]int64{-1, -1}, 0, false, 0
		for i := range c.Rows {
			rep.RankRows++
			// Rows come grouped by step, mostly in the steps' order: look
			// the step up when it changes (the next one first).
			if k := [2]int64{attempt[i], step[i]}; k != lastKey {
				lastKey = k
				if n := si + 1; ok && n < sp.len() && kc.at(n) == k {
					si = n
				} else {
					si, ok = sp.stepAt(k)
				}
				hc = heat.col(si)
			}
			if !ok {
				continue
			}
			r := rank[i]
			// compute as tps.StepRecord.ComputeNs, without building a record
			ci := dur[i] - exposed[i] - data[i] - pp[i] - ckpt[i]
			comp := float64(max(ci, 0))
			heat.addCol(hc, r, comp)
			inRange := r >= 0 && r < int64(len(byRank))
			if n := c.Strings[i]; n != "" && (!inRange || !named[r]) && nodes[r] == "" {
				nodes[r] = n
				if inRange {
					named[r] = true
				}
			}
			warm := sp.warm(si)
			if sp.slowest != nil && r == int64(sp.slowest[si]) && !warm && sp.flag[si]&flagTimed != 0 {
				// what the critical rank had more of than the mean rank
				crit.addOwn(c.Strings[i], r, comp, float64(data[i]))
			}
			rep.own.addMem(r, memAlloc[i], memResv[i], memCap[i])
			if warm {
				continue
			}
			rep.own.addCost(1, capture[i], captureCPU[i], dur[i])
			// its own time (what the others wait for in a synchronous step:
			// compute and waiting for data), and of it the data wait and the
			// measured forward, backward and optimizer
			wins.add(si, r, comp+float64(data[i]), float64(data[i]), float64(fwd[i]+bwd[i]+optim[i]))
			if pad := padded[i]; pad > 0 {
				k.realTok += tokens[i]
				k.padTok += pad
			}
			var m *tps.Median
			if inRange {
				if m = byRank[r]; m == nil {
					m = &tps.Median{Keep: keep}
					byRank[r] = m
				}
			} else if m = medians[r]; m == nil {
				m = &tps.Median{Keep: keep}
				medians[r] = m
			}
			m.Add(comp)
		}
		done += int64(c.Rows)
		if a.opt.Progress != nil {
			a.opt.Progress(done, a.rankTotal)
		}
		return nil
	}, rep.read)
	rep.RankRowsSkipped = pruned.Rows
	if err = rep.tolerate(err); err != nil {
		return err
	}
	for r, m := range byRank {
		if m != nil {
			medians[int64(r)] = m
		}
	}
	k.med = make(map[int64]float64, len(medians))
	for r, m := range medians {
		k.med[r] = m.Value()
	}
	return nil
}

// windowPass reads rank_windows instead: per rank, the merged compute
// sketches' median; per window row, its mean compute in the heatmap at
// its first steady step, and its sums in the episode window of that step.
// Rows of a window holding a warm-up step (or no selected step) are left
// out, so figures cover whole windows; rows of one key are merged by the
// sums they add to, which is what Merge does.
func (a *analysis) windowPass(k *rankSink) error {
	rep, sp, heat, wins, nodes := a.rep, a.sp, k.heat, k.wins, k.nodes
	sketches := map[int64]*tps.Sketch{}
	var scratch tps.Sketch
	// the window's steps in the (sorted) selection: walked once for the
	// window's ranks, which come together (a lookup per step of every
	// window row was most of a 100 M-row report)
	lastKey, si, in, anyWarm := [3]int64{-1, -1, -1}, -1, false, false
	// the columns the pass takes, decoded column by column: parquet-go's
	// rows rebuilt all 45 of a window's columns through reflection
	_, err := trace.EachColumnsStrs(filepath.Join(a.dir, trace.RankWindows), windowColumns, []string{"node", "compute_sketch"}, windowRanges(a.ranges), func(c *trace.Columns) error {
		attempt, rank, first, last, steps := c.Int64[0], c.Int64[1], c.Int64[2], c.Int64[3], c.Int64[4]
		compute, data, fwd, bwd, optim, padded, tokPadded := c.Int64[5], c.Int64[6], c.Int64[7], c.Int64[8], c.Int64[9], c.Int64[10], c.Int64[11]
		capture, captureCPU, dur := c.Int64[12], c.Int64[13], c.Int64[14]
		memAlloc, memResv, memCap := c.Int64[15], c.Int64[16], c.Int64[17]
		node, sketch := c.Str[0], c.Str[1]
		for i := range c.Rows {
			rep.RankWindows++
			if k := [3]int64{attempt[i], first[i], last[i]}; k != lastKey {
				lastKey = k
				si, in, anyWarm = -1, false, false
				kc := keyCursor{ks: &sp.keys}
				for j := sp.firstStepFrom([2]int64{k[0], k[1]}); j < sp.len(); j++ {
					if k := kc.at(j); k[0] != attempt[i] || k[1] > last[i] {
						break
					}
					in = true
					if sp.warm(j) {
						anyWarm = true
						break
					}
					if si < 0 {
						si = j
					}
				}
			}
			if !in {
				continue // outside the selection
			}
			if anyWarm || si < 0 || steps[i] <= 0 {
				rep.RankWindowsLeft++
				continue
			}
			rep.RankRows += steps[i]
			r, n := rank[i], float64(steps[i])
			if node[i] != "" && nodes[r] == "" {
				nodes[r] = node[i]
			}
			heat.add(si, r, float64(compute[i])/n)
			rep.own.addCost(steps[i], capture[i], captureCPU[i], dur[i])
			rep.own.addMem(r, memAlloc[i], memResv[i], memCap[i])
			own := float64(compute[i] + data[i])
			wins.addN(si, r, own, float64(data[i]), float64(fwd[i]+bwd[i]+optim[i]), int32(steps[i]))
			if padded[i] > 0 {
				k.realTok += tokPadded[i]
				k.padTok += padded[i]
			}
			// the sketch's JSON read in place (SketchFromJSON does not keep
			// it; the string is valid during this call: trace.Volatile)
			ok, err := tps.SketchFromJSON(unsafe.Slice(unsafe.StringData(sketch[i]), len(sketch[i])), &scratch)
			if err != nil {
				return fmt.Errorf("report: rank window %d of rank %d: %w", tps.WindowOf(first[i]), r, err)
			}
			if !ok {
				continue
			}
			if m := sketches[r]; m == nil {
				sk := scratch
				sk.Bins = slices.Clone(scratch.Bins) // scratch is decoded into again
				sketches[r] = &sk
			} else {
				m.Merge(&scratch)
			}
		}
		return nil
	}, rep.read, trace.Volatile("compute_sketch"))
	if err = rep.tolerate(err); err != nil {
		return err
	}
	k.med = make(map[int64]float64, len(sketches))
	for r, sk := range sketches {
		k.med[r] = sk.Quantile(0.5)
	}
	return nil
}

// windowColumns are the int64 columns of rank_windows the report reads
// (with node and compute_sketch).
var windowColumns = []string{"attempt", "rank", "first_step", "last_step", "steps",
	"compute_ns.sum", "data_wait_ns.sum", "fwd_ns.sum", "bwd_ns.sum", "optim_ns.sum", "padded_tokens", "tokens_padded",
	"?capture_ns.sum", "?capture_cpu_ns.sum", "duration_ns.sum",
	"?mem_peak_allocated_bytes.max", "?mem_peak_reserved_bytes.max", "?mem_capacity_bytes.max"}

// windowRanges bound the rank_windows row groups that can hold windows of
// the selected steps (ranges: attempt and step, as spine.ranges gives;
// none: all): a window [first_step, last_step] holds a step of [lo, hi]
// when first_step <= hi and last_step >= lo.
func windowRanges(ranges []trace.Range) []trace.Range {
	var within []trace.Range
	for _, r := range ranges {
		switch r.Column {
		case "step":
			within = append(within, trace.Range{Column: "first_step", Min: math.MinInt64, Max: r.Max},
				trace.Range{Column: "last_step", Min: r.Min, Max: math.MaxInt64})
		default:
			within = append(within, r)
		}
	}
	return within
}
