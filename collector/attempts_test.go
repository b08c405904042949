package collector

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/wire"
)

// The book: records raise the highest attempt; an attempt is running while
// some node that started it has not ended it.
func TestAttemptBook(t *testing.T) {
	var b attemptBook
	if _, ok := b.reply("j"); ok {
		t.Fatal("an empty book answered")
	}
	b.sawRecords("j", 2)
	b.sawEvent(tps.Event{Job: "j", Attempt: 3, Kind: tps.EventAttemptStart, Node: "a", StartUnixNs: 100})
	b.sawEvent(tps.Event{Job: "j", Attempt: 3, Kind: tps.EventAttemptStart, Node: "b", StartUnixNs: 90})
	b.sawEvent(tps.Event{Job: "j", Attempt: 3, Kind: tps.EventAttemptEnd, Node: "a", StartUnixNs: 100})
	r, _ := b.reply("j")
	if !r.HasData || r.MaxAttempt != 3 || r.Running != 3 || r.RunningSinceUnixNs != 90 {
		t.Fatalf("one node of two ended: %+v", r)
	}
	b.sawEvent(tps.Event{Job: "j", Attempt: 3, Kind: tps.EventAttemptEnd, Node: "b", StartUnixNs: 90})
	if r, _ = b.reply("j"); r.Running != -1 {
		t.Fatalf("every node ended: %+v", r)
	}
	b.sawRecords("j", 5) // a torchrun restart inside the launch
	if r, _ = b.reply("j"); r.MaxAttempt != 5 {
		t.Fatalf("records of attempt 5: %+v", r)
	}
}

// One record or event with attempt 2^63-1 poisoned the job: the next
// launch took attempt -2^63 and its rows were dropped. Past tps.MaxAttempt
// a record or event is rejected at validation, and a book fed from files
// written before the bound ignores such attempts.
func TestAttemptBookCannotBePoisoned(t *testing.T) {
	rec := tps.StepRecord{Job: "p", Attempt: math.MaxInt64, Step: 1, Rank: 0, WorldSize: 1, StartUnixNs: 1.8e18, EndUnixNs: 1.8e18 + 1e9, DurationNs: 1e9}
	if err := rec.Validate(); err == nil || !strings.Contains(err.Error(), "attempt") {
		t.Fatalf("attempt 2^63-1 accepted: %v", err)
	}
	ev := tps.Event{Job: "p", Attempt: math.MaxInt64, Kind: tps.EventAttemptStart, StartUnixNs: 1.8e18}
	if err := ev.Validate(); err == nil {
		t.Fatal("an event with attempt 2^63-1 accepted")
	}
	var b attemptBook
	b.sawEvent(tps.Event{Job: "p", Attempt: 2, Kind: tps.EventAttemptStart, Node: "a", StartUnixNs: 100})
	b.sawEvent(ev) // read back from an old file
	b.merge("p", wire.AttemptReply{HasData: true, MaxAttempt: math.MaxInt64})
	r, _ := b.reply("p")
	if got, _ := r.Choose(time.Unix(0, 1e18), time.Minute); got < 0 || got > tps.MaxAttempt || r.MaxAttempt > tps.MaxAttempt {
		t.Fatalf("book %+v: the next launch takes attempt %d", r, got)
	}
}
