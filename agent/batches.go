package agent

import (
	"fmt"
	"sync"

	"github.com/tpsprof/tpsprof/tps"
)

// Ranks counted as separate data-parallel replicas but fed identical
// batches are most often tensor- or pipeline-parallel peers the job never
// declared: each counts the same tokens, and the job's tokens (its TPS,
// MFU) come out doubled or more. tpsprof.torch sends, with its first steps'
// records, a fingerprint of the step's first host batch (batch_fp: CRC-32
// of the token ids' first 4 KiB and their shape); the agent compares those
// of the ranks it serves and, when two replicas trained on identical
// batches at batchMatches of their first steps, says so once per job and
// attempt: a log line and a topology_warning event, which the report shows.
// Ranks on other nodes are not compared (tensor-parallel peers share a
// node as a rule). The fingerprint is not forwarded.

const (
	// batchSteps is how many steps from a job's first one are compared.
	batchSteps = 16
	// batchMatches is how many identical steps make a pair suspect (one
	// identical batch may be chance: a fixed warm-up batch).
	batchMatches = 3
	// maxBatchJobs and maxBatchRanks bound what is held.
	maxBatchJobs  = 256
	maxBatchRanks = 1024
)

type batchKey struct {
	job     string
	attempt int64
}

// batchRank is a rank as the check sees it: its replica is its dp_rank, or
// the rank itself when the job declares no layout (every rank a replica).
type batchRank struct{ rank, replica int64 }

type jobBatches struct {
	first  int64
	steps  map[int64]map[string][]batchRank // step → fingerprint → ranks
	pairs  map[[2]int64]int                 // (rank, rank) → identical steps
	warned bool
}

type batchCheck struct {
	mu   sync.Mutex
	jobs map[batchKey]*jobBatches
}

// see folds a record's fingerprint in; it returns the warning to give (at
// most once per job and attempt), empty for none.
func (b *batchCheck) see(r *tps.StepRecord, fp string) string {
	if fp == "" || len(fp) > 32 {
		return ""
	}
	replica := r.Rank
	if r.DPRank != nil {
		replica = int64(*r.DPRank)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	k := batchKey{r.Job, r.Attempt}
	j := b.jobs[k]
	if j == nil {
		if b.jobs == nil {
			b.jobs = map[batchKey]*jobBatches{}
		}
		if len(b.jobs) >= maxBatchJobs {
			return ""
		}
		j = &jobBatches{first: r.Step, steps: map[int64]map[string][]batchRank{}, pairs: map[[2]int64]int{}}
		b.jobs[k] = j
	}
	if j.warned || r.Step < j.first || r.Step >= j.first+batchSteps {
		if r.Step >= j.first+batchSteps && j.steps != nil {
			j.steps, j.pairs = nil, nil // done: only the flag is kept
		}
		return ""
	}
	byFP := j.steps[r.Step]
	if byFP == nil {
		byFP = map[string][]batchRank{}
		j.steps[r.Step] = byFP
	}
	same := byFP[fp]
	if len(same) >= maxBatchRanks {
		return ""
	}
	msg := ""
	for _, o := range same {
		if o.replica == replica || o.rank == r.Rank {
			continue
		}
		p := [2]int64{min(o.rank, r.Rank), max(o.rank, r.Rank)}
		j.pairs[p]++
		if j.pairs[p] >= batchMatches && msg == "" {
			j.warned = true
			how := "the job declares no layout, so every rank counts as a replica"
			if r.DPRank != nil {
				how = fmt.Sprintf("dp_rank %d and %d", o.replica, replica)
			}
			msg = fmt.Sprintf("ranks %d and %d trained on identical batches at %d of the first steps, yet are counted as separate data-parallel replicas (%s): "+
				"if they are tensor- or pipeline-parallel peers, declare the layout (tpsprof launch --dp/--tp/--pp/--cp/--ep, TPSPROF_TOPOLOGY, or a DeviceMesh), "+
				"or each token is counted once per rank and TPS and MFU read too high; if they are replicas, their sampler gives them the same data",
				p[0], p[1], j.pairs[p], how)
		}
	}
	byFP[fp] = append(same, batchRank{r.Rank, replica})
	return msg
}

// checkBatches runs the check on a step line's fingerprint; the warning is
// logged and published outside the check's lock.
func (a *Agent) checkBatches(r *tps.StepRecord, fp string) {
	msg := a.batches.see(r, fp)
	if msg == "" {
		return
	}
	a.cfg.Logger.Warn("topology: "+msg, "job", r.Job, "attempt", r.Attempt)
	a.SubmitEvent(tps.Event{Job: r.Job, Attempt: r.Attempt, Kind: tps.EventTopologyWarning, Rank: r.Rank, Step: r.Step,
		StartUnixNs: r.StartUnixNs, EndUnixNs: r.EndUnixNs, Detail: msg})
}
