package client_test

import (
	"os/exec"
	"strings"
	"testing"
)

// A Go training program that imports the client links the standard
// library and package tps only (the agent's import graph is 300 packages:
// NATS, Prometheus, cgo NVML).
func TestClientDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/tpsprof/tpsprof/client").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	var ours []string
	for _, p := range strings.Fields(string(out)) {
		if strings.Contains(p, ".") && !strings.HasPrefix(p, "vendor/") { // not the standard library
			ours = append(ours, p)
		}
	}
	for _, p := range ours {
		switch p {
		case "github.com/tpsprof/tpsprof/client", "github.com/tpsprof/tpsprof/tps", "github.com/tpsprof/tpsprof/mfu":
		default:
			t.Errorf("the client depends on %s", p)
		}
	}
	t.Logf("non-standard packages: %v", ours)
}
