package report

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/tpsprof/tpsprof/tps"
)

// StragglerEpisode is a span of steady steps during which a node (or a
// rank without a node) ran below tps.StragglerThreshold: its slowest
// rank's mean own time over a window of steps (compute and waiting for
// data: what the other ranks of a synchronous step wait for), against the
// fastest rank's in the same window. A whole-run median hides a node that
// slows down late; windows do not.
type StragglerEpisode struct {
	Node string `json:"node,omitempty"`
	// Ranks are the node's ranks flagged in some window of the episode.
	Ranks        []int64 `json:"ranks"`
	StartAttempt int64   `json:"start_attempt"`
	StartStep    int64   `json:"start_step"`
	EndAttempt   int64   `json:"end_attempt"`
	EndStep      int64   `json:"end_step"`
	Steps        int     `json:"steps"`
	WorstScore   float64 `json:"worst_score"`
	MeanScore    float64 `json:"mean_score"`
	// TPSDuring is the episode's steps' tokens over their step time (0
	// when they counted none). TPSWithout
	// estimates it had the node kept pace: each step's tokens over its
	// time less the window's excess compute of the node's slowest rank
	// over the fastest rank (in a synchronous step everyone waits for
	// it). CostTPS is the difference, CostFraction it over TPSWithout.
	TPSDuring    float64 `json:"tps_during"`
	TPSWithout   float64 `json:"tps_without"`
	CostTPS      float64 `json:"cost_tps"`
	CostFraction float64 `json:"cost_fraction"`
	// Ongoing is true when the episode lasts to the last steady step.
	Ongoing bool `json:"ongoing"`
	// GPUHoursLost is what the episode cost the job: every GPU waits for
	// the slow node, so each step's excess time (as in TPSWithout) times
	// the world size.
	GPUHoursLost float64 `json:"gpu_hours_lost"`
	// Excess splits the slow rank's extra own time a step (mean over the
	// episode, against the fastest rank of each window) into what it was:
	// Cause names the largest part.
	Excess EpisodeExcess `json:"excess"`
	// Cause is what the joined signals say of the slow node: waiting for
	// data, host time outside the measured forward, backward and optimizer
	// (launch gaps, CPU contention, Python), or slow compute, with its
	// GPUs' SM clock and power against the other nodes' over the episode
	// and the clock event (throttle) reasons NVML gave.
	Cause string `json:"cause"`
	// gpuSlow: Cause is its GPUs' evidence of clocks throttled or low, or
	// a throttle reason (what the findings add to the waiting for it)
	gpuSlow bool
	// Captures are the automatic captures the collector ran while the
	// episode lasted (collector --auto-capture; docs/capture.md).
	Captures []EpisodeCapture `json:"captures,omitempty"`
	// from, to: the episode's time on the rows' clock, for the GPU join
	from, to int64
	// a, b: its first and last steps (spine indexes); excess: per window,
	// the node's slowest flagged rank's mean own time over the fastest's
	// (ns), for its steps' figures (fill)
	a, b   int
	excess []float64
}

// EpisodeExcess is a slow rank's own time a step beyond the fastest
// rank's, in ms, by part: waiting for data, the measured forward, backward
// and optimizer (Compute), and the rest of its own time (Host: between
// them, where the host launches nothing the device runs). HostKnown is
// false when the ranks' records carry no forward/backward/optimizer
// times (hand-written intake): compute and host are then one, in Compute.
type EpisodeExcess struct {
	DataMs    float64 `json:"data_ms"`
	ComputeMs float64 `json:"compute_ms"`
	HostMs    float64 `json:"host_ms"`
	HostKnown bool    `json:"host_known"`
}

