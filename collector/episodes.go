package collector

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/tpsprof/tpsprof/tps"
)

// LiveEpisode is a straggler episode as the live page shows it: a node (or
// a rank without a node) whose recent own time (compute, data wait and host work, an
// exponential moving average over steps) has been more than 1/0.75 of the
// fastest rank's since StartStep, with at least 3 of its last 5 steps slow
// (one stalled step is jitter). EndStep is nil while it lasts.
type LiveEpisode struct {
	Node       string  `json:"node"`
	Ranks      []int64 `json:"ranks"`
	Attempt    int64   `json:"attempt"`
	StartStep  int64   `json:"start_step"`
	EndStep    *int64  `json:"end_step"`
	WorstScore float64 `json:"worst_score"`
	Score      float64 `json:"score"` // now (at the end for a closed episode)
	// Cause is what its slowest rank has more of than the fastest rank,
	// from their moving averages (as the report's episodes say it, without
	// the GPU join): waiting for data, host time, or compute. Updated
	// while the episode lasts.
	Cause string `json:"cause,omitempty"`
	// ExcessMs is its slowest rank's own time a step beyond the fastest
	// rank's (moving averages), what every rank of a synchronous step
	// waits for. TPSDuring is the tokens over step time of its steps the
	// collector still holds (the last 512), TPSIfFixed the same had each
	// been ExcessMs shorter (at most twice as fast), and GPUHoursLost the
	// excess times the world size over the episode's steps so far.
	ExcessMs     float64 `json:"excess_ms"`
	TPSDuring    float64 `json:"tps_during"`
	TPSIfFixed   float64 `json:"tps_if_fixed"`
	GPUHoursLost float64 `json:"gpu_hours_lost"`
	counted      stepKey // the last step added to GPUHoursLost
	// Capture is the automatic capture the episode started
	// (Config.AutoCapture), nil for none.
	Capture  *CaptureLink `json:"capture,omitempty"`
	openedAt int64        // the job's last closed step when it opened
}

// autoCaptureAfter is how many closed steps an episode must stay flagged
// after it opened before it takes the job's automatic capture, and then
// only the worst episode flagged: a rank 1.4 times the fastest (4 ranks
// on 2 cores) opened an episode at a job's 5th step and took the capture
// the real straggler's episode (0.19 of the fastest) needed.
const autoCaptureAfter = 5

// maxEpisodes bounds the closed episodes a job keeps.
const maxEpisodes = 20

// episodeQuietSteps is how long an episode's ranks must keep pace before
// it ends: a window of steps, as the report's episodes go on over one
// unflagged window.
const episodeQuietSteps = 10

// oneNode says whether the job's ranks named at most one node.
func (j *jobState) oneNode() bool {
	first := ""
	for _, n := range j.rankNode {
		if n == "" {
			continue
		}
		if first == "" {
			first = n
		} else if n != first {
			return false
		}
	}
	return true
}

// trackEpisodes opens an episode for each newly flagged node and closes
// those no longer flagged, at the job's last closed step.
func (j *jobState) trackEpisodes(cfg *Config, t *tally) {
	if len(j.recent) == 0 {
		return
	}
	steps := j.recentSteps()
	last := steps[len(steps)-1]
	fastest, best := j.bestOwn()
	j.bestSeen = best
	flagged, worst := j.flaggedNow(best)
	for key, f := range flagged {
		f.Cause = j.liveCause(worst[key], fastest)
		if r := worst[key]; r >= 0 && r < len(j.ownEWMA) {
			f.ExcessMs = (j.ownEWMA[r] - best) / 1e6
		}
	}
	for key, e := range j.openEpisodes {
		if f, ok := flagged[key]; ok && e.Attempt == last.Attempt {
			e.Score, e.WorstScore, e.Ranks = f.Score, min(e.WorstScore, f.Score), mergeRanks(e.Ranks, f.Ranks)
			e.Cause, e.ExcessMs = f.Cause, f.ExcessMs
			e.whatIf(steps)
			continue
		}
		j.maybeEnd(key, e, last)
	}
	for key, f := range flagged {
		if _, ok := j.openEpisodes[key]; !ok {
			j.openEpisode(cfg, t, key, f, steps, last)
		}
	}
	// the automatic capture goes to the worst episode flagged now, once it
	// has stayed flagged autoCaptureAfter steps (on 2 cores 4 ranks' own
	// times differ by 1.4x for as long as they run: such an episode is
	// not the straggler to capture while a worse one is open)
	var worstKey string
	for key := range flagged {
		if e := j.openEpisodes[key]; e != nil && (worstKey == "" || e.Score < j.openEpisodes[worstKey].Score) {
			worstKey = key
		}
	}
	if e := j.openEpisodes[worstKey]; e != nil && e.Capture == nil && e.Attempt == last.Attempt && last.Step-e.openedAt >= autoCaptureAfter {
		j.askCapture(cfg, t, e, worstKey)
	}
}

