package report

import (
	"os"
	"path/filepath"
	"time"

	"github.com/tpsprof/tpsprof/internal/memo"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// AttemptEvents is a job folder's attempt and job start and end events
// (their kind, attempt, times and exit code: what the running check and
// the fleet's interruption rate read), from those five columns of its
// events table alone, remembered while the table's folder is unchanged.
// An RL job's million rollout events made every node pass and every
// neighbour's report read them whole (9.6-12.1 s and ~450 MB a pass over
// four such jobs); the columns read stream, a row group at a time.
func AttemptEvents(jobDir string) ([]tps.Event, error) {
	dir := filepath.Join(jobDir, trace.Events)
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, err
	}
	files, err := trace.PartFiles(dir)
	if err != nil {
		return nil, err
	}
	return attemptCache.Get(dir, attemptKey{fi.ModTime(), len(files)}, true, func() ([]tps.Event, error) { return readAttemptEvents(dir) })
}

// attemptCache remembers the job folders' attempt events (a few each), at
// most 50,000 folders.
var attemptCache = memo.Memo[attemptKey, []tps.Event]{Max: 50_000}

type attemptKey struct {
	mod   time.Time
	parts int
}

func readAttemptEvents(dir string) ([]tps.Event, error) {
	var out []tps.Event
	_, err := trace.EachColumnsStrs(dir, []string{"attempt", "start_unix_ns", "end_unix_ns", "?exit_code"}, []string{"kind"}, nil, func(c *trace.Columns) error {
		at, start, end, exit := c.Int64[0], c.Int64[1], c.Int64[2], c.Int64[3]
		for i, kind := range c.Str[0][:c.Rows] {
			var k string // the constant, not the column's string
			switch kind {
			case tps.EventAttemptStart:
				k = tps.EventAttemptStart
			case tps.EventAttemptEnd:
				k = tps.EventAttemptEnd
			case tps.EventJobStart:
				k = tps.EventJobStart
			case tps.EventJobEnd:
				k = tps.EventJobEnd
			default:
				continue
			}
			out = append(out, tps.Event{Kind: k, Attempt: at[i], StartUnixNs: start[i], EndUnixNs: end[i], ExitCode: exit[i]})
		}
		return nil
	})
	if trace.IsUnreadable(err) {
		err = nil // the readable parts' events: a lying part is the job's report's to name
	}
	return out, err
}
