package cli

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/cmd/tpsprof/internal/demo"
)

// report into a tracker: one at a time, never with --compare; a Python
// without the package is a clear error, and a folder given after a
// tracker's flag is that flag's value, not a job folder (the flag set says
// which flags take values).
func TestReportIntoTrackerFlags(t *testing.T) {
	_, e, code := run(t, "report", "a", "--tensorboard", "x", "--mlflow", "y")
	if code != exitUsage || !strings.Contains(e, "one at a time") {
		t.Errorf("two trackers: exit %d, %q", code, e)
	}
	_, e, code = run(t, "report", "--compare", "a", "b", "--wandb", "r")
	if code != exitUsage || !strings.Contains(e, "one at a time") {
		t.Errorf("--compare into a tracker: exit %d, %q", code, e)
	}
	// two folders would be a usage error; DIR is --tensorboard's value
	_, e, code = run(t, "report", "--tensorboard", "tb-out", t.TempDir())
	if code != exitError || !strings.Contains(e, "no cluster steps") {
		t.Errorf("--tensorboard DIR JOB: exit %d, %q (want the job folder read and refused as empty)", code, e)
	}
}

// report --tensorboard runs its Python child outside the caller's working
// folder: another user's json.py planted in a shared folder the caller
// works in ran as the caller (python -m puts the working folder first on
// sys.path).
func TestTrackerPythonIgnoresTheWorkingFolder(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is needed")
	}
	out := t.TempDir()
	cfg := demo.Defaults()
	cfg.Out, cfg.Steps, cfg.StepInterval = out, 20, 0
	res, err := demo.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	shared := t.TempDir()
	marker := filepath.Join(t.TempDir(), "planted-ran")
	for _, name := range []string{"json.py", "argparse.py"} {
		if err := os.WriteFile(filepath.Join(shared, name), []byte("open("+fmt.Sprintf("%q", marker)+", 'w').write('ran')\nraise SystemExit(3)\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(shared, "tpsprof"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(shared, "tpsprof", "__init__.py"), []byte("open("+fmt.Sprintf("%q", marker)+", 'w').write('ran')\n"), 0o644)
	wd, _ := os.Getwd()
	if err := os.Chdir(shared); err != nil {
		t.Fatal(err)
	}
	defer os.Chdir(wd)
	_, e, code := run(t, "report", "--no-plots", "--python", py, "--tensorboard", "tb", res.JobDir)
	if _, err := os.Stat(marker); err == nil {
		t.Fatalf("a module planted in the working folder ran (exit %d): %s", code, e)
	}
	// (the tensorboard package may be missing in this Python: then a clear
	// error, from our own module, not from the planted ones)
	if code != exitOK && !strings.Contains(e, "tensorboard") {
		t.Errorf("exit %d: %s", code, e)
	}
}
