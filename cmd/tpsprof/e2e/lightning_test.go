package e2e

import (
	"os/exec"
	"path/filepath"
	"testing"
)

// A Lightning fit (a tiny next-token model, gradient accumulation of 2,
// validation every 10 micro-batches, ModelCheckpoint every 6 optimizer
// steps) measured by tpsprof.lightning.TpsprofCallback and nothing else,
// held to the job's own truth as the Trainer callback is: every optimizer
// step one row with exactly the tokens of the micro-batches Lightning
// handed to training_step, a loss, inside the job's own step; validations
// and checkpoints events inside the job's own windows, never in a step; a
// resumed fit numbered from Lightning's global step.
//
// Lightning is not packaged by Debian: .ci/sid-chroot installs it into the
// current-PyTorch chroot from the package index (pinned in
// .ci/sid-packages.txt). Where that Python lacks it the test fails: a skip
// would not be a pass.
func TestLightningCallback(t *testing.T) {
	py := modernTorchPython(t)
	if out, err := exec.Command(py, "-c", "import lightning").CombinedOutput(); err != nil {
		t.Fatalf("Lightning is not importable by %s (bash .ci/sid-chroot installs it; .ci/run does): %v\n%s", py, err, tail(out))
	}
	lit := callbackCase{job: "lightning", script: filepath.Join(repoRoot(t), "examples", "pytorch", "lightning_train.py"),
		resume: "step-step=6.ckpt"}
	t.Run("callback", func(t *testing.T) { callbackRun(t, py, lit, false) })
	// Under tpsprof launch --auto the callback times training_step on the
	// profiler zero-code mode made (its root finder stopped).
	t.Run("auto", func(t *testing.T) { callbackRun(t, py, lit, true) })
}

// tail is the last 400 bytes of out.
func tail(out []byte) []byte {
	if len(out) > 400 {
		return out[len(out)-400:]
	}
	return out
}
