package kineto

import (
	"cmp"
	"slices"
	"sort"
)

// result reads the spilled records back (they are in file order) and
// computes the figures holding few of them at once: each record is
// buffered in its step (the step it was launched in) and in its window of
// time between step boundaries, and a buffer is reduced and dropped as soon
// as it holds every record counted for it in a first pass. Kineto writes a
// trace's GPU activities in about time order, so one step's records (and
// one window's) are held at a time. Per step, the unions are over the
// step's records; over the whole trace they are summed window by window,
// each record clipped to the windows it crosses: the union of a set of
// intervals is the sum of its parts in disjoint windows, so the totals are
// exact.
func (a *analyzer) result() (*Result, error) {
	sort.Slice(a.steps, func(i, j int) bool { return a.steps[i].start < a.steps[j].start })
	p, err := a.newPasses()
	if err != nil {
		return nil, err
	}
	if err := a.sp.each(p.count); err != nil {
		return nil, err
	}
	p.stepBuf = make([][]gpuEvent, len(a.steps))
	p.winBuf = make([][]gpuEvent, len(p.bounds)+1)
	p.r.Steps = make([]StepStats, len(a.steps))
	if err := a.sp.each(p.reduce); err != nil {
		return nil, err
	}
	return p.finish(), nil
}

// passes are result's two passes over the spilled records: the first
// counts each step's and window's records, the second buffers and reduces
// them.
type passes struct {
	a        *analyzer
	r        Result
	cpu      bool
	want     uint8
	own      *owners
	byLaunch bool
	bounds   []int64 // the distinct step boundaries
	stepN    []int   // records of each step
	winN     []int   // records of each window
	stepBuf  [][]gpuEvent
	winBuf   [][]gpuEvent
	held     int
	t        totals
}

func (a *analyzer) newPasses() (*passes, error) {
	p := &passes{a: a, r: a.res, cpu: a.gpu == 0, want: kindGPU}
	r := &p.r
	r.Events = a.events
	r.GPUEvents = a.gpu
	r.Device = "gpu"
	if p.cpu {
		p.want = kindCPU
		r.Device = "cpu"
		r.Notes = append(r.Notes, "no GPU events: CPU-side figures (communication = gloo collectives on their threads, computation = aten operators)")
	}
	if r.Rank == nil {
		r.Notes = append(r.Notes, "no distributedInfo: rank and world size unknown")
	}
	var err error
	if p.own, err = a.launchOwners(); err != nil {
		return nil, err
	}
	p.byLaunch = a.launches > 0
	// Windows: between consecutive distinct step boundaries, plus before
	// the first and after the last.
	for _, st := range a.steps {
		p.bounds = append(p.bounds, st.start, st.end)
	}
	slices.Sort(p.bounds)
	p.bounds = slices.Compact(p.bounds)
	p.stepN = make([]int, len(a.steps))
	p.winN = make([]int, len(p.bounds)+1)
	p.t = totals{lastStep: int32(len(a.steps) - 1), first: 1<<63 - 1, last: -1 << 63, coll: map[collKey]*collAcc{}}
	return p, nil
}

// takes is whether the figures take e. A GPU trace takes its kernels, and
// the gloo operations of its CPU threads: collectives gloo runs on CUDA
// tensors launch no kernel, and read 0 communication before (2 ranks
// sharing an H200, DDP over gloo).
func (p *passes) takes(e gpuEvent) bool {
	return e.kind == p.want || p.want == kindGPU && e.kind == kindCPU && e.cls == comm
}

// stepOf is the step e belongs to: the step whose span holds its launch
// (the runtime call with its correlation id); in a trace without runtime
// calls, the step its start falls in. A kernel whose launch is not in the
// trace was launched before it began (as HTA, it belongs to no step).
func (p *passes) stepOf(e gpuEvent) int32 {
	if p.byLaunch && e.corr >= 0 {
		return p.own.lookup(e.corr)
	}
	return int32(p.a.stepAt(e.start))
}

func (p *passes) window(t int64) int {
	return sort.Search(len(p.bounds), func(i int) bool { return p.bounds[i] > t })
}

