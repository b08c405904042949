package collector

import (
	"slices"

	"github.com/tpsprof/tpsprof/tps"
)

// Clock offsets between nodes (a node whose clock was seconds ahead
// stretched every cluster step by its skew). The ranks of a synchronous
// step finish it together (the step's last collective releases them at
// once), so the difference between a node's latest step end and the
// reference node's, step after step, is that node's clock offset plus a
// jitter of the order of the collective's tail. The reference is rank 0's
// node; each node's offset is the median of its last clockSamples
// differences, applied when it stands out of the jitter: at least
// minClockOffsetNs and more than three median absolute deviations. Nodes
// that are not in step with the others (asynchronous ranks) give
// scattered differences and no offset. docs/report.md ("Clocks").
//
// A node's clock can also jump mid-run (an NTP step, a VM migrated): the
// median would follow only once most of its window had the new value, 16
// steps of rows on the wrong clock. So clockJumpSteps consecutive
// differences that agree with each other (within 10 ms, or three median
// absolute deviations) and lie
// far from the median (clockJumpNs, and ten median absolute deviations)
// restart the node's window from them: a jump is followed within three
// steps. Scattered differences (asynchronous ranks) never agree, so they
// start nothing.
const (
	clockSamples     = 31
	minClockOffsetNs = int64(1_000_000) // 1 ms: below it, clocks count as agreeing
	maxClockNodes    = 1 << 16
	clockJumpSteps   = 3
	clockJumpNs      = int64(50_000_000) // 50 ms: smaller changes the median follows
)

type clockEstimator struct {
	ref   string
	nodes map[string]*nodeClock
	// applied counts the nodes with a non-zero offset: none, and Result
	// takes clocks as they are.
	applied int
}

type nodeClock struct {
	samples [clockSamples]int64
	n, next int
	offset  int64 // the applied offset, ns (0: none)
	median  int64
	mad     int64
	// jump holds the latest differences far from the median that agree
	// with each other (a clock jump in the making)
	jump  [clockJumpSteps]int64
	jumps int
}

// observe folds one closed step's node spans in; the reference is rank
// 0's node (a step without rank 0 gives no sample). It reports whether an
// applied offset appeared, went or moved by a millisecond or more (what
// parts store is then refreshed).
func (c *clockEstimator) observe(spans []tps.NodeSpan) (changed bool) {
	ref := ""
	for _, n := range spans {
		if n.LowestRank == 0 {
			ref = n.Node
			break
		}
	}
	if ref == "" {
		return false
	}
	if ref != c.ref { // rank 0's node learnt (or moved): start again against it
		changed = c.applied > 0
		*c = clockEstimator{ref: ref}
	}
	var refEnd int64
	found := false
	for _, n := range spans {
		if n.Node == ref {
			refEnd, found = n.MaxEndNs, true
			break
		}
	}
	if !found {
		return changed
	}
	for _, n := range spans {
		if n.Node == "" || n.Node == ref {
			continue
		}
		nc := c.nodes[n.Node]
		if nc == nil {
			if len(c.nodes) >= maxClockNodes {
				continue
			}
			if c.nodes == nil {
				c.nodes = map[string]*nodeClock{}
			}
			nc = &nodeClock{}
			c.nodes[n.Node] = nc
		}
		was := nc.offset
		nc.add(n.MaxEndNs - refEnd)
		switch {
		case was != 0 && nc.offset == 0:
			c.applied--
		case was == 0 && nc.offset != 0:
			c.applied++
		}
		if abs64(nc.offset-was) >= minClockOffsetNs || (was == 0) != (nc.offset == 0) {
			changed = true
		}
	}
	return changed
}

func (nc *nodeClock) add(d int64) {
	if nc.n >= clockJumpSteps && abs64(d-nc.median) > max(clockJumpNs, 10*nc.mad) {
		if nc.jumps > 0 && abs64(d-nc.jump[0]) > max(clockJumpNs/5, 3*nc.mad) {
			nc.jumps = 0 // does not agree with the jump so far: start it again
		}
		nc.jump[nc.jumps] = d
		nc.jumps++
		if nc.jumps == clockJumpSteps { // the clock jumped: the window restarts
			jump := nc.jump
			*nc = nodeClock{}
			for _, x := range jump {
				nc.add(x)
			}
			return
		}
	} else {
		nc.jumps = 0
	}
	nc.samples[nc.next] = d
	nc.next = (nc.next + 1) % clockSamples
	nc.n = min(nc.n+1, clockSamples)
	var buf [clockSamples]int64 // on the stack: this runs per node at every closed step
	xs := buf[:nc.n]
	copy(xs, nc.samples[:nc.n])
	slices.Sort(xs)
	med := xs[len(xs)/2]
	for i, x := range xs {
		xs[i] = abs64(x - med)
	}
	slices.Sort(xs)
	mad := xs[len(xs)/2]
	nc.median, nc.mad = med, mad
	if abs64(med) >= minClockOffsetNs && abs64(med) > 3*mad {
		nc.offset = med
	} else {
		nc.offset = 0
	}
}

func abs64(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// offsetFunc is what ResultIn takes: nil while no node has an offset.
func (c *clockEstimator) offsetFunc() func(string) int64 {
	if c.applied == 0 {
		return nil
	}
	return c.offset
}

// offset is node's clock less the reference's, ns (0: none applied).
func (c *clockEstimator) offset(node string) int64 {
	if nc := c.nodes[node]; nc != nil {
		return nc.offset
	}
	return 0
}

// offsets are the applied offsets by node (nil when there are none).
func (c *clockEstimator) offsets() map[string]int64 {
	if c.applied == 0 {
		return nil
	}
	out := make(map[string]int64, c.applied)
	for n, nc := range c.nodes {
		if nc.offset != 0 {
			out[n] = nc.offset
		}
	}
	return out
}
