// Package kineto analyses torch.profiler traces (Kineto's Chrome trace JSON,
// plain or gzipped, and the legacy profiler's bare event array): per
// ProfilerStep#N and over the whole trace, computation, communication and
// memory time as unions of their kernel intervals on every stream, the
// communication no computation kernel overlaps (exposed), the overlap
// percentage and GPU idle time, and the collectives by kind.
//
// It owns the trace's reading and its figures. It never writes: a trace
// is read once, streamed, within bounds on its bytes and events.
//
// Kernels are classified by name as Holistic Trace Analysis does, so the
// figures compare: communication = NCCL/RCCL/HCCL kernels (a name starting
// with "nccl", "rccl" or "hccl", or containing "ncclKernel"/"ncclDevKernel",
// which covers every NCCL naming generation), memory = memcpy and memset
// (their categories, or names starting with Memcpy/Memset), computation =
// every other kernel. The overlap percentage is HTA's
// comp_comm_overlap_ratio: |comm ∩ compute| / |comm|.
//
// Traces without GPU events (CPU training, gloo) give CPU-side figures:
// communication = the gloo collectives' spans on gloo's threads,
// computation = the aten operators'; Result.Device says "cpu".
//
// The file is streamed one event at a time; each GPU event and launch
// becomes a 40-byte record, kept in memory up to 4 MiB and then in an
// unlinked temporary file, and the figures are reduced one step at a time
// (docs/kineto.md says how), so memory is bounded by one step's kernels.
package kineto

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
)

// Result is the analysis of one trace.
type Result struct {
	File      string `json:"file,omitempty"`
	Rank      *int64 `json:"rank"`       // null when the trace does not say
	WorldSize *int64 `json:"world_size"` // null when the trace does not say
	// ProcessGroups is how many process groups the job had made when the
	// trace was taken (distributedInfo's pg_count; 0: not said).
	ProcessGroups int    `json:"process_groups,omitempty"`
	Backend       string `json:"backend,omitempty"`
	// Device is "gpu" when the trace has GPU events, else "cpu" (CPU-side
	// figures: see the package documentation).
	Device string      `json:"device"`
	Steps  []StepStats `json:"steps"`
	// Total is over every GPU event of the trace (every CPU operator for a
	// CPU trace), steps or not.
	Total          StepStats `json:"total"`
	CommOverlapPct *float64  `json:"comm_overlap_pct"` // null without communication
	// HTAOverlapPct is the overlap over the events launched in every
	// ProfilerStep but the last: the window Holistic Trace Analysis uses by
	// default (it drops the last, often incomplete, step and what was
	// launched outside steps), for comparison.
	HTAOverlapPct *float64          `json:"hta_overlap_pct"`
	Collectives   []CollectiveStats `json:"collectives"`
	Events        int64             `json:"events"`
	GPUEvents     int64             `json:"gpu_events"`
	// Calls are the trace's collective calls one by one, in start order,
	// when Options.Calls asks for them (at most MaxCalls; CallsDropped
	// counts the rest).
	Calls        []Call   `json:"calls,omitempty"`
	CallsDropped int64    `json:"calls_dropped,omitempty"`
	Notes        []string `json:"notes,omitempty"`
}

// StepStats are the figures of one ProfilerStep (or of the whole trace), in
// microseconds; the figures but the duration are unions over the step's
// kernels (those launched during it). DurationUs is, on a GPU, the step's
// GPU timeline: from the previous step's last kernel's end (or the step's
// own start, whichever is later, and never after its first kernel; the
// trace's first such step from its first kernel) to its last kernel's end, so compute never exceeds it (its kernels run after the
// CPU-side ProfilerStep span that launched them: a single-GPU NCCL capture
// read compute 254 ms in a 214 ms span); a step with no kernel, and a CPU
// trace, keep the span the profiler recorded; Total is the whole GPU span.
type StepStats struct {
	Step          int64    `json:"step"`
	DurationUs    float64  `json:"duration_us"`
	ComputeUs     float64  `json:"compute_us"`
	CommUs        float64  `json:"comm_us"`
	ExposedCommUs float64  `json:"exposed_comm_us"`
	MemoryUs      float64  `json:"memory_us"`
	IdleUs        float64  `json:"idle_us"`
	OverlapPct    *float64 `json:"overlap_pct"` // null without communication

	busy, gpuFirst, gpuLast int64 // ns: the kernels' union and extent (GPU steps)
}

