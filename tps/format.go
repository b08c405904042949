package tps

import (
	"fmt"
	"math"
)

// scale is a suffix for numbers from at on, and the format of the
// number scaled.
type scale struct {
	at     float64
	suffix string
	format string
}

var (
	rateScales  = []scale{{1e9, "G", "%.2f"}, {1e6, "M", "%.2f"}, {1e3, "k", "%.1f"}}
	countScales = []scale{{1e12, "T", "%.2f"}, {1e9, "B", "%.2f"}, {1e6, "M", "%.2f"}, {1e3, "k", "%.1f"}}
)

// scaled prints v with the first suffix of scales whose threshold mag
// reaches, else in the format small: the one number formatter of the
// project's views.
func scaled(v, mag float64, scales []scale, small string) string {
	for _, s := range scales {
		if mag >= s.at {
			return fmt.Sprintf(s.format, v/s.at) + s.suffix
		}
	}
	return fmt.Sprintf(small, v)
}

// SI prints a rate or count with a k, M or G suffix ("365.4k", "1.23M"), as
// the live line, the live page and the report show throughput.
func SI(v float64) string { return scaled(v, v, rateScales, "%.1f") }

// Count prints a parameter or token count with a k, M, B or T suffix
// ("8.03B"), as model sizes are written.
func Count(v float64) string { return scaled(v, math.Abs(v), countScales, "%.3g") }
