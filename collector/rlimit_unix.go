//go:build unix

package collector

import "syscall"

// openFileLimit is the process's soft limit on open files (Go raises it to
// the hard limit at start-up).
func openFileLimit() (uint64, bool) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, false
	}
	return l.Cur, true
}
