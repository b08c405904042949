package kineto

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// ev writes one complete event; times in µs.
func ev(cat, name string, ts, dur float64, args string) string {
	if args == "" {
		args = "{}"
	}
	return fmt.Sprintf(`{"ph":"X","cat":%q,"name":%q,"pid":0,"tid":7,"ts":%v,"dur":%v,"args":%s}`, cat, name, ts, dur, args)
}

func trace(events ...string) string {
	return `{"schemaVersion":1,"deviceProperties":[{"id":0,"name":"NVIDIA H100"}],` +
		`"distributedInfo":{"backend":"nccl","rank":3,"world_size":8},"traceEvents":[` + strings.Join(events, ",\n") +
		`],"traceName":"x","displayTimeUnit":"ms","baseTimeNanoseconds":1}`
}

func launch(ts float64, corr int) string {
	return ev("cuda_runtime", "cudaLaunchKernel", ts, 1, fmt.Sprintf(`{"correlation":%d}`, corr))
}

func kernel(name string, ts, dur float64, corr, stream int) string {
	return ev("kernel", name, ts, dur, fmt.Sprintf(`{"correlation":%d,"stream":%d,"device":0}`, corr, stream))
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-6 }

// A hand-built trace with a known answer:
//
//	step 1 [0, 100) µs launches: compute 10-40 (stream 7) and 30-50
//	(stream 8, nested/concurrent), all-reduce 35-70 (ncclKernel_, stream
//	20), memcpy 80-90; step 2 [100, 200) launches compute 110-150 and
//	ncclDevKernel_ReduceScatter 140-180 and a compute kernel launched at 190
//	that runs 195-260, past the step's end (it stays step 2's).
func TestKnownAnswer(t *testing.T) {
	src := trace(
		ev("user_annotation", "ProfilerStep#1", 0, 100, ""),
		ev("user_annotation", "ProfilerStep#2", 100, 100, ""),
		launch(1, 1), launch(2, 2), launch(3, 3), launch(4, 4),
		kernel("gemm_a", 10, 30, 1, 7),
		kernel("gemm_b", 30, 20, 2, 8),
		kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", 35, 35, 3, 20),
		ev("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 80, 10, `{"correlation":4,"stream":7}`),
		launch(101, 5), launch(102, 6), launch(190, 7),
		kernel("softmax", 110, 40, 5, 7),
		ev("kernel", "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 140, 40,
			`{"correlation":6,"stream":20,"Collective name":"reduce_scatter","In msg nelems":1024,"dtype":"BFloat16","Process Group Name":"0"}`),
		kernel("late_kernel", 195, 65, 7, 7),
		// not GPU work: a CPU op, a flow, an instant
		ev("cpu_op", "aten::mm", 5, 50, ""),
		`{"ph":"s","id":1,"pid":0,"tid":0,"ts":3,"cat":"ac2g","name":"ac2g"}`,
		`{"ph":"i","s":"t","name":"marker","pid":0,"tid":0,"ts":7}`,
	)
	r, err := Analyze(strings.NewReader(src))
	if err != nil {
		t.Fatal(err)
	}
	if r.Rank == nil || *r.Rank != 3 || *r.WorldSize != 8 || r.Backend != "nccl" || r.Device != "gpu" {
		t.Fatalf("header: %+v", r)
	}
	if len(r.Steps) != 2 {
		t.Fatalf("%d steps", len(r.Steps))
	}
	s1, s2 := r.Steps[0], r.Steps[1]
	// step 1: compute union 10-50 = 40; comm 35-70 = 35, overlapped 35-50 = 15, exposed 20; memory 10;
	// busy 10-70 ∪ 80-90 = 70; its GPU timeline (the trace's first step: its own kernels) 10-90 = 80: idle 10.
	want1 := StepStats{Step: 1, DurationUs: 80, ComputeUs: 40, CommUs: 35, ExposedCommUs: 20, MemoryUs: 10, IdleUs: 10}
	check(t, "step 1", s1, want1, 100*15.0/35)
	// step 2: compute 110-150 ∪ 195-260 = 105; comm 140-180 = 40, overlapped 140-150 = 10; busy 135.
	// Its GPU timeline runs from its own start (100, after step 1's last kernel at 90) to its last
	// kernel's end (260): 160, idle 25. Over the CPU span (100) its compute read 105: more than the step.
	want2 := StepStats{Step: 2, DurationUs: 160, ComputeUs: 105, CommUs: 40, ExposedCommUs: 30, MemoryUs: 0, IdleUs: 25}
	check(t, "step 2", s2, want2, 25)
	// total: span 10-260; compute 40+105, comm 75, exposed 50, memory 10.
	wantT := StepStats{Step: -1, DurationUs: 250, ComputeUs: 145, CommUs: 75, ExposedCommUs: 50, MemoryUs: 10, IdleUs: 250 - (60 + 10 + 40 + 40 + 65 - 10)}
	check(t, "total", r.Total, wantT, 100*25.0/75)
	if r.HTAOverlapPct == nil || !near(*r.HTAOverlapPct, 100*15.0/35) {
		t.Errorf("HTA window (step 1 only): %v", r.HTAOverlapPct)
	}
	kinds := map[string]CollectiveStats{}
	for _, c := range r.Collectives {
		kinds[c.Kind] = c
	}
	if c := kinds["all_reduce"]; c.Count != 1 || !near(c.TimeUs, 35) {
		t.Errorf("all_reduce: %+v", c)
	}
	if c := kinds["reduce_scatter"]; c.Count != 1 || c.Bytes != 2048 || c.Group != "0" {
		t.Errorf("reduce_scatter: %+v (want 1024 bf16 elements = 2048 bytes in group 0)", c)
	}
}

func check(t *testing.T, what string, got, want StepStats, overlap float64) {
	t.Helper()
	if got.OverlapPct == nil || !near(*got.OverlapPct, overlap) {
		t.Errorf("%s: overlap %v, want %.4f", what, got.OverlapPct, overlap)
	}
	got.OverlapPct = nil
	for _, p := range []struct {
		name string
		g, w float64
	}{{"duration", got.DurationUs, want.DurationUs}, {"compute", got.ComputeUs, want.ComputeUs}, {"comm", got.CommUs, want.CommUs},
		{"exposed", got.ExposedCommUs, want.ExposedCommUs}, {"memory", got.MemoryUs, want.MemoryUs}, {"idle", got.IdleUs, want.IdleUs}} {
		if !near(p.g, p.w) {
			t.Errorf("%s: %s %.3f µs, want %.3f", what, p.name, p.g, p.w)
		}
	}
}

// Every naming generation of NCCL (and RCCL) kernels is communication;
// memcpy and memset are memory; synchronisation is left out.
func TestClassification(t *testing.T) {
	for name, want := range map[string]class{
		"ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)": comm,
		"ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)":              comm,
		"ncclSendRecvKernel_copy_i8(ncclDevComm*)":                                       comm,
		"void ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*)":                  comm,
		"rcclGenericKernel<1, false>":                                                    comm,
		"Memcpy DtoD (Device -> Device)":                                                 memory,
		"Memset (Device)":                                                                memory,
		"sm90_xmma_gemm_bf16bf16_bf16f32":                                                compute,
		"void at::native::vectorized_elementwise_kernel<4>":                              compute,
	} {
		if got := classify("kernel", []byte(name)); got != want {
			t.Errorf("%s: class %d, want %d", name, got, want)
		}
	}
	if classify("gpu_memset", []byte("anything")) != memory {
		t.Error("gpu_memset category is memory")
	}
	for name, want := range map[string]string{
		"ncclDevKernel_AllReduce_Sum_f32_RING_LL": "all_reduce", "ncclKernel_ReduceScatter_RING": "reduce_scatter",
		"ncclDevKernel_AllGather_RING_LL": "all_gather", "ncclDevKernel_SendRecv": "send_recv", "ncclKernel_Broadcast_RING": "broadcast",
		"all_to_all": "all_to_all", "ncclDevKernel_Reduce_Sum_f32": "reduce",
	} {
		if got := collKinds[collective(nil, []byte(name))]; got != want {
			t.Errorf("%s: %s, want %s", name, got, want)
		}
	}
}

// Real traces (kineto/testdata/README.md): with HTA's rounding and window
// the overlap is HTA's own figure; per step, exposed communication and
// overlap equal those of an independent implementation (reference_test.py,
// standard-library Python) on the same file.
func TestRealTracesAgainstHTAAndReference(t *testing.T) {
	for file, hta := range map[string]float64{
		"hta_nccl_allreduce_2ranks.json.gz":     14.31,
		"hta_sendrecv_128ranks_sampled.json.gz": 11.81,
	} {
		path := filepath.Join("testdata", file)
		r, err := AnalyzeFileWith(path, Options{HTARounding: true})
		if err != nil {
			t.Fatal(err)
		}
		if r.HTAOverlapPct == nil || math.Abs(*r.HTAOverlapPct-hta) > 0.005 {
			t.Errorf("%s: overlap in HTA's window %v, HTA says %.2f", file, r.HTAOverlapPct, hta)
		}
		exact, err := AnalyzeFile(path)
		if err != nil {
			t.Fatal(err)
		}
		py, err := exec.LookPath("python3")
		if err != nil {
			t.Fatal("python3 is needed for the reference implementation")
		}
		out, err := exec.Command(py, "reference_test.py", path).Output()
		if err != nil {
			t.Fatalf("reference: %v", err)
		}
		var ref map[string][2]*float64
		if err := json.Unmarshal(out, &ref); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if len(ref) != len(exact.Steps) || len(ref) == 0 {
			t.Fatalf("%s: %d steps, reference %d", file, len(exact.Steps), len(ref))
		}
		for _, s := range exact.Steps {
			want := ref[fmt.Sprint(s.Step)]
			// the reference reads µs as float64 (ns-resolution timestamps
			// of 13 digits lose their last ns): agreement to 0.01 µs
			if want[0] == nil || s.OverlapPct == nil || math.Abs(*want[0]-*s.OverlapPct) > 1e-3 || math.Abs(*want[1]-s.ExposedCommUs) > 0.01 {
				t.Errorf("%s step %d: exposed %.3f µs; reference overlap %v exposed %v", file, s.Step, s.ExposedCommUs, *want[0], *want[1])
			}
		}
	}
}

// gzip is found by its magic bytes; the legacy profiler's bare array reads
// too; CPU-only traces give CPU-side figures and say so.
func TestFormats(t *testing.T) {
	src := trace(ev("user_annotation", "ProfilerStep#0", 0, 10, ""), kernel("k", 1, 2, -1, 7))
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	w.Write([]byte(src))
	w.Close()
	r, err := Analyze(&gz)
	if err != nil || len(r.Steps) != 1 || !near(r.Steps[0].ComputeUs, 2) {
		t.Fatalf("gzip: %v %+v", err, r)
	}
	legacy := `[{"name":"ProfilerStep#3","ph":"X","ts":0,"dur":100,"tid":1,"pid":"CPU functions","args":{}},
{"name":"aten::mm","ph":"X","ts":10,"dur":40,"tid":1,"pid":"CPU functions","args":{}},
{"name":"gloo:all_reduce","ph":"X","ts":30,"dur":40,"tid":3,"pid":"CPU functions","args":{}}]`
	r, err = Analyze(strings.NewReader(legacy))
	if err != nil {
		t.Fatal(err)
	}
	s := r.Steps[0]
	if r.Device != "cpu" || s.Step != 3 || !near(s.CommUs, 40) || !near(s.ExposedCommUs, 20) || !near(s.ComputeUs, 40) || len(r.Notes) == 0 || r.Rank != nil {
		t.Fatalf("legacy CPU trace: %+v %+v", r, s)
	}
}

// Bad input: one clear error, never a panic.
func TestBadTraces(t *testing.T) {
	good := trace(ev("user_annotation", "ProfilerStep#0", 0, 10, ""), kernel("k", 1, 2, -1, 7))
	for name, src := range map[string]string{
		"empty":       "",
		"truncated":   good[:len(good)/2],
		"not json":    "hello",
		"no events":   `{"schemaVersion":1}`,
		"events kind": `{"traceEvents":{}}`,
		"bad event":   `{"traceEvents":[1,2]}`,
		"negative":    trace(ev("kernel", "k", 5, -3, "")),
		"bad info":    `{"distributedInfo":[1],"traceEvents":[]}`,
	} {
		if _, err := Analyze(strings.NewReader(src)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := AnalyzeFile(filepath.Join(t.TempDir(), "none.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

func FuzzAnalyze(f *testing.F) {
	f.Add([]byte(trace(ev("user_annotation", "ProfilerStep#0", 0, 10, ""), kernel("ncclDevKernel_AllReduce", 1, 2, 1, 7), launch(0.5, 1))))
	f.Add([]byte(`[{"name":"gloo:all_reduce","ph":"X","ts":1,"dur":2}]`))
	f.Add([]byte(`{"traceEvents":[{"ts":"1e3","dur":1.5e2,"args":{"correlation":"x"}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := Analyze(bytes.NewReader(data))
		if err != nil {
			return
		}
		for _, s := range append(r.Steps, r.Total) {
			if s.ExposedCommUs > s.CommUs+1e-9 || s.ExposedCommUs < 0 {
				t.Fatalf("exposed %v > comm %v", s.ExposedCommUs, s.CommUs)
			}
			if s.OverlapPct != nil && (*s.OverlapPct < -1e-9 || *s.OverlapPct > 100+1e-9) {
				t.Fatalf("overlap %v", *s.OverlapPct)
			}
		}
	})
}

// streamTrace writes, as Kineto lays a trace out (CPU operators and the
// ProfilerStep annotations first, then launches and GPU activities in time
// order), a trace of n steps of 1 ms: per step k+2 launches, k compute
// kernels back to back from 100 µs to 600 µs (the last ends at 1050 µs, 50
// µs into the next step), an all-reduce 500-800 µs and a memcpy 900-950 µs.
func streamTrace(w io.Writer, n, k int) error {
	bw := bufio.NewWriter(w)
	fmt.Fprint(bw, `{"distributedInfo":{"backend":"nccl","rank":0,"world_size":2},"traceEvents":[`)
	for s := 0; s < n; s++ {
		t := float64(s * 1000)
		fmt.Fprint(bw, ev("user_annotation", fmt.Sprintf("ProfilerStep#%d", s), t, 1000, ""), ",")
		fmt.Fprint(bw, ev("cpu_op", "aten::mm", t+1, 5, ""), ",")
	}
	corr := 0
	for s := 0; s < n; s++ {
		t := float64(s * 1000)
		d := 500 / float64(k)
		for j := 0; j < k; j++ {
			corr++
			fmt.Fprint(bw, launch(t+float64(j)/float64(k), corr), ",")
			if j == k-1 {
				d = 1050 - 100 - float64(j)*d
			}
			fmt.Fprint(bw, kernel("gemm", t+100+float64(j)*500/float64(k), d, corr, 7), ",")
		}
		corr++
		fmt.Fprint(bw, launch(t+6, corr), ",")
		fmt.Fprint(bw, kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", t+500, 300, corr, 20), ",")
		corr++
		fmt.Fprint(bw, launch(t+7, corr), ",")
		fmt.Fprint(bw, ev("gpu_memcpy", "Memcpy DtoH", t+900, 50, fmt.Sprintf(`{"correlation":%d,"stream":7}`, corr)), ",")
	}
	fmt.Fprint(bw, `{"ph":"i","name":"end","pid":0,"tid":0,"ts":0}]}`)
	return bw.Flush()
}

// The analysis holds about one step's records, however long the trace,
// and spills the rest to disk; the figures are exact.
func TestBoundedMemory(t *testing.T) {
	defer func(m int) { spillMem = m }(spillMem)
	spillMem = 1000 // well below the trace's 16 records per step × n
	for _, n := range []int{50, 5000} {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(streamTrace(pw, n, 5)) }()
		dir := t.TempDir()
		r, held, err := analyze(pr, Options{SpillDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		// 7 GPU events per step, one of them also in the next step's window
		if held > 24 {
			t.Errorf("n=%d: held %d records at once, want about one step's (7)", n, held)
		}
		if left, _ := os.ReadDir(dir); len(left) != 0 {
			t.Errorf("spill files left behind: %v", left)
		}
		if len(r.Steps) != n {
			t.Fatalf("%d steps, want %d", len(r.Steps), n)
		}
		// per step (its launches): compute 100-1050 = 950, comm 500-800 =
		// 300 all overlapped, memory 50 (inside compute): busy 950. Its GPU
		// timeline: the first step's own kernels, 100-1050 (idle 0); each
		// later one's from the previous step's last kernel's end, 50 µs
		// before its first: 1000, idle 50 (the steps tile the GPU span)
		check(t, "step 0", r.Steps[0], StepStats{Step: 0, DurationUs: 950, ComputeUs: 950, CommUs: 300, MemoryUs: 50}, 100)
		for _, s := range []StepStats{r.Steps[n/2], r.Steps[n-1]} {
			check(t, fmt.Sprintf("step %d", s.Step), s, StepStats{Step: s.Step, DurationUs: 1000, ComputeUs: 950, CommUs: 300, MemoryUs: 50, IdleUs: 50}, 100)
		}
		// whole trace: GPU span 100 to (n-1)×1000+1050, idle the n-1 gaps
		// of 50 µs between one step's last kernel and the next's first
		check(t, "total", r.Total, StepStats{Step: -1, DurationUs: float64((n-1)*1000 + 950), ComputeUs: float64(950 * n),
			CommUs: float64(300 * n), MemoryUs: float64(50 * n), IdleUs: float64(50 * (n - 1))}, 100)
		if len(r.Collectives) != 1 || r.Collectives[0].Count != int64(n) || !near(r.Collectives[0].UnionUs, float64(300*n)) {
			t.Errorf("collectives: %+v", r.Collectives)
		}
		if r.HTAOverlapPct == nil || !near(*r.HTAOverlapPct, 100) {
			t.Errorf("hta overlap %v", r.HTAOverlapPct)
		}
	}
}

// Spilled to disk or held in memory, the figures are the same.
func TestSpillSameFigures(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.json.gz")
	if len(files) == 0 {
		t.Fatal("no testdata traces")
	}
	defer func(m int) { spillMem = m }(spillMem)
	for _, f := range files {
		spillMem = 1 << 30
		inMem, err := AnalyzeFile(f)
		if err != nil {
			t.Fatal(err)
		}
		spillMem = 3
		onDisk, err := AnalyzeFileWith(f, Options{SpillDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		a, _ := json.Marshal(inMem)
		b, _ := json.Marshal(onDisk)
		if !bytes.Equal(a, b) {
			t.Errorf("%s: figures differ when spilled:\n%s\n%s", f, a, b)
		}
	}
}

// Correlation ids of two steps' launches that interleave (not the order
// CUPTI gives, but a trace may be edited or merged) fall back to an exact
// map: each kernel still counts in the step it was launched in.
func TestInterleavedCorrelations(t *testing.T) {
	src := trace(
		ev("user_annotation", "ProfilerStep#1", 0, 100, ""),
		ev("user_annotation", "ProfilerStep#2", 100, 100, ""),
		launch(1, 10), launch(2, 30), launch(101, 20),
		kernel("a", 10, 10, 10, 7), kernel("b", 30, 10, 30, 7), kernel("c", 150, 40, 20, 7),
	)
	r, err := Analyze(strings.NewReader(src))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Steps) != 2 || !near(r.Steps[0].ComputeUs, 20) || !near(r.Steps[1].ComputeUs, 40) {
		t.Fatalf("steps: %+v", r.Steps)
	}
}

// A trace is bounded by what it unpacks to, its event count and the size of
// one value: a small gzip of a huge trace, a trace of many events and a
// distributedInfo of millions of digits are refused with an error, early,
// not held in memory.
func TestAnalysisBounds(t *testing.T) {
	var big bytes.Buffer
	zw := gzip.NewWriter(&big)
	zw.Write([]byte(`{"traceEvents":[`))
	ev := []byte(`{"ph":"X","cat":"kernel","name":"gemm","ts":0,"dur":1,"args":{"stream":7}},`)
	for i := 0; i < 200_000; i++ {
		zw.Write(ev)
	}
	zw.Write([]byte(`{"ph":"X","cat":"kernel","name":"gemm","ts":0,"dur":1}]}`))
	zw.Close()
	if _, err := AnalyzeWith(bytes.NewReader(big.Bytes()), Options{MaxBytes: 1 << 20}); err == nil || !strings.Contains(err.Error(), "uncompressed") {
		t.Errorf("a %d-byte gzip of 15 MB under a 1 MiB bound: %v", big.Len(), err)
	}
	if _, err := AnalyzeWith(bytes.NewReader(big.Bytes()), Options{MaxEvents: 1000}); err == nil || !strings.Contains(err.Error(), "more than 1000 events") {
		t.Errorf("200,001 events under a bound of 1,000: %v", err)
	}
	if _, err := AnalyzeWith(bytes.NewReader(big.Bytes()), Options{}); err != nil {
		t.Errorf("unbounded: %v", err)
	}
	huge := `{"distributedInfo":` + strings.Repeat("9", 20<<20) + `,"traceEvents":[]}`
	if _, err := AnalyzeWith(strings.NewReader(huge), Options{}); !errors.Is(err, errTooBig) {
		t.Errorf("a 20 MB number as distributedInfo: %v", err)
	}
}

// Timestamps near the int64 limits are refused with a clear error: every
// accepted time lies within ±2^61 ns, so no span or difference of spans
// can overflow (a negative duration_us was reported at the limits; the
// parser's own cap at 2^62 ns left differences of two such times able to
// overflow). The largest accepted times still give positive figures.
func TestTimestampsAtTheLimits(t *testing.T) {
	for _, ev := range []string{
		`{"ph":"X","cat":"kernel","name":"gemm","ts":4000000000000000,"dur":10}`,
		`{"ph":"X","cat":"kernel","name":"gemm","ts":-4000000000000000,"dur":10}`,
		`{"ph":"X","cat":"kernel","name":"gemm","ts":0,"dur":4000000000000000}`,
		`{"ph":"X","cat":"kernel","name":"gemm","ts":2000000000000000,"dur":2000000000000000}`,
	} {
		tr := `{"traceEvents":[{"ph":"X","cat":"user_annotation","name":"ProfilerStep#1","ts":0,"dur":100},` + ev + `]}`
		r, err := AnalyzeWith(strings.NewReader(tr), Options{})
		if err == nil {
			for _, s := range r.Steps {
				if s.DurationUs < 0 || s.ComputeUs < 0 {
					t.Errorf("%s: negative figures %+v", ev, s)
				}
			}
			t.Errorf("%s: accepted", ev)
		} else if !strings.Contains(err.Error(), "out of range") {
			t.Errorf("%s: %v", ev, err)
		}
	}
	ok := `{"traceEvents":[{"ph":"X","cat":"user_annotation","name":"ProfilerStep#1","ts":2000000000000000,"dur":100},` +
		`{"ph":"X","cat":"kernel","name":"gemm","ts":2000000000000000,"dur":50}]}`
	r, err := AnalyzeWith(strings.NewReader(ok), Options{})
	if err != nil || len(r.Steps) != 1 || r.Steps[0].DurationUs <= 0 {
		t.Fatalf("times near 2^62 ns: %v %+v", err, r)
	}
}

// Options.Calls lists every collective call of the steps: on the real NCCL
// traces, per step, the union of the calls' spans is the step's
// communication time as the analysis computed it from the same kernels, and
// the calls come in start order with their kinds.
func TestCallsOfRealTraces(t *testing.T) {
	for _, file := range []string{"hta_nccl_allreduce_2ranks.json.gz", "hta_sendrecv_128ranks_sampled.json.gz"} {
		r, err := AnalyzeFileWith(filepath.Join("testdata", file), Options{Calls: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Calls) == 0 || r.CallsDropped != 0 {
			t.Fatalf("%s: %d calls, %d dropped", file, len(r.Calls), r.CallsDropped)
		}
		per := map[int64][]span{}
		kinds := map[string]int{}
		for i, c := range r.Calls {
			if i > 0 && c.StartNs < r.Calls[i-1].StartNs {
				t.Fatalf("%s: calls out of order at %d", file, i)
			}
			if c.EndNs < c.StartNs || c.Kind == "" || c.Kind == "other" {
				t.Errorf("%s: call %+v", file, c)
			}
			per[c.Step] = append(per[c.Step], span{c.StartNs, c.EndNs})
			kinds[c.Kind]++
		}
		for _, s := range r.Steps {
			got := us(total(union(per[s.Step])))
			if math.Abs(got-s.CommUs) > 1e-6 {
				t.Errorf("%s step %d: calls' union %.3f µs, step communication %.3f µs", file, s.Step, got, s.CommUs)
			}
		}
		for _, c := range r.Collectives {
			if kinds[c.Kind] > int(c.Count) {
				t.Errorf("%s: %d %s calls in steps, %d in the whole trace", file, kinds[c.Kind], c.Kind, c.Count)
			}
		}
		t.Logf("%s: %d calls %v", file, len(r.Calls), kinds)
		// without the option, none
		plain, _ := AnalyzeFile(filepath.Join("testdata", file))
		if len(plain.Calls) != 0 {
			t.Errorf("%s: calls listed without Options.Calls", file)
		}
	}
}

// In a CPU (gloo) trace each call gets its issue time: the start of the
// c10d operator that issued it on the rank's own thread, paired by kind
// and order (gloo runs a group's operations in issue order), when it is
// before gloo's thread started it.
func TestCallIssueTimes(t *testing.T) {
	trace := `{"traceEvents": [
{"name": "ProfilerStep#3", "ph": "X", "cat": "user_annotation", "ts": 0, "dur": 100000, "tid": 1},
{"name": "c10d::allreduce_", "ph": "X", "cat": "cpu_op", "ts": 1000, "dur": 50, "tid": 1},
{"name": "c10d::broadcast_", "ph": "X", "cat": "cpu_op", "ts": 1500, "dur": 50, "tid": 1},
{"name": "c10d::allreduce_", "ph": "X", "cat": "cpu_op", "ts": 2000, "dur": 50, "tid": 1},
{"name": "gloo:all_reduce", "ph": "X", "ts": 9000, "dur": 3000, "tid": 2},
{"name": "gloo:broadcast", "ph": "X", "ts": 12500, "dur": 100, "tid": 2},
{"name": "gloo:all_reduce", "ph": "X", "ts": 13000, "dur": 1000, "tid": 2},
{"name": "c10d::allreduce_", "ph": "X", "cat": "cpu_op", "ts": 50000, "dur": 50, "tid": 1}
]}`
	r, err := AnalyzeWith(strings.NewReader(trace), Options{Calls: true})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		kind         string
		issue, start int64
	}{{"all_reduce", 1e6, 9e6}, {"broadcast", 1.5e6, 12.5e6}, {"all_reduce", 2e6, 13e6}}
	if len(r.Calls) != len(want) {
		t.Fatalf("calls %+v", r.Calls)
	}
	for i, w := range want {
		c := r.Calls[i]
		if c.Kind != w.kind || c.IssueNs != w.issue || c.StartNs != w.start || c.Step != 3 {
			t.Errorf("call %d: %+v, want %+v", i, c, w)
		}
	}
}

// The GPU path on real H200 traces (testdata/README.md): a step's duration
// is its GPU timeline, so compute never exceeds it (over the CPU-side
// ProfilerStep span, the single-GPU NCCL capture read compute 254.4 ms in
// 214.3 ms, against the job's own ~267 ms periods), and collectives gloo
// runs on CUDA tensors count as communication from their CPU-side events
// (they read 0 on both ranks; the fast rank waits for the slow one).
func TestH200Traces(t *testing.T) {
	get := func(name string) *Result {
		t.Helper()
		r, err := AnalyzeFileWith(filepath.Join("testdata", "h200", name), Options{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Device != "gpu" || len(r.Steps) == 0 {
			t.Fatalf("%s: device %s, %d steps", name, r.Device, len(r.Steps))
		}
		for _, s := range r.Steps {
			if s.ComputeUs > s.DurationUs || s.IdleUs < 0 || s.CommUs > s.DurationUs {
				t.Errorf("%s step %d: compute %.1f ms, communication %.1f ms, idle %.1f ms in %.1f ms", name, s.Step, s.ComputeUs/1e3, s.CommUs/1e3, s.IdleUs/1e3, s.DurationUs/1e3)
			}
		}
		return r
	}
	nccl := get("nccl1-llama1b-capture-rank0-step30.pt.trace.json.gz")
	if d := nccl.Steps[0].DurationUs / 1e3; d < 250 || d > 290 {
		t.Errorf("the Llama's captured step: %.1f ms, the job's own periods ~267 ms", d)
	}
	fast, slow := get("gloo-cuda-2ranks-capture-rank0-step20.pt.trace.json.gz"), get("gloo-cuda-2ranks-capture-rank1-step20.pt.trace.json.gz")
	if fast.Steps[0].CommUs <= 0 || slow.Steps[0].CommUs <= 0 || fast.Steps[0].CommUs <= slow.Steps[0].CommUs {
		t.Errorf("gloo on CUDA tensors: communication %.1f ms (rank 0) and %.1f ms (rank 1, the slow one); want both counted, the fast rank waiting longer",
			fast.Steps[0].CommUs/1e3, slow.Steps[0].CommUs/1e3)
	}
}

// A real FSDP2 step over gloo (testdata/README.md): its 4 reduce-scatters
// run as gloo all-reduces. Every call gets the issue time of the c10d
// operator that issued it; the reduce-scatters' all-reduces had none (and
// their arrivals read gloo's thread starting, late on a busy host).
func TestFSDP2GlooIssues(t *testing.T) {
	r, err := AnalyzeFileWith(filepath.Join("testdata", "fsdp2-gloo-rank3.step6.pt.trace.json.gz"), Options{Calls: true})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, c := range r.Calls {
		kinds[c.Kind]++
		if c.IssueNs <= 0 || c.IssueNs > c.StartNs || c.StartNs-c.IssueNs > 50_000_000 {
			t.Errorf("%s at %d: issued at %d", c.Kind, c.StartNs, c.IssueNs)
		}
	}
	if len(r.Calls) != 12 || kinds["all_gather"] != 8 || kinds["all_reduce"] != 4 {
		t.Errorf("calls by kind %v, want 8 all-gathers and 4 all-reduces", kinds)
	}
}

// A real CPU trace of a job with three process groups (testdata/README.md):
// the count is read from distributedInfo, and no call names its group
// (what tells the capture's merge that it cannot tell them apart).
func TestProcessGroupsCounted(t *testing.T) {
	r, err := AnalyzeFileWith(filepath.Join("testdata", "pairgroups-gloo-rank2.step10.pt.trace.json.gz"), Options{Calls: true})
	if err != nil {
		t.Fatal(err)
	}
	if r.ProcessGroups != 3 || len(r.Calls) != 5 {
		t.Fatalf("process groups %d, calls %d: want 3 and 5 (the pair's all-reduce and four buckets)", r.ProcessGroups, len(r.Calls))
	}
	for _, c := range r.Calls {
		if c.Group != "" {
			t.Errorf("a call names its group %q: the test's premise is gone (the merge can then tell groups apart)", c.Group)
		}
	}
}
