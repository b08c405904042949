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
}

// ScanDir reads the node rows of every finished job of the output folder
// out, computing and keeping (in out/nodes/) those of the jobs not seen
// since they last changed. A job still running is left for a later scan.
// write false reads and computes without keeping anything (a read-only
// output folder).
func ScanDir(out string, write bool) (*Scan, error) { return ScanDirUntil(out, write, nil) }

// ErrStopped: ScanDirUntil's stop closed before it read every job (what
// it read so far is kept).
var ErrStopped = errors.New("fleet: scan stopped")

// ScanDirUntil is ScanDir, which stops between two jobs once stop is
// closed (a collector closing does not wait for a long first pass).
func ScanDirUntil(out string, write bool, stop <-chan struct{}) (*Scan, error) {
	jobs, err := report.Jobs(out)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(out, Table)
	made := false
	s := &Scan{}
	for _, j := range jobs {
		select {
		case <-stop:
			return s, ErrStopped
		default:
		}
		if j.Running {
			s.Running++
			continue
		}
		path := filepath.Join(dir, j.Name+".parquet")
		if fi, err := os.Lstat(path); err == nil && fi.Mode().IsRegular() && !fi.ModTime().Before(changed(j)) {
			if rows, err := readRows(path); err == nil {
				s.Rows = append(s.Rows, rows...)
				s.Jobs++
				continue
			}
		}
		rows, err := JobNodes(j.Dir, j.Name)
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
					return s, fmt.Errorf("fleet: %w", err)
				}
				made = true
			}
			if err := writeRows(path, rows); err != nil {
				return s, fmt.Errorf("fleet: keeping %s's node rows: %w", j.Name, err)
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
// or an earlier scan computed), without looking at the jobs' folders.
func ReadTable(out string) ([]JobNode, error) {
	entries, err := os.ReadDir(filepath.Join(out, Table))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var rows []JobNode
	for _, e := range entries {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".parquet") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		rs, err := readRows(filepath.Join(out, Table, e.Name()))
		if err != nil {
			return nil, err
		}
		rows = append(rows, rs...)
	}
	return rows, nil
}

func readRows(path string) ([]JobNode, error) {
	f, err := safefs.OpenRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() == 0 {
		return nil, fmt.Errorf("fleet: %s: empty file", path)
	}
	rows, err := parquet.Read[JobNode](f, fi.Size())
	if err != nil {
		return nil, fmt.Errorf("fleet: %s: %w", path, err)
	}
	return slices.Clip(rows), nil
}

func writeRows(path string, rows []JobNode) error {
	return safefs.WriteFileAtomic(path, func(f *os.File) error {
		return parquet.Write(f, rows, parquet.Compression(&parquet.Zstd))
	})
}
