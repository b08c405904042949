package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"github.com/tpsprof/tpsprof/internal/safefs"
	"github.com/tpsprof/tpsprof/report"
)

// Baselines are runs kept under a name (tpsprof report --keep-baseline
// NAME JOB_DIR) to compare later runs against (--baseline NAME): a JSON
// object of names to job folders, in $TPSPROF_BASELINES or the user's
// config folder (~/.config/tpsprof/baselines.json). The folder is kept,
// not a copy of it: the run's Parquet must stay where it is.
type baselines map[string]string

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
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return b, path, nil
	}
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
	b[name] = abs
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
	dir, ok := b[name]
	if !ok {
		return "", fmt.Errorf("no baseline %q in %s (keep one with: tpsprof report --keep-baseline %s JOB_DIR)", name, path, name)
	}
	if !report.IsJobDir(dir) {
		return "", fmt.Errorf("baseline %q is %s, no longer a job folder", name, dir)
	}
	return dir, nil
}
