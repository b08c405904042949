package agent

import (
	"errors"
	"time"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/wire"
)

// GPUReader is what the agent needs from a GPU library: the node's devices
// and one reading of each. The go-nvml adapter (OpenNVML) is one; the demo's
// simulated GPUs are another.
type GPUReader interface {
	// Devices lists the GPUs; the index is what Sample takes.
	Devices() []GPUInfo
	// Sample reads device i. Fields the device does not support stay nil.
	// An error means the device could not be read at all this time.
	Sample(i int) (tps.GPUSample, error)
	// Close releases the library; calling it again does nothing.
	Close() error
}

// GPUInfo identifies one GPU.
type GPUInfo struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	Name  string `json:"name"`
}

// ErrNoNVML means GPU telemetry is unavailable: no NVIDIA driver, or a
// build without cgo.
var ErrNoNVML = errors.New("agent: NVML unavailable")

// sampleGPUs reads every GPU each interval.
func (a *Agent) sampleGPUs() {
	defer a.wg.Done()
	t := time.NewTicker(a.cfg.GPUInterval)
	defer t.Stop()
	for {
		select {
		case <-a.done:
			return
		case <-t.C:
			a.SampleGPUs()
		}
	}
}

// SampleGPUs reads every GPU once, now, and publishes the samples on the gpu
// subject of every job the node has served. It does nothing when the clock
// has not moved since the last reading (a simulated clock). The agent calls
// it every GPUInterval; with a negative interval the caller drives it (the
// demo does, once per simulated step).
func (a *Agent) SampleGPUs() {
	r := a.cfg.GPU
	if r == nil {
		return
	}
	a.sampleMu.Lock()
	defer a.sampleMu.Unlock()
	now := a.cfg.Clock()
	if !now.After(a.lastSample) {
		return
	}
	a.lastSample = now
	devs := r.Devices()
	batch := make([]tps.GPUSample, 0, len(devs))
	for _, d := range devs {
		s, err := r.Sample(d.Index)
		if err != nil {
			a.gpuErrors.Add(1)
			a.log.Warn("gpu", "GPU reading failed", "index", d.Index, "uuid", d.UUID, "err", err)
			continue
		}
		s.Node, s.UnixNs = a.cfg.Node, now.UnixNano()
		batch = append(batch, s)
		a.mu.Lock()
		for len(a.gpuPerDev) <= d.Index && len(a.gpuPerDev) < 1024 {
			a.gpuPerDev = append(a.gpuPerDev, 0)
		}
		if d.Index < len(a.gpuPerDev) {
			a.gpuPerDev[d.Index]++
		}
		a.mu.Unlock()
	}
	if len(batch) == 0 {
		return
	}
	a.gpuSamples.Add(int64(len(batch)))
	data := wire.EncodeGPUSamples(batch)
	for _, job := range a.pub.jobs() {
		a.pub.publishRaw(wire.GPUSubject(job, wire.NodeToken(a.cfg.Node)), data)
	}
}
