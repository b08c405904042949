package memo

import (
	"errors"
	"testing"
)

// A read is remembered while its key is unchanged, read again when the
// key changes; an error is remembered only when asked; Max bounds it.
func TestMemo(t *testing.T) {
	c := Memo[int, string]{Max: 2}
	reads := 0
	read := func(v string, err error) func() (string, error) {
		return func() (string, error) { reads++; return v, err }
	}
	if v, _ := c.Get("a", 1, false, read("x", nil)); v != "x" || reads != 1 {
		t.Fatalf("%q after %d reads", v, reads)
	}
	if v, _ := c.Get("a", 1, false, read("y", nil)); v != "x" || reads != 1 {
		t.Errorf("unchanged key read again: %q, %d reads", v, reads)
	}
	if v, _ := c.Get("a", 2, false, read("y", nil)); v != "y" || reads != 2 {
		t.Errorf("changed key: %q, %d reads", v, reads)
	}
	bad := errors.New("bad")
	c.Get("b", 1, false, read("", bad))
	if _, err := c.Get("b", 1, false, read("z", nil)); err != nil || reads != 4 {
		t.Errorf("an error kept without keepErr: %v, %d reads", err, reads)
	}
	c.Get("c", 1, true, read("", bad))
	if _, err := c.Get("c", 1, true, read("z", nil)); err != nil && reads != 5 {
		t.Errorf("reads %d", reads)
	}
	if len(c.m) > 2 {
		t.Errorf("%d entries past Max 2", len(c.m))
	}
}
