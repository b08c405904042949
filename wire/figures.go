package wire

import (
	"encoding/json"
	"fmt"
	"math"

	"github.com/tpsprof/tpsprof/tps"
)

// FiguresSubject is where the collector publishes a job's cluster figures
// as they stand (ClusterFigures), every few seconds while steps close; the
// agents serving the job's ranks hand them to rank 0, whose Python package
// logs them into the job's own tracker run (docs/trackers.md).
func FiguresSubject(job string) string { return "tpsprof.ctl." + Version + "." + job + ".figures" }

// MaxFiguresBytes bounds a ClusterFigures message an agent accepts.
const MaxFiguresBytes = 4096

// ClusterFigures are a job's figures over its last closed steps, as the
// collector's live page shows them.
type ClusterFigures struct {
	Job string `json:"job"`
	// Step is the last closed cluster step; WindowSteps how many closed
	// steps (up to it) the figures are over.
	Step        int64 `json:"step"`
	WindowSteps int   `json:"window_steps"`
	// TPS is tokens over step time of those steps (nil: no token counted).
	TPS *float64 `json:"tps,omitempty"`
	MFU *float64 `json:"mfu,omitempty"`
	HFU *float64 `json:"hfu,omitempty"`
	// MFUCounted: MFU and HFU are from the FLOPs PyTorch counted (the
	// job declares no model), not the analytic model's.
	MFUCounted bool `json:"mfu_counted,omitempty"`
	// Shares are where those steps' time went, by tps.ShareParts key.
	Shares map[string]float64 `json:"shares"`
	// MFULost is where the MFU went (tps.Ledger's lost points by bucket
	// key: the breakdown's parts but compute, and compute_efficiency).
	MFULost map[string]float64 `json:"mfu_lost,omitempty"`
	// EpisodesOpen are the straggler episodes open now; Stragglers the
	// ranks currently scored as stragglers.
	EpisodesOpen int `json:"straggler_episodes_open"`
	Stragglers   int `json:"stragglers"`
}

// DecodeClusterFigures reads and checks a message of job's FiguresSubject:
// a forged or broken one (another job's, absurd values, unknown parts,
// too long) is an error, never passed on.
func DecodeClusterFigures(job string, data []byte) (ClusterFigures, error) {
	var f ClusterFigures
	if len(data) > MaxFiguresBytes {
		return f, fmt.Errorf("wire: cluster figures of %d bytes (at most %d)", len(data), MaxFiguresBytes)
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return f, fmt.Errorf("wire: cluster figures: %w", err)
	}
	if f.Job != job {
		return f, fmt.Errorf("wire: cluster figures of job %q on job %q's subject", f.Job, job)
	}
	return f, f.check()
}

// check bounds the figures: step, counts, TPS, utilisation and shares.
func (f *ClusterFigures) check() error {
	if f.Step < 0 || f.Step > tps.MaxStep || f.WindowSteps < 0 || f.EpisodesOpen < 0 || f.Stragglers < 0 {
		return fmt.Errorf("wire: cluster figures: step %d, window %d, episodes %d, stragglers %d out of range", f.Step, f.WindowSteps, f.EpisodesOpen, f.Stragglers)
	}
	if f.TPS != nil && (math.IsNaN(*f.TPS) || math.IsInf(*f.TPS, 0) || *f.TPS < 0) {
		return fmt.Errorf("wire: cluster figures: tps %v", *f.TPS)
	}
	for _, p := range []*float64{f.MFU, f.HFU} {
		if p != nil && !(*p >= 0 && *p <= 1) {
			return fmt.Errorf("wire: cluster figures: a utilisation of %v (a fraction in [0, 1])", *p)
		}
	}
	return f.checkShares()
}

// checkShares allows only the breakdown's parts, as fractions.
func (f *ClusterFigures) checkShares() error {
	known := map[string]bool{}
	for _, p := range tps.ShareParts() {
		known[p.Key] = true
	}
	for k, v := range f.Shares {
		if !known[k] || !(v >= 0 && v <= 1) {
			return fmt.Errorf("wire: cluster figures: share %q = %v", k, v)
		}
	}
	known[tps.ComputeEfficiency] = true
	for k, v := range f.MFULost {
		if k == "compute" || !known[k] || !(v >= 0 && v <= 100) {
			return fmt.Errorf("wire: cluster figures: MFU lost %q = %v points", k, v)
		}
	}
	return nil
}
