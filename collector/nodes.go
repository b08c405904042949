package collector

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/tpsprof/tpsprof/fleet"
)

// maxNodeGauges bounds the hosts /metrics exports (the drain candidates
// and the costliest first): a fleet's history must not make a scrape
// unbounded.
const maxNodeGauges = 1000

// NodesView is the fleet's node health as the collector's node pass last
// found it (docs/nodes.md): from the node rows of every finished job in
// the output folder, those computed in earlier passes (and by earlier
// collectors) read back from OUT/nodes/.
type NodesView struct {
	Nodes []fleet.Node `json:"nodes"`
	// Jobs are the finished jobs the view covers; Running those left for
	// a later pass; Failed those whose folders could not be read.
	Jobs int `json:"jobs"`
	// Computed of them were read from their folders in this pass (the
	// rest from OUT/nodes/).
	Computed int               `json:"computed"`
	Running  int               `json:"running"`
	Failed   map[string]string `json:"failed,omitempty"`
	// Unreadable are the kept node files that could not be read (each
	// recomputed from its job); KeepFailed the jobs whose rows could not
	// be kept this pass (in the view all the same).
	Unreadable map[string]string `json:"unreadable,omitempty"`
	KeepFailed int               `json:"keep_failed,omitempty"`
	At         time.Time         `json:"at"`
	Err        string            `json:"error,omitempty"`
}

// nodePass keeps the node health: at start (what earlier collectors kept
// is there at once) and every NodesEvery, a scan of the output folder on
// this goroutine, under no lock (it reads and writes files).
func (c *Collector) nodePass() {
	defer c.wg.Done()
	tick := time.NewTicker(c.cfg.NodesEvery)
	defer tick.Stop()
	c.refreshNodes()
	for {
		select {
		case <-c.done:
			return
		case <-tick.C:
			c.refreshNodes()
		case ack := <-c.nodesNow:
			c.refreshNodes()
			close(ack)
		}
	}
}

func (c *Collector) refreshNodes() {
	v := &NodesView{At: time.Now()}
	s, err := fleet.ScanDirWith(c.cfg.OutDir, fleet.ScanOptions{Write: true, Stop: c.done, Retention: c.cfg.NodesRetention})
	if errors.Is(err, fleet.ErrStopped) {
		return // closing
	}
	if err != nil {
		v.Err = err.Error()
		c.log.Warn("nodes", "node health pass failed", "err", err)
	}
	if s != nil {
		v.Nodes = fleet.Health(s.Rows, fleet.DefaultOptions())
		v.Jobs, v.Computed, v.Running, v.Failed = s.Jobs, s.Computed, s.Running, s.Failed
		v.Unreadable, v.KeepFailed = s.Unreadable, s.KeepFailed
		for job, why := range s.Unreadable {
			c.log.Warn("nodes", "kept node rows unreadable: recomputed from the job's folder", "job", job, "err", why)
		}
		if s.KeepFailed > 0 {
			c.log.Warn("nodes", "node rows not kept (the view is whole; computed again next pass)", "jobs", s.KeepFailed, "err", s.KeepErr)
		}
		c.n.nodeUnreadable.Add(int64(len(s.Unreadable)))
		c.n.nodeKeepFailed.Add(int64(s.KeepFailed))
	}
	c.nodes.Store(v)
}

// Nodes is the node health of the last pass (nil before the first, or
// when NodesEvery is negative).
func (c *Collector) Nodes() *NodesView { return c.nodes.Load() }

// RefreshNodes runs a node pass now (one that starts after the call) and
// waits for it, at most timeout; false if none ended in time or passes
// are off.
func (c *Collector) RefreshNodes(timeout time.Duration) bool {
	if c.nodesNow == nil {
		return false
	}
	ack := make(chan struct{})
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case c.nodesNow <- ack:
	case <-c.done:
		return false
	case <-t.C:
		return false
	}
	select {
	case <-ack:
		return true
	case <-c.done:
		return false
	case <-t.C:
		return false
	}
}

// nodeState is the collector's node-pass state.
type nodeState struct {
	nodes    atomic.Pointer[NodesView]
	nodesNow chan chan struct{}
}
