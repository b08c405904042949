// Package report analyses a job's Parquet traces after the fact: steady-state
// throughput, MFU, the time breakdown, goodput, stragglers, energy and cost,
// and draws the plots. It streams rank_steps and gpu_samples a row group at a
// time, and cluster_steps a chunk of steps at a time (cluster.go): memory
// follows the number of ranks (a bounded sample per rank, a fixed heatmap
// grid) and, at 57 to 125 bytes a step (120 more with plots), the number
// of steps, not the number of rows.
//
// analyze.go runs it as named stages over one analysis (open the job,
// read the steps, the events, the cluster pass, the rank pass, finish);
// the figures of the cluster rows are stepFigures registered in one list
// (figures.go). It owns the after-the-fact figures and their views (text,
// Markdown, HTML, plots, trackers). It never writes into a job's tables:
// it reads them, and writes only the plots and pages it is asked for.
package report

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// Options tune the analysis.
type Options struct {
	// Warmup excludes that many leading steps of each attempt; negative
	// (tps.AutoWarmup) applies the automatic rule.
	Warmup int
	// TrainTokens, when set, asks for the time to finish that budget.
	TrainTokens float64
	// GPUHourUSD overrides the price in the run metadata.
	GPUHourUSD float64
	// TopStragglers is how many ranks and nodes to list (default 5).
	TopStragglers int
	// Progress, when set, is called as rank rows are read (done of total),
	// on a goroutine of the report's own (one at a time) while it runs.
	Progress func(done, total int64)
	// Select restricts the report to part of the run (the zero value: all).
	Select Selection
	// RankSource chooses what per-rank figures (straggler scores, episodes,
	// the heatmap, padding) are read from: RankSourceAuto (rank_windows
	// when rank_steps holds more than WindowsAbove rows, or none),
	// RankSourceSteps or RankSourceWindows.
	RankSource string

	// chunk, when above 0, streams the cluster rows in chunks of that
	// many steps whatever the run's size (tests)
	chunk int
	// energyChunk, when above 0, is how many steady steps the energy join
	// takes at a time at least (tests; else clusterChunk)
	energyChunk int
	// valuesInMemory, when above 0, is how many step times and rates a
	// series holds before it spills to a file (tests; else
	// valuesInMemory)
	valuesInMemory int
}

// Rank sources (Options.RankSource).
const (
	RankSourceAuto    = ""
	RankSourceSteps   = trace.RankSteps
	RankSourceWindows = trace.RankWindows
)

// WindowsAbove is the rank_steps size past which an automatic report reads
// rank_windows instead (one row per rank and 100 steps).
const WindowsAbove int64 = 50_000_000

// Breakdown is where the steady steps' time went, as shares of their step
// time (tps.ShareSum: each part's time, mean over ranks, over the steps'
// time): the parts from Compute to Other add up to 1.
type Breakdown struct {
	tps.Shares
	BubbleTheoretical float64 `json:"bubble_theoretical"`
	CommOverlap       float64 `json:"comm_overlap"`
}

// Padding is real against padded tokens over the steady rank rows that
// report padded tokens (both summed over those rows, so the ratio holds
// whatever the parallelism).
type Padding struct {
	RealTokens   int64   `json:"real_tokens"`
	PaddedTokens int64   `json:"padded_tokens"`
	RealFraction float64 `json:"real_fraction"`
}

// Generation sums up the generation phase of the steady steps that had
// one (RL post-training: rollouts, then the update).
type Generation struct {
	Steps    int   `json:"steps"`
	Requests int64 `json:"requests"`
	// Generated and prompt tokens over the slowest rank's generation time
	// of each step, summed over steps: the fleet's generation throughput
	// (output: generated tokens only; total: with the prompts).
	OutputTPS    float64 `json:"output_tps"`
	TotalTPS     float64 `json:"total_tps"`
	OutputTokens int64   `json:"output_tokens"`
	PromptTokens int64   `json:"prompt_tokens"`
	// Shares of step time (means over steps of the means over ranks):
	// generating, waiting (exposed communication, pipeline, data,
	// checkpoint) and training (the rest: the update's compute).
	GenShare      float64 `json:"gen_share"`
	TrainingShare float64 `json:"training_share"`
	WaitingShare  float64 `json:"waiting_share"`
	// MFUTraining is the mean MFU of the training phase alone (the
	// update's FLOPs over the step time less the generation); nil when
	// MFU is unknown.
	MFUTraining *float64 `json:"mfu_training"`
	// Latencies per request, seconds, merged across ranks and steps from
	// the ranks' sketches (1% relative accuracy); nil without rollout
	// events.
	TTFT *Latency `json:"ttft_s"`
	ITL  *Latency `json:"itl_s"`
}

