package agent

import (
	"fmt"

	"github.com/tpsprof/tpsprof/tps"
)

// rankKey is one rank of one attempt of a job.
type rankKey struct {
	job           string
	attempt, rank int64
}

// maxRankClaims bounds the ranks the agent remembers who holds (a node's
// ranks over its jobs; those of closed connections are pruned first).
const maxRankClaims = 1 << 16

// claimRank notes that info's process reports r's rank (its first record
// of that job, attempt and rank). Another open connection holding it is
// another process claiming the same rank: said once (a log line and a
// rank_conflict event for the report), since the collector keeps one
// process's steps and drops the other's as duplicates, silently (two
// tasks under srun with the rank not set each reported rank 0 of world 1:
// the report said 1 rank and TPS half the job's, with no warning).
func (a *Agent) claimRank(info *connInfo, r *tps.StepRecord) {
	k := rankKey{r.Job, r.Attempt, r.Rank}
	a.mu.Lock()
	if a.rankHeld == nil { // (an Agent not made by Start: the tests')
		a.rankHeld, a.rankWarned, a.userSaid = map[rankKey]*connInfo{}, map[rankKey]bool{}, map[string]bool{}
	}
	sayUser := info.uid >= 0 && !a.userSaid[r.Job]
	if sayUser {
		if len(a.userSaid) >= maxRankClaims {
			clear(a.userSaid) // (a job said again costs an event)
		}
		a.userSaid[r.Job] = true
	}
	held, ok := a.rankHeld[k]
	conflict := ok && held != info && a.connOpen(held)
	if !conflict {
		if len(a.rankHeld) >= maxRankClaims {
			a.pruneRankClaims()
		}
		a.rankHeld[k] = info
	}
	say := conflict && !a.rankWarned[k]
	if say && len(a.rankWarned) < maxRankClaims {
		a.rankWarned[k] = true
	}
	a.mu.Unlock()
	if sayUser {
		// whose process this is, for the fleet view's count of a host's
		// slow jobs by user: the agent's word, not the record's
		a.publishEvent(tps.Event{Job: r.Job, Attempt: r.Attempt, Kind: tps.EventRankUser, Rank: r.Rank, Step: r.Step,
			StartUnixNs: r.StartUnixNs, EndUnixNs: r.StartUnixNs, Detail: tps.RankUserDetail(info.uid)})
	}
	if !say {
		return
	}
	msg := fmt.Sprintf("two processes on node %s report rank %d of job %s (attempt %d, world size %d): one's steps are dropped as duplicates and its tokens not counted; "+
		"each process must know its own rank and the world size (RANK and WORLD_SIZE, the process group it made, or srun's SLURM_PROCID and SLURM_NTASKS)",
		a.cfg.Node, r.Rank, r.Job, r.Attempt, r.WorldSize)
	a.cfg.Logger.Warn("ranks: "+msg, "job", r.Job, "attempt", r.Attempt, "rank", r.Rank)
	a.SubmitEvent(tps.Event{Job: r.Job, Attempt: r.Attempt, Kind: tps.EventRankConflict, Rank: r.Rank, Step: r.Step,
		StartUnixNs: r.StartUnixNs, EndUnixNs: r.EndUnixNs, Detail: msg})
}

// connOpen reports whether info is an open connection's; mu held.
func (a *Agent) connOpen(info *connInfo) bool {
	for _, c := range a.conns {
		if c == info {
			return true
		}
	}
	return false
}

// pruneRankClaims forgets the claims of closed connections, and all of
// them if that is not enough; mu held.
func (a *Agent) pruneRankClaims() {
	open := make(map[*connInfo]bool, len(a.conns))
	for _, c := range a.conns {
		open[c] = true
	}
	for k, c := range a.rankHeld {
		if !open[c] {
			delete(a.rankHeld, k)
		}
	}
	if len(a.rankHeld) >= maxRankClaims {
		clear(a.rankHeld)
	}
	if len(a.rankWarned) >= maxRankClaims {
		clear(a.rankWarned)
	}
}
