package wire

import (
	"strings"
	"testing"
)

// What the agent hands to rank 0 is checked first: another job's figures,
// absurd values, unknown parts and oversized messages are refused.
func TestDecodeClusterFigures(t *testing.T) {
	good := `{"job":"j","step":7,"window_steps":5,"tps":1200.5,"mfu":0.41,"shares":{"compute":0.8,"waiting_for_peers":0.2},"straggler_episodes_open":1,"stragglers":1}`
	f, err := DecodeClusterFigures("j", []byte(good))
	if err != nil || f.Step != 7 || *f.TPS != 1200.5 || *f.MFU != 0.41 || f.Shares["waiting_for_peers"] != 0.2 {
		t.Fatalf("%+v, %v", f, err)
	}
	for _, bad := range []struct{ job, msg, says string }{
		{"other", good, "on job"},
		{"j", `{"job":"j","step":-1}`, "out of range"},
		{"j", `{"job":"j","step":1,"tps":-3}`, "tps"},
		{"j", `{"job":"j","step":1,"mfu":1.7}`, "utilisation"},
		{"j", `{"job":"j","step":1,"shares":{"compute":1.5}}`, "share"},
		{"j", `{"job":"j","step":1,"shares":{"<script>":0.1}}`, "share"},
		{"j", `{"job":"j","step":1,"x":"` + strings.Repeat("a", MaxFiguresBytes) + `"}`, "bytes"},
		{"j", `garbage`, "cluster figures"},
	} {
		if _, err := DecodeClusterFigures(bad.job, []byte(bad.msg)); err == nil || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("%.60s on %s: %v, want an error saying %q", bad.msg, bad.job, err, bad.says)
		}
	}
}
