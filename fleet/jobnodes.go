// Package fleet keeps what the collector's jobs say about the nodes they
// ran on, across jobs: which hosts and GPUs slow job after job, what that
// cost in GPU-hours, and with what evidence (docs/nodes.md).
//
// Each finished job gives one row per node it ran on (JobNodes: the node's
// slowest rank's own time against the job's median rank, the steps, the
// GPU-hours its excess cost the job, its GPU's telemetry against its peers),
// kept as a small Parquet file per job in the output folder's nodes/ table,
// written once the job's folder is final. The fleet's view (Health) folds
// those rows per node: a score decayed over jobs, the GPU-hours lost, and a
// drain verdict that needs slowness in at least MinJobs jobs, or one job's
// strong hardware evidence.
package fleet

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"slices"
	"strings"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// JobNode is one node's part in one job: a GPU (its NVML UUID) or, where
// the ranks named none, a host. Own time is a rank's compute and data time
// (StepRecord.ComputeNs plus its data wait): what the other ranks of a
// synchronous step wait for when it is long.
type JobNode struct {
	Job string `json:"job" parquet:"job,dict"`
	// Key is the node's identity across jobs: "gpu:<uuid>" or "host:<name>".
	Key  string `json:"key" parquet:"key,dict"`
	Host string `json:"host" parquet:"host,dict"`
	GPU  string `json:"gpu,omitempty" parquet:"gpu,dict"`
	// Rank is the node's slowest rank, Ranks how many ranks it held.
	Rank      int64 `json:"rank" parquet:"rank"`
	Ranks     int64 `json:"ranks" parquet:"ranks"`
	WorldSize int64 `json:"world_size" parquet:"world_size"`
	Steps     int64 `json:"steps" parquet:"steps"`
	// StartUnixNs and EndUnixNs bound the job's steps on this node.
	StartUnixNs int64 `json:"start_unix_ns" parquet:"start_unix_ns"`
	EndUnixNs   int64 `json:"end_unix_ns" parquet:"end_unix_ns"`
	// OwnNs is the slowest rank's mean own time a step; MedianOwnNs the
	// job's median rank's; Excess OwnNs/MedianOwnNs − 1.
	OwnNs       float64 `json:"own_ns" parquet:"own_ns"`
	MedianOwnNs float64 `json:"median_own_ns" parquet:"median_own_ns"`
	Excess      float64 `json:"excess" parquet:"excess"`
	// CostGPUHours is what it cost the job: in each step where one of its
	// ranks was the slowest, that rank's own time over the slowest rank of
	// any other node, times the step's ranks (each waits for it in a
	// synchronous step).
	CostGPUHours float64 `json:"cost_gpu_hours" parquet:"cost_gpu_hours"`
	// Evidence from the node's GPU telemetry over the job (zero without
	// samples): samples, those with a clock-slowing reason (ThrottleReasons
	// names them), XID and uncorrectable ECC events, and the mean
	// temperature and power against the job's median GPU's.
	GPUSamples       int64   `json:"gpu_samples" parquet:"gpu_samples"`
	ThrottledSamples int64   `json:"throttled_samples" parquet:"throttled_samples"`
	ThrottleReasons  string  `json:"throttle_reasons,omitempty" parquet:"throttle_reasons"`
	XIDEvents        int64   `json:"xid_events" parquet:"xid_events"`
	ECCUncorrected   int64   `json:"ecc_uncorrected" parquet:"ecc_uncorrected"`
	TempC            float64 `json:"temp_c" parquet:"temp_c"`
	PeerTempC        float64 `json:"peer_temp_c" parquet:"peer_temp_c"`
	PowerW           float64 `json:"power_w" parquet:"power_w"`
	PeerPowerW       float64 `json:"peer_power_w" parquet:"peer_power_w"`
	// Users are the users (uids, sorted, comma-separated) whose processes
	// reported the node's ranks, as its agent said (rank_user events);
	// empty where none said (a file kept before, an agent that cannot
	// read its peers). Health counts a host's slow jobs by user.
	Users string `json:"users,omitempty" parquet:"users,dict"`
}

