//go:build cgo

package agent

import (
	"errors"
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tpsprof/tpsprof/tps"
)

// OpenNVML loads the NVIDIA driver's NVML and returns a reader of the
// node's GPUs. Without a driver it returns ErrNoNVML. After a failed Init no
// NVML function may be called (not even Shutdown: the process would die on a
// missing symbol), so nothing is.
func OpenNVML() (GPUReader, error) {
	return newNVMLReader(nvml.New())
}

// nvmlReader adapts go-nvml's Interface (the real library or its mocks) to
// GPUReader.
type nvmlReader struct {
	lib    nvml.Interface
	mu     sync.Mutex
	devs   []nvmlDev
	xid    nvml.EventSet
	closed bool
}

type nvmlDev struct {
	info        GPUInfo
	h           nvml.Device
	unsupported map[string]bool
	gpm         bool
	gpmPrev     nvml.GpmSample
	gpmCur      nvml.GpmSample
	xidCount    int64
	lastXID     int64
	hasXID      bool
}

var _ GPUReader = (*nvmlReader)(nil)

func newNVMLReader(lib nvml.Interface) (r *nvmlReader, err error) {
	defer func() {
		// go-nvml panics when the library cannot be loaded at all.
		if p := recover(); p != nil {
			r, err = nil, fmt.Errorf("%w: %v", ErrNoNVML, p)
		}
	}()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: init: %v", ErrNoNVML, ret)
	}
	r = &nvmlReader{lib: lib}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		lib.Shutdown()
		return nil, fmt.Errorf("agent: nvml device count: %v", ret)
	}
	if set, ret := lib.EventSetCreate(); ret == nvml.SUCCESS {
		r.xid = set
	}
	for i := 0; i < n; i++ {
		h, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		d := nvmlDev{h: h, unsupported: map[string]bool{}, info: GPUInfo{Index: i}}
		d.info.UUID, _ = h.GetUUID()
		d.info.Name, _ = h.GetName()
		if r.xid != nil {
			if ret := h.RegisterEvents(nvml.EventTypeXidCriticalError, r.xid); ret != nvml.SUCCESS {
				d.unsupported["xid"] = true
			}
		}
		if sup, ret := lib.GpmQueryDeviceSupport(h); ret == nvml.SUCCESS && sup.IsSupportedDevice != 0 {
			a, r1 := lib.GpmSampleAlloc()
			b, r2 := lib.GpmSampleAlloc()
			if r1 == nvml.SUCCESS && r2 == nvml.SUCCESS && h.GpmSampleGet(a) == nvml.SUCCESS {
				d.gpm, d.gpmPrev, d.gpmCur = true, a, b
			}
		}
		r.devs = append(r.devs, d)
	}
	return r, nil
}

func (r *nvmlReader) Devices() []GPUInfo {
	out := make([]GPUInfo, len(r.devs))
	for i, d := range r.devs {
		out[i] = d.info
	}
	return out
}

// errDeviceLost means the GPU stopped answering (fell off the bus, XID 79).
var errDeviceLost = errors.New("agent: GPU lost")

// read records one field: set on success, absent when not supported (and
// not asked again), absent on other errors. It reports a lost GPU.
func read[T any](d *nvmlDev, name string, get func() (T, nvml.Return), set func(T)) error {
	if d.unsupported[name] {
		return nil
	}
	v, ret := get()
	switch ret {
	case nvml.SUCCESS:
		set(v)
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_NO_PERMISSION, nvml.ERROR_FUNCTION_NOT_FOUND:
		d.unsupported[name] = true
	case nvml.ERROR_GPU_IS_LOST:
		return fmt.Errorf("%w: %s: %v", errDeviceLost, name, ret)
	}
	return nil
}

func f64(v float64) *float64 { return &v }
func i64(v int64) *int64     { return &v }