// EpisodeCapture is an automatic capture linked to an episode: the step
// profiled, the rank the others waited for and how long (nil when none
// stood out, or the capture failed: Error).
type EpisodeCapture struct {
	ID           string  `json:"id,omitempty"`
	Attempt      int64   `json:"attempt"`
	Step         int64   `json:"step"`
	Culprit      *int64  `json:"culprit"`
	OthersWaitUs float64 `json:"others_wait_us,omitempty"`
	Error        string  `json:"error,omitempty"`
}

// episodeCaptures links the capture events to the episodes they fall in
// (same node, step within the episode's span give or take a window: the
// live episode that started the capture opens when the collector's
// moving average crosses the threshold, the report's by whole windows).
func (rep *Report) episodeCaptures(events []tps.Event) {
	for _, ev := range events {
		if ev.Kind != tps.EventCapture {
			continue
		}
		var d struct {
			Node         string  `json:"episode_node"`
			Culprit      *int64  `json:"culprit"`
			OthersWaitUs float64 `json:"others_wait_us"`
			Error        string  `json:"error"`
		}
		if json.Unmarshal([]byte(ev.Detail), &d) != nil {
			continue
		}
		for i := range rep.Episodes {
			e := &rep.Episodes[i]
			w := int64(rep.EpisodeWindow)
			if ev.Attempt < e.StartAttempt || ev.Attempt > e.EndAttempt || (d.Node != "" && e.Node != "" && d.Node != e.Node && !e.hasRankKey(d.Node)) {
				continue
			}
			if (ev.Attempt == e.StartAttempt && ev.Step < e.StartStep-w) || (ev.Attempt == e.EndAttempt && ev.Step > e.EndStep+w) {
				continue
			}
			if len(e.Captures) < 16 {
				e.Captures = append(e.Captures, EpisodeCapture{ID: ev.Name, Attempt: ev.Attempt, Step: ev.Step, Culprit: d.Culprit,
					OthersWaitUs: d.OthersWaitUs, Error: d.Error})
			}
			break
		}
	}
}

// hasRankKey says whether key names one of the episode's ranks ("rank
// N": the live episodes of a one-node job are its ranks').
func (e *StragglerEpisode) hasRankKey(key string) bool {
	var r int64
	if _, err := fmt.Sscanf(key, "rank %d", &r); err != nil {
		return false
	}
	return slices.Contains(e.Ranks, r)
}

// episodeCells bounds windows × ranks (20 bytes each, 50 MiB): at 131,072
// ranks, 20 windows; up to 50,000 ranks, 50.
const episodeCells = 5 << 19

// windows splits the steady steps into at most 50 windows of at least 10
// steps (fewer windows when the world is large).
type windows struct {
	sp    *spine
	first []int // window → index of its first step
	// the last step asked of and its window (of)
	lastStep, lastWin int
	size              int
	world             int
	sum               []float64 // window*world + rank: own time (compute, data wait and host work), ns
	data              []float32 // of it, waiting for data
	work              []float32 // the measured forward, backward and optimizer
	n                 []int32
}

// newWindows lays out the episode windows: about 50 over the steady steps
// (fewer for a large world), of at least minSize steps.
func newWindows(sp *spine, world int64, minSize int) *windows {
	steady := 0
	for i := range sp.len() {
		if sp.steady(i) {
			steady++
		}
	}
	maxW := min(50, max(1, episodeCells/max(int(world), 1)))
	size := max(10, (steady+maxW-1)/maxW, minSize)
	w := &windows{sp: sp, size: size, world: int(max(world, 1)), lastStep: -1}
	k := 0
	for i := range sp.len() {
		if !sp.steady(i) {
			continue
		}
		if k%size == 0 {
			w.first = append(w.first, i)
		}
		k++
	}
	cells := len(w.first) * w.world
	w.sum, w.data, w.work, w.n = make([]float64, cells), make([]float32, cells), make([]float32, cells), make([]int32, cells)
	return w
}

