package report

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/tpsprof/tpsprof/trace"
)

// JobInfo is one job folder of a collector's output folder.
type JobInfo struct {
	Name string `json:"name"`
	Dir  string `json:"dir"`
	// Parts are the finalised parts of its cluster_steps; OpenParts those
	// still being written (the job is running).
	Parts     int       `json:"parts"`
	OpenParts int       `json:"open_parts"`
	Modified  time.Time `json:"modified"`
	// Running: parts still being written, or its newest attempt recorded
	// a start and no end while its steps were written within RunningQuiet
	// (RunningWhy says which).
	Running    bool   `json:"running"`
	RunningWhy string `json:"running_why,omitempty"`
}

// IsJobDir reports whether dir holds a job's tables (cluster_steps or
// rank_steps).
func IsJobDir(dir string) bool {
	for _, t := range []string{trace.ClusterSteps, trace.RankSteps} {
		if fi, err := os.Stat(filepath.Join(dir, t)); err == nil && fi.IsDir() {
			return true
		}
	}
	return false
}

// Jobs lists the job folders of a collector's output folder (those with a
// cluster_steps or rank_steps table), most recently modified first.
func Jobs(outDir string) ([]JobInfo, error) {
	entries, err := os.ReadDir(outDir)
	if err != nil {
		return nil, err
	}
	var out []JobInfo
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(outDir, e.Name())
		if !IsJobDir(dir) {
			continue
		}
		cl := filepath.Join(dir, trace.ClusterSteps)
		fi, err := os.Stat(cl)
		if err != nil {
			fi, _ = os.Stat(dir)
		}
		files, _ := trace.PartFiles(cl)
		j := JobInfo{Name: e.Name(), Dir: dir, Parts: len(files), OpenParts: trace.OpenParts(cl) + trace.OpenParts(filepath.Join(dir, trace.RankSteps)), Modified: fi.ModTime()}
		if j.OpenParts > 0 {
			j.Running, j.RunningWhy = true, fmt.Sprintf("%d part(s) still being written", j.OpenParts)
		} else if events, err := AttemptEvents(dir); err == nil {
			if why := openAttempt(events, cl, time.Now()); why != "" {
				j.Running, j.RunningWhy = true, why
			}
		}
		out = append(out, j)
	}
	slices.SortFunc(out, func(a, b JobInfo) int { return b.Modified.Compare(a.Modified) })
	return out, nil
}
