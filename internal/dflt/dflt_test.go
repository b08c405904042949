package dflt

import (
	"testing"
	"time"
)

func TestDefaults(t *testing.T) {
	a, b, c := 0, -3, 7
	Positive(&a, 5)
	Positive(&b, 5)
	Positive(&c, 5)
	if a != 5 || b != 5 || c != 7 {
		t.Errorf("Positive: %d %d %d, want 5 5 7", a, b, c)
	}
	d, e := time.Duration(0), -time.Second
	Zero(&d, time.Minute)
	Zero(&e, time.Minute)
	if d != time.Minute || e != -time.Second {
		t.Errorf("Zero: %v %v, want 1m0s -1s", d, e)
	}
}
