package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/launch"
	"github.com/tpsprof/tpsprof/report"
)

// A nanoGPT-style loop (batches cut from a token array by a function, no
// DataLoader, forward(idx, targets), gradient accumulation under DDP's
// no_sync) under launch --auto with nothing declared: every rank row has
// the tokens the job counted itself, and the report says they came from
// the forward inputs. With --tokens-per-step the declared count is every
// row's, and the report says so.
func TestTorchNanoGPTTokens(t *testing.T) {
	py := torchPython(t)
	script := filepath.Join(repoRoot(t), "examples", "pytorch", "nanogpt_train.py")
	for _, c := range []struct {
		name     string
		perStep  int64
		source   string
		wantFrom string
	}{
		{"forward inputs", 0, "forward", "forward inputs"},
		{"declared at launch", 1000, "per_step", "--tokens-per-step"},
	} {
		t.Run(c.name, func(t *testing.T) {
			truth := t.TempDir()
			dir, log := launchTorch(t, "gpt", true, torchrun(py, 2, script, "--iters", "6", "--truth", truth),
				func(cfg *launch.Config) { cfg.TokensPerStep = c.perStep })
			want := map[[2]int64]int64{} // (rank, iteration) -> tokens, the job's own count
			for r := range 2 {
				f, err := os.Open(filepath.Join(truth, fmt.Sprintf("truth.%d.jsonl", r)))
				if err != nil {
					t.Fatalf("%v\n%s", err, log)
				}
				sc := bufio.NewScanner(f)
				for sc.Scan() {
					var l struct{ Iter, Tokens int64 }
					if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
						t.Fatal(err)
					}
					want[[2]int64{int64(r), l.Iter}] = l.Tokens
				}
				f.Close()
			}
			rows := rankRows(t, dir)
			if len(rows) != 12 || len(want) != 12 {
				t.Fatalf("%d rows, %d truth lines, want 12\n%s", len(rows), len(want), log)
			}
			for _, r := range rows {
				tok := want[[2]int64{r.Rank, r.Step}]
				if c.perStep > 0 {
					tok = c.perStep
				}
				if r.Tokens != tok {
					t.Errorf("rank %d step %d: %d tokens, the job's own count %d", r.Rank, r.Step, r.Tokens, tok)
				}
			}
			rep, err := report.Analyze(dir, report.Options{})
			if err != nil {
				t.Fatal(err)
			}
			checkInvariants(t, rep)
			if rep.Meta == nil || rep.Meta.TokenSource != c.source {
				t.Fatalf("token source %+v, want %q", rep.Meta, c.source)
			}
			var text strings.Builder
			for _, l := range rep.Lines() {
				if l.Key == "tokens from" {
					text.WriteString(l.Value)
				}
			}
			if !strings.Contains(text.String(), c.wantFrom) {
				t.Errorf("report: tokens from %q, want it to name %q", text.String(), c.wantFrom)
			}
		})
	}
}
