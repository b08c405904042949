package report

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
)

// Known answer: 4 GPUs on two nodes draw 500 W each, steps of 1 s carry
// 1,000 tokens, so tokens per joule are 1000 / (4 × 500 × 1) = 0.5 exactly.
// The cluster rows' spans overlap by 0.2 s (ranks start at different
// moments): joined over the spans, as the live join does, the same run
// reads 1000 / (4 × 500 × 1.2) = 0.417. Node b's clock runs 2 s ahead;
// readings come every 0.7 s, in an order shuffled across GPUs.
func TestEnergyJoinKnownAnswer(t *testing.T) {
	const (
		t0     = int64(1_700_000_000e9)
		steps  = 50
		period = int64(1e9)
		watts  = 500.0
	)
	offsets := map[string]int64{"b": 2e9}
	rows := make([]tps.ClusterStep, steps)
	for i := range rows {
		end := t0 + int64(i+1)*period
		rows[i] = tps.ClusterStep{Step: int64(i), StartUnixNs: end - period - period/5, EndUnixNs: end, StepTimeNs: period, Tokens: 1000}
	}
	type gpu struct {
		node string
		idx  int32
	}
	gpus := []gpu{{"a", 0}, {"a", 1}, {"b", 0}, {"b", 1}}
	// each GPU's readings, from 1 s before the first step to 1 s after the last
	reading := func(g gpu, at int64, energy func(int64) int64) tps.GPUSample {
		p, e := watts, energy(at)
		return tps.GPUSample{Node: g.node, Index: g.idx, UUID: g.node + string(rune('0'+g.idx)), UnixNs: at + offsets[g.node], PowerW: &p, EnergyMJ: &e}
	}
	counter := func(at int64) int64 { return int64(watts * float64(at-t0+5e9) / 1e6) } // mJ, exact at whole ms
	series := func(drop func(g gpu, at int64) bool, energy func(g gpu, at int64) int64) [][]tps.GPUSample {
		out := make([][]tps.GPUSample, len(gpus))
		for k, g := range gpus {
			for at := t0 - 1e9 + int64(k)*13e6; at <= t0+int64(steps+1)*period; at += 700e6 {
				if drop == nil || !drop(g, at) {
					out[k] = append(out[k], reading(g, at, func(a int64) int64 { return energy(g, a) }))
				}
			}
		}
		return out
	}
	// shuffled across GPUs, each GPU's readings in their order
	feed := func(e *energyJoin, per [][]tps.GPUSample, rng *rand.Rand) {
		next := make([]int, len(per))
		for {
			var open []int
			for k := range per {
				if next[k] < len(per[k]) {
					open = append(open, k)
				}
			}
			if len(open) == 0 {
				return
			}
			k := open[rng.IntN(len(open))]
			e.add(&per[k][next[k]])
			next[k]++
		}
	}
	skip := make([]bool, steps)
	run := func(drop func(g gpu, at int64) bool, energy func(g gpu, at int64) int64, seed uint64) (float64, int) {
		e := newEnergyJoin(rows, skip, offsets)
		feed(e, series(drop, energy), rand.New(rand.NewPCG(seed, 1)))
		tpj, n, ok := e.result()
		if !ok {
			t.Fatal("no step covered")
		}
		return tpj, n
	}
	plain := func(_ gpu, at int64) int64 { return counter(at) }
	for seed := uint64(1); seed <= 3; seed++ {
		if tpj, n := run(nil, plain, seed); math.Abs(tpj-0.5) > 1e-9 || n != steps {
			t.Errorf("seed %d: %.6f tokens/J over %d steps, want 0.5 over %d", seed, tpj, n, steps)
		}
	}
	// GPU b/1 silent for 12 s (its sampler stopped): the steps it does not
	// cover are left out, the others still read 0.5
	silent := func(g gpu, at int64) bool {
		return g == (gpu{"b", 1}) && at > t0+20e9 && at < t0+32e9
	}
	if tpj, n := run(silent, plain, 4); math.Abs(tpj-0.5) > 1e-9 || n < steps-14 || n > steps-11 {
		t.Errorf("a silent GPU: %.6f tokens/J over %d steps, want 0.5 over %d less the 11-14 it missed", tpj, n, steps)
	}
	// GPU a/0's counter reset (a GPU reset) halfway: that interval is
	// measured from its power instead
	reset := func(g gpu, at int64) int64 {
		if g == (gpu{"a", 0}) && at > t0+25e9 {
			return counter(at) - counter(t0+25e9)
		}
		return counter(at)
	}
	if tpj, n := run(nil, reset, 5); math.Abs(tpj-0.5) > 1e-9 || n != steps {
		t.Errorf("a counter reset: %.6f tokens/J over %d steps, want 0.5 over %d", tpj, n, steps)
	}
	// a reading repeated or out of order is skipped, not counted twice
	e := newEnergyJoin(rows, skip, offsets)
	per := series(nil, plain)
	feed(e, per, rand.New(rand.NewPCG(6, 1)))
	e.add(&per[0][10])
	if tpj, _, _ := e.result(); math.Abs(tpj-0.5) > 1e-9 || e.stale != 1 {
		t.Errorf("a stale reading: %.6f tokens/J, %d skipped; want 0.5 and 1", tpj, e.stale)
	}
	// without the offset, node b's readings land 2 s late: the run's
	// energy is the same but the first steps' are not covered
	if tpj, n := func() (float64, int) {
		e := newEnergyJoin(rows, skip, nil)
		feed(e, series(nil, plain), rand.New(rand.NewPCG(7, 1)))
		tpj, n, _ := e.result()
		return tpj, n
	}(); n == steps {
		t.Errorf("without the clock offset every step was still covered (%.6f tokens/J)", tpj)
	}
}

// newEnergyJoin is the join of the steps that count (skip false, a step
// time), as the cluster pass feeds it.
func newEnergyJoin(steps []tps.ClusterStep, skip []bool, offsets map[string]int64) *energyJoin {
	e := newEnergyJoinOf(offsets)
	for i := range steps {
		if !skip[i] && steps[i].StepTimeNs > 0 && steps[i].EndUnixNs > 0 {
			e.addStep(&steps[i])
		}
	}
	return e
}
