// Package memo remembers what was read from a file or folder while its
// fingerprint (a modification time and a size or part count, as the
// caller takes it) is unchanged: a collector's node pass reads the same
// finished jobs every interval, and a stat costs far less than the read.
package memo

import "sync"

// Memo maps a path to what a read of it gave under fingerprint K, at most
// Max paths (past that it starts over: a larger folder is read again).
// Safe for concurrent use; a read runs outside the lock.
type Memo[K comparable, V any] struct {
	Max int
	mu  sync.Mutex
	m   map[string]entry[K, V]
}

type entry[K comparable, V any] struct {
	key K
	val V
	err error
}

// Get is what read gave for path under key: remembered, or read now and
// remembered (an error too, unless keepErr is false).
func (c *Memo[K, V]) Get(path string, key K, keepErr bool, read func() (V, error)) (V, error) {
	c.mu.Lock()
	had, ok := c.m[path]
	c.mu.Unlock()
	if ok && had.key == key {
		return had.val, had.err
	}
	v, err := read()
	if err != nil && !keepErr {
		return v, err
	}
	c.mu.Lock()
	if c.m == nil || (c.Max > 0 && len(c.m) >= c.Max) {
		c.m = map[string]entry[K, V]{}
	}
	c.m[path] = entry[K, V]{key, v, err}
	c.mu.Unlock()
	return v, err
}

// Forget drops what is remembered.
func (c *Memo[K, V]) Forget() {
	c.mu.Lock()
	c.m = nil
	c.mu.Unlock()
}
