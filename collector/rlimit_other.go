//go:build !unix

package collector

func openFileLimit() (uint64, bool) { return 0, false }