// clip is s within window w.
func (p *passes) clip(s span, w int) span {
	if w > 0 {
		s.start = max(s.start, p.bounds[w-1])
	}
	if w < len(p.bounds) {
		s.end = min(s.end, p.bounds[w])
	}
	return s
}

// count is the first pass.
func (p *passes) count(e gpuEvent) {
	if !p.takes(e) {
		return
	}
	if i := p.stepOf(e); i >= 0 {
		p.stepN[i]++
	}
	if e.end > e.start {
		for w := p.window(e.start); w <= p.window(e.end-1); w++ {
			p.winN[w]++
		}
	}
}

// reduce is the second pass: a step's (and a window's) records are
// reduced once it holds all of them.
func (p *passes) reduce(e gpuEvent) {
	if !p.takes(e) {
		return
	}
	a := p.a
	e.step = p.stepOf(e)
	if e.cls == comm {
		p.t.collective(e)
		p.call(e)
	}
	if i := e.step; i >= 0 {
		p.stepBuf[i] = append(p.stepBuf[i], e)
		p.held++
		if len(p.stepBuf[i]) == p.stepN[i] {
			p.r.Steps[i] = stats(p.stepBuf[i], a.steps[i].span, p.cpu)
			p.held -= len(p.stepBuf[i])
			p.stepBuf[i] = nil
		}
	}
	if e.end > e.start {
		for w := p.window(e.start); w <= p.window(e.end-1); w++ {
			c := e
			c.span = p.clip(e.span, w)
			p.winBuf[w] = append(p.winBuf[w], c)
			p.held++
			if len(p.winBuf[w]) == p.winN[w] {
				p.t.add(p.winBuf[w])
				p.held -= len(p.winBuf[w])
				p.winBuf[w] = nil
			}
		}
	}
	a.maxHeld = max(a.maxHeld, p.held)
}

// call keeps a collective call: every call, also outside steps, for
// pairIssues; those outside (step -1) are dropped after.
func (p *passes) call(e gpuEvent) {
	a, r := p.a, &p.r
	if !a.opt.Calls {
		return
	}
	if len(r.Calls) < 2*MaxCalls {
		step := int64(-1)
		if e.step >= 0 {
			step = a.steps[e.step].n
		}
		r.Calls = append(r.Calls, Call{Step: step, Group: a.groupOf[e.group], Kind: collKinds[e.coll],
			StartNs: e.start, EndNs: e.end, Bytes: e.bytes})
	} else if e.step >= 0 {
		r.CallsDropped++
	}
}

// finish completes the steps without records, the totals and the calls.
func (p *passes) finish() *Result {
	a, r, t := p.a, &p.r, &p.t
	for i, st := range a.steps {
		if p.stepN[i] == 0 {
			r.Steps[i] = stats(nil, st.span, p.cpu)
		}
		r.Steps[i].Step = st.n
	}
	if !p.cpu {
		gpuWindows(r.Steps, a.steps)
	}
	r.Total = t.stats()
	r.CommOverlapPct = r.Total.OverlapPct
	if len(a.steps) > 0 && t.htaComm > 0 {
		x := 100 * float64(t.htaOver) / float64(t.htaComm)
		r.HTAOverlapPct = &x
	}
	r.Collectives = t.collectives(a.groupOf)
	p.finishCalls()
	if len(r.Steps) == 0 {
		r.Notes = append(r.Notes, "no ProfilerStep#N annotations: totals only")
	}
	return r
}

// finishCalls sorts the calls, pairs their issues (CPU traces), drops
// those outside steps and bounds them.
func (p *passes) finishCalls() {
	r := &p.r
	sort.SliceStable(r.Calls, func(i, j int) bool { return r.Calls[i].StartNs < r.Calls[j].StartNs })
	if p.cpu {
		p.a.pairIssues(r.Calls)
	}
	r.Calls = slices.DeleteFunc(r.Calls, func(c Call) bool { return c.Step < 0 })
	if len(r.Calls) > MaxCalls {
		r.CallsDropped += int64(len(r.Calls) - MaxCalls)
		r.Calls = r.Calls[:MaxCalls]
	}
	if len(r.Calls) == 0 {
		r.Calls = nil
	}
}