// Check reports whether a node row is one JobNodes could have made:
// every figure finite and in its range (a kept file's NaN made
// /api/nodes and `tpsprof nodes --json` empty, its table "+NaN%").
func (n JobNode) Check() error {
	for _, f := range []struct {
		name   string
		v      float64
		lo, hi float64
	}{
		{"own_ns", n.OwnNs, 0, 1e15}, {"median_own_ns", n.MedianOwnNs, 0, 1e15}, {"excess", n.Excess, -1, 1e6},
		{"cost_gpu_hours", n.CostGPUHours, 0, 1e9}, {"temp_c", n.TempC, -100, 300}, {"peer_temp_c", n.PeerTempC, -100, 300},
		{"power_w", n.PowerW, 0, 1e5}, {"peer_power_w", n.PeerPowerW, 0, 1e5},
	} {
		if math.IsNaN(f.v) || f.v < f.lo || f.v > f.hi {
			return fmt.Errorf("%s %v out of range [%g, %g]", f.name, f.v, f.lo, f.hi)
		}
	}
	for _, c := range []struct {
		name string
		v    int64
	}{{"ranks", n.Ranks}, {"world_size", n.WorldSize}, {"steps", n.Steps}, {"gpu_samples", n.GPUSamples},
		{"throttled_samples", n.ThrottledSamples}, {"xid_events", n.XIDEvents}, {"ecc_uncorrected", n.ECCUncorrected}} {
		if c.v < 0 {
			return fmt.Errorf("%s %d below 0", c.name, c.v)
		}
	}
	if n.ThrottledSamples > n.GPUSamples {
		return fmt.Errorf("%d throttled samples of %d", n.ThrottledSamples, n.GPUSamples)
	}
	if n.Key == "" || n.Job == "" {
		return fmt.Errorf("no key or job")
	}
	if len(n.Users) > 1024 || strings.Trim(n.Users, "0123456789,") != "" {
		return fmt.Errorf("users %.40q: not uids", n.Users)
	}
	return nil
}

// ThrottledFraction is the share of the node's GPU samples with a
// clock-slowing reason (0 without samples).
func (n JobNode) ThrottledFraction() float64 {
	if n.GPUSamples == 0 {
		return 0
	}
	return float64(n.ThrottledSamples) / float64(n.GPUSamples)
}

// WarmSteps are the first steps of each attempt left out (compilation,
// allocator and loader warm-up differ between ranks for reasons no node
// keeps).
const WarmSteps = 2

// rankOwn is a rank's own time over a job.
type rankOwn struct {
	host, gpu  string
	where      string // the host the step's top-two hosts compare (host, else GPU, else "rank N")
	whereID    int32  // where's number in stepTop
	steps      int64
	own        float64 // Σ own time, ns
	cost       float64 // Σ GPU-ns the others waited for it, as the critical rank
	start, end int64
	world      int64
}

// stepTop is a step's two slowest hosts (distinct): the critical rank's
// own time and host, and the slowest own time on any other host. Hosts
// are numbers from hostIDs (0: none): a job's steps are held, 40 bytes
// each.
type stepTop struct {
	own1, own2   int64
	rank1        int64
	host1, host2 int32
	n            int32
}

func (t *stepTop) add(own int64, host int32, rank int64) {
	t.n++
	switch {
	case t.n == 1:
		t.own1, t.host1, t.rank1 = own, host, rank
	case host == t.host1:
		if own > t.own1 {
			t.own1, t.rank1 = own, rank
		}
	case own > t.own1:
		t.own2, t.host2 = t.own1, t.host1
		t.own1, t.host1, t.rank1 = own, host, rank
	case host == t.host2 || own > t.own2:
		t.own2, t.host2 = max(t.own2, own), host
	}
}

// attemptSteps spans one attempt's step numbers, from the first pass,
// with its lowest WarmSteps+1 distinct numbers: the warm-up is its first
// steps by order, not by number (a job numbering its steps by samples
// left only its first step out).
type attemptSteps struct {
	first, last, rows int64
	low               [WarmSteps + 1]int64
	lows              int
}

func (sp *attemptSteps) add(step int64) {
	if sp.rows == 0 {
		sp.first, sp.last = step, step
	}
	sp.first, sp.last, sp.rows = min(sp.first, step), max(sp.last, step), sp.rows+1
	i := sp.lows
	for i > 0 && sp.low[i-1] > step {
		i--
	}
	if (i > 0 && sp.low[i-1] == step) || i == len(sp.low) {
		return
	}
	copy(sp.low[i+1:], sp.low[i:])
	sp.low[i] = step
	sp.lows = min(sp.lows+1, len(sp.low))
}