// Latency is a latency distribution from a merged sketch.
type Latency struct {
	Count int64   `json:"count"`
	Mean  float64 `json:"mean"`
	P50   float64 `json:"p50"`
	P95   float64 `json:"p95"`
	P99   float64 `json:"p99"`
}

func latencyOf(s *tps.Sketch) *Latency {
	if s.Count == 0 {
		return nil
	}
	return &Latency{Count: s.Count, Mean: s.Mean(), P50: s.Quantile(0.5), P95: s.Quantile(0.95), P99: s.Quantile(0.99)}
}

// TextRate is throughput in text, comparable across tokenizers: bytes
// (UTF-8) per second of step time over the steady steps that reported
// bytes, and tokens per byte of those steps.
type TextRate struct {
	Steps          int     `json:"steps"`
	BytesPerSecond float64 `json:"bytes_per_second"`
	TokensPerByte  float64 `json:"tokens_per_byte"`
}

// Energy sums up the GPU samples joined to steady steps.
type Energy struct {
	// TokensPerJoule and JoulesPerToken are 0 (omitted from JSON) where no
	// token was counted (Summary.TPSUnknown says why).
	TokensPerJoule float64 `json:"tokens_per_joule,omitempty"`
	JoulesPerToken float64 `json:"joules_per_token,omitempty"`
	PowerWMean     float64 `json:"power_w_mean"` // per GPU
	SMClockMHzMean float64 `json:"sm_clock_mhz_mean"`
	// ThrottledSteps are steady steps during which some GPU reported a
	// clock-event reason other than idle or application clocks.
	ThrottledSteps int `json:"throttled_steps"`
	// Steps are the steady steps the tokens per joule are over: those
	// whose whole period every GPU's readings in gpu_samples cover (the
	// report joins them again, see energyJoin), else those the collector
	// joined live.
	Steps int `json:"steps"`
	// FromSamples says the figures were joined again from gpu_samples;
	// false: the collector's live join in the cluster rows.
	FromSamples bool `json:"from_samples"`
}

// CommFit is the least-squares line of step TPS against the exposed
// communication fraction over steady steps: how much throughput each point
// of exposed communication costs.
// MinFitR2 is the share of TPS variance a fit must explain to be quoted as
// a cost: below it the report says no relation was found (a line through
// noise, e.g. R² 0.04, is not a cost per point of communication).
const MinFitR2 = 0.3

type CommFit struct {
	Slope     float64 `json:"slope_tps_per_fraction"`
	Intercept float64 `json:"intercept_tps"`
	R2        float64 `json:"r2"`
}

// Related says whether the fit explains enough of the TPS variance to be
// quoted as a cost (and drawn as a line).
func (f CommFit) Related() bool { return f.Slope != 0 && f.R2 >= MinFitR2 }

