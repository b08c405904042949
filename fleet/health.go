package fleet

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Options are the fleet's rules (the defaults: DefaultOptions).
type Options struct {
	// SlowExcess is the excess own time over a job's median rank from
	// which a node counts as slow in that job (0.02: 2%).
	SlowExcess float64
	// MinJobs is how many jobs a node must have been slow in before it is
	// a drain candidate on slowness alone (3).
	MinJobs int
	// Decay weighs a node's jobs in its score: the newest 1, the one before
	// Decay, the one before that Decay², ... (0.7).
	Decay float64
	// ThrottledFraction is the share of a node's GPU samples in one job
	// with a clock-slowing reason that is strong hardware evidence by
	// itself (0.25); so is any XID or uncorrectable ECC event.
	ThrottledFraction float64
	// Since keeps only the jobs that ended after it (zero: every job).
	Since time.Time
}

// DefaultOptions are the rules docs/nodes.md gives.
func DefaultOptions() Options {
	return Options{SlowExcess: 0.02, MinJobs: 3, Decay: 0.7, ThrottledFraction: 0.25}
}

func (o *Options) defaults() {
	d := DefaultOptions()
	if o.SlowExcess <= 0 {
		o.SlowExcess = d.SlowExcess
	}
	if o.MinJobs <= 0 {
		o.MinJobs = d.MinJobs
	}
	if o.Decay <= 0 || o.Decay > 1 {
		o.Decay = d.Decay
	}
	if o.ThrottledFraction <= 0 {
		o.ThrottledFraction = d.ThrottledFraction
	}
}

// Node is a host's health over the jobs that ran on it (a GPU's, where
// the ranks named no host).
type Node struct {
	Host string `json:"host"`
	// GPUs are the GPUs of it the jobs used; Worst the one that was
	// slowest most recently (or throttled), the one to look at first.
	GPUs  []string `json:"gpus,omitempty"`
	Worst string   `json:"worst_gpu,omitempty"`
	// Jobs ran on it; SlowJobs of them found it slow (its slowest rank's
	// own time SlowExcess or more over the job's median rank).
	Jobs     int `json:"jobs"`
	SlowJobs int `json:"slow_jobs"`
	// Score is that excess, a mean decayed over its jobs (newest weighs
	// most); LastExcess the newest job's.
	Score      float64 `json:"score"`
	LastExcess float64 `json:"last_excess"`
	// CostGPUHours is the GPU-hours it cost its jobs: the other ranks'
	// waiting for it in the steps it was the slowest (JobNode).
	CostGPUHours float64 `json:"cost_gpu_hours"`
	// Hardware evidence: the jobs in which one of its GPUs throttled (by
	// ThrottledFraction) and the reasons, XID and uncorrectable ECC events
	// over its jobs, the newest job's hottest GPU against its peers.
	ThrottledJobs   int     `json:"throttled_jobs"`
	ThrottleReasons string  `json:"throttle_reasons,omitempty"`
	XIDEvents       int64   `json:"xid_events"`
	ECCUncorrected  int64   `json:"ecc_uncorrected"`
	TempOverPeersC  float64 `json:"temp_over_peers_c"`
	// Drain: a drain candidate, Why says on what evidence. Held says why
	// a host slow in enough jobs is not one: its slow jobs were one
	// user's, while another user's jobs ran well on it meanwhile.
	Drain bool   `json:"drain_candidate"`
	Why   string `json:"why,omitempty"`
	Held  string `json:"held,omitempty"`
	// LastJob and LastSeen are its newest job and when that ended;
	// RecentJobs its newest jobs (at most 5), newest first.
	LastJob    string    `json:"last_job"`
	LastSeen   time.Time `json:"last_seen"`
	RecentJobs []string  `json:"recent_jobs"`
}

// hostJob is a host's part in one job: its GPUs' rows folded.
type hostJob struct {
	job                   string
	end                   int64
	excess, cost          float64
	worst                 string
	throttled             float64 // the largest throttled fraction of its GPUs
	throttledGPU, reasons string
	xid, ecc              int64
	tempOver              float64
	users                 string // its rows' users (JobNode.Users), "" not known
}

// oneUsersSlowness says why a host's slow jobs do not make it a drain
// candidate, or "" when they do: they were all one user's (the agent
// said whose, rank_user) while a job of another user that ended after
// the first of them ran well on it. One user can make any host they
// run on look slow (a rank that sleeps); another user's good job in
// the same span says the host is not. A host only one user ran on
// meanwhile, or whose users no agent said, is judged on its jobs.
func oneUsersSlowness(ps []*hostJob, opt Options) string {
	slowUser, first := "", int64(math.MaxInt64)
	for _, p := range ps {
		if p.excess < opt.SlowExcess {
			continue
		}
		if p.users == "" || strings.Contains(p.users, ",") || (slowUser != "" && p.users != slowUser) {
			return "" // users not known, or more than one
		}
		slowUser, first = p.users, min(first, p.end)
	}
	for _, p := range ps {
		if p.excess < opt.SlowExcess && p.end > first && p.users != "" && p.users != slowUser {
			return fmt.Sprintf("its slow jobs were all of user %s, while job %s of user %s ran well on it after the first of them: one user's jobs alone do not drain a host (docs/nodes.md)",
				slowUser, p.job, p.users)
		}
	}
	return ""
}

