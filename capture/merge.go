package capture

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// View is the merged figures of one capture: per rank and step, and per
// collective matched across ranks.
type View struct {
	ID    string  `json:"id"`
	Job   string  `json:"job"`
	Steps []int64 `json:"steps"`
	// Ranks lists each rank's figures over the captured steps.
	Ranks []RankView `json:"ranks"`
	// Collectives are the calls matched across ranks, in order.
	Collectives []Collective `json:"collectives"`
	// Culprit is the rank that held the captured collectives back the
	// most (nil when none did: no collective matched, or no rank was last
	// to arrive by more than the clocks' uncertainty, or when the same
	// steps' own records name another rank: see Verdict).
	Culprit *Culprit `json:"culprit"`
	// Records is the rank the captured steps' own step records say the
	// others waited for (nil: fewer than two ranks' records came, or none
	// stood out), checked against the collectives' arrivals.
	Records *RecordsCritical `json:"records_critical,omitempty"`
	// Verdict says, in words, who the others waited for and how sure that
	// is: the capture and the records agreeing, disagreeing (then no rank
	// is named, and why the capture may be wrong), or not checked.
	Verdict string `json:"verdict"`
	// Missing are the targeted ranks that sent nothing, with why.
	Missing []Missing `json:"missing,omitempty"`
	Notes   []string  `json:"notes,omitempty"`
	// GroupsUnnamed is how many process groups the job has where its
	// traces do not name each call's (0: named, or only one).
	GroupsUnnamed int `json:"groups_unnamed,omitempty"`
	// Kept lists the traces written on request.
	Kept []string `json:"kept,omitempty"`
}

// RankView is one rank's figures summed over the captured steps it traced
// (microseconds, as kineto reports them).
type RankView struct {
	Rank          int64   `json:"rank"`
	Node          string  `json:"node"`
	Device        string  `json:"device"`
	Steps         int     `json:"steps"`
	DurationUs    float64 `json:"duration_us"`
	ComputeUs     float64 `json:"compute_us"`
	CommUs        float64 `json:"comm_us"`
	ExposedCommUs float64 `json:"exposed_comm_us"`
	IdleUs        float64 `json:"idle_us"`
	// OffsetUs is this rank's clock minus the reference rank's, estimated
	// from the ends of the collectives they share (0 for the reference).
	OffsetUs float64 `json:"clock_offset_us"`
	// WaitUs is the time this rank waited at the captured collectives for
	// the last rank to arrive; LastArrivals how often it was that rank;
	// HeldBackUs how long, at those, the others waited for it beyond the
	// second-latest arrival (the time it alone cost).
	WaitUs       float64 `json:"wait_us"`
	LastArrivals int     `json:"last_arrivals"`
	HeldBackUs   float64 `json:"held_back_us"`
	// TransferUs is the communication time that was not waiting for a
	// later rank: CommUs less WaitUs (at least 0), the split of the time in
	// collectives measured from arrival times.
	TransferUs float64 `json:"transfer_us"`
	// Record is the mean of the rank's own step records of the captured
	// steps (nil: none came with its traces): what the verdict checks.
	Record *RecordFigures `json:"record,omitempty"`
}

// Collective is one call matched across the ranks that made it.
type Collective struct {
	Step  int64   `json:"step"`
	Group string  `json:"process_group,omitempty"`
	Seq   int     `json:"seq"` // its order among the group's calls in the step
	Kind  string  `json:"kind"`
	Ranks []int64 `json:"ranks"`
	// ArrivalUs is each rank's arrival after the first (same order as
	// Ranks), on clocks aligned by the offsets.
	ArrivalUs []float64 `json:"arrival_us"`
	Last      int64     `json:"last"`
	// SpreadUs is the last arrival after the first: how long the first
	// rank waited. HeldBackUs is the last after the second-latest.
	SpreadUs   float64 `json:"spread_us"`
	firstNs    int64   // the first arrival on the aligned clock (the step's spans)
	HeldBackUs float64 `json:"held_back_us"`
}

// Culprit names the rank the others waited for.
type Culprit struct {
	Rank         int64   `json:"rank"`
	Node         string  `json:"node"`
	LastArrivals int     `json:"last_arrivals"`
	Collectives  int     `json:"collectives"`
	HeldBackUs   float64 `json:"held_back_us"`
	// OthersWaitUs is the mean over the other ranks of their wait at the
	// collectives where it arrived last.
	OthersWaitUs float64 `json:"others_wait_us"`
	// WaitDoubt says why OthersWaitUs may be off ("" when nothing says
	// so): calls lost in matching leave their waits out (one DDP capture
	// in 50 that lost 6 of 16 calls read 78 ms against 123 ms by the
	// job's clocks).
	WaitDoubt string `json:"wait_doubt,omitempty"`
}