// Report is the analysis of one job. Its JSON keys are stable and
// documented in docs/report.md.
type Report struct {
	Job       string       `json:"job"`
	Dir       string       `json:"dir"`
	Meta      *tps.RunMeta `json:"meta,omitempty"`
	Summary   tps.Summary  `json:"summary"`
	Breakdown Breakdown    `json:"breakdown"`
	// MFULedger is where the MFU went, each lost point in one bucket.
	MFULedger MFULedger `json:"mfu_ledger"`
	// Findings are where the throughput goes, largest headroom first.
	Findings []Finding `json:"findings"`
	// Checkpoint is how often to checkpoint, from the saves' length and
	// the run's interruptions (or why not).
	Checkpoint *CheckpointAdvice `json:"checkpoint_advice"`
	CommFit    CommFit           `json:"comm_fit"`
	Goodput    Goodput           `json:"goodput"`
	// Attempts are the run's attempts (launches and restarts inside
	// them): steps, TPS, MFU, wall time and how each ended.
	Attempts   []AttemptRow    `json:"attempts"`
	Stragglers []tps.RankScore `json:"straggler_ranks"`
	// WaitCharged is the waiting for slower peers of the steady steps
	// charged to the node whose rank was critical (the cluster row's
	// slowest rank), most first, at most TopStragglers nodes.
	WaitCharged []WaitShare     `json:"wait_charged"`
	Nodes       []tps.NodeScore `json:"straggler_nodes"`
	// NodeCount is how many nodes the ranks named: with one, no node is
	// called a straggler (the views name ranks).
	NodeCount int `json:"node_count"`
	// Episodes are the spans of steps during which a node ran below the
	// straggler threshold, judged over windows of EpisodeWindow steps.
	Episodes      []StragglerEpisode `json:"straggler_episodes"`
	EpisodeWindow int                `json:"straggler_window_steps"`
	RankRows      int64              `json:"rank_rows"`
	// TablesRead are the tables the report read, and RankWindows the
	// rank_windows rows when per-rank figures came from them (with
	// RankWindowsLeft, windows holding warm-up steps left out).
	TablesRead      []string `json:"tables_read"`
	RankWindows     int64    `json:"rank_windows,omitempty"`
	RankWindowsLeft int64    `json:"rank_windows_left_out,omitempty"`
	// BytesRead is what the report read from the job's part files
	// (footers included), of BytesInTables in the tables it reads from.
	BytesRead     int64 `json:"bytes_read"`
	BytesInTables int64 `json:"bytes_in_tables"`
	// Selection says what part of the run the report covers ("" for all);
	// RankRowsSkipped counts the rank rows it did not read (row groups
	// outside the selection, by the parts' statistics).
	Selection       string           `json:"selection,omitempty"`
	RankRowsSkipped int64            `json:"rank_rows_skipped,omitempty"`
	GPUSamples      int64            `json:"gpu_samples"`
	Events          map[string]int64 `json:"events"`
	// Padding compares real and padded tokens where ranks report both.
	Padding *Padding `json:"padding,omitempty"`
	// CaptureCost is what measuring cost the ranks that measured it
	// (tpsprof.torch); Memory the ranks' device memory, where reported.
	CaptureCost *CaptureCost `json:"capture_cost,omitempty"`
	// CountedFLOPs are the FLOPs PyTorch counted on sampled steps, beside
	// the analytic model's, and MFU and HFU from them.
	CountedFLOPs *CountedFLOPs `json:"counted_flops,omitempty"`
	Memory       *Memory       `json:"memory,omitempty"`
	own          ownAcc
	// Generation sums up the steps' generation phase (RL rollouts), when
	// ranks reported one.
	Generation *Generation `json:"generation,omitempty"`
	// Text is throughput in bytes of text, when ranks reported bytes.
	Text *TextRate `json:"text,omitempty"`
	// Loss is the training loss over the steady steps, when ranks
	// reported one.
	Loss *Loss `json:"loss,omitempty"`
	// Running is true when some part of the job is still being written:
	// the report covers what is finalised (Notes say so).
	Running    bool `json:"running"`
	runningWhy string
	// ClockOffsetsNs are the nodes' clock offsets from rank 0's node that
	// the collector removed from cluster rows (docs/report.md, "Clocks").
	ClockOffsetsNs map[string]int64 `json:"clock_offsets_ns,omitempty"`
	Notes          []string         `json:"notes,omitempty"`
	Traces         *TraceSummary    `json:"traces,omitempty"`
	Energy         *Energy          `json:"energy,omitempty"`
	CostPerMTok    *float64         `json:"cost_per_million_tokens_usd,omitempty"`
	TimeToTrainS   *float64         `json:"time_to_train_s,omitempty"`

	// read is what every read of the report takes: counted in BytesRead,
	// each part's footer read once.
	read trace.ReadOption
	// leastPP is the steady steps' pipeline wait of their least-waiting
	// rank, mean a step (ns; rank_steps read only): the time a step would
	// lose without its bubble (the others' waits beyond it are on no
	// critical path); leastPPSteps how many steps it is over.
	leastPP      float64
	leastPPSteps int
}

