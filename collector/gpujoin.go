package collector

import (
	"math"

	"github.com/tpsprof/tpsprof/tps"
)

// maxGPUPoints bounds the samples kept per GPU (10 minutes at 1 s).
const maxGPUPoints = 600

// gpuSeries is one GPU's recent samples, oldest first.
type gpuSeries struct {
	node   string // its samples' times are on this node's clock
	points []tps.GPUPoint
}

// gpuJoin is a job's GPU samples by GPU and the closed rows waiting for
// them, joined as they come (joinGPU). Its job's lock guards it.
type gpuJoin struct {
	gpuSeries map[string]*gpuSeries // node/uuid → samples
	nodes     map[string]struct{}   // nodes named by the job's records
	gpuNodes  map[string]struct{}   // nodes that sent GPU samples
	pending   []pendingRow          // closed rows waiting for GPU samples
	lastTPJ   float64               // the last row's tokens per joule
}

func (g *gpuSeries) add(s *tps.GPUSample) {
	if n := len(g.points); n > 0 && s.UnixNs <= g.points[n-1].UnixNs {
		return // stale or repeated
	}
	p := tps.GPUPoint{UnixNs: s.UnixNs, EnergyMJ: -1, TempC: -1, PowerW: math.NaN()}
	if s.TempC != nil {
		p.TempC = float64(*s.TempC)
	}
	if s.EnergyMJ != nil {
		p.EnergyMJ = *s.EnergyMJ
	}
	if s.PowerW != nil && *s.PowerW >= 0 && !math.IsInf(*s.PowerW, 0) {
		p.PowerW = *s.PowerW
	}
	if s.SMClockMHz != nil {
		p.SMClock = float64(*s.SMClockMHz)
	}
	if s.ClockEventReason != nil {
		p.Reasons = *s.ClockEventReason
	}
	if len(g.points) >= maxGPUPoints {
		copy(g.points, g.points[1:])
		g.points = g.points[:len(g.points)-1]
	}
	g.points = append(g.points, p)
}

func (g *gpuSeries) last() int64 {
	if len(g.points) == 0 {
		return 0
	}
	return g.points[len(g.points)-1].UnixNs
}

// gpuCovered reports whether every GPU has reported past t, and GPUs of
// as many nodes as the job's records name have reported at all: a node
// whose sampler has not spoken yet (it starts late, or its first message
// is still in flight) holds the row until GPUJoinWait rather than have it
// written with that node's GPUs missing. (Nodes are counted, not matched
// by name: a rank may name its node differently from its agent.)
func (j *jobState) gpuCovered(t int64) bool {
	if len(j.gpuNodes) < len(j.nodes) {
		return false
	}
	for _, g := range j.gpuSeries {
		if g.last()-j.clocks.offset(g.node) < t {
			return false
		}
	}
	return true
}

// joinGPU adds energy, power, clock and throttle reasons to a cluster row,
// over the step's period (its end less its step time, to its end):
// consecutive periods tile the time, where the rows' spans overlap as
// ranks start their steps at different moments, and energy joined over
// the spans was counted twice in the overlaps.
func (j *jobState) joinGPU(c *tps.ClusterStep) {
	var power, clock float64
	start := c.StartUnixNs
	if c.StepTimeNs > 0 && c.EndUnixNs-c.StepTimeNs > start {
		start = c.EndUnixNs - c.StepTimeNs
	}
	for _, g := range j.gpuSeries {
		off := j.clocks.offset(g.node) // the row is on the reference clock
		w, ok := tps.JoinGPU(g.points, start+off, c.EndUnixNs+off)
		if !ok {
			continue
		}
		c.GPUsJoined++
		c.EnergyJ += w.EnergyJ
		power += w.PowerW
		clock += w.SMClock
		c.ClockEventReasons |= w.Reasons
	}
	if c.GPUsJoined > 0 {
		c.PowerWMean = power / float64(c.GPUsJoined)
		c.SMClockMHzMean = clock / float64(c.GPUsJoined)
		if c.EnergyJ > 0 {
			c.TokensPerJoule = float64(c.Tokens) / c.EnergyJ
			j.lastTPJ = c.TokensPerJoule
		}
	}
}