// pairIssues sets each gloo call's issue time: per kind, the k-th c10d
// operator of the trace issued the k-th operation gloo ran (a process
// group runs its operations in the order they were issued), when that
// operator started before it; a trace that lost an operation at its end
// (the profiler stopped first) pairs the earlier ones all the same.
//
// gloo runs a reduce-scatter of one tensor (c10d's _reduce_scatter_base_,
// FSDP2's gradient reduction) as an all-reduce: in a trace with no gloo
// reduce-scatter, c10d's reduce-scatters issue its all-reduces (before,
// FSDP2's reductions on gloo had no issue time, and their arrivals were
// gloo's thread starting, late on a busy host).
func (a *analyzer) pairIssues(calls []Call) {
	sort.SliceStable(a.issues, func(i, j int) bool { return a.issues[i].at < a.issues[j].at })
	glooRS := slices.ContainsFunc(calls, func(c Call) bool { return c.Kind == "reduce_scatter" })
	byKind := map[string][]int64{}
	for _, is := range a.issues {
		k := collKinds[is.kind]
		if k == "reduce_scatter" && !glooRS {
			k = "all_reduce"
		}
		byKind[k] = append(byKind[k], is.at)
	}
	next := map[string]int{}
	for i := range calls {
		c := &calls[i]
		q := byKind[c.Kind]
		k := next[c.Kind]
		if k >= len(q) {
			continue
		}
		next[c.Kind] = k + 1
		if q[k] <= c.StartNs {
			c.IssueNs = q[k]
		}
	}
}

// totals sums the whole trace's figures window by window.
type totals struct {
	compute, comm, memory, over, busy int64
	first, last                       int64 // the GPU's first start and last end
	lastStep                          int32
	htaComm, htaOver                  int64 // over the events of every step but the last
	coll                              map[collKey]*collAcc
}

type collKey struct {
	coll  uint8
	group uint16
}

type collAcc struct {
	CollectiveStats
	union int64
}

func (t *totals) collective(e gpuEvent) {
	k := collKey{e.coll, e.group}
	c := t.coll[k]
	if c == nil {
		c = &collAcc{}
		t.coll[k] = c
	}
	c.Count++
	c.TimeUs += us(e.end - e.start)
	c.Bytes += e.bytes
}

// add takes one window's records (clipped to it).
func (t *totals) add(evs []gpuEvent) {
	var cs, ms, ks, hc, hm []span
	byColl := map[collKey][]span{}
	for _, e := range evs {
		inHTA := e.step >= 0 && e.step < t.lastStep
		switch e.cls {
		case compute:
			cs = append(cs, e.span)
			if inHTA {
				hc = append(hc, e.span)
			}
		case comm:
			ms = append(ms, e.span)
			if inHTA {
				hm = append(hm, e.span)
			}
			k := collKey{e.coll, e.group}
			byColl[k] = append(byColl[k], e.span)
		case memory:
			ks = append(ks, e.span)
		}
	}
	cu, mu, ku := union(cs), union(ms), union(ks)
	all := union(append(append(slices.Clone(cu), mu...), ku...))
	t.compute += total(cu)
	t.comm += total(mu)
	t.memory += total(ku)
	t.over += intersect(mu, cu)
	t.busy += total(all)
	if len(all) > 0 {
		t.first = min(t.first, all[0].start)
		t.last = max(t.last, all[len(all)-1].end)
	}
	hmu := union(hm)
	t.htaComm += total(hmu)
	t.htaOver += intersect(hmu, union(hc))
	for k, s := range byColl {
		t.coll[k].union += total(union(s))
	}
}

func (t *totals) stats() StepStats {
	st := StepStats{Step: -1, ComputeUs: us(t.compute), CommUs: us(t.comm), MemoryUs: us(t.memory),
		ExposedCommUs: us(t.comm - t.over)}
	if t.comm > 0 {
		p := 100 * float64(t.over) / float64(t.comm)
		st.OverlapPct = &p
	}
	if t.last > t.first {
		st.DurationUs = us(t.last - t.first)
		st.IdleUs = us(t.last - t.first - t.busy)
	}
	return st
}

