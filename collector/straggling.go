package collector

import "time"

// stragglerTrack is a job's live straggler tracking: each rank's moving
// averages of its own time (the one live score: slowest ranks,
// stragglers, episodes), its runs of slow steps, and the episodes open
// and closed (episodes.go). Its job's lock guards it; it does no I/O.
type stragglerTrack struct {
	ownEWMA            []float64 // per rank, ns: own time (compute and data wait)
	dataEWMA, workEWMA []float64 // per rank, ns: of it, data wait, and the measured fwd+bwd+optim
	openEpisodes       map[string]*LiveEpisode
	slowSince          []int64 // per rank: first step of its current run of slow own times, -1 for none
	slowLast           []int64 // per rank: the last step its own time was slow, -1 for none
	slowRecent         []uint8 // per rank: its last 8 own times, a bit set for each slow one (newest lowest)
	bestSeen           float64 // the fastest own-time average at the last episode tracking
	lastAutoCapture    time.Time
	episodes           []LiveEpisode // closed, the last maxEpisodes
	episodesEnded      int64         // closed since the job started
	newSinceEpisodes   bool          // a step closed since episodes were last tracked
}
