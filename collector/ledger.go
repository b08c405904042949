package collector

// ledger is a job's durable bookkeeping: what its messages fed, which of
// that a checkpoint may acknowledge, and what parts written before a
// restart (or a job reset) already hold. The durable source creates one
// per job (newJob asks it) and alone reads it whole, at checkpoints and
// resets; core mode has none (nil), and every method below is a no-op or
// false on nil, so the state and the handlers ask it without a mode flag.
// The job's lock guards it.
type ledger struct {
	// unacked are the messages whose data is not yet known to be in
	// finalised parts, in arrival order.
	unacked []ackItem
	// checkpointing: a checkpoint holds some of its messages (the job is
	// not evicted until they are settled).
	checkpointing bool
	// written are the steps whose cluster rows went to the writers since
	// the last checkpoint: a message is acknowledged once every step it
	// fed is among them and their parts are finalised.
	written map[stepKey]bool
	// disk are the keys in parts no acknowledgement covers (written
	// before a restart): their steps are not closed again, their rank rows
	// not written again.
	disk *diskKeys
	// redo are the steps a reset job aggregates again whatever its window
	// says (their rows never reached Parquet); reclose those of them the
	// job before the reset had closed and counted: closing them again
	// counts them as reclosed, not closed.
	redo, reclose map[stepKey]bool
}

// ackItem is a message waiting for its acknowledgement and the open steps
// its records went into.
type ackItem struct {
	ack   acker
	steps []stepKey
}

func newLedger() *ledger { return &ledger{written: map[stepKey]bool{}} }

// hold registers a message to acknowledge once the steps it fed are in
// finalised parts.
func (l *ledger) hold(ack acker, steps []stepKey) {
	if l != nil && ack != nil {
		l.unacked = append(l.unacked, ackItem{ack: ack, steps: steps})
	}
}

// wrote notes that a step's cluster row went to the writer.
func (l *ledger) wrote(k stepKey) {
	if l != nil {
		l.written[k] = true
	}
}

// closedOnDisk: the step's cluster row is in a part from before a restart.
func (l *ledger) closedOnDisk(k stepKey) bool { return l != nil && l.disk != nil && l.disk.closed[k] }

// rankOnDisk: the rank's row of the step is in a part from before a restart.
func (l *ledger) rankOnDisk(k stepKey, rank int64) bool {
	return l != nil && l.disk != nil && l.disk.ranks[k][rank]
}

// markOnDisk notes a rank row as written (a late record of a step closed
// before the restart is written once).
func (l *ledger) markOnDisk(k stepKey, rank int64) {
	if l != nil && l.disk != nil {
		l.disk.markRank(k, rank)
	}
}

// redoes: the step is aggregated again after a reset whatever the job's
// window says.
func (l *ledger) redoes(k stepKey) bool { return l != nil && l.redo[k] }

// closing forgets a step's redo mark as it closes, and says whether it is
// closed again (reclosed) rather than for the first time.
func (l *ledger) closing(k stepKey) (again bool) {
	if l == nil {
		return false
	}
	delete(l.redo, k)
	again = l.reclose[k]
	delete(l.reclose, k)
	return again
}

// settled: no message waits and no checkpoint holds any (the job may be
// evicted).
func (l *ledger) settled() bool {
	return l == nil || (len(l.unacked) == 0 && !l.checkpointing && l.disk == nil)
}

// waiting counts the messages not acknowledged.
func (l *ledger) waiting() int {
	if l == nil {
		return 0
	}
	return len(l.unacked)
}

// closedAndCounted are the steps a job being reset closed (and counted)
// whose rows the messages handed back fed, with those an earlier reset
// left to close again: the fresh job closes them again without counting
// them again. A step still open was not closed by this job, even below
// the closed window's floor (a redone step comes back after later ones
// closed): closing it later is its first close. Taken for forgotten, it
// was counted as reclosed and never as closed (CI under load: 199 of 200
// steps closed). The caller holds the job's lock.
func (s *jobState) closedAndCounted(items []ackItem) map[stepKey]bool {
	reclose := map[stepKey]bool{}
	if s.led != nil {
		for k := range s.led.reclose {
			reclose[k] = true
		}
	}
	for _, it := range items {
		for _, k := range it.steps {
			if _, open := s.open[k]; open {
				continue
			}
			if _, closed := s.closed.seen[k]; closed || s.closed.forgotten(k) {
				reclose[k] = true
			}
		}
	}
	return reclose
}