// Plots is what the report's figures draw, apart from its result (the
// Report, which is what JSON, text, Markdown and HTML print): the steps
// and their warm-up mask, the rank heatmap's grid, the GPU series, the
// events marked on the plots. Kept small whatever the trace size, but for
// the steps themselves.
type Plots struct {
	steps  []plotStep
	warm   []bool
	heat   *heatGrid
	gpu    *gpuSeries
	nodeOf map[int64]string
	events []tps.Event // checkpoints and evaluations, marked on plots
}

// Analyze reads the traces of the job folder dir (OUT/<job>) and returns
// the report's result.
func Analyze(dir string, opt Options) (*Report, error) {
	rep, _, err := analyze(dir, opt, false)
	return rep, err
}

// AnalyzeWithPlots is Analyze, and what the report's figures draw
// (Plots.Figures): 120 B a step more (plotStep), the plots drawing every
// step.
func AnalyzeWithPlots(dir string, opt Options) (*Report, *Plots, error) {
	return analyze(dir, opt, true)
}

// fitSums is ordinary least squares of y on x from the sums over n
// points of x, y, x², xy and y².
func fitSums(n, sx, sy, sxx, sxy, syy float64) CommFit {
	if n < 2 {
		return CommFit{}
	}
	vx := sxx - sx*sx/n
	vy := syy - sy*sy/n
	if vx <= 0 {
		return CommFit{Intercept: sy / n}
	}
	slope := (sxy - sx*sy/n) / vx
	f := CommFit{Slope: slope, Intercept: (sy - slope*sx) / n}
	if vy > 0 {
		r := (sxy - sx*sy/n) / math.Sqrt(vx*vy)
		f.R2 = r * r
	}
	return f
}

// RunningQuiet is how long after its newest part was written a job whose
// last attempt recorded a start and no end is still taken as running
// (the collector finalises parts at least every minute while steps come;
// past this it ended without a record: a launcher killed with the job).
const RunningQuiet = 10 * time.Minute

// openAttempt says why a job is running by its events ("" when it is
// not): its newest attempt recorded a start (attempt_start or job_start)
// and no end, and its steps' newest part was written within RunningQuiet.
func openAttempt(events []tps.Event, clusterDir string, now time.Time) string {
	last, lastEnd := int64(-1), int64(-1)
	for _, e := range events {
		switch e.Kind {
		case tps.EventAttemptStart, tps.EventJobStart:
			last = max(last, e.Attempt)
		case tps.EventAttemptEnd, tps.EventJobEnd:
			lastEnd = max(lastEnd, e.Attempt)
		}
	}
	// (an end at a later attempt ended the launch: launchEnds moves a
	// launch's end to the last attempt restarted inside it)
	if last < 0 || lastEnd >= last {
		return ""
	}
	files, _ := trace.PartFiles(clusterDir)
	var newest time.Time
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil && fi.ModTime().After(newest) {
			newest = fi.ModTime()
		}
	}
	if newest.IsZero() || now.Sub(newest) > RunningQuiet {
		return ""
	}
	return fmt.Sprintf("attempt %d recorded no end; its steps were last written %s ago", last, now.Sub(newest).Round(time.Second))
}

// readMeta takes the run metadata from the newest cluster_steps part.
func readMeta(dir string) *tps.RunMeta {
	files, _ := trace.PartFiles(dir)
	for i := len(files) - 1; i >= 0; i-- {
		md, err := trace.FileMetadata(files[i])
		if err != nil {
			continue
		}
		var m tps.RunMeta
		if raw, ok := md[trace.MetaRun]; ok && json.Unmarshal([]byte(raw), &m) == nil {
			return &m
		}
	}
	return nil
}

// nodeLabel is what the report calls a rank's node: its name, or "rank
// N" for a rank that named none.
func nodeLabel(node string, rank int64) string {
	if node == "" {
		return fmt.Sprintf("rank %d", rank)
	}
	return node
}

// critExcess is how much more compute, data wait and host work each node's rank had
// than the step's mean rank in the steps it was critical: the critical
// rank's own figures (its rank_steps rows) against the mean rank's (the
// cluster rows), each a mean over the steps it has. It keeps no figure
// of a step.
type critExcess struct {
	own     map[string]*excessSums // node → its critical ranks' sums
	ownRank map[int64]*excessSums  // critical rank → the same (the waiting by rank, on one node)
	mean    map[int64]*excessSums  // critical rank → the mean rank's, the same
	// by rank (below 1<<16), the last node its row named and its sums in
	// own and ownRank: a critical rank's row is one of every step's, and
	// its two map lookups (a label made of a rank without a node) were
	// most of what the step pass spent on it
	last []critLast
}