// endEpisodes closes the open episodes at the job's last closed step: its
// last attempt ended (an episode of a finished job read "ongoing" and its
// straggler gauge stayed up, firing the alert for a job that was over).
func (j *jobState) endEpisodes() {
	if len(j.openEpisodes) == 0 || len(j.recent) == 0 {
		return
	}
	end := j.lastRow().Step
	for key, e := range j.openEpisodes {
		j.closeEpisode(key, e, end)
	}
}

// flaggedNow is the episodes the ranks' moving averages flag now, by node
// (by rank with one node), and the slowest rank of each.
func (j *jobState) flaggedNow(best float64) (map[string]*LiveEpisode, map[string]int) {
	flagged := map[string]*LiveEpisode{}
	worst := map[string]int{}
	if best <= 0 {
		return flagged, worst
	}
	// With one node, episodes are its ranks' (each with its own start):
	// the node itself is no straggler among nodes.
	byRank := j.oneNode()
	for r, v := range j.ownEWMA {
		if v <= 0 || best/v >= tps.StragglerThreshold || !j.keepsSlow(r) {
			continue
		}
		node := ""
		if r < len(j.rankNode) {
			node = j.rankNode[r]
		}
		key := node
		if key == "" || byRank {
			key = fmt.Sprintf("rank %d", r)
		}
		e := flagged[key]
		if e == nil {
			e = &LiveEpisode{Node: cmp.Or(node, key), Score: 1}
			flagged[key] = e
		}
		if best/v < e.Score {
			e.Score, worst[key] = best/v, r
		}
		if len(e.Ranks) < 64 {
			e.Ranks = append(e.Ranks, int64(r))
		}
	}
	return flagged, worst
}

// maybeEnd ends open episode e, no longer flagged, at its ranks' last
// slow step; a slowdown that dips above the threshold for less than a
// window of steps goes on as the same episode.
func (j *jobState) maybeEnd(key string, e *LiveEpisode, last tps.ClusterStep) {
	end := last.Step
	if e.Attempt == last.Attempt {
		lastSlow := int64(-1)
		for _, r := range e.Ranks {
			if r < int64(len(j.slowLast)) {
				lastSlow = max(lastSlow, j.slowLast[r])
			}
		}
		if lastSlow >= e.StartStep {
			if last.Step-lastSlow < episodeQuietSteps {
				return
			}
			end = lastSlow
		}
	}
	j.closeEpisode(key, e, end)
}

// closeEpisode ends open episode e (under key) at step end and keeps it
// among the last maxEpisodes closed.
func (j *jobState) closeEpisode(key string, e *LiveEpisode, end int64) {
	e.EndStep = &end
	j.episodesEnded++
	j.episodes = append(j.episodes, *e)
	if len(j.episodes) > maxEpisodes {
		j.episodes = j.episodes[len(j.episodes)-maxEpisodes:]
	}
	delete(j.openEpisodes, key)
}

// openEpisode opens episode f, newly flagged, where its slowest ranks' run of
// slow steps began (not where the moving average crossed the threshold).
func (j *jobState) openEpisode(cfg *Config, t *tally, key string, f *LiveEpisode, steps []tps.ClusterStep, last tps.ClusterStep) {
	if j.openEpisodes == nil {
		j.openEpisodes = map[string]*LiveEpisode{}
	}
	f.Attempt, f.StartStep, f.WorstScore, f.openedAt = last.Attempt, last.Step, f.Score, last.Step
	for _, r := range f.Ranks {
		if r < int64(len(j.slowSince)) && j.slowSince[r] >= 0 && j.slowSince[r] < f.StartStep {
			f.StartStep = j.slowSince[r]
		}
	}
	f.counted = stepKey{f.Attempt, f.StartStep - 1}
	f.whatIf(steps)
	j.openEpisodes[key] = f
}

// whatIf updates the episode's TPS during and had it kept pace over the
// recent steps since it began, and adds the steps closed since the last
// call to its GPU-hours lost (each step's excess times its world size).
func (e *LiveEpisode) whatIf(steps []tps.ClusterStep) {
	excess := e.ExcessMs * 1e6
	var tokens, during, fixed float64
	for i := range steps {
		st := &steps[i]
		if st.Attempt != e.Attempt || st.Step < e.StartStep || st.StepTimeNs <= 0 {
			continue
		}
		d := float64(st.StepTimeNs)
		faster := max(d-excess, d/2) // never more than twice as fast
		tokens += float64(st.Tokens)
		during += d / 1e9
		fixed += faster / 1e9
		if k := (stepKey{st.Attempt, st.Step}); st.Attempt > e.counted.attempt || (st.Attempt == e.counted.attempt && st.Step > e.counted.step) {
			e.GPUHoursLost += (d - faster) / 1e9 * float64(st.WorldSize) / 3600
			e.counted = k
		}
	}
	if tokens > 0 && during > 0 && fixed > 0 {
		e.TPSDuring, e.TPSIfFixed = tokens/during, tokens/fixed // tokens over time, as every throughput
	}
}

