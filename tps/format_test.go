package tps

import "testing"

// One formatter prints rates (k, M, G) and counts (k, M, B, T): the
// report's throughput and the mfu command's parameter counts.
func TestFormatters(t *testing.T) {
	for _, c := range []struct {
		got, want string
	}{
		{SI(365_400), "365.4k"}, {SI(1_234_567), "1.23M"}, {SI(2.5e9), "2.50G"}, {SI(12.34), "12.3"}, {SI(-2500), "-2500.0"},
		{Count(8.03e9), "8.03B"}, {Count(1.2e12), "1.20T"}, {Count(70.6e6), "70.60M"}, {Count(512), "512"}, {Count(-2500), "-2.5k"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