// CollectiveStats sums one kind of collective.
type CollectiveStats struct {
	Kind  string `json:"kind"` // all_reduce, reduce_scatter, all_gather, send_recv, all_to_all, broadcast, reduce, other
	Group string `json:"process_group,omitempty"`
	Count int64  `json:"count"`
	// TimeUs sums the kernels' durations; UnionUs is the time at least one
	// of them ran.
	TimeUs  float64 `json:"time_us"`
	UnionUs float64 `json:"union_us"`
	// Bytes sums the message sizes where the trace records them (input
	// elements × element size); 0 when it does not.
	Bytes int64 `json:"bytes"`
}

type class uint8

const (
	compute class = iota
	comm
	memory
	other
)

type span struct{ start, end int64 }

// maxTraceNs bounds event timestamps and durations (see Analyze's event
// check).
const maxTraceNs = int64(1) << 61

type gpuEvent struct {
	span
	corr  int64
	bytes int64
	step  int32 // the step it was launched in, -1 for none (set on reading back)
	group uint16
	cls   class
	coll  uint8
	kind  uint8
}

type stepSpan struct {
	n int64
	span
}

// Call is one collective call of a trace: on a GPU its communication
// kernel, on a CPU (gloo) its span on gloo's thread; from the rank's
// arrival (the kernel or the gloo operation starting) to its completion,
// in the trace's own clock (nanoseconds). Calls of one process group are
// issued in the same order on every rank, so the k-th call of a group in a
// step is the same collective on every rank of the group.
type Call struct {
	Step    int64  `json:"step"`
	Group   string `json:"process_group,omitempty"`
	Kind    string `json:"kind"`
	StartNs int64  `json:"start_ns"`
	EndNs   int64  `json:"end_ns"`
	Bytes   int64  `json:"bytes,omitempty"`
	// IssueNs is when the rank's own thread called the collective (its
	// c10d operator), in a CPU trace; 0 when unknown. gloo's worker thread
	// starts the operation later, by a scheduling delay that an
	// oversubscribed host stretches to tens of milliseconds.
	IssueNs int64 `json:"issue_ns,omitempty"`
}

// MaxCalls bounds Result.Calls.
const MaxCalls = 100_000

// Collective kinds, by index.
var collKinds = []string{"", "all_reduce", "reduce_scatter", "all_gather", "send_recv", "all_to_all", "broadcast", "reduce", "other"}

// Options change how a trace is read.
type Options struct {
	// HTARounding shrinks every event to whole microseconds as Holistic
	// Trace Analysis does with nanosecond-resolution traces (start rounded
	// up, end rounded down; see pytorch/pytorch#122425), so that its
	// figures are reproduced exactly. Off, the trace's own precision is
	// kept.
	HTARounding bool
	// SpillDir is where the compact records of a large trace wait between
	// passes (an unlinked temporary file; default os.TempDir()).
	SpillDir string
	// MaxBytes and MaxEvents bound what one analysis reads: the trace's
	// bytes once decompressed (a small gzip can hold gigabytes) and its
	// events (the records of the densest step are held at once, about
	// 200 B each). 0: no bound. Past either the analysis stops with an
	// error.
	MaxBytes  int64
	MaxEvents int64
	// Stop, once closed, ends the analysis at its next read of the
	// trace's (decompressed) bytes with ErrStopped: a gzip of a few MB can
	// take tens of seconds to read, and a process told to stop must not
	// wait for it.
	Stop <-chan struct{}
	// Calls lists each collective call of the steps (Result.Calls).
	Calls bool
}