type critLast struct {
	node      string
	own, rank *excessSums
}

// excessSums are a rank's own time's parts over steps: compute, data wait
// and host work before the forward (ns), and the steps.
type excessSums struct{ compute, data, host, steps float64 }

func newCritExcess() *critExcess {
	return &critExcess{own: map[string]*excessSums{}, ownRank: map[int64]*excessSums{}, mean: map[int64]*excessSums{}}
}

// resetOwn drops the critical ranks' rows' sums (the rank rows read
// again), keeping the mean rank's.
func (x *critExcess) resetOwn() {
	x.own, x.ownRank, x.last = map[string]*excessSums{}, map[int64]*excessSums{}, nil
}

// addOwn takes the critical rank's row of a steady step.
func (x *critExcess) addOwn(node string, rank int64, compute, data, host float64) {
	if rank >= 0 && rank < int64(len(x.last)) {
		if l := &x.last[rank]; l.own != nil && l.node == node {
			l.own.add(compute, data, host)
			l.rank.add(compute, data, host)
			return
		}
	}
	label := nodeLabel(node, rank)
	addExcess(x.own, label, 4096, compute, data, host)
	addExcess(x.ownRank, rank, 1<<16, compute, data, host)
	if own, r := x.own[label], x.ownRank[rank]; own != nil && r != nil && rank >= 0 && rank < 1<<16 {
		if int(rank) >= len(x.last) {
			x.last = append(x.last, make([]critLast, int(rank)+1-len(x.last))...)
		}
		x.last[rank] = critLast{node: node, own: own, rank: r}
	}
}

func (e *excessSums) add(compute, data, host float64) {
	e.compute += compute
	e.data += data
	e.host += host
	e.steps++
}

// addMean takes a steady step's mean rank, by its critical rank.
func (x *critExcess) addMean(rank int64, compute, data, host float64) {
	addExcess(x.mean, rank, 1<<16, compute, data, host)
}

// addExcess adds a step's parts to m's sums at k (at most limit keys).
func addExcess[K comparable](m map[K]*excessSums, k K, limit int, compute, data, host float64) {
	e := m[k]
	if e == nil {
		if len(m) >= limit {
			return
		}
		e = &excessSums{}
		m[k] = e
	}
	e.add(compute, data, host)
}

// explain names what made each node's rank critical: its compute, its
// wait for data or its host work before the forward, whichever it had
// most of beyond the mean rank.
func (x *critExcess) explain(ws []WaitShare, nodeOf map[int64]string) {
	mean := map[string]*excessSums{}
	for r, m := range x.mean {
		n := nodeLabel(nodeOf[r], r)
		e := mean[n]
		if e == nil {
			e = &excessSums{}
			mean[n] = e
		}
		e.compute, e.data, e.host, e.steps = e.compute+m.compute, e.data+m.data, e.host+m.host, e.steps+m.steps
	}
	for i := range ws {
		e, m := x.own[ws[i].Node], mean[ws[i].Node]
		if ws[i].ByRank && len(ws[i].Ranks) == 1 {
			// one node: the rank's own excess over the mean rank's
			e, m = x.ownRank[ws[i].Ranks[0]], x.mean[ws[i].Ranks[0]]
		}
		if e == nil || e.steps == 0 || m == nil || m.steps == 0 {
			continue
		}
		c := (e.compute/e.steps - m.compute/m.steps) / 1e6
		d := (e.data/e.steps - m.data/m.steps) / 1e6
		h := (e.host/e.steps - m.host/m.steps) / 1e6
		ws[i].ComputeExcessMs, ws[i].DataExcessMs, ws[i].HostExcessMs = c, d, h
		switch {
		case d > c && d >= h && d > 0:
			ws[i].Cause = fmt.Sprintf("data loading: %.1f ms a step more waiting for data than the mean rank (compute %+.1f ms)", d, c)
		case h > c && h > 0:
			ws[i].Cause = fmt.Sprintf("host work before the forward: %.1f ms a step more than the mean rank (compute %+.1f ms, data wait %+.1f ms)", h, c, d)
		case c > 0:
			ws[i].Cause = fmt.Sprintf("compute: %.1f ms a step more than the mean rank (data wait %+.1f ms)", c, d)
		}
	}
}