// RecordsCritical is the rank with the most own time (compute and waiting
// for data: what the others of a synchronous step wait for) in its own
// step records of the captured steps, against the other ranks' mean.
type RecordsCritical struct {
	Rank int64 `json:"rank"`
	// ExcessUs is its own time a step beyond the other ranks' mean; Ranks how
	// many ranks' records were there.
	ExcessUs float64 `json:"excess_us"`
	Ranks    int     `json:"ranks"`
	// Phase is where that excess lay, when one phase's excess is at least
	// 80% of the others' wait a step as the capture measured it (of the
	// excess itself when the capture names no rank or another): "data
	// fetch", "forward", "backward", "optimizer" or "host code" (the
	// rank's own time outside them); "" when none is (cause not
	// established) or the records do not time the phases.
	Phase string `json:"phase,omitempty"`
	// the phase with the largest excess and that excess (ns a step),
	// named as Phase only where it explains phaseShare of the wait
	phase   string
	phaseNs float64
}

// explain names the phase when its excess is at least phaseShare of
// wait (ns a step).
func (rc *RecordsCritical) explain(wait float64) {
	rc.Phase = ""
	if wait > 0 && rc.phaseNs >= phaseShare*wait {
		rc.Phase = rc.phase
	}
}

// phaseShare is how much of the others' wait (or of the rank's excess,
// where the arrivals name no rank) one phase must explain to be named as
// its cause.
const phaseShare = 0.8

// phaseOf is the phase in which the slow rank's own time exceeds the mean
// of the others' the most, and by how much a step (ns; "" and 0 when the
// records do not time the phases or no phase exceeds).
func phaseOf(byRank map[int64][]Report, slow int64) (string, float64) {
	type parts struct{ data, fwd, bwd, optim, host float64 }
	mean := func(rk int64) (p parts, ok bool) {
		n := 0.0
		for _, r := range byRank[rk] {
			f := r.Record
			if f == nil {
				continue
			}
			work := f.FwdNs + f.BwdNs + f.OptimNs
			if work == 0 {
				return p, false // phases not timed
			}
			p.data += float64(f.DataWaitNs)
			p.fwd += float64(f.FwdNs)
			p.bwd += float64(f.BwdNs)
			p.optim += float64(f.OptimNs)
			p.host += float64(f.ComputeNs - work)
			n++
		}
		if n == 0 {
			return p, false
		}
		return parts{p.data / n, p.fwd / n, p.bwd / n, p.optim / n, p.host / n}, true
	}
	s, ok := mean(slow)
	if !ok {
		return "", 0
	}
	var o parts
	k := 0.0
	for rk := range byRank {
		if rk == slow {
			continue
		}
		if p, ok := mean(rk); ok {
			o.data, o.fwd, o.bwd, o.optim, o.host = o.data+p.data, o.fwd+p.fwd, o.bwd+p.bwd, o.optim+p.optim, o.host+p.host
			k++
		}
	}
	if k == 0 {
		return "", 0
	}
	best, name := 0.0, ""
	for _, c := range []struct {
		name string
		d    float64
	}{{"data fetch", s.data - o.data/k}, {"forward", s.fwd - o.fwd/k}, {"backward", s.bwd - o.bwd/k}, {"optimizer", s.optim - o.optim/k}, {"host code", s.host - o.host/k}} {
		if c.d > best {
			best, name = c.d, c.name
		}
	}
	return name, best
}