// of is step i's window, -1 when it is not steady.
func (w *windows) of(i int) int {
	if i == w.lastStep {
		return w.lastWin
	}
	win := -1
	if w.sp.steady(i) {
		k, found := slices.BinarySearch(w.first, i)
		if !found {
			k--
		}
		win = k
	}
	w.lastStep, w.lastWin = i, win
	return win
}

// addIn notes a rank's own time at a step of window win (of; -1: none),
// and of it the data wait and the measured forward, backward and
// optimizer (0 when not measured).
func (w *windows) addIn(win int, rank int64, ownNs, dataNs, workNs float64) {
	if win < 0 || rank < 0 || rank >= int64(w.world) {
		return
	}
	k := win*w.world + int(rank)
	w.sum[k] += ownNs
	w.data[k] += float32(dataNs)
	w.work[k] += float32(workNs)
	w.n[k]++
}

// addN notes a rank's sums over n steady steps that all fall in the
// window of step (a rank_windows row).
func (w *windows) addN(step int, rank int64, ownNs, dataNs, workNs float64, n int32) {
	win := w.of(step)
	if win < 0 || rank < 0 || rank >= int64(w.world) || n <= 0 {
		return
	}
	k := win*w.world + int(rank)
	w.sum[k] += ownNs
	w.data[k] += float32(dataNs)
	w.work[k] += float32(workNs)
	w.n[k] += n
}

// excess is rank slow's mean time beyond rank fast's in window win, by part.
func (w *windows) excess(win, slow, fast int) EpisodeExcess {
	ks, kf := win*w.world+slow, win*w.world+fast
	ns, nf := float64(w.n[ks]), float64(w.n[kf])
	if ns == 0 || nf == 0 {
		return EpisodeExcess{}
	}
	own := w.sum[ks]/ns - w.sum[kf]/nf
	data := float64(w.data[ks])/ns - float64(w.data[kf])/nf
	ws, wf := float64(w.work[ks])/ns, float64(w.work[kf])/nf
	e := EpisodeExcess{DataMs: data / 1e6, HostKnown: ws > 0 && wf > 0}
	if e.HostKnown {
		e.ComputeMs = (ws - wf) / 1e6
		e.HostMs = (own - data - (ws - wf)) / 1e6
	} else {
		e.ComputeMs = (own - data) / 1e6
	}
	return e
}

// episodes finds the straggler episodes: per window, each rank's score is
// the fastest rank's mean own time over its own. A rank's flagged windows
// make its runs (a run goes on over one unflagged window: a slowdown that
// dips above the threshold for a window is one episode, not two); the
// ranks of a node whose runs span the same windows make one episode, so a
// node-level episode never hides which of its ranks are slow, or since
// when. Their steps' figures (TPS during and without, GPU hours lost) are
// then taken from the steps' rows, read again from src.
func (w *windows) episodes(sp *spine, nodes map[int64]string, src clusterSource) ([]StragglerEpisode, error) {
	groups, order := runsOf(w.flaggedCells(), nodes)
	var out []StragglerEpisode
	for _, k := range order {
		out = append(out, w.episode(sp, k, groups[k], nodes))
	}
	if err := w.fill(out, src); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b StragglerEpisode) int {
		return cmp.Or(cmp.Compare(a.StartAttempt, b.StartAttempt), cmp.Compare(a.StartStep, b.StartStep), cmp.Compare(a.Node, b.Node), cmp.Compare(a.Ranks[0], b.Ranks[0]))
	})
	return out, nil
}

// episodeCell is a rank's flagged window.
type episodeCell struct {
	win    int
	score  float64
	excess float64 // ns: the rank's mean own time over the fastest's
	parts  EpisodeExcess
}

