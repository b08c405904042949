package cli

import (
	"strings"
	"testing"
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