// BlockedNs is how long a rank waited at a step's collectives, from each
// call's span [its arrival, the last rank's arrival]. Calls it reached
// before an earlier one's last arrival were issued asynchronously (DDP's
// gradient buckets, fired through backward): their waits overlap, and the
// rank worked until its last arrival among them, so such a chain counts
// from that arrival to the chain's latest release. Synchronous calls
// (each reached after the previous released) add up. Summing every span
// read 130 ms for a rank 40 ms late at four buckets.
func BlockedNs(spans [][2]int64) int64 {
	slices.SortFunc(spans, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
	var total int64
	for i := 0; i < len(spans); {
		arrive, release := spans[i][0], spans[i][1]
		j := i + 1
		for ; j < len(spans) && spans[j][0] < release; j++ {
			arrive, release = spans[j][0], max(release, spans[j][1])
		}
		total += max(release-arrive, 0)
		i = j
	}
	return total
}

// meanRecord is the mean of a rank's step records over its reports (nil
// for none).
func meanRecord(reps []Report) *RecordFigures {
	var m RecordFigures
	n := int64(0)
	for _, r := range reps {
		if f := r.Record; f != nil {
			m.DurationNs += f.DurationNs
			m.ComputeNs += f.ComputeNs
			m.DataWaitNs += f.DataWaitNs
			m.ExposedCommNs += f.ExposedCommNs
			m.FwdNs += f.FwdNs
			m.BwdNs += f.BwdNs
			m.OptimNs += f.OptimNs
			n++
		}
	}
	if n == 0 {
		return nil
	}
	m.DurationNs, m.ComputeNs, m.DataWaitNs, m.ExposedCommNs = m.DurationNs/n, m.ComputeNs/n, m.DataWaitNs/n, m.ExposedCommNs/n
	m.FwdNs, m.BwdNs, m.OptimNs = m.FwdNs/n, m.BwdNs/n, m.OptimNs/n
	return &m
}

// recordsMinExcess: a rank stands out in the records when its own time a
// step exceeds the other ranks' mean by this share of it, and by minLeadNs.
const recordsMinExcess = 0.05

// recordsCritical finds the rank the records single out (nil: fewer than
// two ranks' records, or none stands out).
func recordsCritical(byRank map[int64][]Report, ranks []int64) *RecordsCritical {
	own := map[int64]float64{}
	for _, rk := range ranks {
		var sum float64
		n := 0
		for _, r := range byRank[rk] {
			if r.Record != nil {
				sum += float64(r.Record.ComputeNs + r.Record.DataWaitNs)
				n++
			}
		}
		if n > 0 {
			own[rk] = sum / float64(n)
		}
	}
	if len(own) < 2 {
		return nil
	}
	var sum float64
	best, top := int64(-1), -1.0
	for _, rk := range ranks {
		v, ok := own[rk]
		if !ok {
			continue
		}
		sum += v
		if v > top {
			best, top = rk, v
		}
	}
	// against the others' mean (with the rank in it, 40 ms of a rank's
	// own among 4 read 30)
	mean := (sum - top) / float64(len(own)-1)
	if ex := top - mean; ex < minLeadNs || ex < recordsMinExcess*mean {
		return nil
	}
	rc := &RecordsCritical{Rank: best, ExcessUs: (top - mean) / 1e3, Ranks: len(own)}
	rc.phase, rc.phaseNs = phaseOf(byRank, best)
	rc.explain(top - mean)
	return rc
}

// cause says where the records put the rank's excess.
func (rc *RecordsCritical) cause() string {
	if rc.Phase == "" {
		return "cause not established (no phase explains 80% of it, or the records do not time the phases)"
	}
	return "in its " + rc.Phase + " (at least 80% of the wait)"
}

// verdict checks the capture's culprit against the records, and says it.
func (v *View) verdict(rc *RecordsCritical, unmatched int, unaligned map[int64]bool) {
	v.Records = rc
	c := v.Culprit
	var doubts []string
	if unmatched > 0 {
		doubts = append(doubts, fmt.Sprintf("%d calls lost in matching", unmatched))
	}
	if len(unaligned) > 0 {
		doubts = append(doubts, fmt.Sprintf("%d ranks' clocks not aligned in some step", len(unaligned)))
	}
	if len(doubts) == 0 {
		doubts = append(doubts, "the ranks' traced windows or clocks disagree (a loaded host delays the profiler's and gloo's threads)")
	}
	switch {
	case rc == nil && c != nil:
		v.Verdict = fmt.Sprintf("rank %d (the step records do not single out any rank, or too few of them came: not checked)", c.Rank)
	case rc == nil:
		v.Verdict = "no rank established"
	case c != nil && c.Rank == rc.Rank:
		if c.OthersWaitUs > 0 && len(v.Steps) > 0 {
			// the cause must explain the others' wait, as the capture
			// measured it a step
			rc.explain(c.OthersWaitUs * 1e3 / float64(len(v.Steps)))
			c.doubtAgainst(rc, len(v.Steps))
		}
		v.Verdict = fmt.Sprintf("rank %d, agreed by the step records: its own time (compute and data wait) %.1f ms a step more than the other ranks' mean; %s", c.Rank, rc.ExcessUs/1e3, rc.cause())
	case c != nil:
		v.Verdict = fmt.Sprintf("not established: the collectives' arrivals name rank %d, the same steps' own records rank %d (own time %.1f ms a step more than the other ranks' mean); %s",
			c.Rank, rc.Rank, rc.ExcessUs/1e3, strings.Join(doubts, ", "))
		v.Culprit = nil // never a confident wrong rank
	default:
		v.Verdict = fmt.Sprintf("the collectives' arrivals name no rank; the same steps' own records name rank %d (own time %.1f ms a step more than the other ranks' mean)", rc.Rank, rc.ExcessUs/1e3)
	}
}

// waitRecordsTol is how far the others' wait a step, as the traces give
// it, may lie from the culprit's own excess by its step records before
// the wait is said to be in doubt.
const waitRecordsTol = 0.25

// doubtAgainst says the others' wait is in doubt (WaitDoubt, when nothing
// else put it there) where the culprit's own step records do not bear it
// out: in a synchronous step the others wait about as long as the late
// rank's own time exceeds theirs. On a loaded host the profiler's and
// gloo's threads run late (an FSDP2 capture on a busy 2-core machine read
// 183 ms against a 120 ms delay, its records 116 ms).
func (c *Culprit) doubtAgainst(rc *RecordsCritical, steps int) {
	if c.WaitDoubt != "" || rc.ExcessUs <= 0 || steps <= 0 {
		return
	}
	w := c.OthersWaitUs / float64(steps)
	if off := w/rc.ExcessUs - 1; math.Abs(off) > waitRecordsTol {
		c.WaitDoubt = fmt.Sprintf("the others' wait from the traces (%.1f ms a step) and rank %d's own excess by its step records (%.1f ms a step) differ by %+.0f%%: the traced threads ran late (a busy host), or the records' clocks and the profiler's disagree",
			w/1e3, c.Rank, rc.ExcessUs/1e3, 100*off)
	}
}

// withholdForMissing names no rank when a targeted rank sent no trace:
// the rank the others waited for may be the one missing (a capture whose
// request reached two of four ranks too late named rank 1 while rank 3
// held every step back).
func (v *View) withholdForMissing() {
	if len(v.Missing) == 0 || (v.Culprit == nil && v.Records == nil) {
		return
	}
	var miss []string
	for _, m := range v.Missing {
		miss = append(miss, strconv.FormatInt(m.Rank, 10))
	}
	named := "no rank"
	if v.Culprit != nil {
		named = "rank " + strconv.FormatInt(v.Culprit.Rank, 10)
	}
	v.Verdict = fmt.Sprintf("not established: ranks %s sent no trace of the steps and the rank the others waited for may be among them (the traced ranks' arrivals name %s)",
		strings.Join(miss, ", "), named)
	v.Culprit = nil
}

// Missing is a targeted rank without figures.
type Missing struct {
	Rank int64  `json:"rank"`
	Why  string `json:"why"`
}

// minLeadNs is the least lead of the last arrival over the second-latest
// that counts as holding a collective back: below it, clocks aligned from
// collective ends cannot tell who was last.
const minLeadNs = 50_000

// Merge joins the ranks' results of one capture. Per step and process
// group, each rank's calls are matched with the group's lowest rank's in
// order (every rank of a group issues its collectives in the same order),
// by their ends on aligned clocks: a collective completes at about the
// same moment on every rank (the last arrival releases them all). Each
// trace's offset is the one that matches the most calls within matchTolNs,
// refined to the median difference of the matched ends, so traces with
// their own time origins and nodes with skewed clocks compare, and a call
// one trace lacks is left out without shifting the others.
func Merge(id, job string, results []Report) *View {
	m := newMerger(id, job, results)
	if len(m.ranks) == 0 {
		return m.v
	}
	m.sequences()
	for _, step := range m.v.Steps {
		gs := m.groupsOf(step)
		offset := m.align(step, gs)
		for _, g := range gs {
			m.match(step, g, offset)
		}
		for rk, spans := range m.waits {
			m.rank(rk).WaitUs += float64(BlockedNs(spans)) / 1e3
		}
		clear(m.waits)
		if step == m.v.Steps[0] {
			for rk, off := range offset {
				m.rank(rk).OffsetUs = float64(off) / 1e3
			}
		}
	}
	m.notes(results)
	m.attribute()
	v := m.v
	v.verdict(recordsCritical(m.byRank, m.ranks), m.unmatched, m.unaligned)
	for i := range v.Ranks {
		r := &v.Ranks[i]
		r.TransferUs = max(r.CommUs-r.WaitUs, 0)
	}
	v.trimCollectives()
	return v
}

// merger is one Merge: the ranks' traced steps, each rank's calls per
// step and process group, and what matching them found.
type merger struct {
	v      *View
	byRank map[int64][]Report
	ranks  []int64       // sorted
	idx    map[int64]int // rank → its place in v.Ranks
	seqs   map[seqKey][]call
	groups map[int64]map[string]bool // per step
	waits  map[int64][][2]int64      // a step's [arrival, last arrival] spans per rank

	unmatched int
	unaligned map[int64]bool
}

type seqKey struct {
	rank, step int64
	group      string
}

// newMerger takes the traced reports, and sums each rank's figures.
func newMerger(id, job string, results []Report) *merger {
	m := &merger{v: &View{ID: id, Job: job}, byRank: map[int64][]Report{}, idx: map[int64]int{},
		seqs: map[seqKey][]call{}, groups: map[int64]map[string]bool{}, waits: map[int64][][2]int64{}, unaligned: map[int64]bool{}}
	for _, r := range results {
		if r.State == StateTraced {
			m.byRank[r.Rank] = append(m.byRank[r.Rank], r)
		}
	}
	for r := range m.byRank {
		m.ranks = append(m.ranks, r)
	}
	slices.Sort(m.ranks)
	steps := map[int64]bool{}
	for _, rk := range m.ranks {
		rv := RankView{Rank: rk}
		for _, r := range m.byRank[rk] {
			rv.Node, rv.Device = r.Node, r.Device
			rv.Steps++
			steps[r.Step] = true
			f := r.Figures
			rv.DurationUs += f.DurationUs
			rv.ComputeUs += f.ComputeUs
			rv.CommUs += f.CommUs
			rv.ExposedCommUs += f.ExposedCommUs
			rv.IdleUs += f.IdleUs
		}
		rv.Record = meanRecord(m.byRank[rk])
		m.idx[rk] = len(m.v.Ranks)
		m.v.Ranks = append(m.v.Ranks, rv)
	}
	for s := range steps {
		m.v.Steps = append(m.v.Steps, s)
	}
	slices.Sort(m.v.Steps)
	return m
}

func (m *merger) rank(rk int64) *RankView { return &m.v.Ranks[m.idx[rk]] }

// sequences sorts each rank's calls per step and process group in issue
// order: every rank of a group issues its collectives in the same order
// (their ends may not be: DDP's buckets overlap).
func (m *merger) sequences() {
	for _, rk := range m.ranks {
		for _, r := range m.byRank[rk] {
			for _, c := range r.Calls {
				k := seqKey{rk, r.Step, c.Group}
				arrive := c.StartNs
				if c.IssueNs > 0 && c.IssueNs <= c.StartNs {
					arrive = c.IssueNs // the rank's own call, not gloo's thread starting
				}
				m.seqs[k] = append(m.seqs[k], call{c.Kind, arrive, c.EndNs})
				if m.groups[r.Step] == nil {
					m.groups[r.Step] = map[string]bool{}
				}
				m.groups[r.Step][c.Group] = true
			}
		}
	}
	for _, s := range m.seqs {
		slices.SortFunc(s, func(a, b call) int { return cmp.Or(cmp.Compare(a.start, b.start), cmp.Compare(a.end, b.end)) })
	}
}

func (m *merger) groupsOf(step int64) []string {
	var gs []string
	for g := range m.groups[step] {
		gs = append(gs, g)
	}
	slices.Sort(gs)
	return gs
}

// align is each rank's clock offset within the step (each rank's trace of
// a step may have its own time origin): against the lowest rank with
// calls, through another rank where the two share no process group. A
// rank that shares no call with an aligned one has none.
func (m *merger) align(step int64, gs []string) map[int64]int64 {
	offset := map[int64]int64{}
	for _, rk := range m.ranks {
		if m.hasCalls(rk, step, gs) {
			offset[rk] = 0
			break
		}
	}
	for changed := true; changed; {
		changed = false
		for _, rk := range m.ranks {
			if _, ok := offset[rk]; ok {
				continue
			}
			for _, o := range m.ranks {
				off, ok := offset[o]
				if !ok {
					continue
				}
				if d, n := bestOffset(m.shared(rk, o, step, gs)); n > 0 {
					offset[rk] = d + off
					changed = true
					break
				}
			}
		}
	}
	return offset
}

func (m *merger) hasCalls(rk, step int64, gs []string) bool {
	for _, g := range gs {
		if len(m.seqs[seqKey{rk, step, g}]) > 0 {
			return true
		}
	}
	return false
}

// shared is the call sequences of the groups both ranks have calls in.
func (m *merger) shared(rk, o, step int64, gs []string) (a, b [][]call) {
	for _, g := range gs {
		if x, y := m.seqs[seqKey{rk, step, g}], m.seqs[seqKey{o, step, g}]; len(x) > 0 && len(y) > 0 {
			a, b = append(a, x), append(b, y)
		}
	}
	return a, b
}

// arrival is a rank's arrival at a collective, on the reference clock.
type arrival struct {
	rank int64
	t    int64
	kind string
}

// match pairs each rank's calls of group g in step with the reference
// rank's (the group's lowest aligned one) and adds the collectives seen
// by at least two ranks.
func (m *merger) match(step int64, g string, offset map[int64]int64) {
	var ref int64 = -1
	for _, rk := range m.ranks {
		if _, ok := offset[rk]; ok && len(m.seqs[seqKey{rk, step, g}]) > 0 {
			ref = rk
			break
		}
	}
	if ref < 0 {
		return
	}
	base := m.seqs[seqKey{ref, step, g}]
	arrivals := make([][]arrival, len(base))
	for i, c := range base {
		arrivals[i] = []arrival{{ref, c.start - offset[ref], c.kind}}
	}
	for _, rk := range m.ranks {
		mine := m.seqs[seqKey{rk, step, g}]
		if rk == ref || len(mine) == 0 {
			continue
		}
		off, ok := offset[rk]
		if !ok {
			m.unaligned[rk] = true
			continue
		}
		pairs := pairCalls(mine, base, off-offset[ref])
		m.unmatched += len(mine) - len(pairs)
		for _, p := range pairs {
			arrivals[p[1]] = append(arrivals[p[1]], arrival{rk, mine[p[0]].start - off, mine[p[0]].kind})
		}
	}
	for i, as := range arrivals {
		if len(as) >= 2 { // one rank's call: nothing to compare
			m.collective(Collective{Step: step, Group: g, Seq: i, Kind: as[0].kind}, as)
		}
	}
}

// collective adds c, the arrivals as at it: who came last, by how much,
// and each rank's wait.
func (m *merger) collective(c Collective, as []arrival) {
	slices.SortFunc(as, func(a, b arrival) int { return cmp.Compare(a.rank, b.rank) })
	first, last, second := as[0].t, as[0], int64(-1<<63)
	for _, a := range as {
		first = min(first, a.t)
		if a.t > last.t {
			last = a
		}
	}
	for _, a := range as {
		if a.rank != last.rank {
			second = max(second, a.t)
		}
	}
	for _, a := range as {
		c.Ranks = append(c.Ranks, a.rank)
		c.ArrivalUs = append(c.ArrivalUs, float64(a.t-first)/1e3)
		m.waits[a.rank] = append(m.waits[a.rank], [2]int64{a.t, last.t})
	}
	c.Last, c.firstNs = last.rank, first
	c.SpreadUs = float64(last.t-first) / 1e3
	c.HeldBackUs = float64(last.t-second) / 1e3
	if last.t-second >= minLeadNs {
		rv := m.rank(last.rank)
		rv.LastArrivals++
		rv.HeldBackUs += c.HeldBackUs
	}
	m.v.Collectives = append(m.v.Collectives, c)
}

// notes says what the matching could not do.
func (m *merger) notes(results []Report) {
	v := m.v
	for _, rk := range m.ranks {
		if m.unaligned[rk] {
			v.Notes = append(v.Notes, fmt.Sprintf("rank %d shares no collective with the others in some step: its clock is not aligned there and it is left out of those arrivals", rk))
		}
	}
	if n := unnamedGroups(results); n > 0 {
		v.Notes = append(v.Notes, fmt.Sprintf("the traces count %d process groups and do not name the group of each call (PyTorch's CPU traces do not): calls of different groups are paired as one group's, so a wait in one group may be read against another's", n))
		v.GroupsUnnamed = n
	}
	if m.unmatched > 0 {
		v.Notes = append(v.Notes, fmt.Sprintf("%d calls matched no call of their group's first rank (a trace lacks some calls, or the ranks issued different collectives): left out", m.unmatched))
	}
}

// attribute names the culprit, the rank that held the collectives back
// the longest, and the others' wait for it: per other rank and step, its
// waits at those collectives, the spans of asynchronous ones overlapping
// (BlockedNs), summed over the steps, averaged over the others.
func (m *merger) attribute() {
	v := m.v
	var best *RankView
	for i := range v.Ranks {
		r := &v.Ranks[i]
		if r.HeldBackUs > 0 && (best == nil || r.HeldBackUs > best.HeldBackUs) {
			best = r
		}
	}
	if best == nil {
		return
	}
	cu := &Culprit{Rank: best.Rank, Node: best.Node, LastArrivals: best.LastArrivals, Collectives: len(v.Collectives), HeldBackUs: best.HeldBackUs}
	spans := map[[2]int64][][2]int64{} // (rank, step) -> spans, ns
	for _, c := range v.Collectives {
		if c.Last != best.Rank || c.HeldBackUs*1e3 < minLeadNs {
			continue
		}
		for i, rk := range c.Ranks {
			if rk != best.Rank {
				k := [2]int64{rk, c.Step}
				spans[k] = append(spans[k], [2]int64{c.firstNs + int64(c.ArrivalUs[i]*1e3), c.firstNs + int64(c.SpreadUs*1e3)})
			}
		}
	}
	var wait int64
	for _, sp := range spans {
		wait += BlockedNs(sp)
	}
	if len(spans) > 0 {
		cu.OthersWaitUs = float64(wait) / 1e3 / float64(len(v.Ranks)-1)
	}
	if m.unmatched > 0 {
		cu.WaitDoubt = fmt.Sprintf("%d calls lost in matching: the others' wait leaves theirs out", m.unmatched)
	} else if v.GroupsUnnamed > 0 {
		cu.WaitDoubt = fmt.Sprintf("%d process groups not told apart in the traces: the others' wait may count one group's calls against another's", v.GroupsUnnamed)
	}
	v.Culprit = cu
}

// trimCollectives keeps the MaxViewCollectives calls with the longest
// waits (the figures count them all).
func (v *View) trimCollectives() {
	n := len(v.Collectives)
	if n <= MaxViewCollectives {
		return
	}
	slices.SortStableFunc(v.Collectives, func(a, b Collective) int { return cmp.Compare(b.SpreadUs, a.SpreadUs) })
	v.Collectives = v.Collectives[:MaxViewCollectives]
	slices.SortStableFunc(v.Collectives, func(a, b Collective) int {
		return cmp.Or(cmp.Compare(a.Step, b.Step), cmp.Compare(a.Group, b.Group), cmp.Compare(a.Seq, b.Seq))
	})
	v.Notes = append(v.Notes, fmt.Sprintf("%d matched calls; the %d with the longest waits are listed (the figures count them all)", n, MaxViewCollectives))
}

type call struct {
	kind       string
	start, end int64
}

// matchTolNs is how far apart two ranks' ends of one collective may be on
// aligned clocks for matchCalls to pair them (the last arrival releases
// every rank within a transfer).
const matchTolNs = 2_000_000

// orderTolNs is how far apart two ranks' ends of one collective, paired by
// their place in the group's order, may be on aligned clocks: a rank's
// collective thread finishes its part late on a busy host (5-10 ms seen
// with four ranks on two cores), and calls of one kind follow each other
// closer than that, so pairing by end alone paired neighbours.
const orderTolNs = 50_000_000

// maxShift is how many calls at the start or end of a step one rank's
// trace may lack against another's for their calls to be paired by order.
const maxShift = 3

// orderPairs pairs a's calls with b's (both in issue order) by their
// place in the group's order: every rank of a group issues its
// collectives in the same order. Where both hold the same sequence (as
// many calls, the same kinds call by call), the i-th with the i-th. Where
// one trace lacks up to maxShift calls at either end (the profiler drops
// an operation still open when it stops), a[i] with b[i+k] for a shift k
// under which every overlapping call's kind agrees, over at least half
// the calls of each; of several such shifts (a run of one kind), the one
// whose paired ends agree best, if it is clearly the best (its spread
// under half the next one's). The pairs' ends must lie within orderTolNs
// of their median difference (a clock offset). same: the sequences were
// the same; nil: no such pairing.
func orderPairs(a, b []call) (ps [][2]int, same bool) {
	if len(a) == 0 || len(b) == 0 {
		return nil, false
	}
	type cand struct {
		ps     [][2]int
		spread int64
	}
	try := func(k int) *cand {
		var ps [][2]int
		for i := range a {
			j := i + k
			if j < 0 || j >= len(b) {
				continue
			}
			if a[i].kind != b[j].kind {
				return nil
			}
			ps = append(ps, [2]int{i, j})
		}
		if 2*len(ps) < max(len(a), len(b)) {
			return nil
		}
		ds := make([]int64, len(ps))
		for n, p := range ps {
			ds[n] = a[p[0]].end - b[p[1]].end
		}
		slices.Sort(ds)
		if med := ds[len(ds)/2]; ds[0]-med < -orderTolNs || ds[len(ds)-1]-med > orderTolNs {
			return nil
		}
		return &cand{ps, ds[len(ds)-1] - ds[0]}
	}
	if len(a) == len(b) {
		if c := try(0); c != nil {
			return c.ps, true
		}
	}
	var best, next *cand
	for k := -maxShift; k <= maxShift; k++ {
		c := try(k)
		switch {
		case c == nil:
		case best == nil || c.spread < best.spread:
			best, next = c, best
		case next == nil || c.spread < next.spread:
			next = c
		}
	}
	if best == nil || (next != nil && 2*best.spread >= next.spread) {
		return nil, false
	}
	return best.ps, false
}

// pairCalls pairs a's calls with b's (both in issue order; off is a's
// clock less b's): the same sequence by place (orderPairs), each within
// orderTolNs on aligned clocks; else by their ends (matchCalls), leaving
// out what one trace lacks, unless a shifted pairing by place (calls lost
// at an end) pairs more. A call lost in the middle looks like one lost at
// an end to kinds alone; its ends tell them apart where they pair as many.
// Before, every pair went by ends within 2 ms: under FSDP2 on a loaded
// host 6-16 of 36 calls a step found no counterpart, and a wait read
// 6.7 ms against 120.
func pairCalls(a, b []call, off int64) [][2]int {
	ps, same := orderPairs(a, b)
	for _, p := range ps {
		if d := a[p[0]].end - off - b[p[1]].end; d > orderTolNs || d < -orderTolNs {
			ps, same = nil, false
			break
		}
	}
	if same {
		return ps
	}
	if m := matchCalls(a, b, off); len(m) >= len(ps) {
		return m
	}
	return ps
}

// endOrder is the order of s's calls by their ends.
func endOrder(s []call) []int {
	o := make([]int, len(s))
	for i := range o {
		o[i] = i
	}
	slices.SortStableFunc(o, func(x, y int) int { return cmp.Compare(s[x].end, s[y].end) })
	return o
}

// matchCalls pairs a's calls with b's by their ends: in end order, where
// a call's end less off falls within matchTolNs of the other's and their
// kinds agree; a call with no counterpart (a trace lost it) is skipped.
// The pairs are indices into a and b.
func matchCalls(a, b []call, off int64) [][2]int {
	return matchOrdered(a, b, endOrder(a), endOrder(b), off)
}

func matchOrdered(a, b []call, ia, ib []int, off int64) [][2]int {
	var out [][2]int
	for i, j := 0, 0; i < len(ia) && j < len(ib); {
		x, y := a[ia[i]], b[ib[j]]
		d := x.end - off - y.end
		switch {
		case d >= -matchTolNs && d <= matchTolNs && x.kind == y.kind:
			out = append(out, [2]int{ia[i], ib[j]})
			i++
			j++
		case d < 0:
			i++
		default:
			j++
		}
	}
	return out
}

// bestOffset estimates the clock offset of a's rank from b's (per group,
// the two ranks' calls, in issue order). Where groups' calls pair by
// their place in the same sequence (orderPairs), the median difference
// of the paired ends, if every pair then falls within orderTolNs. Else among
// the offsets that align one of the first calls of a with one of b's, the
// one that matches the most calls by their ends, refined to the median of
// the matched pairs' differences. n is how many calls agree with it.
func bestOffset(a, b [][]call) (int64, int) {
	var ds []int64
	for g := range a {
		if ps, same := orderPairs(a[g], b[g]); same {
			for _, p := range ps {
				ds = append(ds, a[g][p[0]].end-b[g][p[1]].end)
			}
		}
	}
	if len(ds) > 0 {
		slices.Sort(ds)
		if med := ds[len(ds)/2]; ds[0]-med >= -orderTolNs && ds[len(ds)-1]-med <= orderTolNs {
			return med, len(ds)
		}
		ds = ds[:0]
	}
	const k = 32
	ia, ib := make([][]int, len(a)), make([][]int, len(b))
	for g := range a {
		ia[g], ib[g] = endOrder(a[g]), endOrder(b[g])
	}
	bestN, bestRes := 0, int64(0)
	var best int64
	for g := range a {
		for i := 0; i < min(len(a[g]), k); i++ {
			for j := 0; j < min(len(b[g]), k); j++ {
				if a[g][i].kind != b[g][j].kind {
					continue
				}
				d := a[g][i].end - b[g][j].end
				n, res := 0, int64(0)
				for h := range a {
					for _, p := range matchOrdered(a[h], b[h], ia[h], ib[h], d) {
						n++
						x := a[h][p[0]].end - d - b[h][p[1]].end
						res += max(x, -x)
					}
				}
				if n > bestN || (n == bestN && res < bestRes) {
					bestN, bestRes, best = n, res, d
				}
			}
		}
	}
	if bestN == 0 {
		return 0, 0
	}
	for h := range a {
		for _, p := range matchOrdered(a[h], b[h], ia[h], ib[h], best) {
			ds = append(ds, a[h][p[0]].end-b[h][p[1]].end)
		}
	}
	slices.Sort(ds)
	return ds[len(ds)/2], bestN
}

// unnamedGroups is how many process groups the traces say the job has,
// where that is more than one and no call names its group (0 otherwise).
func unnamedGroups(results []Report) int {
	n := 0
	for _, r := range results {
		if r.State != StateTraced {
			continue
		}
		for _, c := range r.Calls {
			if c.Group != "" {
				return 0
			}
		}
		n = max(n, r.ProcessGroups)
	}
	if n < 2 {
		return 0
	}
	return n
}
