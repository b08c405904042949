package report

import (
	"cmp"
	"os"
	"path/filepath"
	"slices"

	"github.com/tpsprof/tpsprof/internal/safefs"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// FleetJobsRead bounds the other jobs whose events the checkpoint advice
// reads for the fleet's interruption rate (the newest first).
const FleetJobsRead = 200

// fleetRate is the interruptions and run time of the other finished jobs
// of a collector's output folder: the fleet's history, for a run too short
// to have its own rate.
type fleetRate struct {
	jobs, interruptions int
	elapsedS            float64
}

// fleetInterruptions reads the events of the other jobs of out (not
// self) whose folders the same user owns: each attempt's start and end events give its run time (attempts
// without both are left out of it), an attempt that ended with a non-zero
// exit code, or recorded no end before a later attempt, an interruption.
// Only events tables are read.
func fleetInterruptions(out, self string) fleetRate {
	entries, err := os.ReadDir(out)
	if err != nil {
		return fleetRate{}
	}
	type job struct {
		dir string
		mod int64
	}
	// only the jobs of the same user as self's folder: one user's junk
	// jobs in a shared folder must not set everyone's rate
	uid, known := -1, false
	if fi, err := os.Stat(filepath.Join(out, self)); err == nil {
		uid, known = safefs.Owner(fi)
	}
	var jobs []job
	for _, e := range entries {
		if !e.IsDir() || e.Name() == self {
			continue
		}
		dir := filepath.Join(out, e.Name())
		fi, err := os.Stat(filepath.Join(dir, trace.Events))
		if err != nil || !IsJobDir(dir) {
			continue
		}
		if d, err := os.Stat(dir); known && (err != nil || !sameOwner(d, uid)) {
			continue
		}
		jobs = append(jobs, job{dir, fi.ModTime().UnixNano()})
	}
	slices.SortFunc(jobs, func(a, b job) int { return cmp.Compare(b.mod, a.mod) })
	var r fleetRate
	for _, j := range jobs[:min(len(jobs), FleetJobsRead)] {
		events, err := AttemptEvents(j.dir)
		if err != nil {
			continue
		}
		n, s, ok := interruptionsOf(events)
		if !ok {
			continue
		}
		r.jobs++
		r.interruptions += n
		r.elapsedS += s
	}
	return r
}

func sameOwner(fi os.FileInfo, uid int) bool {
	u, ok := safefs.Owner(fi)
	return ok && u == uid
}

// interruptionsOf is a job's interruptions and run time from its attempt
// events; ok is false without a complete attempt.
func interruptionsOf(events []tps.Event) (n int, elapsedS float64, ok bool) {
	type span struct {
		start, end int64
		exit       int64
		ended      bool
	}
	at := map[int64]*span{}
	get := func(a int64) *span {
		s := at[a]
		if s == nil {
			s = &span{}
			at[a] = s
		}
		return s
	}
	for _, e := range events {
		switch e.Kind {
		case tps.EventAttemptStart, tps.EventJobStart:
			s := get(e.Attempt)
			if s.start == 0 || e.StartUnixNs < s.start {
				s.start = e.StartUnixNs
			}
		case tps.EventAttemptEnd, tps.EventJobEnd:
			s := get(e.Attempt)
			s.end = max(s.end, e.EndUnixNs, e.StartUnixNs)
			s.ended = true
			if e.ExitCode != 0 {
				s.exit = e.ExitCode
			}
		}
	}
	last := int64(-1)
	for a := range at {
		last = max(last, a)
	}
	for a, s := range at {
		if (s.ended && s.exit != 0) || (!s.ended && a < last) {
			n++
		}
		if s.start > 0 && s.ended && s.end > s.start {
			elapsedS += float64(s.end-s.start) / 1e9
			ok = true
		}
	}
	return n, elapsedS, ok
}
