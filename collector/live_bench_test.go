package collector

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
)

// slowRanks and stragglers give what scoring every rank with
// tps.ScoreMedians gives (ties included), without its maps and sort.
func TestSlowRanksMatchScoreMedians(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const world = 1000
	j := &jobState{world: world, rankNode: make([]string, world), stragglerTrack: stragglerTrack{ownEWMA: make([]float64, world), slowRecent: bytes.Repeat([]byte{0xff}, world)}} // each rank at its average for its last steps
	med, nodes := map[int64]float64{}, map[int64]string{}
	for r := range world {
		if r%97 == 5 {
			continue // not reported yet
		}
		v := 1e9 + float64(rng.IntN(50))*1e7 // many ties
		if r%113 == 7 {
			v *= 1.6 // stragglers
		}
		j.ownEWMA[r], med[int64(r)] = v, v
		j.rankNode[r], nodes[int64(r)] = fmt.Sprint("n", r/8), fmt.Sprint("n", r/8)
	}
	all := tps.ScoreMedians(med, nodes)
	for _, n := range []int{1, 5, 40} {
		if got := j.slowRanks(n); !reflect.DeepEqual(got, all[:n]) {
			t.Errorf("n=%d:\n got %+v\nwant %+v", n, got, all[:n])
		}
	}
	want := 0
	for _, s := range all {
		if s.Straggler {
			want++
		}
	}
	if got := j.stragglers(); got != want || want == 0 {
		t.Errorf("stragglers %d, want %d (> 0)", got, want)
	}
}

// BenchmarkLiveScores: the straggler figures the live page and /metrics
// compute under a job's lock (the live page) or at each closed step (/metrics), at 131,072 ranks.
//
//	go test -run '^$' -bench LiveScores ./collector/
func BenchmarkLiveScores(b *testing.B) {
	const world = 131072
	j := &jobState{world: world, rankNode: make([]string, world), stragglerTrack: stragglerTrack{ownEWMA: make([]float64, world), slowRecent: bytes.Repeat([]byte{0xff}, world)}}
	for r := range world {
		j.ownEWMA[r] = 1e9 + float64((r*7919)%1000)*1e6
		j.rankNode[r] = fmt.Sprintf("node-%d", r/8)
	}
	b.Run("stragglers", func(b *testing.B) {
		for b.Loop() {
			j.stragglers()
		}
	})
	b.Run("slowRanks5", func(b *testing.B) {
		for b.Loop() {
			j.slowRanks(5)
		}
	})
}