// WaitShare is the waiting for slower peers charged to one node: the
// ranks waited in their collectives for its rank.
type WaitShare struct {
	// Cause is what its critical rank had more of than the mean rank:
	// compute or waiting for data.
	Cause string  `json:"cause,omitempty"`
	Node  string  `json:"node"`
	Ranks []int64 `json:"ranks"` // its ranks that were critical (at most 64)
	Steps int     `json:"steps"` // steady steps it was critical in
	WaitS float64 `json:"wait_s"`
	Share float64 `json:"share"` // of all the waiting
	// ByRank: the job runs on one node, whose ranks are who the others
	// waited for: the waiting is charged to Ranks[0] alone.
	ByRank bool `json:"by_rank,omitempty"`
	// ComputeExcessMs, DataExcessMs and HostExcessMs are what its critical rank had
	// more of than the mean rank a step, in the steps it was critical
	// (what Cause says in words; 0 where unknown).
	ComputeExcessMs float64 `json:"compute_excess_ms,omitempty"`
	DataExcessMs    float64 `json:"data_excess_ms,omitempty"`
	HostExcessMs    float64 `json:"host_excess_ms,omitempty"`
}

// unstepClocks repairs the timeline of steps (sorted by attempt, step)
// whose clock was stepped back (an NTP correction, a hand-set clock): a
// step ending more than a second before its predecessor ended cannot be,
// so it and the attempt's later steps are moved to follow the predecessor
// by their own step time. It returns how many jumps it repaired and the
// largest, in seconds. (A clock stepped forward looks like an idle gap
// and is left as it is.)
func unstepClocks(steps []tps.ClusterStep) (n int, largest float64) {
	return unstep(len(steps), func(i int) (int64, *int64, *int64, int64) {
		c := &steps[i]
		return c.Attempt, &c.StartUnixNs, &c.EndUnixNs, c.StepTimeNs
	})
}

// unstep is unstepClocks over n steps that at gives the attempt, the
// start and end (to move) and the step time of.
func unstep(n int, at func(i int) (attempt int64, start, end *int64, stepTime int64)) (jumps int, largest float64) {
	var u unstepper
	for i := range n {
		u.next(at(i))
	}
	return u.jumps, u.largest
}

// unstepper is unstep a step at a time: shift is what it added to the
// last step's times.
type unstepper struct {
	started                     bool
	shift, prevAttempt, prevEnd int64
	jumps                       int
	largest                     float64
}

func (u *unstepper) next(attempt int64, start, end *int64, stepTime int64) {
	if !u.started || u.prevAttempt != attempt {
		u.started = true
		u.shift, u.prevAttempt, u.prevEnd = 0, attempt, *end
		return
	}
	*start += u.shift
	*end += u.shift
	if *end < u.prevEnd-1_000_000_000 { // more than a second back
		d := u.prevEnd + max(stepTime, 0) - *end
		*start += d
		*end += d
		u.shift += d
		u.jumps++
		u.largest = max(u.largest, float64(d)/1e9)
	}
	u.prevEnd = *end
}

// readClockOffsets reads the clock offsets of the newest part that has
// them (the collector's estimate settles as steps close).
func readClockOffsets(dir string) map[string]int64 {
	files, _ := trace.PartFiles(dir)
	for i := len(files) - 1; i >= 0; i-- {
		md, err := trace.FileMetadata(files[i])
		if err != nil {
			continue
		}
		var m map[string]int64
		if raw, ok := md[trace.MetaClockOffsets]; ok && json.Unmarshal([]byte(raw), &m) == nil && len(m) > 0 {
			return m
		}
	}
	return nil
}

// alignEvents brings events onto the cluster rows' clock: an event keeps
// its rank's clock in Parquet (it may arrive before the collector knows
// any offset), so the offset of its rank's node is removed here. Events of
// no rank (a launcher's) are taken as they are. With nodeOf nil it moves
// the events that name their node (an agent names it: known before the
// rank pass, which the cluster pass runs before); with nodeOf, the others,
// by their rank's node. It returns how many it moved.
func alignEvents(events []tps.Event, offs map[string]int64, nodeOf map[int64]string) int {
	if len(offs) == 0 {
		return 0
	}
	moved := 0
	for i := range events {
		e := &events[i]
		if e.Rank < 0 || (nodeOf == nil) != (e.Node != "") {
			continue
		}
		node := e.Node
		if nodeOf != nil {
			node = nodeOf[e.Rank]
		}
		if off := offs[node]; off != 0 {
			e.StartUnixNs -= off
			e.EndUnixNs -= off
			moved++
		}
	}
	return moved
}

