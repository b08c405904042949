package tps

// A Series is a sequence of float64 kept for exact quantiles: the steady
// steps' times and rates (Summarizer), the step times of the warm-up rule
// (WarmupThresholdOfValues). MemSeries holds them in memory; a caller
// that must bound its memory over millions of steps brings its own (the
// report spills them to files: this package does no I/O).
type Series interface {
	Append(x float64)
	Len() int
	// Dist is NewDist of the values, MedianMAD their MedianMAD.
	Dist() (Dist, error)
	MedianMAD() (median, mad float64, err error)
	// Each calls fn with the values in order, a block at a time (valid
	// during the call).
	Each(fn func([]float64)) error
	Close()
}

// MemSeries is a Series in memory. The zero MemSeries is empty and ready.
type MemSeries struct{ xs []float64 }

// NewMemSeries is a MemSeries with room for n values.
func NewMemSeries(n int) *MemSeries { return &MemSeries{xs: make([]float64, 0, n)} }

func (m *MemSeries) Append(x float64) { m.xs = append(m.xs, x) }
func (m *MemSeries) Len() int         { return len(m.xs) }

// Dist is NewDist of the values (it may reorder them).
func (m *MemSeries) Dist() (Dist, error) { return NewDist(m.xs), nil }

func (m *MemSeries) MedianMAD() (median, mad float64, err error) {
	median, mad = MedianMAD(m.xs)
	return median, mad, nil
}

func (m *MemSeries) Each(fn func([]float64)) error {
	fn(m.xs)
	return nil
}

func (m *MemSeries) Close() {}