// AnalyzeFile analyses a trace file; gzip is recognised by its magic bytes,
// whatever the name.
func AnalyzeFile(path string) (*Result, error) { return AnalyzeFileWith(path, Options{}) }

// AnalyzeFileWith is AnalyzeFile with options.
func AnalyzeFileWith(path string, opt Options) (*Result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	res, err := AnalyzeWith(f, opt)
	if err != nil {
		return nil, fmt.Errorf("%s: %s", path, strings.TrimPrefix(err.Error(), "kineto: "))
	}
	res.File = path
	return res, nil
}

// Analyze reads one trace.
func Analyze(r io.Reader) (*Result, error) { return AnalyzeWith(r, Options{}) }

// AnalyzeWith reads one trace with options.
func AnalyzeWith(r io.Reader, opt Options) (*Result, error) {
	res, _, err := analyze(r, opt)
	return res, err
}

// analyze also says how many records the analysis held in its buffers at
// most (the spill's in-memory part aside).
func analyze(r io.Reader, opt Options) (*Result, int, error) {
	br := bufio.NewReaderSize(r, 1<<20)
	var src io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return nil, 0, fmt.Errorf("kineto: gzip: %w", err)
		}
		defer gz.Close()
		src = gz
	}
	// The bounds apply to the decompressed bytes.
	if opt.MaxBytes > 0 {
		src = &boundedReader{r: src, left: opt.MaxBytes, limit: opt.MaxBytes}
	}
	if opt.Stop != nil {
		src = stopReader{src, opt.Stop}
	}
	if src != io.Reader(br) {
		br = bufio.NewReaderSize(src, 1<<20)
	}
	a := analyzer{groups: map[string]uint16{}, groupOf: []string{""}, opt: opt, sp: spill{dir: opt.SpillDir}}
	defer a.sp.close()
	s := scanner{r: br, buf: make([]byte, 0, 4096)}
	err := s.trace(a.event, a.info)
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, 0, fmt.Errorf("kineto: the trace is truncated (at byte %d)", s.off)
		}
		return nil, 0, err
	}
	res, err := a.result()
	return res, a.maxHeld, err
}

type issue struct {
	at   int64
	kind uint8
}

type analyzer struct {
	issues   []issue // c10d operators' starts (Options.Calls)
	res      Result
	steps    []stepSpan
	sp       spill // GPU events, launches and CPU-trace operators, in file order
	gpu      int64 // GPU events in sp
	launches int64 // launches in sp
	maxHeld  int   // records buffered at once in result, at most
	groups   map[string]uint16
	groupOf  []string
	events   int64
	ev       rawEvent
	opt      Options
}

type rawEvent struct {
	ph, cat, name          []byte
	ts, dur                int64
	hasTs                  bool
	corr                   int64
	stream                 bool
	collName, dtype, group []byte
	nelems                 int64
}

func (a *analyzer) info(b []byte) error {
	var di struct {
		Backend   string            `json:"backend"`
		Rank      *int64            `json:"rank"`
		WorldSize *int64            `json:"world_size"`
		PGCount   int               `json:"pg_count"`
		PGConfig  []json.RawMessage `json:"pg_config"`
	}
	if err := json.Unmarshal(b, &di); err != nil {
		return fmt.Errorf("kineto: distributedInfo: %w", err)
	}
	a.res.Backend, a.res.Rank, a.res.WorldSize = di.Backend, di.Rank, di.WorldSize
	a.res.ProcessGroups = max(di.PGCount, len(di.PGConfig), 0)
	return nil
}

// ErrStopped ends an analysis whose Options.Stop was closed.
var ErrStopped = errors.New("kineto: analysis stopped")

// stopReader reads r until stop is closed.
type stopReader struct {
	r    io.Reader
	stop <-chan struct{}
}

func (s stopReader) Read(p []byte) (int, error) {
	select {
	case <-s.stop:
		return 0, ErrStopped
	default:
		return s.r.Read(p)
	}
}