// warm reports whether step is of the attempt's warm-up.
func (sp *attemptSteps) warm(step int64) bool {
	return sp.lows <= WarmSteps || step < sp.low[WarmSteps]
}

// stepTops holds a job's steps' tops: an attempt whose steps are
// numbered closely (the loop's own count: the usual case) in a slice by
// step, any other in a map. The map of every step was 706 MB at 4 M
// steps, more than the job's report took.
type stepTops struct {
	attempts map[int64]*attemptTops
	sparse   map[[2]int64]*stepTop
	last     *attemptTops // the attempt looked up last: rows come by attempt
	lastAt   int64
}

// attemptTops is one attempt's span and, where its steps are numbered
// closely, its steps' tops by step from its first.
type attemptTops struct {
	attemptSteps
	dense []stepTop
}

func newStepTops(spans map[int64]attemptSteps) *stepTops {
	s := &stepTops{attempts: make(map[int64]*attemptTops, len(spans)), sparse: map[[2]int64]*stepTop{}}
	for at, sp := range spans {
		a := &attemptTops{attemptSteps: sp}
		// dense where the numbers leave at most one gap a row
		if n := sp.last - sp.first + 1; n <= 2*sp.rows+16 && n <= 1<<28 {
			a.dense = make([]stepTop, n)
		}
		s.attempts[at] = a
	}
	return s
}

// attempt is the attempt's span and tops (every attempt of the rows the
// first pass read has one).
func (s *stepTops) attempt(at int64) *attemptTops {
	if s.last == nil || s.lastAt != at {
		s.last, s.lastAt = s.attempts[at], at
	}
	return s.last
}

func (s *stepTops) at(a *attemptTops, attempt, step int64) *stepTop {
	if i := step - a.first; i >= 0 && i < int64(len(a.dense)) {
		return &a.dense[i]
	}
	k := [2]int64{attempt, step}
	t := s.sparse[k]
	if t == nil {
		t = &stepTop{}
		s.sparse[k] = t
	}
	return t
}

func (s *stepTops) each(fn func(*stepTop)) {
	for _, a := range s.attempts {
		for i := range a.dense {
			fn(&a.dense[i])
		}
	}
	for _, t := range s.sparse {
		fn(t)
	}
}

