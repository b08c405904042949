package collector

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// DefaultMaxStateBytes is Config.MaxStateBytes when none is given: a
// quarter of the memory this process may use (the machine's, or its
// cgroup's limit when lower), at most 4 GiB and at least 256 MiB. A fixed
// 4 GiB let a collector limited to 3 GiB be OOM-killed before its budget
// refused anything.
func DefaultMaxStateBytes() int64 {
	return stateBudget(memoryLimit("/proc/meminfo", "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"))
}

func stateBudget(limit int64) int64 {
	const hi, lo = 4 << 30, 256 << 20
	if limit <= 0 {
		return hi
	}
	return min(max(limit/4, lo), hi)
}

// memoryLimit is the smallest of the machine's memory (MemTotal of a
// meminfo file) and the limits in cgroup files ("max" or absurd values
// mean none); 0 when none can be read.
func memoryLimit(meminfo string, cgroups ...string) int64 {
	var limit int64
	if f, err := os.Open(meminfo); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) >= 2 && fields[0] == "MemTotal:" {
				if kb, err := strconv.ParseInt(fields[1], 10, 64); err == nil && kb > 0 {
					limit = kb << 10
				}
				break
			}
		}
		f.Close()
	}
	for _, p := range cgroups {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil || v <= 0 || v >= 1<<60 { // "max", or cgroup v1's "unlimited" 2^63-4096
			continue
		}
		if limit == 0 || v < limit {
			limit = v
		}
	}
	return limit
}