// boundedReader fails once more than limit bytes were read.
type boundedReader struct {
	r           io.Reader
	left, limit int64
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, fmt.Errorf("kineto: the trace is larger than %d bytes (uncompressed): not analysed", b.limit)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

func (a *analyzer) event(b []byte) error {
	a.events++
	if a.opt.MaxEvents > 0 && a.events > a.opt.MaxEvents {
		return fmt.Errorf("kineto: the trace has more than %d events: not analysed", a.opt.MaxEvents)
	}
	e := &a.ev
	*e = rawEvent{corr: -1}
	if err := fields(b, e.field); err != nil {
		return fmt.Errorf("%w (event %d)", err, a.events)
	}
	if !e.hasTs || (len(e.ph) > 0 && string(e.ph) != "X") {
		return nil // metadata, instants, flows
	}
	if e.dur < 0 {
		return fmt.Errorf("kineto: event %d (%s) has a negative duration", a.events, e.name)
	}
	// Bounded so that no span or difference of spans overflows int64 (at
	// the limits a step's duration came out negative): ±2^61 ns is ±73
	// years around the trace's time origin.
	if e.ts > maxTraceNs || e.ts < -maxTraceNs || e.dur > maxTraceNs-max(e.ts, 0) {
		return fmt.Errorf("kineto: event %d (%s): timestamp or duration out of range (beyond ±2^61 ns)", a.events, e.name)
	}
	sp := span{e.ts, e.ts + e.dur}
	if a.opt.HTARounding {
		sp = span{ceilMicro(sp.start), floorMicro(sp.end)}
		sp.end = max(sp.end, sp.start)
	}
	return a.take(e, sp)
}

// field takes one of an event's fields.
func (e *rawEvent) field(k, v []byte) error {
	switch string(k) {
	case "ph":
		e.ph = unquote(v)
	case "cat":
		e.cat = unquote(v)
	case "name":
		e.name = unquote(v)
	case "ts":
		e.ts, e.hasTs = microsToNs(v)
	case "dur":
		e.dur, _ = microsToNs(v)
	case "args":
		if len(v) > 0 && v[0] == '{' {
			return fields(v, e.arg)
		}
	}
	return nil
}

// arg takes one of an event's args.
func (e *rawEvent) arg(k, v []byte) error {
	switch string(k) {
	case "correlation":
		e.corr, _ = atoi(v)
	case "stream":
		e.stream = true
	case "Collective name":
		e.collName = unquote(v)
	case "In msg nelems", "In msg size":
		e.nelems, _ = atoi(v)
	case "dtype":
		e.dtype = unquote(v)
	case "Process Group Name":
		e.group = unquote(v)
	}
	return nil
}

func isDeviceCat(cat string) bool {
	switch cat {
	case "kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset":
		return true
	}
	return false
}

func isRuntimeCat(cat string) bool {
	switch cat {
	case "cuda_runtime", "cuda_driver", "Runtime", "Driver":
		return true
	}
	return false
}

// isCPUOp is whether cat is a CPU operator's (or none, as older traces).
func isCPUOp(cat string) bool { return cat == "cpu_op" || cat == "" }

// take keeps what the analysis uses of a complete event over sp.
func (a *analyzer) take(e *rawEvent, sp span) error {
	cat := string(e.cat)
	switch {
	case isDeviceCat(cat):
		return a.device(e, cat, sp)
	case isRuntimeCat(cat):
		if e.corr >= 0 {
			a.launches++
			return a.sp.add(gpuEvent{span: span{e.ts, e.ts}, corr: e.corr, kind: kindLaunch})
		}
	case isStepMark(e.name, cat):
		if n, ok := atoi(e.name[len("ProfilerStep#"):]); ok {
			a.steps = append(a.steps, stepSpan{n: n, span: sp})
		}
	case a.opt.Calls && bytes.HasPrefix(e.name, []byte("c10d::")) && isCPUOp(cat):
		a.issue(e)
	case bytes.HasPrefix(e.name, []byte("gloo:")):
		return a.sp.add(gpuEvent{span: sp, corr: -1, cls: comm, coll: collective(e.collName, e.name[5:]),
			bytes: e.nelems * dtypeSize(e.dtype), group: a.group(e.group), kind: kindCPU})
	case a.gpu == 0 && bytes.HasPrefix(e.name, []byte("aten::")) && isCPUOp(cat):
		// kept until the trace proves to be a GPU trace
		return a.sp.add(gpuEvent{span: sp, corr: -1, cls: compute, kind: kindCPU})
	}
	return nil
}

// isStepMark is whether an event is a step's ProfilerStep#N annotation.
func isStepMark(name []byte, cat string) bool {
	return bytes.HasPrefix(name, []byte("ProfilerStep#")) && (cat == "user_annotation" || isCPUOp(cat))
}

// issue keeps when the rank's thread issued a collective (c10d's
// operator), for pairIssues.
func (a *analyzer) issue(e *rawEvent) {
	if k := collective(nil, e.name[len("c10d::"):]); k != 8 && len(a.issues) < MaxCalls {
		a.issues = append(a.issues, issue{e.ts, k})
	}
}

// device keeps a kernel, copy or set as HTA classifies it.
func (a *analyzer) device(e *rawEvent, cat string, sp span) error {
	cls := classify(cat, e.name)
	if cls == other {
		return nil
	}
	g := gpuEvent{span: sp, corr: e.corr, cls: cls, kind: kindGPU}
	if cls == comm {
		g.coll = collective(e.collName, e.name)
		g.bytes = e.nelems * dtypeSize(e.dtype)
		g.group = a.group(e.group)
	}
	a.gpu++
	return a.sp.add(g)
}

func (a *analyzer) group(name []byte) uint16 {
	if len(name) == 0 {
		return 0
	}
	if g, ok := a.groups[string(name)]; ok {
		return g
	}
	if len(a.groupOf) >= 1000 {
		return 0
	}
	a.groupOf = append(a.groupOf, string(name))
	g := uint16(len(a.groupOf) - 1)
	a.groups[string(name)] = g
	return g
}

// classify applies HTA's kernel grouping (see the package documentation).
func classify(cat string, name []byte) class {
	switch {
	case bytes.HasPrefix(name, []byte("nccl")) || bytes.HasPrefix(name, []byte("rccl")) || bytes.HasPrefix(name, []byte("hccl")) ||
		bytes.Contains(name, []byte("ncclKernel")) || bytes.Contains(name, []byte("ncclDevKernel")):
		return comm
	case cat == "gpu_memcpy" || cat == "gpu_memset" || cat == "Memcpy" || cat == "Memset" ||
		bytes.HasPrefix(name, []byte("Memcpy")) || bytes.HasPrefix(name, []byte("Memset")) || bytes.HasPrefix(name, []byte("dma")):
		return memory
	case bytes.Contains(name, []byte("Sync")) && bytes.HasPrefix(name, []byte("cuda")), bytes.HasPrefix(name, []byte("Stream Wait Event")):
		return other
	}
	return compute
}

// collective names a collective's kind from the profiler's "Collective
// name" argument or the kernel's name (ncclDevKernel_AllReduce_Sum_f32_RING_LL…).
func collective(collName, kernel []byte) uint8 {
	src := collName
	if len(src) == 0 {
		src = kernel
	}
	n := strings.ToLower(strings.NewReplacer("_", "", "-", "", " ", "").Replace(string(src)))
	n = strings.TrimPrefix(strings.TrimPrefix(strings.TrimPrefix(n, "nccldevkernel"), "ncclkernel"), "nccl")
	switch {
	case strings.Contains(n, "allreduce"):
		return 1
	case strings.Contains(n, "reducescatter"):
		return 2
	case strings.Contains(n, "allgather"):
		return 3
	case strings.Contains(n, "sendrecv"), strings.HasPrefix(n, "send"), strings.HasPrefix(n, "recv"):
		return 4
	case strings.Contains(n, "alltoall"):
		return 5
	case strings.Contains(n, "broadcast"):
		return 6
	case strings.HasPrefix(n, "reduce"):
		return 7
	}
	return 8
}

func dtypeSize(d []byte) int64 {
	switch strings.ToLower(string(d)) {
	case "float", "float32", "int", "int32", "uint32":
		return 4
	case "double", "float64", "long", "int64", "uint64":
		return 8
	case "half", "float16", "bfloat16", "short", "int16":
		return 2
	case "byte", "char", "int8", "uint8", "bool", "float8_e4m3fn", "float8_e5m2":
		return 1
	}
	return 0
}

// -- interval arithmetic ----------------------------------------------------

func union(s []span) []span {
	s = slices.Clone(s)
	sort.Slice(s, func(i, j int) bool { return s[i].start < s[j].start })
	out := s[:0]
	for _, x := range s {
		if x.end <= x.start {
			continue
		}
		if n := len(out); n > 0 && x.start <= out[n-1].end {
			out[n-1].end = max(out[n-1].end, x.end)
			continue
		}
		out = append(out, x)
	}
	return out
}

func total(s []span) int64 {
	var t int64
	for _, x := range s {
		t += x.end - x.start
	}
	return t
}

// intersect is the time of two unions that overlaps.
func intersect(a, b []span) int64 {
	var t int64
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		lo, hi := max(a[i].start, b[j].start), min(a[i].end, b[j].end)
		if hi > lo {
			t += hi - lo
		}
		if a[i].end < b[j].end {
			i++
		} else {
			j++
		}
	}
	return t
}