// JobNodes reads a finished job's folder (OUT/<job>) and returns one row
// per node (GPU, or host without one) its ranks ran on, from rank_steps
// (the columns it needs, twice: the attempts' first steps, then the rest)
// and gpu_samples. A job with fewer than 2 ranks, or whose ranks named no
// node, gives no row: a node is slow only against peers. Cost: in each
// step the critical rank's own time over the slowest rank of any other
// host is what every rank of the step waited for it, charged to it.
func JobNodes(dir, job string) ([]JobNode, error) {
	blocking, core := tps.BlockingMeasures()
	owned, _ := tps.OwnMeasures()
	cols := []string{"attempt", "step", "rank", "world_size", "duration_ns", "start_unix_ns", "end_unix_ns"}
	var ownAt []int // the columns of the measures a rank's own time adds (StepRecord.OwnNs)
	for i, m := range blocking {
		if slices.Contains(owned, m) {
			ownAt = append(ownAt, len(cols))
		}
		if core[i] {
			cols = append(cols, m)
		} else {
			cols = append(cols, "?"+m) // a part written before the measure existed: zeros
		}
	}
	table := dir + "/" + trace.RankSteps
	spans := map[int64]attemptSteps{} // attempt -> its steps
	_, err := trace.EachColumnsStrs(table, cols[:2], nil, nil, func(c *trace.Columns) error {
		at, st := c.Int64[0], c.Int64[1]
		for i := range c.Rows {
			sp := spans[at[i]]
			sp.add(st[i])
			spans[at[i]] = sp
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("fleet: %s: %w", job, err)
	}
	ranks := map[int64]*rankOwn{}
	steps := newStepTops(spans)
	hostIDs := map[string]int32{} // a rank's where → its number in stepTop (from 1)
	blocked := make([]int64, len(blocking))
	_, err = trace.EachColumnsStrs(table, cols, []string{"node", "gpu_uuid"}, nil, func(c *trace.Columns) error {
		at, st, rk, ws := c.Int64[0], c.Int64[1], c.Int64[2], c.Int64[3]
		dur, start, end := c.Int64[4], c.Int64[5], c.Int64[6]
		for i := range c.Rows {
			a := steps.attempt(at[i])
			if a == nil || a.warm(st[i]) || rk[i] < 0 {
				continue
			}
			for k := range blocked {
				blocked[k] = c.Int64[7+k][i]
			}
			own := tps.ComputeNs(dur[i], blocked...)
			for _, j := range ownAt {
				own += c.Int64[j][i]
			}
			r := ranks[rk[i]]
			if r == nil {
				r = &rankOwn{start: start[i], end: end[i]}
				ranks[rk[i]] = r
			}
			if h := c.Str[0][i]; h != "" && h != r.host {
				r.host, r.where = h, ""
			}
			if g := c.Str[1][i]; g != "" && g != r.gpu {
				r.gpu, r.where = g, ""
			}
			if r.where == "" { // (once a rank, not a string a row)
				r.where = cmp.Or(r.host, r.gpu, fmt.Sprintf("rank %d", rk[i]))
				if hostIDs[r.where] == 0 {
					hostIDs[r.where] = int32(len(hostIDs) + 1)
				}
				r.whereID = hostIDs[r.where]
			}
			r.steps++
			r.own += float64(own)
			r.start, r.end = min(r.start, start[i]), max(r.end, end[i])
			r.world = max(r.world, ws[i])
			steps.at(a, at[i], st[i]).add(own, r.whereID, rk[i])
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("fleet: %s: %w", job, err)
	}
	if len(ranks) < 2 {
		return nil, nil
	}
	steps.each(func(t *stepTop) {
		if t.n < 2 || t.host2 == 0 {
			return
		}
		if r := ranks[t.rank1]; r != nil {
			// the ranks that reported the step waited: a world size is a
			// record's claim (one claiming 4 Mi ranks charged its host
			// 1,630 GPU-hours for 3 s of steps)
			r.cost += float64(t.own1-t.own2) * float64(t.n)
		}
	})
	means := make([]float64, 0, len(ranks))
	var world int64
	for _, r := range ranks {
		means = append(means, r.own/float64(r.steps))
		world = max(world, r.world)
	}
	world = max(world, int64(len(ranks)))
	slices.Sort(means)
	median := tps.Quantile(means, 0.5)
	if median <= 0 {
		return nil, nil
	}
	byKey := map[string]*JobNode{}
	for rk, r := range ranks {
		key := ""
		switch {
		case r.gpu != "":
			key = "gpu:" + r.gpu
		case r.host != "":
			key = "host:" + r.host
		default:
			continue
		}
		own := r.own / float64(r.steps)
		n := byKey[key]
		if n == nil {
			n = &JobNode{Job: job, Key: key, Host: r.host, GPU: r.gpu, Rank: rk, WorldSize: world, MedianOwnNs: median,
				StartUnixNs: r.start, EndUnixNs: r.end, OwnNs: own, Steps: r.steps}
			byKey[key] = n
		}
		n.Ranks++
		n.CostGPUHours += r.cost / 3.6e12
		n.StartUnixNs, n.EndUnixNs = min(n.StartUnixNs, r.start), max(n.EndUnixNs, r.end)
		if own > n.OwnNs || (own == n.OwnNs && rk < n.Rank) {
			n.OwnNs, n.Rank, n.Steps = own, rk, r.steps
		}
	}
	hosts := map[string]bool{}
	for _, r := range ranks {
		hosts[r.where] = true
	}
	out := make([]JobNode, 0, len(byKey))
	for _, n := range byKey {
		n.Excess = n.OwnNs/median - 1
		if len(hosts) < 2 {
			// no peer host: a host is slow only against others (a
			// single-host job drained its host against itself, "0.000
			// GPU-hours"); its GPUs' hardware evidence still counts
			n.Excess = 0
		}
		out = append(out, *n)
	}
	if err := addEvidence(dir, out); err != nil {
		return nil, fmt.Errorf("fleet: %s: GPU samples: %w", job, err)
	}
	if err := addUsers(dir, out); err != nil {
		return nil, fmt.Errorf("fleet: %s: events: %w", job, err)
	}
	slices.SortFunc(out, func(a, b JobNode) int { return cmp.Compare(a.Key, b.Key) })
	return out, nil
}

// addEvidence folds the job's GPU samples into its nodes' rows: per GPU
// (by UUID), over the row's own span of steps (an agent publishes its
// samples to every job it served, later ones' times included), the samples
// with a clock-slowing reason, XID and uncorrectable ECC events (counter
// deltas), and mean temperature and power, with the median GPU's.
func addEvidence(dir string, rows []JobNode) error {
	type acc struct {
		n, throttled, reasons int64
		xid, ecc              [2]int64 // the lowest and highest counter
		xidSeen, eccSeen      bool
		temp, power           float64
		tempN, powerN         int64
	}
	at := map[string]int{}
	for i, r := range rows {
		if r.GPU != "" {
			at[r.GPU] = i
		}
	}
	accs := make([]acc, len(rows))
	slowing := int64(0)
	for _, r := range tps.ThrottleReasons() {
		slowing |= r.Bit
	}
	counter := func(c *[2]int64, seen *bool, v *int64) {
		if v == nil {
			return
		}
		if !*seen {
			*c, *seen = [2]int64{*v, *v}, true
		}
		c[0], c[1] = min(c[0], *v), max(c[1], *v)
	}
	addSample := func(s *tps.GPUSample) {
		i, ok := at[s.UUID]
		if !ok || s.UnixNs < rows[i].StartUnixNs || s.UnixNs > rows[i].EndUnixNs {
			return
		}
		a := &accs[i]
		a.n++
		if s.ClockEventReason != nil && *s.ClockEventReason&slowing != 0 {
			a.throttled++
			a.reasons |= *s.ClockEventReason & slowing
		}
		counter(&a.xid, &a.xidSeen, s.XIDEvents)
		counter(&a.ecc, &a.eccSeen, s.ECCUncorrected)
		if s.TempC != nil {
			a.temp += float64(*s.TempC)
			a.tempN++
		}
		if s.PowerW != nil && !math.IsNaN(*s.PowerW) && !math.IsInf(*s.PowerW, 0) {
			a.power += *s.PowerW
			a.powerN++
		}
	}
	// streamed, a row group at a time: a job's samples are never held
	err := trace.Each(dir+"/"+trace.GPUSamples, func(samples []tps.GPUSample) error {
		for i := range samples {
			addSample(&samples[i])
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) && !trace.IsUnreadable(err) {
		return err // (an unreadable part is skipped: the others' samples count)
	}
	var temps, powers []float64
	for _, a := range accs {
		if a.tempN > 0 {
			temps = append(temps, a.temp/float64(a.tempN))
		}
		if a.powerN > 0 {
			powers = append(powers, a.power/float64(a.powerN))
		}
	}
	slices.Sort(temps)
	slices.Sort(powers)
	for i := range rows {
		a, r := &accs[i], &rows[i]
		if a.n == 0 {
			continue
		}
		r.GPUSamples, r.ThrottledSamples = a.n, a.throttled
		r.ThrottleReasons = reasonNames(a.reasons)
		r.XIDEvents, r.ECCUncorrected = a.xid[1]-a.xid[0], a.ecc[1]-a.ecc[0]
		if a.tempN > 0 {
			r.TempC, r.PeerTempC = a.temp/float64(a.tempN), tps.Quantile(temps, 0.5)
		}
		if a.powerN > 0 {
			r.PowerW, r.PeerPowerW = a.power/float64(a.powerN), tps.Quantile(powers, 0.5)
		}
	}
	return nil
}

// addUsers gives each row the users its host's agent said reported the
// job's ranks there (rank_user events: the agent's word, by the node it
// stamps, not a record's).
func addUsers(dir string, rows []JobNode) error {
	users := map[string][]string{} // host → uids
	_, err := trace.EachColumnsStrs(dir+"/"+trace.Events, []string{"rank"}, []string{"kind", "node", "detail"}, nil, func(c *trace.Columns) error {
		for i := range c.Rows {
			if c.Str[0][i] != tps.EventRankUser {
				continue
			}
			uid, ok := tps.ParseRankUser(c.Str[2][i])
			host := c.Str[1][i]
			if ok && host != "" && !slices.Contains(users[host], uid) && len(users[host]) < 64 {
				users[strings.Clone(host)] = append(users[host], strings.Clone(uid))
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) && !trace.IsUnreadable(err) {
		return err
	}
	for i := range rows {
		if u := users[rows[i].Host]; len(u) > 0 {
			u = slices.Clone(u)
			slices.Sort(u)
			rows[i].Users = strings.Join(u, ",")
		}
	}
	return nil
}

func reasonNames(bits int64) string {
	var names []string
	for _, r := range tps.ThrottleReasons() {
		if bits&r.Bit != 0 {
			names = append(names, r.Name)
		}
	}
	return strings.Join(names, ", ")
}
