package collector

import (
	"testing"

	"github.com/tpsprof/tpsprof/tps"
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
