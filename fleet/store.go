package fleet

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/parquet-go/parquet-go"

	"github.com/tpsprof/tpsprof/internal/memo"
	"github.com/tpsprof/tpsprof/internal/safefs"
	"github.com/tpsprof/tpsprof/report"
	"github.com/tpsprof/tpsprof/trace"
)

// Table is the output folder's table of node rows: one Parquet file per
// finished job (<job>.parquet, JobNode rows), readable by DuckDB as
// read_parquet('OUT/nodes/*.parquet') (docs/parquet.md).
const Table = "nodes"

// Scan is what one pass over an output folder found.
type Scan struct {
	Rows []JobNode `json:"-"`
	// Jobs are the finished jobs whose rows are in Rows; Computed of them
	// were read from their folders in this pass (the rest from nodes/);
	// Running the jobs left for later (parts still written, or an attempt
	// open); Failed the jobs that could not be read, with why.
	Jobs     int               `json:"jobs"`
	Computed int               `json:"computed"`
	Running  int               `json:"running"`
	Failed   map[string]string `json:"failed,omitempty"`
	// Unreadable are the kept node files that could not be read (a
	// corrupt or lying file, a row out of range), with why: each was
	// recomputed from its job's folder.
	Unreadable map[string]string `json:"unreadable,omitempty"`
	// KeepFailed counts the jobs whose node rows could not be kept (a full
	// disk), KeepErr the first error: their rows are in the view all the
	// same, computed again next pass.
	KeepFailed int    `json:"keep_failed,omitempty"`
	KeepErr    string `json:"keep_error,omitempty"`
	// Removed counts the kept node files past the retention removed
	// (Retention), and temporaries left by an interrupted pass.
	Removed int `json:"removed,omitempty"`
}

// ScanDir reads the node rows of every finished job of the output folder
// out, computing and keeping (in out/nodes/) those of the jobs not seen
// since they last changed. A job still running is left for a later scan.
// write false reads and computes without keeping anything (a read-only
// output folder).
func ScanDir(out string, write bool) (*Scan, error) {
	return ScanDirWith(out, ScanOptions{Write: write})
}

// ErrStopped: a scan's Stop closed before it read every job (what it read
// so far is kept).
var ErrStopped = errors.New("fleet: scan stopped")

// ScanDirUntil is ScanDir, which stops between two jobs once stop is
// closed (a collector closing does not wait for a long first pass).
func ScanDirUntil(out string, write bool, stop <-chan struct{}) (*Scan, error) {
	return ScanDirWith(out, ScanOptions{Write: write, Stop: stop})
}

// ScanOptions are how a scan reads and keeps.
type ScanOptions struct {
	// Write keeps the node rows computed in out/nodes/ (false: a
	// read-only output folder).
	Write bool
	// Stop ends the scan between two jobs once closed.
	Stop <-chan struct{}
	// Retention leaves out the jobs whose folders last changed longer ago
	// (their kept node files removed, when writing): the fleet's view and
	// its files bounded by age (0: every job).
	Retention time.Duration
	// Now is the scan's time (zero: time.Now()).
	Now time.Time
}

// ScanDirWith is ScanDir with its options.
func ScanDirWith(out string, o ScanOptions) (*Scan, error) {
	jobs, err := report.Jobs(out)
	if err != nil {
		return nil, err
	}
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	write, stop := o.Write, o.Stop
	dir := filepath.Join(out, Table)
	made := false
	s := &Scan{}
	if write {
		s.Removed += removeTemporaries(dir, o.Now)
	}
	for _, j := range jobs {
		select {
		case <-stop:
			return s, ErrStopped
		default:
		}
		if o.Retention > 0 && o.Now.Sub(changed(j)) > o.Retention {
			if write && os.Remove(filepath.Join(dir, j.Name+".parquet")) == nil {
				s.Removed++
			}
			continue
		}
		if j.Running {
			s.Running++
			continue
		}
		path := filepath.Join(dir, j.Name+".parquet")
		if fi, err := os.Lstat(path); err == nil && fi.Mode().IsRegular() && !fi.ModTime().Before(changed(j)) {
			rows, err := keptRows(path, fi)
			if err == nil {
				s.Rows = append(s.Rows, rows...)
				s.Jobs++
				continue
			}
			if s.Unreadable == nil {
				s.Unreadable = map[string]string{}
			}
			s.Unreadable[j.Name] = err.Error() // recomputed below, and kept again
		}
		rows, err := JobNodes(j.Dir, j.Name)
		if err == nil {
			for i := range rows {
				if cerr := rows[i].Check(); cerr != nil { // (absurd records: the job is left out, not a NaN in the view)
					err = fmt.Errorf("fleet: %s: node %s: %w", j.Name, rows[i].Key, cerr)
					break
				}
			}
		}
		if err != nil {
			if s.Failed == nil {
				s.Failed = map[string]string{}
			}
			s.Failed[j.Name] = err.Error()
			continue
		}
		s.Computed++
		s.Jobs++
		s.Rows = append(s.Rows, rows...)
		if write {
			if !made { // made at the first job kept: a folder without finished jobs stays as it was
				if err := os.MkdirAll(dir, 0o755); err != nil {
					if s.KeepFailed++; s.KeepErr == "" {
						s.KeepErr = fmt.Sprintf("fleet: %v", err)
					}
					write = false
					continue
				}
				made = true
			}
			if err := writeRows(path, rows); err != nil {
				// the view is still whole: a failed keep costs the next
				// pass this job's computation again
				if s.KeepFailed++; s.KeepErr == "" {
					s.KeepErr = fmt.Sprintf("fleet: keeping %s's node rows: %v", j.Name, err)
				}
			}
		}
	}
	return s, nil
}

