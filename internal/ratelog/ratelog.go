// Package ratelog logs at most one line per key per interval, counting what
// it suppressed, so a flood of bad input cannot flood the log.
// It owns no file: it writes through the slog.Logger it is given.
package ratelog

import (
	"log/slog"
	"sync"
	"time"
)

// Logger wraps a slog.Logger with per-key rate limits.
type Logger struct {
	l        *slog.Logger
	interval time.Duration
	mu       sync.Mutex
	last     map[string]time.Time
	dropped  map[string]int
}

// New returns a Logger that writes to l at most once per interval per key.
func New(l *slog.Logger, interval time.Duration) *Logger {
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	return &Logger{l: l, interval: interval, last: map[string]time.Time{}, dropped: map[string]int{}}
}

// Warn logs msg at warning level unless key was logged within the interval.
func (r *Logger) Warn(key, msg string, args ...any) {
	now := time.Now()
	r.mu.Lock()
	if t, ok := r.last[key]; ok && now.Sub(t) < r.interval {
		r.dropped[key]++
		r.mu.Unlock()
		return
	}
	if len(r.last) > 4096 { // keys are bounded by design; guard anyway
		clear(r.last)
	}
	r.last[key] = now
	n := r.dropped[key]
	delete(r.dropped, key)
	r.mu.Unlock()
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	r.l.Warn(msg, args...)
}
