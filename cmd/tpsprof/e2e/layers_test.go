package e2e

import (
	"os/exec"
	"strings"
	"testing"
)

// The layers of the module, read from the import graph: internal/ is the
// bottom layer (it imports no other tpsprof package), the agent does not
// run commands (package launch does) nor know the collector, and only the
// binary's own tree imports its wiring (the Go toolchain enforces that
// part through cmd/tpsprof/internal).
func TestLayers(t *testing.T) {
	const mod = "github.com/tpsprof/tpsprof/"
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", mod+"...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	imports := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		for _, p := range f[1:] {
			if strings.HasPrefix(p, mod) {
				imports[strings.TrimPrefix(f[0], mod)] = append(imports[strings.TrimPrefix(f[0], mod)], strings.TrimPrefix(p, mod))
			}
		}
	}
	if len(imports) < 10 {
		t.Fatalf("go list found %d packages importing others of the module: %s", len(imports), out)
	}
	for pkg, deps := range imports {
		for _, d := range deps {
			switch {
			case strings.HasPrefix(pkg, "internal/") && !strings.HasPrefix(d, "internal/"):
				t.Errorf("%s (bottom layer) imports %s", pkg, d)
			case pkg == "agent" && (d == "launch" || d == "collector" || strings.HasPrefix(d, "cmd/")):
				t.Errorf("agent imports %s", d)
			case !strings.HasPrefix(pkg, "cmd/") && strings.HasPrefix(d, "cmd/"):
				t.Errorf("%s imports the binary's %s", pkg, d)
			}
		}
	}
}
