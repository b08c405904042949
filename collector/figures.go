package collector

import (
	"encoding/json"
	"time"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/wire"
)

// publishFigures publishes, every FiguresEvery, the cluster figures of
// each job a step closed for since the last time (wire.FiguresSubject):
// the agents hand them to the job's rank 0, which logs them into the
// job's tracker run. It reads the figures the live page reads (no job
// lock); a publish is a buffered write to the connection.
func (c *Collector) publishFigures() {
	defer c.wg.Done()
	t := time.NewTicker(c.cfg.FiguresEvery)
	defer t.Stop()
	sent := map[*job]int64{} // the last step published, by job
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
		}
		live := map[*job]bool{}
		for _, j := range c.jobList() {
			live[j] = true
			f := j.live.Load()
			if f.last == nil || f.ended {
				continue
			}
			if last, ok := sent[j]; ok && last == f.last.Step {
				continue
			}
			sent[j] = f.last.Step
			b, err := json.Marshal(clusterFigures(j.st.id, f))
			if err == nil {
				err = c.nc.Publish(wire.FiguresSubject(j.st.id), b)
			}
			if err != nil {
				c.cfg.Logger.Debug("cluster figures not published", "job", j.st.id, "err", err)
			}
		}
		for j := range sent {
			if !live[j] {
				delete(sent, j) // evicted
			}
		}
	}
}

// clusterFigures are a job's published live figures as the wire carries
// them.
func clusterFigures(id string, f *liveFigures) wire.ClusterFigures {
	out := wire.ClusterFigures{Job: id, Step: f.last.Step, WindowSteps: f.win.steps, MFU: fraction(f.win.mfu), HFU: fraction(f.win.hfu),
		Shares: map[string]float64{}, EpisodesOpen: f.episodesOpen, Stragglers: f.stragglers, MFUCounted: f.win.counted}
	if f.win.tpsUnknown == "" && f.win.tps > 0 {
		v := f.win.tps
		out.TPS = &v
	}
	for _, p := range tps.ShareParts() {
		out.Shares[p.Key] = *p.Of(&f.win.shares)
	}
	if l, _ := f.win.ledger(); l != nil {
		out.MFULost = map[string]float64{}
		for _, b := range l.Lost {
			out.MFULost[b.Key] = b.Points
		}
	}
	return out
}

// fraction is p where it is a fraction in [0, 1], else nil (unknown: a
// utilisation past 100% is never passed on).
func fraction(p *float64) *float64 {
	if p == nil || !(*p >= 0 && *p <= 1) {
		return nil
	}
	return p
}
