package collector

import (
	"encoding/json"
	"errors"
	"io/fs"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
	"github.com/tpsprof/tpsprof/wire"
)

// attemptBook keeps, per job, what `tpsprof launch` needs to choose the
// attempt of a new launch (docs/capture.md, "Attempts and runs"): the
// highest attempt seen and which attempts nodes started and have not ended.
// It has its own lock, taken for map updates only: the step path touches
// it once per batch.
type attemptBook struct {
	mu   sync.Mutex
	jobs map[string]*jobAttempts
}

// maxBookJobs bounds the book; past it, the job seen least recently goes
// (a request for it then reads the job's folder).
const maxBookJobs = 10000

type jobAttempts struct {
	max     int64
	has     bool
	onDisk  bool // the job's folder was read into this entry
	seen    time.Time
	started map[int64]*launchNodes
}

type launchNodes struct {
	since          int64               // earliest attempt_start
	started, ended map[string]struct{} // nodes
}

func (b *attemptBook) entry(job string) *jobAttempts {
	if b.jobs == nil {
		b.jobs = map[string]*jobAttempts{}
	}
	j := b.jobs[job]
	if j == nil {
		if len(b.jobs) >= maxBookJobs {
			var oldest string
			var at time.Time
			for id, e := range b.jobs {
				if oldest == "" || e.seen.Before(at) {
					oldest, at = id, e.seen
				}
			}
			delete(b.jobs, oldest)
		}
		j = &jobAttempts{max: -1, started: map[int64]*launchNodes{}}
		b.jobs[job] = j
	}
	j.seen = time.Now()
	return j
}

// sawRecords notes step records of attempts up to max.
func (b *attemptBook) sawRecords(job string, maxAttempt int64) {
	b.mu.Lock()
	j := b.entry(job)
	j.has = true
	j.max = max(j.max, maxAttempt)
	b.mu.Unlock()
}

// sawEvent notes an attempt event.
func (b *attemptBook) sawEvent(e tps.Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e.Attempt < 0 || e.Attempt > tps.MaxAttempt {
		return // never validated (files written before the bound): ignored
	}
	j := b.entry(e.Job)
	j.has = true
	j.max = max(j.max, e.Attempt)
	switch e.Kind {
	case tps.EventAttemptStart, tps.EventAttemptEnd:
	default:
		return
	}
	l := j.started[e.Attempt]
	if l == nil {
		if len(j.started) >= 64 { // only recent attempts matter
			for a := range j.started {
				if a < e.Attempt-32 {
					delete(j.started, a)
				}
			}
		}
		l = &launchNodes{since: e.StartUnixNs, started: map[string]struct{}{}, ended: map[string]struct{}{}}
		j.started[e.Attempt] = l
	}
	if e.Kind == tps.EventAttemptStart {
		l.started[e.Node] = struct{}{}
		l.since = min(l.since, e.StartUnixNs)
	} else {
		l.ended[e.Node] = struct{}{}
	}
}

// reply answers for a job the book holds; ok is false when it holds none.
func (b *attemptBook) reply(job string) (wire.AttemptReply, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	j := b.jobs[job]
	if j == nil {
		return wire.AttemptReply{}, false
	}
	r := wire.AttemptReply{HasData: j.has, MaxAttempt: max(j.max, 0), Running: -1}
	for a, l := range j.started {
		if len(l.started) > len(l.ended) && a > r.Running {
			r.Running, r.RunningSinceUnixNs = a, l.since
		}
	}
	return r, true
}

// readFromDisk reports whether the job's folder was merged into the book.
func (b *attemptBook) readFromDisk(job string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	j := b.jobs[job]
	return j != nil && j.onDisk
}

// merge adds what a folder holds to the book.
func (b *attemptBook) merge(job string, disk wire.AttemptReply) {
	b.mu.Lock()
	defer b.mu.Unlock()
	j := b.entry(job)
	j.onDisk = true
	if disk.HasData {
		j.has = true
		j.max = max(j.max, min(disk.MaxAttempt, tps.MaxAttempt))
	}
}

// attemptsOnDisk reads a job's attempts from its folder (events and
// cluster rows) when the book has none: after a restart, or eviction.
func attemptsOnDisk(out, job string) (wire.AttemptReply, error) {
	r := wire.AttemptReply{Running: -1}
	root := filepath.Join(out, job)
	events, err := trace.ReadAll[tps.Event](filepath.Join(root, trace.Events))
	if err != nil && !errors.Is(err, fs.ErrNotExist) && !trace.IsUnreadable(err) {
		return r, err
	}
	var b attemptBook
	for _, e := range events {
		b.sawEvent(e)
	}
	if got, ok := b.reply(job); ok {
		r = got
	}
	maxSeen := int64(-1)
	if r.HasData {
		maxSeen = r.MaxAttempt
	}
	err = trace.EachColumns(filepath.Join(root, trace.ClusterSteps), []string{"attempt"}, "", func(c *trace.Columns) error {
		for _, a := range c.Int64[0][:c.Rows] {
			if a <= tps.MaxAttempt { // rows written before the bound may hold any value
				maxSeen = max(maxSeen, a)
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) && !trace.IsUnreadable(err) {
		return r, err
	}
	if maxSeen >= 0 {
		r.HasData, r.MaxAttempt = true, maxSeen
	}
	return r, nil
}

// handleAttempt answers `tpsprof launch`. It runs on the subscription's own
// goroutine: a folder read here stalls no step.
func (c *Collector) handleAttempt(m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	job, kind, _, err := wire.ParseSubject(m.Subject)
	if err != nil || kind != "attempt" {
		c.reject("subject:invalid", 1)
		return
	}
	if !c.mine(job, "") {
		return
	}
	if !c.attempts.readFromDisk(job) {
		// What earlier collectors wrote counts too: read the folder once
		// per job (outside every lock) and merge it into the book.
		disk, err := attemptsOnDisk(c.cfg.OutDir, job)
		if err != nil {
			c.log.Warn("attempt", "cannot read the job's attempts", "job", job, "err", err)
		}
		c.attempts.merge(job, disk)
	}
	r, _ := c.attempts.reply(job)
	data, _ := json.Marshal(r)
	_ = m.Respond(data)
}
