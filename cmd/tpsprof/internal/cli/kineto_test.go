package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// tpsprof kineto reads a trace within the agent's bounds (it reached
// 3.2 GB on an 18.8 MB file): a step with more events than --max-events
// is refused with a clear error, and the same file is analysed when the
// bound allows it.
func TestKinetoCommandBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"traceEvents":[{"ph":"X","cat":"user_annotation","name":"ProfilerStep#1","pid":1,"tid":1,"ts":0,"dur":100000}`)
	for i := range 5000 {
		fmt.Fprintf(&b, `,{"ph":"X","cat":"cpu_op","name":"aten::add","pid":1,"tid":1,"ts":%d,"dur":1}`, 10+i*2)
	}
	b.WriteString("]}")
	p := filepath.Join(t.TempDir(), "t.json")
	os.WriteFile(p, []byte(b.String()), 0o644)
	_, errOut, code := run(t, "kineto", "--max-events", "1000", p)
	if code == 0 || !strings.Contains(errOut, "more than 1000 events") {
		t.Errorf("a trace past --max-events: exit %d, %q", code, errOut)
	}
	if _, errOut, code := run(t, "kineto", p); code != 0 {
		t.Errorf("within the default bound: exit %d, %s", code, errOut)
	}
}
