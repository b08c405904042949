package demo

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/tps"
)

// simClock is the simulation's time, which runs faster than the wall clock.
type simClock struct{ ns atomic.Int64 }

func (c *simClock) Now() time.Time  { return time.Unix(0, c.ns.Load()) }
func (c *simClock) Set(t time.Time) { c.ns.Store(t.UnixNano()) }

// NVML clock-event reason bits the simulation uses.
const (
	reasonHWSlowdown        = 0x8
	reasonHWThermalSlowdown = 0x40
)

// simGPUs is one node's GPUs: H100s at about 620 W, or, on the straggler
// node once it slows down, throttled to 1500 MHz by a thermal slowdown.
type simGPUs struct {
	mu        sync.Mutex
	node      int
	n         int
	clock     *simClock
	slowAfter func() bool
	rng       *rand.Rand
	energyMJ  []float64
	last      []int64
}

var _ agent.GPUReader = (*simGPUs)(nil)

func newSimGPUs(node, n int, clock *simClock, slow func() bool, seed uint64) *simGPUs {
	return &simGPUs{node: node, n: n, clock: clock, slowAfter: slow, rng: rand.New(rand.NewPCG(seed, uint64(node))),
		energyMJ: make([]float64, n), last: make([]int64, n)}
}

func (g *simGPUs) Devices() []agent.GPUInfo {
	out := make([]agent.GPUInfo, g.n)
	for i := range out {
		out[i] = agent.GPUInfo{Index: i, UUID: fmt.Sprintf("GPU-sim-%02d-%02d", g.node, i), Name: "NVIDIA H100 80GB HBM3"}
	}
	return out
}

func (g *simGPUs) Sample(i int) (tps.GPUSample, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.clock.ns.Load()
	power, clock, reasons, temp := 620+g.rng.NormFloat64()*15, int64(1980), int64(0), int64(68)
	if g.slowAfter() {
		// a hot GPU the hardware slows down (a failing fan, a blocked airflow)
		power, clock, reasons, temp = 540+g.rng.NormFloat64()*15, 1500, reasonHWSlowdown|reasonHWThermalSlowdown, 89
	}
	if g.last[i] != 0 && now > g.last[i] {
		g.energyMJ[i] += power * float64(now-g.last[i]) / 1e6 // W × ns → mJ
	}
	g.last[i] = now
	util, memUsed := 99.0, int64(71)<<30
	// GPM (Hopper): the simulated steps compute at half the peak for about
	// two thirds of their time, so the tensor pipes are busy about a third
	// of it, the SMs more (non-tensor kernels, communication's)
	tensor, sm := 34+g.rng.NormFloat64()*2, 58+g.rng.NormFloat64()*3
	f := func(v float64) *float64 { return &v }
	n := func(v int64) *int64 { return &v }
	d := g.Devices()[i]
	return tps.GPUSample{Index: int32(i), UUID: d.UUID, Name: d.Name,
		GPUUtilPct: f(util), MemUtilPct: f(38), MemUsedBytes: n(memUsed), MemTotalBytes: n(80 << 30),
		PowerW: f(power), PowerLimitW: f(700), EnergyMJ: n(int64(g.energyMJ[i])),
		SMClockMHz: n(clock), SMClockMaxMHz: n(1980), MemClockMHz: n(2619), MemClockMaxMHz: n(2619),
		TempC: n(temp), ClockEventReason: n(reasons),
		GPMTensorPct: f(tensor), GPMSMUtilPct: f(sm), GPMDRAMBWPct: f(31 + g.rng.NormFloat64())}, nil
}

func (g *simGPUs) Close() error { return nil }
