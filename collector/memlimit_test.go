package collector

import (
	"os"
	"path/filepath"
	"testing"
)

// The default state budget follows the memory the collector may use: a
// 3 GiB cgroup gives 768 MiB (the fixed 4 GiB let such a collector be
// OOM-killed first), a large machine 4 GiB, a tiny one 256 MiB.
func TestDefaultStateBudgetFollowsMemory(t *testing.T) {
	dir := t.TempDir()
	meminfo := filepath.Join(dir, "meminfo")
	os.WriteFile(meminfo, []byte("MemTotal:       65536000 kB\nMemFree: 1 kB\n"), 0o600)
	cg := filepath.Join(dir, "memory.max")
	for _, c := range []struct {
		cgroup string
		want   int64
	}{
		{"max\n", 4 << 30},                 // 62.5 GiB machine, no cgroup limit
		{"3221225472\n", 768 << 20},        // a 3 GiB cgroup
		{"536870912\n", 256 << 20},         // 512 MiB: the floor
		{"9223372036854771712\n", 4 << 30}, // cgroup v1 "unlimited"
	} {
		os.WriteFile(cg, []byte(c.cgroup), 0o600)
		if got := stateBudget(memoryLimit(meminfo, cg, filepath.Join(dir, "absent"))); got != c.want {
			t.Errorf("cgroup %q: budget %d, want %d", c.cgroup, got, c.want)
		}
	}
	if got := stateBudget(memoryLimit(filepath.Join(dir, "none"))); got != 4<<30 {
		t.Errorf("nothing readable: %d", got)
	}
	if got := DefaultMaxStateBytes(); got < 256<<20 || got > 4<<30 {
		t.Errorf("this machine: %d", got)
	}
}