func (t *totals) collectives(groupOf []string) []CollectiveStats {
	out := make([]CollectiveStats, 0, len(t.coll))
	for k, c := range t.coll {
		s := c.CollectiveStats
		s.Kind = collKinds[min(int(k.coll), len(collKinds)-1)]
		if s.Kind == "" {
			s.Kind = "other"
		}
		if int(k.group) < len(groupOf) {
			s.Group = groupOf[k.group]
		}
		s.UnionUs = us(c.union)
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].TimeUs != out[j].TimeUs {
			return out[i].TimeUs > out[j].TimeUs
		}
		return out[i].Kind+out[i].Group < out[j].Kind+out[j].Group
	})
	return out
}

// owners maps a correlation id to the step its launch fell in: runs of
// consecutive ids launched in one step (ids grow with launch time, so a
// trace has about one run per step and per gap between steps), or, when
// runs of different steps interleave, an exact map.
type owners struct {
	runs  []corrRun
	exact map[int64]int32
}

type corrRun struct {
	lo, hi int64
	step   int32
}

func (o *owners) lookup(c int64) int32 {
	if o.exact != nil {
		if s, ok := o.exact[c]; ok {
			return s
		}
		return -1
	}
	i := sort.Search(len(o.runs), func(i int) bool { return o.runs[i].lo > c }) - 1
	if i >= 0 && c <= o.runs[i].hi {
		return o.runs[i].step
	}
	return -1
}

// compact sorts the runs and merges those that overlap; false when two
// runs of different steps overlap.
func (o *owners) compact() bool {
	slices.SortFunc(o.runs, func(x, y corrRun) int { return cmp.Compare(x.lo, y.lo) })
	out := o.runs[:0]
	for _, r := range o.runs {
		if n := len(out); n > 0 && r.lo <= out[n-1].hi {
			if r.step != out[n-1].step {
				return false
			}
			out[n-1].hi = max(out[n-1].hi, r.hi)
			continue
		}
		out = append(out, r)
	}
	o.runs = out
	return true
}

func (a *analyzer) launchOwners() (*owners, error) {
	o := &owners{}
	if a.launches == 0 {
		return o, nil
	}
	ok, limit := true, 1024
	err := a.sp.each(func(e gpuEvent) {
		if e.kind != kindLaunch || !ok {
			return
		}
		st := int32(a.stepAt(e.start))
		if n := len(o.runs); n > 0 && o.runs[n-1].step == st && e.corr > o.runs[n-1].hi {
			o.runs[n-1].hi = e.corr
			return
		}
		o.runs = append(o.runs, corrRun{e.corr, e.corr, st})
		if len(o.runs) > limit {
			ok = o.compact()
			limit = 2*len(o.runs) + 1024
		}
	})
	if err == nil && ok {
		ok = o.compact()
	}
	if err != nil || ok {
		return o, err
	}
	o.runs, o.exact = nil, map[int64]int32{}
	err = a.sp.each(func(e gpuEvent) {
		if e.kind == kindLaunch {
			o.exact[e.corr] = int32(a.stepAt(e.start))
		}
	})
	return o, err
}

// gpuWindows sets each GPU step's duration to its GPU timeline (see
// StepStats): from the later of the previous step's last kernel's end
// and its own recorded start, but never after its first kernel (the
// trace's first step with kernels: from its first kernel), to its last
// kernel's end; idle is what its kernels leave of it. Steps are in the
// order of their recorded starts.
func gpuWindows(out []StepStats, steps []stepSpan) {
	var prevLast int64 = -1 << 63
	for i := range out {
		st := &out[i]
		if st.gpuLast <= st.gpuFirst {
			continue // no kernel: the recorded span
		}
		start := st.gpuFirst // the first step: its own kernels (the GPU may still run earlier work)
		if prevLast > -1<<63 {
			start = min(st.gpuFirst, max(prevLast, steps[i].start))
		}
		st.DurationUs = us(st.gpuLast - start)
		st.IdleUs = us(st.gpuLast - start - st.busy)
		prevLast = st.gpuLast
	}
}
