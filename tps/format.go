package tps

import "fmt"

// SI prints a rate or count with a k, M or G suffix ("365.4k", "1.23M"), as
// the live line, the live page and the report show throughput.
func SI(v float64) string {
	switch a := v; {
	case a >= 1e9:
		return fmt.Sprintf("%.2fG", v/1e9)
	case a >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case a >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.1f", v)
}
