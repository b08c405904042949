package collector

import (
	"math/bits"
	"time"

	"github.com/tpsprof/tpsprof/tps"
)

// stragglerTrack is a job's live straggler tracking: each rank's moving
// averages of its own time (the one live score: slowest ranks,
// stragglers, episodes), its runs of slow steps, and the episodes open
// and closed (episodes.go). Its job's lock guards it; it does no I/O.
type stragglerTrack struct {
	ownEWMA            []float64 // per rank, ns: own time (compute, data wait and host work)
	dataEWMA, workEWMA []float64 // per rank, ns: of it, data wait, and the measured fwd+bwd+optim
	openEpisodes       map[string]*LiveEpisode
	slowSince          []int64 // per rank: first step of its current run of slow own times, -1 for none
	slowLast           []int64 // per rank: the last step its own time was slow, -1 for none
	slowRecent         []uint8 // per rank: its last 8 own times, a bit set for each slow one (newest lowest)
	warm               []uint8 // per rank: its steps seen, up to episodeWarmSteps
	bestSeen           float64 // the fastest own-time average at the last episode tracking
	lastAutoCapture    time.Time
	episodes           []LiveEpisode // closed, the last maxEpisodes
	episodesEnded      int64         // closed since the job started
	newSinceEpisodes   bool          // a step closed since episodes were last tracked
}

// observeRank folds a rank's record at a step (of a job of world ranks)
// into its moving averages:
// compute (the live straggler scores), and for episodes its own time
// (compute, data wait and host work: what the others of a synchronous step wait for)
// with its data wait and measured forward, backward and optimizer apart,
// which say why it is slow. It notes from which step on its own times
// have been below the straggler threshold against the fastest average
// (so that an episode, which opens once the average crosses it, starts
// where the slowness began: a rank 1.4 times slower crosses ~17 steps
// later).
func (s *stragglerTrack) observeRank(r *tps.StepRecord, world int64) {
	if int64(len(s.ownEWMA)) != world {
		s.ownEWMA = make([]float64, world)
		s.dataEWMA, s.workEWMA = make([]float64, world), make([]float64, world)
		s.slowSince, s.slowLast = make([]int64, world), make([]int64, world)
		s.slowRecent, s.warm = make([]uint8, world), make([]uint8, world)
		for i := range s.slowSince {
			s.slowSince[i], s.slowLast[i] = -1, -1
		}
	}
	rank := r.Rank
	if rank < 0 || rank >= int64(len(s.ownEWMA)) {
		return
	}
	if s.warm[rank] < episodeWarmSteps {
		// a rank's first steps (compilation, the allocator's and the
		// loader's warm-up) seed no average: rank 0's first step 220 ms
		// against 69 opened an episode on the warm-up
		s.warm[rank]++
		return
	}
	own := float64(r.OwnNs()) // compute, data wait, host work before the forward
	first := s.ownEWMA[rank] == 0
	for _, x := range []struct {
		avg []float64
		v   float64
	}{{s.ownEWMA, own}, {s.dataEWMA, float64(r.DataWaitNs)}, {s.workEWMA, float64(r.FwdNs + r.BwdNs + r.OptimNs)}} {
		if first {
			x.avg[rank] = x.v
		} else {
			x.avg[rank] += ewmaAlpha * (x.v - x.avg[rank])
		}
	}
	slow := s.bestSeen > 0 && own > 0 && s.bestSeen/own < tps.StragglerThreshold
	s.slowRecent[rank] <<= 1
	if slow {
		s.slowRecent[rank] |= 1
	}
	switch {
	case !slow:
		s.slowSince[rank] = -1
	case s.slowSince[rank] < 0 || r.Step < s.slowSince[rank]:
		s.slowSince[rank] = r.Step
		fallthrough
	default:
		s.slowLast[rank] = max(s.slowLast[rank], r.Step)
	}
}

// episodeWarmSteps are each rank's first steps left out of its averages
// (the report leaves out the warm-up too).
const episodeWarmSteps = 2

// episodeMinSlow of a rank's last episodeRecent own times must have been
// slow for its moving average to open an episode: one step descheduled
// or stalled (4.3 times its pace is enough to lift an average with
// ewmaAlpha 0.1 over the threshold) is jitter, not a straggler.
const episodeMinSlow, episodeRecent = 3, 5

// keepsSlow says whether enough of rank r's recent own times were slow
// for an episode.
func (s *stragglerTrack) keepsSlow(r int) bool {
	return r < len(s.slowRecent) && bits.OnesCount8(s.slowRecent[r]&(1<<episodeRecent-1)) >= episodeMinSlow
}

// bestOwn is the fastest rank's own-time average and that rank (-1, 0 for none).
func (s *stragglerTrack) bestOwn() (int, float64) {
	at, best := -1, 0.0
	for r, v := range s.ownEWMA {
		if v > 0 && (best == 0 || v < best) {
			at, best = r, v
		}
	}
	return at, best
}
