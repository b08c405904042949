package report

import "math"

// Loss is the training loss over the steady steps, as the ranks reported
// it (each step's mean over its ranks that reported one): where it
// started and where it ended, its mean and its lowest.
type Loss struct {
	Steps  int     `json:"steps"`
	First  float64 `json:"first"`
	Last   float64 `json:"last"`
	Mean   float64 `json:"mean"`
	Lowest float64 `json:"lowest"`
}

// lossFigure is Loss: a step figure, this file and one line in
// stepFigures. A step whose loss is 0 reported none (no rank did).
type lossFigure struct {
	l   Loss
	sum float64
}

func (f *lossFigure) step(s *stepAt) {
	v := s.c.LossMean
	if !s.steady() || v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return
	}
	if f.l.Steps == 0 {
		f.l.First, f.l.Lowest = v, v
	}
	f.l.Steps++
	f.l.Last, f.l.Lowest = v, min(f.l.Lowest, v)
	f.sum += v
}

func (f *lossFigure) write(a *analysis) error {
	if f.l.Steps > 0 {
		l := f.l
		l.Mean = f.sum / float64(l.Steps)
		a.rep.Loss = &l
	}
	return nil
}