// flaggedCells is each rank's windows below the straggler threshold
// against the window's fastest rank, in order.
func (w *windows) flaggedCells() map[int64][]episodeCell {
	perRank := map[int64][]episodeCell{}
	for win := range w.first {
		best, fastest := math.Inf(1), -1
		for r := 0; r < w.world; r++ {
			if n := w.n[win*w.world+r]; n > 0 && w.sum[win*w.world+r]/float64(n) < best {
				best, fastest = w.sum[win*w.world+r]/float64(n), r
			}
		}
		if best <= 0 || math.IsInf(best, 1) {
			continue
		}
		for r := 0; r < w.world; r++ {
			n := w.n[win*w.world+r]
			if n == 0 {
				continue
			}
			mean := w.sum[win*w.world+r] / float64(n)
			if score := best / mean; score < tps.StragglerThreshold {
				perRank[int64(r)] = append(perRank[int64(r)], episodeCell{win, score, mean - best, w.excess(win, r, fastest)})
			}
		}
	}
	return perRank
}

// episodeSpan is a run of flagged windows of a node (or rank).
type episodeSpan struct {
	key      string
	from, to int
}

// episodeGroup is the ranks whose runs span the same windows, and their
// flagged windows.
type episodeGroup struct {
	ranks []int64
	cells []episodeCell
}

// runsOf groups each rank's runs (windows at most two apart) by node and
// span, in the order first seen.
func runsOf(perRank map[int64][]episodeCell, nodes map[int64]string) (map[episodeSpan]*episodeGroup, []episodeSpan) {
	groups := map[episodeSpan]*episodeGroup{}
	var order []episodeSpan
	for _, r := range slices.Sorted(maps.Keys(perRank)) {
		cs := perRank[r]
		for i := 0; i < len(cs); {
			j := i
			for j+1 < len(cs) && cs[j+1].win-cs[j].win <= 2 {
				j++
			}
			k := episodeSpan{nodeLabel(nodes[r], r), cs[i].win, cs[j].win}
			g := groups[k]
			if g == nil {
				g = &episodeGroup{}
				groups[k] = g
				order = append(order, k)
			}
			if len(g.ranks) < 64 {
				g.ranks = append(g.ranks, r)
			}
			g.cells = append(g.cells, cs[i:j+1]...)
			i = j + 1
		}
	}
	return groups, order
}

// lastOf is the last steady step of window win.
func (w *windows) lastOf(sp *spine, win int) int {
	if win+1 < len(w.first) {
		last := w.first[win+1] - 1
		for last > w.first[win] && w.of(last) < 0 {
			last--
		}
		return last
	}
	last := sp.len() - 1
	for last > 0 && w.of(last) < 0 {
		last--
	}
	return last
}

// episode is the group's episode over span k: its scores, steps, and per
// window the slowest of its ranks' excess (what the others wait for).
func (w *windows) episode(sp *spine, k episodeSpan, g *episodeGroup, nodes map[int64]string) StragglerEpisode {
	nw := len(w.first)
	e := StragglerEpisode{WorstScore: 1, Ranks: g.ranks}
	if nodes[g.ranks[0]] != "" {
		e.Node = k.key
	}
	slowest := make(map[int]episodeCell, k.to-k.from+1)
	var sumScore float64
	for _, c := range g.cells {
		e.WorstScore = min(e.WorstScore, c.score)
		sumScore += c.score
		if s, ok := slowest[c.win]; !ok || c.excess > s.excess {
			slowest[c.win] = c
		}
	}
	e.MeanScore = sumScore / float64(len(g.cells))
	a, b := w.first[k.from], w.lastOf(sp, k.to)
	ka, kb := sp.key(a), sp.key(b)
	e.StartAttempt, e.StartStep = ka[0], ka[1]
	e.EndAttempt, e.EndStep = kb[0], kb[1]
	e.Ongoing = k.to == nw-1
	e.a, e.b = a, b
	e.excess = make([]float64, nw)
	for i := a; i <= b; i++ {
		win := w.of(i)
		if win < 0 {
			continue
		}
		p := slowest[win].parts // zero in a window the run went on over
		e.Excess.DataMs += p.DataMs
		e.Excess.ComputeMs += p.ComputeMs
		e.Excess.HostMs += p.HostMs
		e.Excess.HostKnown = e.Excess.HostKnown || p.HostKnown
		e.Steps++
		e.excess[win] = slowest[win].excess
	}
	if e.Steps > 0 {
		e.Excess.DataMs /= float64(e.Steps)
		e.Excess.ComputeMs /= float64(e.Steps)
		e.Excess.HostMs /= float64(e.Steps)
	}
	return e
}