// changed is when a job's folder last changed in what its node rows
// read: a part renamed into (or removed from) rank_steps, cluster_steps or
// gpu_samples changes that folder's time. (The cluster rows' time alone
// missed rank rows finalised a moment after them.)
func changed(j report.JobInfo) time.Time {
	t := j.Modified
	for _, table := range []string{trace.RankSteps, trace.ClusterSteps, trace.GPUSamples} {
		if fi, err := os.Stat(filepath.Join(j.Dir, table)); err == nil && fi.ModTime().After(t) {
			t = fi.ModTime()
		}
	}
	return t
}

// ReadTable reads every node row kept in out/nodes/ (the jobs a collector
// or an earlier scan computed), without looking at the jobs' folders. A
// file it cannot read is skipped, named in an *UnreadableFiles error
// returned with the other files' rows.
func ReadTable(out string) ([]JobNode, error) {
	entries, err := os.ReadDir(filepath.Join(out, Table))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var rows []JobNode
	var bad []error
	for _, e := range entries {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".parquet") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		rs, err := readRows(filepath.Join(out, Table, e.Name()))
		if err != nil {
			bad = append(bad, err)
			continue
		}
		rows = append(rows, rs...)
	}
	if len(bad) > 0 {
		return rows, &UnreadableFiles{Errs: bad}
	}
	return rows, nil
}

// UnreadableFiles names the node files ReadTable skipped (the rows of the
// others were read).
type UnreadableFiles struct{ Errs []error }

func (u *UnreadableFiles) Error() string {
	return fmt.Sprintf("fleet: %d unreadable node file(s) skipped: %v", len(u.Errs), errors.Join(u.Errs...))
}

// readRows reads a kept node file through the trace package's checked
// reader (a footer's claims bounded by the file's bytes: a 124 KB file
// claiming 64 row groups of 4 Mi rows was allocated whole), every row
// checked (Check): a file with one bad row is unreadable whole.
func readRows(path string) ([]JobNode, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("fleet: %s: not a regular file", path)
	}
	if fi.Size() == 0 {
		return nil, fmt.Errorf("fleet: %s: empty file", path)
	}
	if fi.Size() > maxNodeFile {
		return nil, fmt.Errorf("fleet: %s: %d bytes, more than a job's node rows take (%d)", path, fi.Size(), maxNodeFile)
	}
	rows, err := trace.ReadFile[JobNode](path)
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	if len(rows) > maxNodeRows {
		return nil, fmt.Errorf("fleet: %s: %d rows, more than a job has nodes (%d)", path, len(rows), maxNodeRows)
	}
	job := strings.TrimSuffix(filepath.Base(path), ".parquet")
	for i := range rows {
		if err := rows[i].Check(); err != nil {
			return nil, fmt.Errorf("fleet: %s: row %d: %w", path, i, err)
		}
		if rows[i].Job != job {
			return nil, fmt.Errorf("fleet: %s: row %d names job %q", path, i, rows[i].Job)
		}
	}
	return slices.Clip(rows), nil
}

// keptRows is readRows, remembered while the file's time and size are
// unchanged: a pass after the first costs a finished job its stats (the
// node files' footers and rows were 1.4 s of a 1.8 s pass over 2,000
// kept jobs).
func keptRows(path string, fi os.FileInfo) ([]JobNode, error) {
	return keptCache.Get(path, keptKey{fi.ModTime(), fi.Size()}, false, func() ([]JobNode, error) { return readRows(path) })
}

// keptCache remembers the node files read (a few rows each), at most
// 100,000 of them.
var keptCache = memo.Memo[keptKey, []JobNode]{Max: 100_000}

type keptKey struct {
	mod  time.Time
	size int64
}

// maxNodeRows bounds a job's node rows (one a GPU: 100,000 GPUs), and
// maxNodeFile a kept file's bytes (those rows take ~100 B each).
const (
	maxNodeRows = 100_000
	maxNodeFile = 64 << 20
)

// removeTemporaries removes what an interrupted keep left in the node
// table (.<job>.parquet.*.tmp) once older than an hour: no keep takes that
// long, so none is being written.
func removeTemporaries(dir string, now time.Time) int {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || !strings.HasPrefix(name, ".") || !strings.HasSuffix(name, ".tmp") || !strings.Contains(name, ".parquet.") {
			continue
		}
		if fi, err := e.Info(); err == nil && now.Sub(fi.ModTime()) > time.Hour && os.Remove(filepath.Join(dir, name)) == nil {
			n++
		}
	}
	return n
}

func writeRows(path string, rows []JobNode) error {
	return safefs.WriteFileAtomic(path, func(f *os.File) error {
		return parquet.Write(f, rows, parquet.Compression(&parquet.Zstd))
	})
}
