package tps

import (
	"fmt"
	"math"
	"time"
)

// TimeToTrain is how long a token budget takes at a steady cluster TPS.
func TimeToTrain(tokens, tps float64) (time.Duration, error) {
	if tokens <= 0 || math.IsNaN(tokens) || math.IsInf(tokens, 0) {
		return 0, fmt.Errorf("tps: token budget %g must be a positive number", tokens)
	}
	if tps <= 0 || math.IsNaN(tps) || math.IsInf(tps, 0) {
		return 0, fmt.Errorf("tps: throughput %g tokens/s must be positive", tps)
	}
	s := tokens / tps
	if s > float64(math.MaxInt64)/1e9 {
		return 0, fmt.Errorf("tps: %g tokens at %g tokens/s takes longer than a time.Duration holds (%.0f years)", tokens, tps, s/3.15576e7)
	}
	return time.Duration(s * 1e9), nil
}

// CostPerMillionTokens is the price of a million tokens for gpus GPUs at
// usdPerGPUHour each, running at a cluster throughput of tps tokens/s.
func CostPerMillionTokens(tps float64, gpus int, usdPerGPUHour float64) (float64, error) {
	if tps <= 0 || math.IsNaN(tps) || math.IsInf(tps, 0) {
		return 0, fmt.Errorf("tps: throughput %g tokens/s must be positive", tps)
	}
	if gpus <= 0 {
		return 0, fmt.Errorf("tps: GPU count %d must be positive", gpus)
	}
	if usdPerGPUHour < 0 || math.IsNaN(usdPerGPUHour) || math.IsInf(usdPerGPUHour, 0) {
		return 0, fmt.Errorf("tps: price %g $/GPU-hour must not be negative", usdPerGPUHour)
	}
	usdPerSecond := usdPerGPUHour * float64(gpus) / 3600
	return usdPerSecond / tps * 1e6, nil
}