// fill takes the episodes' steps' figures from their rows, in one pass
// over the steps from the first episode's to the last one's: TPS during,
// TPS had the node kept pace (each step's time less its window's excess,
// never more than twice as fast) and the GPU hours that excess cost.
func (w *windows) fill(eps []StragglerEpisode, src clusterSource) error {
	if len(eps) == 0 {
		return nil
	}
	lo, hi := eps[0].a, eps[0].b
	for _, e := range eps {
		lo, hi = min(lo, e.a), max(hi, e.b)
	}
	// tokens over time, during the episode and had it kept pace (never a
	// mean of the steps' rates)
	tokens, during, without := make([]float64, len(eps)), make([]float64, len(eps)), make([]float64, len(eps))
	err := src.each(lo, hi+1, func(off int, rows []tps.ClusterStep) error {
		end := off + len(rows)
		for k := range eps {
			e := &eps[k]
			for i := max(e.a, off); i <= min(e.b, end-1); i++ {
				if w.of(i) < 0 {
					continue
				}
				c := &rows[i-off]
				if i == e.a {
					e.from = c.StartUnixNs
				}
				if i == e.b {
					e.to = c.EndUnixNs
				}
				d := float64(c.StepTimeNs)
				faster := max(d-e.excess[w.of(i)], d/2) // never more than twice as fast
				tokens[k] += float64(c.Tokens)
				during[k] += d / 1e9
				without[k] += faster / 1e9
				e.GPUHoursLost += (d - faster) / 1e9 * float64(c.WorldSize) / 3600
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for k := range eps {
		e := &eps[k]
		if tokens[k] > 0 && during[k] > 0 && without[k] > 0 {
			e.TPSDuring, e.TPSWithout = tokens[k]/during[k], tokens[k]/without[k]
		}
		e.CostTPS = max(0, e.TPSWithout-e.TPSDuring)
		if e.TPSWithout > 0 {
			e.CostFraction = e.CostTPS / e.TPSWithout
		}
		e.excess = nil
	}
	return nil
}

// episodeCauses explains each episode: the largest part of its slow
// rank's excess own time (EpisodeExcess) when it is waiting for data or
// host time, else slow compute, from the GPU samples of its node against
// the other nodes' over the same time.
func (rep *Report) episodeCauses(g *gpuSeries) {
	for i := range rep.Episodes {
		e := &rep.Episodes[i]
		if c := ownCause(e.Excess); c != "" {
			e.Cause = c
			continue
		}
		e.Cause = "slow compute on the node's ranks (no GPU samples of the node to say why)"
		if rep.GPUSamples == 0 || g.nodes[e.Node] == nil || len(g.nodes) < 2 {
			continue
		}
		x := g.nodeAgainstOthers(e.Node, e.from, e.to)
		if c := x.cause(); c != "" {
			e.Cause, e.gpuSlow = c, x.slow()
		}
	}
}

// ownCause names the cause when the largest part of the slow rank's
// excess is waiting for data or host time ("" when it is compute).
func ownCause(x EpisodeExcess) string {
	switch {
	case x.DataMs > 0 && x.DataMs >= x.ComputeMs && x.DataMs >= x.HostMs:
		return fmt.Sprintf("waiting for data: %.1f ms a step more than the fastest rank (compute %+.1f ms, host %+.1f ms): the input pipeline of the node's ranks (loader workers, storage, a slow shard)", x.DataMs, x.ComputeMs, x.HostMs)
	case x.HostKnown && x.HostMs > 0 && x.HostMs >= x.ComputeMs:
		return fmt.Sprintf("host time outside forward, backward and optimizer: %.1f ms a step more than the fastest rank (compute %+.1f ms, data %+.1f ms): launch gaps, CPU contention or Python on the node", x.HostMs, x.ComputeMs, x.DataMs)
	}
	return ""
}

// gpuEvidence is a node's GPU samples against the other nodes' over the
// same time.
type gpuEvidence struct {
	clk, pw, k, oclk, ok, tmp, kt, otmp, okt float64
	reasons                                  int64
}

// nodeAgainstOthers sums node's samples and the others' over [from, to].
func (g *gpuSeries) nodeAgainstOthers(node string, from, to int64) gpuEvidence {
	n := g.nodes[node]
	lo, hi := int((from-g.t0)/g.width)/g.nodeBin, int((to-g.t0)/g.width)/g.nodeBin
	lo, hi = max(lo, 0), min(hi, len(n.n)-1)
	var x gpuEvidence
	for b := lo; b <= hi; b++ {
		if n.n[b] > 0 {
			x.clk += n.clock[b]
			x.pw += n.power[b]
			x.k += float64(n.n[b])
			x.reasons |= n.reasons[b]
		}
		x.tmp += n.temp[b]
		x.kt += float64(n.nTemp[b])
		for name, o := range g.nodes {
			if name == node {
				continue
			}
			if o.n[b] > 0 {
				x.oclk += o.clock[b]
				x.ok += float64(o.n[b])
			}
			x.otmp += o.temp[b]
			x.okt += float64(o.nTemp[b])
		}
	}
	return x
}

// slow says the evidence shows the node's GPUs slowed: clocks below 95% of
// the other nodes', or a throttle reason (cause's first three cases).
func (x gpuEvidence) slow() bool {
	return x.k > 0 && x.ok > 0 && (x.clk/x.k < 0.95*x.oclk/x.ok || x.reasons&throttleBits != 0)
}

// throttleBits are the clock event reasons tps.ThrottleReasons names.
var throttleBits = func() (b int64) {
	for _, t := range tps.ThrottleReasons() {
		b |= t.Bit
	}
	return b
}()

// cause reads the evidence: clocks throttled or low, throttle reasons,
// or normal clocks ("" when either side has no samples).
func (x gpuEvidence) cause() string {
	if x.k == 0 || x.ok == 0 {
		return ""
	}
	clk, pw, oclk := x.clk/x.k, x.pw/x.k, x.oclk/x.ok
	// the temperature beside the clocks, when both sides report one
	hot := ""
	if x.kt > 0 && x.okt > 0 {
		hot = fmt.Sprintf(", %.0f °C against %.0f °C", x.tmp/x.kt, x.otmp/x.okt)
	}
	var why []string
	for _, t := range tps.ThrottleReasons() {
		if x.reasons&t.Bit != 0 {
			why = append(why, t.Name)
		}
	}
	switch {
	case clk < 0.95*oclk && len(why) > 0:
		return fmt.Sprintf("GPU clocks throttled: %.0f MHz against %.0f MHz on the other nodes (%s), %.0f W%s", clk, oclk, strings.Join(why, ", "), pw, hot)
	case clk < 0.95*oclk:
		return fmt.Sprintf("GPU clocks low: %.0f MHz against %.0f MHz on the other nodes, %.0f W%s, no throttle reason given", clk, oclk, pw, hot)
	case len(why) > 0:
		return fmt.Sprintf("throttle reasons on the node (%s) with clocks near the others' (%.0f against %.0f MHz%s)", strings.Join(why, ", "), clk, oclk, hot)
	}
	return fmt.Sprintf("slow compute with normal GPU clocks (%.0f MHz, others %.0f MHz%s): the kernels, the input or the host (launch gaps, CPU contention)", clk, oclk, hot)
}