// liveCause says what rank slow has more of than rank fast, from their
// moving averages (job lock held).
func (j *jobState) liveCause(slow, fast int) string {
	if slow < 0 || fast < 0 || slow >= len(j.ownEWMA) || fast >= len(j.ownEWMA) {
		return ""
	}
	data := (j.dataEWMA[slow] - j.dataEWMA[fast]) / 1e6
	own := (j.ownEWMA[slow] - j.ownEWMA[fast]) / 1e6
	work, host := own-data, 0.0
	if j.workEWMA[slow] > 0 && j.workEWMA[fast] > 0 {
		work = (j.workEWMA[slow] - j.workEWMA[fast]) / 1e6
		host = own - data - work
	}
	switch {
	case data > 0 && data >= work && data >= host:
		return fmt.Sprintf("waiting for data: %.1f ms a step more than the fastest rank", data)
	case host > 0 && host >= work:
		return fmt.Sprintf("host time outside forward, backward and optimizer: %.1f ms a step more than the fastest rank", host)
	default:
		why := fmt.Sprintf("slow compute: %.1f ms a step more than the fastest rank", work)
		if slow < len(j.rankNode) {
			if g := j.gpuEvidence(j.rankNode[slow]); g != "" {
				why += "; " + g
			}
		}
		return why
	}
}

// liveGPUWindow is how far back the live cause looks in each GPU's
// samples (from its newest).
const liveGPUWindow = 30e9

// gpuEvidence compares the GPUs of node with the other nodes' over their
// last samples (liveGPUWindow of each GPU's): SM clocks, the throttle
// reasons seen, temperature. Empty when either side has no samples.
func (j *jobState) gpuEvidence(node string) string {
	var clk, n, oclk, on, tmp, nt, otmp, ont float64
	var reasons int64
	for _, g := range j.gpuSeries {
		last := g.last()
		mine := g.node == node
		for i := len(g.points) - 1; i >= 0 && g.points[i].UnixNs >= last-liveGPUWindow; i-- {
			p := &g.points[i]
			switch {
			case mine && p.SMClock > 0:
				clk, n = clk+p.SMClock, n+1
				reasons |= p.Reasons
			case !mine && p.SMClock > 0:
				oclk, on = oclk+p.SMClock, on+1
			}
			switch {
			case mine && p.TempC >= 0:
				tmp, nt = tmp+p.TempC, nt+1
			case !mine && p.TempC >= 0:
				otmp, ont = otmp+p.TempC, ont+1
			}
		}
	}
	if n == 0 || on == 0 {
		return ""
	}
	out := fmt.Sprintf("GPU clocks %.0f MHz against %.0f MHz on the other nodes", clk/n, oclk/on)
	var why []string
	for _, t := range tps.ThrottleReasons() {
		if reasons&t.Bit != 0 {
			why = append(why, t.Name)
		}
	}
	if len(why) > 0 {
		out += " (" + strings.Join(why, ", ") + ")"
	}
	if nt > 0 && ont > 0 {
		out += fmt.Sprintf(", %.0f °C against %.0f °C", tmp/nt, otmp/ont)
	}
	return out
}

func mergeRanks(a, b []int64) []int64 {
	for _, r := range b {
		if !slices.Contains(a, r) && len(a) < 64 {
			a = append(a, r)
		}
	}
	slices.Sort(a)
	return a
}

// liveEpisodes are the job's episodes, open ones last, by start step.
func (j *jobState) liveEpisodes() []LiveEpisode {
	out := slices.Clone(j.episodes)
	for _, e := range j.openEpisodes {
		c := *e
		c.Ranks = slices.Clone(e.Ranks)
		slices.Sort(c.Ranks)
		out = append(out, c)
	}
	slices.SortStableFunc(out, func(a, b LiveEpisode) int {
		if (a.EndStep == nil) != (b.EndStep == nil) {
			if a.EndStep == nil {
				return 1
			}
			return -1
		}
		if a.StartStep != b.StartStep {
			return int(a.StartStep - b.StartStep)
		}
		if a.Node < b.Node {
			return -1
		}
		return 1
	})
	return out
}