func (r *nvmlReader) Sample(i int) (tps.GPUSample, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return tps.GPUSample{}, fmt.Errorf("%w: reader closed", ErrNoNVML)
	}
	if i < 0 || i >= len(r.devs) {
		return tps.GPUSample{}, fmt.Errorf("agent: no GPU %d", i)
	}
	r.drainXID()
	d := &r.devs[i]
	h := d.h
	s := tps.GPUSample{Index: int32(d.info.Index), UUID: d.info.UUID, Name: d.info.Name}
	errs := []error{
		read(d, "util", h.GetUtilizationRates, func(u nvml.Utilization) { s.GPUUtilPct, s.MemUtilPct = f64(float64(u.Gpu)), f64(float64(u.Memory)) }),
		read(d, "mem", h.GetMemoryInfo, func(m nvml.Memory) { s.MemUsedBytes, s.MemTotalBytes = i64(int64(m.Used)), i64(int64(m.Total)) }),
		read(d, "power", h.GetPowerUsage, func(mw uint32) { s.PowerW = f64(float64(mw) / 1000) }),
		read(d, "power_limit", h.GetEnforcedPowerLimit, func(mw uint32) { s.PowerLimitW = f64(float64(mw) / 1000) }),
		read(d, "energy", h.GetTotalEnergyConsumption, func(mj uint64) { s.EnergyMJ = i64(int64(mj)) }),
		read(d, "sm_clock", func() (uint32, nvml.Return) { return h.GetClockInfo(nvml.CLOCK_SM) }, func(v uint32) { s.SMClockMHz = i64(int64(v)) }),
		read(d, "sm_clock_max", func() (uint32, nvml.Return) { return h.GetMaxClockInfo(nvml.CLOCK_SM) }, func(v uint32) { s.SMClockMaxMHz = i64(int64(v)) }),
		read(d, "mem_clock", func() (uint32, nvml.Return) { return h.GetClockInfo(nvml.CLOCK_MEM) }, func(v uint32) { s.MemClockMHz = i64(int64(v)) }),
		read(d, "mem_clock_max", func() (uint32, nvml.Return) { return h.GetMaxClockInfo(nvml.CLOCK_MEM) }, func(v uint32) { s.MemClockMaxMHz = i64(int64(v)) }),
		read(d, "temp", func() (uint32, nvml.Return) { return h.GetTemperature(nvml.TEMPERATURE_GPU) }, func(v uint32) { s.TempC = i64(int64(v)) }),
		read(d, "clock_events", h.GetCurrentClocksEventReasons, func(v uint64) { s.ClockEventReason = i64(int64(v)) }),
		read(d, "pcie_tx", func() (uint32, nvml.Return) { return h.GetPcieThroughput(nvml.PCIE_UTIL_TX_BYTES) }, func(kb uint32) { s.PCIeTxBps = i64(int64(kb) * 1024) }),
		read(d, "pcie_rx", func() (uint32, nvml.Return) { return h.GetPcieThroughput(nvml.PCIE_UTIL_RX_BYTES) }, func(kb uint32) { s.PCIeRxBps = i64(int64(kb) * 1024) }),
		read(d, "ecc_corrected", func() (uint64, nvml.Return) {
			return h.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.AGGREGATE_ECC)
		}, func(v uint64) { s.ECCCorrected = i64(int64(v)) }),
		read(d, "ecc_uncorrected", func() (uint64, nvml.Return) {
			return h.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.AGGREGATE_ECC)
		}, func(v uint64) { s.ECCUncorrected = i64(int64(v)) }),
		read(d, "remapped", func() ([2]int, nvml.Return) {
			c, u, _, _, ret := h.GetRemappedRows()
			return [2]int{c, u}, ret
		}, func(v [2]int) { s.RemappedCorr, s.RemappedUncorr = i64(int64(v[0])), i64(int64(v[1])) }),
		read(d, "nvlink", func() ([2]int64, nvml.Return) {
			fv := []nvml.FieldValue{{FieldId: nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ScopeId: ^uint32(0)}, {FieldId: nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ScopeId: ^uint32(0)}}
			if ret := h.GetFieldValues(fv); ret != nvml.SUCCESS {
				return [2]int64{}, ret
			}
			for _, f := range fv {
				if nvml.Return(f.NvmlReturn) != nvml.SUCCESS {
					return [2]int64{}, nvml.Return(f.NvmlReturn)
				}
			}
			// KiB counters; the value is an unsigned long long.
			return [2]int64{int64(leU64(fv[0].Value)) * 1024, int64(leU64(fv[1].Value)) * 1024}, nvml.SUCCESS
		}, func(v [2]int64) { s.NVLinkTxBytes, s.NVLinkRxBytes = i64(v[0]), i64(v[1]) }),
	}
	for _, err := range errs {
		if err != nil {
			return tps.GPUSample{}, err
		}
	}
	if !d.unsupported["xid"] && r.xid != nil {
		s.XIDEvents = i64(d.xidCount)
		if d.hasXID {
			s.LastXID = i64(d.lastXID)
		}
	}
	if d.gpm {
		r.gpmMetrics(d, &s)
	}
	return s, nil
}

func leU64(b [8]byte) uint64 {
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}

// drainXID collects pending XID events without waiting.
func (r *nvmlReader) drainXID() {
	if r.xid == nil {
		return
	}
	for k := 0; k < 64; k++ {
		ev, ret := r.xid.Wait(0)
		if ret != nvml.SUCCESS {
			return
		}
		for i := range r.devs {
			if ev.Device == r.devs[i].h {
				r.devs[i].xidCount++
				r.devs[i].lastXID = int64(ev.EventData)
				r.devs[i].hasXID = true
			}
		}
	}
}

// gpmMetrics takes a new GPM sample and computes SM, tensor and DRAM
// bandwidth utilisation over the interval since the previous one.
func (r *nvmlReader) gpmMetrics(d *nvmlDev, s *tps.GPUSample) {
	if d.h.GpmSampleGet(d.gpmCur) != nvml.SUCCESS {
		return
	}
	m := nvml.GpmMetricsGetType{NumMetrics: 3, Sample1: d.gpmPrev, Sample2: d.gpmCur}
	m.Metrics[0].MetricId = uint32(nvml.GPM_METRIC_SM_UTIL)
	m.Metrics[1].MetricId = uint32(nvml.GPM_METRIC_ANY_TENSOR_UTIL)
	m.Metrics[2].MetricId = uint32(nvml.GPM_METRIC_DRAM_BW_UTIL)
	if r.lib.GpmMetricsGet(&m) == nvml.SUCCESS {
		for i, dst := range []**float64{&s.GPMSMUtilPct, &s.GPMTensorPct, &s.GPMDRAMBWPct} {
			if nvml.Return(m.Metrics[i].NvmlReturn) == nvml.SUCCESS {
				*dst = f64(m.Metrics[i].Value)
			}
		}
	}
	d.gpmPrev, d.gpmCur = d.gpmCur, d.gpmPrev
}

// Close frees the GPM samples and the event set and shuts NVML down. It is
// safe to call more than once.
func (r *nvmlReader) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	for _, d := range r.devs {
		if d.gpm {
			d.gpmPrev.Free()
			d.gpmCur.Free()
		}
	}
	if r.xid != nil {
		r.xid.Free()
	}
	if ret := r.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("agent: nvml shutdown: %v", ret)
	}
	return nil
}
