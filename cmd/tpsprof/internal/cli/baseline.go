package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"

	"github.com/tpsprof/tpsprof/internal/safefs"
	"github.com/tpsprof/tpsprof/report"
	"github.com/tpsprof/tpsprof/trace"
)

// Baselines are runs kept under a name (tpsprof report --keep-baseline
// NAME JOB_DIR) to compare later runs against (--baseline NAME): a JSON
// object of names to job folders, in $TPSPROF_BASELINES or the user's
// config folder (~/.config/tpsprof/baselines.json). The folder is kept,
// not a copy of it: the run's Parquet must stay where it is.
type baselines map[string]baseline

// baseline is a kept run: its folder, its owner when kept and its
// fingerprint (its cluster and rank rows, the newest cluster part's
// time), checked on use: another user's run put at the kept path, or the
// run changed since ("36.4% faster ... gate: pass" against a folder
// swapped in), is refused, not compared against. A file written before
// fingerprints were kept names the folder alone (a string).
type baseline struct {
	Dir         string `json:"dir"`
	Owner       *int   `json:"owner,omitempty"`
	ClusterRows int64  `json:"cluster_rows"`
	RankRows    int64  `json:"rank_rows"`
	NewestPart  int64  `json:"newest_part_unix_ns"`
}

func (b *baseline) UnmarshalJSON(data []byte) error {
	var dir string
	if json.Unmarshal(data, &dir) == nil {
		*b = baseline{Dir: dir}
		return nil
	}
	type plain baseline
	return json.Unmarshal(data, (*plain)(b))
}

// fingerprint is dir's baseline as it is now.
func fingerprint(dir string) (baseline, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return baseline{}, err
	}
	b := baseline{Dir: dir, ClusterRows: trace.RowCount(filepath.Join(dir, trace.ClusterSteps)), RankRows: trace.RowCount(filepath.Join(dir, trace.RankSteps))}
	if uid, ok := safefs.Owner(fi); ok {
		b.Owner = &uid
	}
	parts, _ := trace.PartFiles(filepath.Join(dir, trace.ClusterSteps))
	for _, p := range parts {
		if pi, err := os.Stat(p); err == nil {
			b.NewestPart = max(b.NewestPart, pi.ModTime().UnixNano())
		}
	}
	return b, nil
}

var baselineName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

func baselinesPath() (string, error) {
	if p := os.Getenv("TPSPROF_BASELINES"); p != "" {
		return p, nil
	}
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("no config folder for the baselines (set TPSPROF_BASELINES): %w", err)
	}
	return filepath.Join(dir, "tpsprof", "baselines.json"), nil
}

func readBaselines() (baselines, string, error) {
	path, err := baselinesPath()
	if err != nil {
		return nil, "", err
	}
	b := baselines{}
	f, err := safefs.OpenRegular(path) // (a FIFO named there hung the report)
	if errors.Is(err, os.ErrNotExist) {
		return b, path, nil
	}
	if err != nil {
		return nil, path, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, 16<<20))
	if err != nil {
		return nil, path, err
	}
	if err := json.Unmarshal(data, &b); err != nil {
		return nil, path, fmt.Errorf("%s: not a baselines file: %w", path, err)
	}
	return b, path, nil
}

// keepBaseline records dir as the baseline called name.
func keepBaseline(name, dir string) (string, error) {
	if !baselineName.MatchString(name) {
		return "", fmt.Errorf("--keep-baseline %q: a name of 1-64 characters of [A-Za-z0-9_.-]", name)
	}
	if !report.IsJobDir(dir) {
		return "", fmt.Errorf("%s is not a job folder (OUT/JOB with cluster_steps)", dir)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	b, path, err := readBaselines()
	if err != nil {
		return "", err
	}
	fp, err := fingerprint(abs)
	if err != nil {
		return "", err
	}
	b[name] = fp
	data, _ := json.MarshalIndent(b, "", "  ")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	return path, safefs.WriteFileAtomic(path, func(f *os.File) error {
		_, err := f.Write(append(data, '\n'))
		return err
	})
}

// baselineDir is the job folder kept under name.
func baselineDir(name string) (string, error) {
	b, path, err := readBaselines()
	if err != nil {
		return "", err
	}
	kept, ok := b[name]
	if !ok {
		return "", fmt.Errorf("no baseline %q in %s (keep one with: tpsprof report --keep-baseline %s JOB_DIR)", name, path, name)
	}
	dir := kept.Dir
	if !report.IsJobDir(dir) {
		return "", fmt.Errorf("baseline %q is %s, no longer a job folder", name, dir)
	}
	if kept.Owner == nil { // kept before fingerprints: taken as it is
		return dir, nil
	}
	now, err := fingerprint(dir)
	if err != nil {
		return "", err
	}
	again := fmt.Sprintf("keep it again if it is the run you mean: tpsprof report --keep-baseline %s %s", name, dir)
	if now.Owner != nil && *now.Owner != *kept.Owner {
		return "", fmt.Errorf("baseline %q: %s is owned by uid %d, kept as uid %d's: not the run kept (%s)", name, dir, *now.Owner, *kept.Owner, again)
	}
	if now.ClusterRows != kept.ClusterRows || now.RankRows != kept.RankRows || now.NewestPart != kept.NewestPart {
		return "", fmt.Errorf("baseline %q: %s changed since it was kept (%d cluster and %d rank rows, against %d and %d): not the run kept (%s)",
			name, dir, now.ClusterRows, now.RankRows, kept.ClusterRows, kept.RankRows, again)
	}
	return dir, nil
}
