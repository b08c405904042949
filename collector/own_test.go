package collector

import (
	"encoding/json"
	"math"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/wire"
)

// The live page shows what measuring costs the ranks (their records'
// capture_ns and capture_cpu_ns) and the fullest rank's device memory
// over the last two windows of steps: in /api/summary and in the page a
// real browser draws. A rank whose spike lies more than two windows back
// is no longer the fullest; a job without such records shows neither.
func TestLiveCostAndMemory(t *testing.T) {
	c, nc := startCollectorWith(t, Config{OutDir: t.TempDir(), Grace: time.Minute})
	const ms = int64(1e6)
	at := time.Now().Add(-time.Hour).UnixNano()
	var recs []tps.StepRecord
	for s := range int64(350) {
		for r := range int64(2) {
			rec := tps.StepRecord{Job: "mem", Step: s, Rank: r, WorldSize: 2, Node: "vm", Tokens: 1000,
				StartUnixNs: at, EndUnixNs: at + 100*ms, DurationNs: 100 * ms,
				CaptureNs: 200_000, CaptureCPUNs: 500_000, CaptureCommNs: 150_000, CaptureCommCPUNs: 300_000,
				MemPeakAllocatedBytes: 20 << 30, MemPeakReservedBytes: (24 + r) << 30, MemCapacityBytes: 80 << 30}
			if r == 0 && s == 5 {
				rec.MemPeakReservedBytes = 79 << 30 // long gone by the end: windows 0 and 1 are past
			}
			if r == 0 && s == 330 {
				rec.MemPeakReservedBytes = 60 << 30 // this window's fullest
			}
			if s%50 == 25 {
				// a step a profiler traced (its trace's figures attached):
				// its cost (6.5 ms) is the profiler's, apart from the always-on
				rec.CaptureNs, rec.TraceComputeNs, rec.TraceCommNs = 6_500_000, 50*ms, 10*ms
			}
			recs = append(recs, rec)
		}
		at += 110 * ms
	}
	plain := []tps.StepRecord{}
	for s := range int64(5) {
		plain = append(plain, tps.StepRecord{Job: "plain", Step: s, Rank: 0, WorldSize: 1, Tokens: 10,
			StartUnixNs: at + s*ms, EndUnixNs: at + (s+1)*ms, DurationNs: ms})
	}
	for i := 0; i < len(recs); i += 200 {
		if err := nc.Publish(wire.StepsSubject("mem", "vm"), wire.AppendSteps(nil, recs[i:min(i+200, len(recs))])); err != nil {
			t.Fatal(err)
		}
	}
	nc.Publish(wire.StepsSubject("plain", "vm"), wire.AppendSteps(nil, plain))
	nc.Flush()
	if err := c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	var sum LiveSummary
	if err := json.Unmarshal([]byte(get(t, c, "/api/summary")), &sum); err != nil {
		t.Fatal(err)
	}
	byJob := map[string]LiveJob{}
	for _, j := range sum.Jobs {
		byJob[j.Job] = j
	}
	lj := byJob["mem"]
	cc, m := lj.CaptureCost, lj.Memory
	if cc == nil || math.Abs(cc.PerStepUs-200) > 1e-6 || cc.StepFraction == nil || math.Abs(*cc.StepFraction-0.002) > 1e-9 || math.Abs(cc.CPUPerStepUs-500) > 1e-6 {
		t.Errorf("capture cost %+v, want 200 µs a step, 0.2%%, CPU 500 µs", cc)
	}
	if cc == nil || cc.CommPerStepUs == nil || math.Abs(*cc.CommPerStepUs-150) > 1e-6 || math.Abs(*cc.CommCPUPerStepUs-300) > 1e-6 {
		t.Errorf("capture cost %+v, want the communication component's 150 µs and 300 µs CPU of it", cc)
	}
	if cc == nil || cc.ProfiledPerStepUs == nil || math.Abs(*cc.ProfiledPerStepUs-6500) > 1e-6 {
		t.Errorf("capture cost %+v: want the traced steps' 6,500 µs apart", cc)
	}
	if m == nil || m.Rank != 0 || m.PeakReservedBytes != 60<<30 || m.CapacityBytes != 80<<30 || m.Headroom == nil || math.Abs(*m.Headroom-0.25) > 1e-9 {
		t.Errorf("memory %+v, want rank 0's 60 GiB of 80 (headroom 25%%): step 5's 79 GiB is two windows back", m)
	}
	if p := byJob["plain"]; p.CaptureCost != nil || p.Memory != nil {
		t.Errorf("a job without such records: cost %+v, memory %+v", p.CaptureCost, p.Memory)
	}
	srv := httptest.NewServer(c.Handler())
	dom := dumpDOM(t, srv.URL+"/")
	srv.Close()
	for _, want := range []string{`<b class="v-memory">60.0 GiB / 80.0 GiB</b>`, "peak reserved, rank 0, headroom 25%", `<b class="v-capture">200 µs</b>`, "of them communication 150 + 300 µs CPU"} {
		if !strings.Contains(dom, want) {
			t.Errorf("the live page lacks %q", want)
		}
	}
}