// largestOffset is the largest clock offset of a node, either way (ns).
func largestOffset(offs map[string]int64) int64 {
	var m int64
	for _, o := range offs {
		m = max(m, abs(o))
	}
	return m
}

// ClockOffsetsText is the nodes' clock offsets in one line, the largest
// first and at most eight named ("" when there are none).
func ClockOffsetsText(offs map[string]int64) string {
	if len(offs) == 0 {
		return ""
	}
	nodes := slices.Collect(maps.Keys(offs))
	slices.SortFunc(nodes, func(a, b string) int {
		if c := cmp.Compare(abs(offs[b]), abs(offs[a])); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for _, n := range nodes[:min(len(nodes), 8)] {
		parts = append(parts, fmt.Sprintf("%s %+.3f s", n, float64(offs[n])/1e9))
	}
	if len(nodes) > 8 {
		parts = append(parts, fmt.Sprintf("and %d more", len(nodes)-8))
	}
	return strings.Join(parts, ", ") + " from rank 0's node; removed before comparing times across nodes"
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// medianBudget bounds the values the per-rank medians hold together (128
// MiB of float64), so the report's memory does not grow with the world
// size past a few thousand ranks: up to 16,384 ranks each keeps 1,024
// values; at 131,072 ranks, 128 (a rank error of ±4.4% instead of ±1.6%).
const medianBudget = 16 << 20

func medianKeepFor(world int64) int {
	return int(min(max(medianBudget/max(world, 1), 64), 1024))
}

// heatGrid is the per-rank compute time over steps, binned to at most
// 400 step columns and 512 rank rows.
type heatGrid struct {
	stepBins, rankBins int
	stepsPer, ranksPer int
	sum                []float64
	n                  []int32
}

func newHeatGrid(steps, ranks int) *heatGrid {
	ranks = max(ranks, 1)
	h := &heatGrid{stepsPer: (steps + 399) / 400, ranksPer: (ranks + 511) / 512}
	h.stepsPer, h.ranksPer = max(h.stepsPer, 1), max(h.ranksPer, 1)
	h.stepBins = (steps + h.stepsPer - 1) / h.stepsPer
	h.rankBins = (ranks + h.ranksPer - 1) / h.ranksPer
	h.sum = make([]float64, h.stepBins*h.rankBins)
	h.n = make([]int32, h.stepBins*h.rankBins)
	return h
}

func (h *heatGrid) add(step int, rank int64, v float64) {
	h.addCol(h.col(step), rank, v)
}

// col is the column of step (addCol with it saves a division a row).
func (h *heatGrid) col(step int) int { return step / h.stepsPer }

func (h *heatGrid) addCol(c int, rank int64, v float64) {
	r := int(rank)
	if h.ranksPer > 1 {
		r /= h.ranksPer
	}
	if c >= h.stepBins || r >= h.rankBins || r < 0 {
		return
	}
	h.sum[r*h.stepBins+c] += v
	h.n[r*h.stepBins+c]++
}

func (h *heatGrid) value(c, r int) float64 {
	i := r*h.stepBins + c
	if h.n[i] == 0 {
		return math.NaN()
	}
	return h.sum[i] / float64(h.n[i])
}

// gpuSeries bins GPU samples over the run's time into at most 600
// buckets, for all GPUs and (coarser, 150 buckets) per node.
type gpuSeries struct {
	t0, width    int64
	power, clock []float64
	util         []float64
	n, nUtil     []int
	nodes        map[string]*nodeGPU
	nodeBin      int              // buckets per node bucket
	offsets      map[string]int64 // nodes' clock offsets (samples are on their node's clock)
}

// nodeGPU is one node's power, clock and temperature, in buckets of
// nodeBin.
type nodeGPU struct {
	power, clock []float64
	n            []int
	reasons      []int64 // NVML clock event reasons seen, OR'ed
	temp         []float64
	nTemp        []int // samples with a temperature
}

// maxGPUNodes bounds the nodes tracked one by one.
const maxGPUNodes = 4096

// newGPUSeries bins the time from lo to hi (ns).
func newGPUSeries(lo, hi int64) *gpuSeries {
	g := &gpuSeries{t0: lo, width: max((hi-lo)/600+1, 1), nodes: map[string]*nodeGPU{}, nodeBin: 4}
	g.power, g.clock, g.util = make([]float64, 600), make([]float64, 600), make([]float64, 600)
	g.n, g.nUtil = make([]int, 600), make([]int, 600)
	return g
}

func (g *gpuSeries) add(s *tps.GPUSample) {
	b := (s.UnixNs - g.offsets[s.Node] - g.t0) / g.width // onto the rows' clock
	if b < 0 || b >= 600 {
		return
	}
	if s.PowerW != nil && s.SMClockMHz != nil {
		g.power[b] += *s.PowerW
		g.clock[b] += float64(*s.SMClockMHz)
		g.n[b]++
		n := g.nodes[s.Node]
		if n == nil && len(g.nodes) < maxGPUNodes {
			k := 600 / g.nodeBin
			n = &nodeGPU{power: make([]float64, k), clock: make([]float64, k), n: make([]int, k), reasons: make([]int64, k),
				temp: make([]float64, k), nTemp: make([]int, k)}
			g.nodes[s.Node] = n
		}
		if n != nil {
			nb := int(b) / g.nodeBin
			n.power[nb] += *s.PowerW
			n.clock[nb] += float64(*s.SMClockMHz)
			n.n[nb]++
			if s.ClockEventReason != nil {
				n.reasons[nb] |= *s.ClockEventReason
			}
			if s.TempC != nil {
				n.temp[nb] += float64(*s.TempC)
				n.nTemp[nb]++
			}
		}
	}
	if s.GPUUtilPct != nil {
		g.util[b] += *s.GPUUtilPct
		g.nUtil[b]++
	}
}

// oddNodes are the nodes (at most k, most different first) whose mean
// power or SM clock differs from the median node's by more than 3%.
func (g *gpuSeries) oddNodes(k int) []string {
	if len(g.nodes) < 2 {
		return nil
	}
	type nm struct {
		name         string
		power, clock float64
	}
	var ms []nm
	for name, n := range g.nodes {
		var p, c float64
		cnt := 0
		for b := range n.n {
			p, c, cnt = p+n.power[b], c+n.clock[b], cnt+n.n[b]
		}
		if cnt > 0 {
			ms = append(ms, nm{name, p / float64(cnt), c / float64(cnt)})
		}
	}
	med := func(get func(nm) float64) float64 {
		v := make([]float64, len(ms))
		for i, m := range ms {
			v[i] = get(m)
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	mp, mc := med(func(m nm) float64 { return m.power }), med(func(m nm) float64 { return m.clock })
	type odd struct {
		name string
		dev  float64
	}
	var out []odd
	for _, m := range ms {
		dev := 0.0
		if mp > 0 {
			dev = math.Abs(m.power-mp) / mp
		}
		if mc > 0 {
			dev = math.Max(dev, math.Abs(m.clock-mc)/mc)
		}
		if dev > 0.03 {
			out = append(out, odd{m.name, dev})
		}
	}
	sort.Slice(out, func(a, b int) bool {
		return out[a].dev > out[b].dev || (out[a].dev == out[b].dev && out[a].name < out[b].name)
	})
	var names []string
	for _, o := range out[:min(k, len(out))] {
		names = append(names, o.name)
	}
	return names
}

// tolerate turns unreadable parts (skipped, the rest read) into a note;
// other errors pass.
func (rep *Report) tolerate(err error) error {
	if note, ok := unreadableNote(err); ok {
		rep.Notes = append(rep.Notes, note)
		return nil
	}
	return err
}

// unreadableNote is the note of err when it is unreadable parts skipped.
func unreadableNote(err error) (string, bool) {
	var u *trace.UnreadableParts
	if errors.As(err, &u) {
		return fmt.Sprintf("%d unreadable part(s) skipped (not Parquet, empty or truncated): %s", len(u.Paths), strings.Join(u.Paths, ", ")), true
	}
	return "", false
}