// Health folds jobs' node rows into each host's health, the drain
// candidates first, then by GPU-hours lost and score.
func Health(rows []JobNode, opt Options) []Node {
	opt.defaults()
	type key struct{ host, job string }
	parts := map[key]*hostJob{}
	gpus := map[string][]string{}
	for _, r := range rows {
		if !opt.Since.IsZero() && r.EndUnixNs < opt.Since.UnixNano() {
			continue
		}
		host := r.Host
		if host == "" {
			host = r.Key
		}
		k := key{host, r.Job}
		p := parts[k]
		if p == nil {
			p = &hostJob{job: r.Job, end: r.EndUnixNs, excess: r.Excess, worst: r.GPU}
			parts[k] = p
		}
		if r.GPU != "" && !slices.Contains(gpus[host], r.GPU) {
			gpus[host] = append(gpus[host], r.GPU)
		}
		p.end = max(p.end, r.EndUnixNs)
		if r.Excess > p.excess {
			p.excess, p.worst = r.Excess, r.GPU
		}
		p.cost += r.CostGPUHours
		if f := r.ThrottledFraction(); f > p.throttled {
			p.throttled, p.throttledGPU, p.reasons = f, r.GPU, r.ThrottleReasons
		}
		p.xid += r.XIDEvents
		p.ecc += r.ECCUncorrected
		if r.Users != "" && !strings.Contains(","+p.users+",", ","+r.Users+",") {
			p.users = strings.Trim(p.users+","+r.Users, ",")
		}
		if r.PeerTempC > 0 {
			p.tempOver = max(p.tempOver, r.TempC-r.PeerTempC)
		}
	}
	byHost := map[string][]*hostJob{}
	for k, p := range parts {
		byHost[k.host] = append(byHost[k.host], p)
	}
	out := make([]Node, 0, len(byHost))
	for host, ps := range byHost {
		slices.SortFunc(ps, func(a, b *hostJob) int { return cmp.Or(cmp.Compare(b.end, a.end), cmp.Compare(a.job, b.job)) })
		g := slices.Clone(gpus[host])
		slices.Sort(g)
		n := Node{Host: host, GPUs: g, Jobs: len(ps), LastJob: ps[0].job, LastSeen: time.Unix(0, ps[0].end).UTC(),
			LastExcess: ps[0].excess, TempOverPeersC: ps[0].tempOver, Worst: ps[0].worst}
		w, sw := 1.0, 0.0
		var reasons, strong []string
		for i, p := range ps {
			// a job that ran faster on it than on its median rank says
			// nothing about a slow host: clipped at 0, one fast job cannot
			// hide the slow ones (a forged fast job pulled a slow host's
			// score to -0.371)
			n.Score += w * max(p.excess, 0)
			sw += w
			w *= opt.Decay
			if p.excess >= opt.SlowExcess {
				n.SlowJobs++
			}
			n.CostGPUHours += p.cost
			n.XIDEvents += p.xid
			n.ECCUncorrected += p.ecc
			if p.throttled >= opt.ThrottledFraction {
				n.ThrottledJobs++
				for _, s := range strings.Split(p.reasons, ", ") {
					if s != "" && !slices.Contains(reasons, s) {
						reasons = append(reasons, s)
					}
				}
				if len(strong) == 0 {
					strong = append(strong, fmt.Sprintf("GPU %s throttled in %.0f%% of its samples in job %s (%s)", p.throttledGPU, 100*p.throttled, p.job, p.reasons))
					if i == 0 {
						n.Worst = p.throttledGPU
					}
				}
			}
			if i < 5 {
				n.RecentJobs = append(n.RecentJobs, p.job)
			}
		}
		n.Score /= sw
		n.ThrottleReasons = strings.Join(reasons, ", ")
		if n.XIDEvents > 0 {
			strong = append(strong, fmt.Sprintf("%d XID event(s)", n.XIDEvents))
		}
		if n.ECCUncorrected > 0 {
			strong = append(strong, fmt.Sprintf("%d uncorrectable ECC error(s)", n.ECCUncorrected))
		}
		held := ""
		if n.SlowJobs >= opt.MinJobs && n.Score >= opt.SlowExcess {
			held = oneUsersSlowness(ps, opt)
		}
		switch {
		case n.SlowJobs >= opt.MinJobs && n.Score >= opt.SlowExcess && held == "":
			n.Drain = true
			n.Why = fmt.Sprintf("slow in %d of its %d jobs (%.1f%% over each job's median rank, decayed mean)", n.SlowJobs, n.Jobs, 100*n.Score)
			if len(strong) > 0 {
				n.Why += "; " + strings.Join(strong, "; ")
			}
		case len(strong) > 0:
			n.Drain = true
			n.Why = "hardware: " + strings.Join(strong, "; ")
		}
		if !n.Drain {
			n.Held = held
		}
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b Node) int {
		if a.Drain != b.Drain {
			if a.Drain {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(b.CostGPUHours, a.CostGPUHours), cmp.Compare(b.Score, a.Score), cmp.Compare(a.Host, b.Host))
	})
	return out
}