// -- results ------------------------------------------------------------------

func (a *analyzer) stepAt(t int64) int {
	i := sort.Search(len(a.steps), func(i int) bool { return a.steps[i].start > t }) - 1
	if i >= 0 && t < a.steps[i].end {
		return i
	}
	return -1
}

// stats computes one step's (or the whole trace's, window empty) figures.
func stats(evs []gpuEvent, window span, cpu bool) StepStats {
	var cs, ms, ks []span
	for _, e := range evs {
		switch e.cls {
		case compute:
			cs = append(cs, e.span)
		case comm:
			ms = append(ms, e.span)
		case memory:
			ks = append(ks, e.span)
		}
	}
	cu, mu, ku := union(cs), union(ms), union(ks)
	all := union(append(append(slices.Clone(cu), mu...), ku...))
	var st StepStats
	st.ComputeUs = us(total(cu))
	st.CommUs = us(total(mu))
	st.MemoryUs = us(total(ku))
	over := intersect(mu, cu)
	st.ExposedCommUs = us(total(mu) - over)
	if total(mu) > 0 {
		p := 100 * float64(over) / float64(total(mu))
		st.OverlapPct = &p
	}
	busy := total(all)
	if window.end > window.start {
		st.DurationUs = us(window.end - window.start)
		if !cpu && len(all) > 0 {
			// the GPU's own span for this step's kernels (gpuWindows
			// widens it to the step's GPU timeline)
			st.busy, st.gpuFirst, st.gpuLast = busy, all[0].start, all[len(all)-1].end
			st.IdleUs = us(all[len(all)-1].end - all[0].start - busy)
		} else {
			st.IdleUs = us(max(window.end-window.start-busy, 0))
		}
	} else if len(all) > 0 {
		st.DurationUs = us(all[len(all)-1].end - all[0].start)
		st.IdleUs = us(all[len(all)-1].end - all[0].start - busy)
	}
	return st
}

func us(ns int64) float64 { return float64(ns) / 1e3 }

func floorMicro(ns int64) int64 {
	q := ns / 1000 * 1000
	if q > ns {
		q -= 1000
	}
	return q
}

func ceilMicro(ns int64) int64 { return -floorMicro(-ns) }
