package report

import (
	"testing"

	"github.com/tpsprof/tpsprof/tps"
)

// The loss figure, fed as the cluster pass feeds it: the steady steps'
// losses only (warm-up, profiled and stepless rows left out, a step with
// no loss reported skipped), first, last, mean and lowest.
func TestLossFigure(t *testing.T) {
	var f lossFigure
	rows := []struct {
		loss float64
		skip bool
		ns   int64
	}{{9.5, true, 1e9}, {4.0, false, 1e9}, {0, false, 1e9}, {3.0, false, 1e9}, {2.5, false, 0}, {3.5, false, 1e9}}
	for i, r := range rows {
		c := tps.ClusterStep{Step: int64(i), LossMean: r.loss, StepTimeNs: r.ns}
		f.step(&stepAt{c: &c, i: i, warm: r.skip, skip: r.skip})
	}
	a := &analysis{rep: &Report{}}
	if err := f.write(a); err != nil {
		t.Fatal(err)
	}
	want := Loss{Steps: 3, First: 4, Last: 3.5, Mean: 3.5, Lowest: 3}
	if a.rep.Loss == nil || *a.rep.Loss != want {
		t.Errorf("loss %+v, want %+v", a.rep.Loss, want)
	}
	var none lossFigure
	b := &analysis{rep: &Report{}}
	none.write(b)
	if b.rep.Loss != nil {
		t.Errorf("a run without loss: %+v", b.rep.Loss)
	}
}
