package trace

import (
	"syscall"
	"unsafe"
)

// madvPopulateWrite is Linux's MADV_POPULATE_WRITE (5.14).
const madvPopulateWrite = 23

// populate asks the kernel to back a fresh slice's pages (4 MiB and more)
// at once, where the decoding goroutines would otherwise fault them in one
// at a time as they first write each: the 65 MB of a 156,250-step run's
// cluster rows took ~200 ms of faults across the two decoders, 8 ms to
// fill once populated; `tpsprof report` over 10 M rank rows 0.41-0.44 s
// wall and 0.10-0.12 s system instead of 0.50-0.57 s and 0.28-0.40 s.
// The contents are unchanged (fresh pages are zero, as make's slice is).
// Kernels before 5.14 say EINVAL: nothing is done.
func populate[T any](s []T) {
	if len(s) == 0 {
		return
	}
	size := uintptr(len(s)) * unsafe.Sizeof(s[0])
	if size < 4<<20 {
		return
	}
	page := uintptr(syscall.Getpagesize())
	start := uintptr(unsafe.Pointer(&s[0]))
	lo, hi := (start+page-1)&^(page-1), (start+size)&^(page-1)
	if hi <= lo {
		return
	}
	b := unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(&s[0]), lo-start)), hi-lo)
	_ = syscall.Madvise(b, madvPopulateWrite)
}
