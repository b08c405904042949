package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/tpsprof/tpsprof/launch"
	"github.com/tpsprof/tpsprof/report"
)

// trackerTarget is where report --tensorboard/--mlflow/--wandb writes the
// run's figures, text and plots: the Python package the binary carries
// does it (python/tpsprof/_report_to.py) with the tracker's own package,
// in the Python the user names.
type trackerTarget struct {
	tensorboard, mlflow, wandb, wandbProject, python string
}

func (t *trackerTarget) count() int {
	n := 0
	for _, v := range []string{t.tensorboard, t.mlflow, t.wandb} {
		if v != "" {
			n++
		}
	}
	return n
}

// trackerPayload is what _report_to reads.
type trackerPayload struct {
	Job      string             `json:"job"`
	Step     int64              `json:"step"`
	Figures  map[string]float64 `json:"figures"`
	Markdown string             `json:"markdown"`
	Plots    []string           `json:"plots"`
}

// write hands the report to the tracker (nothing without a target) and
// says what it wrote; the exit code of the report command.
func (t *trackerTarget) write(rep *report.Report, plots []string, stdout, stderr io.Writer) int {
	if t.count() == 0 {
		return exitOK
	}
	p := trackerPayload{Job: rep.Job, Figures: rep.TrackerFigures(), Plots: []string{}}
	for _, a := range rep.Attempts {
		p.Step = max(p.Step, a.LastStep)
	}
	var md bytes.Buffer
	report.WriteMarkdown(&md, rep)
	p.Markdown = md.String()
	for _, f := range plots {
		if strings.HasSuffix(f, ".png") {
			abs, err := filepath.Abs(f)
			if err == nil {
				p.Plots = append(p.Plots, abs)
			}
		}
	}
	err := t.run(p, stdout, stderr)
	if err != nil {
		failErr(stderr, "report", err)
		return exitError
	}
	return exitOK
}

func (t *trackerTarget) run(p trackerPayload, stdout, stderr io.Writer) error {
	pkg, err := launch.PackageDir("")
	if err != nil {
		return fmt.Errorf("the Python package: %w", err)
	}
	f, err := os.CreateTemp("", "tpsprof-report-*.json")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	err = json.NewEncoder(f).Encode(p)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	args := []string{"-m", "tpsprof._report_to"}
	switch {
	case t.tensorboard != "":
		dir, err := filepath.Abs(t.tensorboard)
		if err != nil {
			return err
		}
		args = append(args, "--tensorboard", dir)
	case t.mlflow != "":
		args = append(args, "--mlflow", t.mlflow) // a run id (the tracking URI from the environment)
	default:
		args = append(args, "--wandb", t.wandb)
		if t.wandbProject != "" {
			args = append(args, "--wandb-project", t.wandbProject)
		}
	}
	cmd := exec.Command(t.python, append(args, f.Name())...)
	path := pkg
	if old := os.Getenv("PYTHONPATH"); old != "" {
		path += string(os.PathListSeparator) + old
	}
	// `python -m` puts its working folder first on sys.path: in a shared
	// folder another user's json.py (or tpsprof/) ran as the caller. The
	// child works in the package's own folder (which -m then puts first:
	// ours), with PYTHONSAFEPATH set (Python 3.11 and later add nothing).
	// MLflow's default store (./mlruns) is the caller's folder: said by its
	// URI when the environment names none.
	cmd.Dir = pkg
	cmd.Env = append(os.Environ(), "PYTHONPATH="+path, "PYTHONSAFEPATH=1")
	if wd, err := os.Getwd(); err == nil && t.mlflow != "" && os.Getenv("MLFLOW_TRACKING_URI") == "" {
		cmd.Env = append(cmd.Env, "MLFLOW_TRACKING_URI=file://"+filepath.Join(wd, "mlruns"))
	}
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", t.python, strings.Join(args, " "), err)
	}
	var got struct {
		Tracker string `json:"tracker"`
		Where   string `json:"where"`
		Figures int    `json:"figures"`
		Plots   int    `json:"plots"`
	}
	if err := json.Unmarshal(lastLine(out.Bytes()), &got); err != nil {
		return fmt.Errorf("%s said %q: %w", t.python, out.String(), err)
	}
	fmt.Fprintf(stdout, "%s: %d figures, the report's text and %d plots written to %s\n", got.Tracker, got.Figures, got.Plots, got.Where)
	return nil
}

// lastLine is b's last non-empty line (a tracker may print before it).
func lastLine(b []byte) []byte {
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	return lines[len(lines)-1]
}
