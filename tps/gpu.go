package tps

import (
	"math"
	"slices"
	"time"
)

// GPUSample is one reading of one GPU. Pointer fields are absent when the GPU
// or driver does not report them: absent is not zero.
type GPUSample struct {
	Job    string `json:"job,omitempty" parquet:"job,dict"`
	Node   string `json:"node" parquet:"node,dict"`
	Index  int32  `json:"index" parquet:"index"`
	UUID   string `json:"uuid" parquet:"uuid,dict"`
	Name   string `json:"name" parquet:"name,dict"`
	UnixNs int64  `json:"unix_ns" parquet:"unix_ns"`

	GPUUtilPct       *float64 `json:"gpu_util_pct,omitempty" parquet:"gpu_util_pct,optional"`
	MemUtilPct       *float64 `json:"mem_util_pct,omitempty" parquet:"mem_util_pct,optional"`
	MemUsedBytes     *int64   `json:"mem_used_bytes,omitempty" parquet:"mem_used_bytes,optional"`
	MemTotalBytes    *int64   `json:"mem_total_bytes,omitempty" parquet:"mem_total_bytes,optional"`
	PowerW           *float64 `json:"power_w,omitempty" parquet:"power_w,optional"`
	PowerLimitW      *float64 `json:"power_limit_w,omitempty" parquet:"power_limit_w,optional"`
	EnergyMJ         *int64   `json:"energy_mj,omitempty" parquet:"energy_mj,optional"` // total energy counter, millijoules
	SMClockMHz       *int64   `json:"sm_clock_mhz,omitempty" parquet:"sm_clock_mhz,optional"`
	SMClockMaxMHz    *int64   `json:"sm_clock_max_mhz,omitempty" parquet:"sm_clock_max_mhz,optional"`
	MemClockMHz      *int64   `json:"mem_clock_mhz,omitempty" parquet:"mem_clock_mhz,optional"`
	MemClockMaxMHz   *int64   `json:"mem_clock_max_mhz,omitempty" parquet:"mem_clock_max_mhz,optional"`
	TempC            *int64   `json:"temp_c,omitempty" parquet:"temp_c,optional"`
	ClockEventReason *int64   `json:"clock_event_reasons,omitempty" parquet:"clock_event_reasons,optional"` // NVML bitmask
	PCIeTxBps        *int64   `json:"pcie_tx_bytes_per_s,omitempty" parquet:"pcie_tx_bytes_per_s,optional"`
	PCIeRxBps        *int64   `json:"pcie_rx_bytes_per_s,omitempty" parquet:"pcie_rx_bytes_per_s,optional"`
	NVLinkTxBytes    *int64   `json:"nvlink_tx_bytes,omitempty" parquet:"nvlink_tx_bytes,optional"`
	NVLinkRxBytes    *int64   `json:"nvlink_rx_bytes,omitempty" parquet:"nvlink_rx_bytes,optional"`
	ECCCorrected     *int64   `json:"ecc_corrected,omitempty" parquet:"ecc_corrected,optional"`
	ECCUncorrected   *int64   `json:"ecc_uncorrected,omitempty" parquet:"ecc_uncorrected,optional"`
	RemappedCorr     *int64   `json:"remapped_rows_correctable,omitempty" parquet:"remapped_rows_correctable,optional"`
	RemappedUncorr   *int64   `json:"remapped_rows_uncorrectable,omitempty" parquet:"remapped_rows_uncorrectable,optional"`
	XIDEvents        *int64   `json:"xid_events,omitempty" parquet:"xid_events,optional"`
	LastXID          *int64   `json:"last_xid,omitempty" parquet:"last_xid,optional"`
	GPMSMUtilPct     *float64 `json:"gpm_sm_util_pct,omitempty" parquet:"gpm_sm_util_pct,optional"`
	GPMTensorPct     *float64 `json:"gpm_tensor_pct,omitempty" parquet:"gpm_tensor_pct,optional"`
	GPMDRAMBWPct     *float64 `json:"gpm_dram_bw_pct,omitempty" parquet:"gpm_dram_bw_pct,optional"`
}

// ThrottleReason is an NVML clock event reason (a ClockEventReason bit)
// that slows a GPU.
type ThrottleReason struct {
	Bit  int64
	Name string
}

// throttleReasons are those that slow a GPU: not idle, application
// clocks, sync boost or display settings.
var throttleReasons = []ThrottleReason{{0x4, "software power cap"}, {0x8, "hardware slowdown"}, {0x20, "software thermal slowdown"}, {0x40, "hardware thermal slowdown"}, {0x80, "power brake"}}

// ThrottleReasons are the clock event reasons that slow a GPU (a copy).
func ThrottleReasons() []ThrottleReason { return slices.Clone(throttleReasons) }

// gpuFloatFields and gpuIntFields name the optional fields of a GPUSample
// (their Parquet and JSON names) in the order OptionalFloats and
// OptionalInts return them, which is also their order on the wire.
var (
	gpuFloatFields = [7]string{"gpu_util_pct", "mem_util_pct", "power_w", "power_limit_w", "gpm_sm_util_pct", "gpm_tensor_pct", "gpm_dram_bw_pct"}
	gpuIntFields   = [19]string{"mem_used_bytes", "mem_total_bytes", "energy_mj", "sm_clock_mhz", "sm_clock_max_mhz", "mem_clock_mhz",
		"mem_clock_max_mhz", "temp_c", "clock_event_reasons", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "nvlink_tx_bytes",
		"nvlink_rx_bytes", "ecc_corrected", "ecc_uncorrected", "remapped_rows_correctable", "remapped_rows_uncorrectable",
		"xid_events", "last_xid"}
)

// OptionalFloats returns the addresses of the optional float fields, in
// the order of gpuFloatFields.
func (s *GPUSample) OptionalFloats() [7]**float64 {
	return [...]**float64{&s.GPUUtilPct, &s.MemUtilPct, &s.PowerW, &s.PowerLimitW, &s.GPMSMUtilPct, &s.GPMTensorPct, &s.GPMDRAMBWPct}
}

// OptionalInts returns the addresses of the optional integer fields, in
// the order of gpuIntFields.
func (s *GPUSample) OptionalInts() [19]**int64 {
	return [...]**int64{&s.MemUsedBytes, &s.MemTotalBytes, &s.EnergyMJ, &s.SMClockMHz, &s.SMClockMaxMHz, &s.MemClockMHz,
		&s.MemClockMaxMHz, &s.TempC, &s.ClockEventReason, &s.PCIeTxBps, &s.PCIeRxBps, &s.NVLinkTxBytes, &s.NVLinkRxBytes,
		&s.ECCCorrected, &s.ECCUncorrected, &s.RemappedCorr, &s.RemappedUncorr, &s.XIDEvents, &s.LastXID}
}

// Validate checks a sample: identity strings bounded, a plausible time, and
// every present number finite and not negative.
func (s *GPUSample) Validate() error {
	for _, f := range []struct{ name, v string }{{"node", s.Node}, {"uuid", s.UUID}, {"name", s.Name}} {
		if len(f.v) > MaxStringLen || !printable(f.v) {
			return fieldErr(f.name, truncate(f.v, 80), ReasonInvalid, "must be at most %d printable characters", MaxStringLen)
		}
	}
	if s.Index < 0 {
		return fieldErr("index", s.Index, ReasonNegative, "must not be negative")
	}
	if s.UnixNs < MinUnixNs {
		return fieldErr("unix_ns", s.UnixNs, ReasonOutOfRange, "before 2000-01-01: not a Unix time in nanoseconds")
	}
	for k, p := range s.OptionalFloats() {
		if x := *p; x != nil && (math.IsNaN(*x) || math.IsInf(*x, 0) || *x < 0) {
			return fieldErr(gpuFloatFields[k], *x, ReasonOutOfRange, "must be a finite, non-negative number")
		}
	}
	for k, p := range s.OptionalInts() {
		if x := *p; x != nil && *x < 0 {
			return fieldErr(gpuIntFields[k], *x, ReasonNegative, "must not be negative")
		}
	}
	return nil
}

// CheckClock rejects a sample stamped further than tolerance in the
// future: one such sample would make every later sample of its GPU look
// stale until the clock caught up (no energy, no GPU join).
func (s *GPUSample) CheckClock(now time.Time, tolerance time.Duration) error {
	return checkFuture("unix_ns", s.UnixNs, now, tolerance)
}

// MemHeadroom is the device memory left at a peak: 1 − reserved ÷
// capacity, false where it is unknown (no capacity, or a capacity below
// the peak: a record's own inconsistency).
func MemHeadroom(reserved, capacity int64) (float64, bool) {
	if capacity <= 0 || reserved < 0 || reserved > capacity {
		return 0, false
	}
	return 1 - float64(reserved)/float64(capacity), true
}

// MemFuller orders two ranks' memory peaks, fullest first: less headroom,
// then (or where none is known, after those with one) the larger reserved
// peak. It returns a negative number when a is fuller, as slices.SortFunc
// takes.
func MemFuller(aReserved, aCapacity, bReserved, bCapacity int64) int {
	ha, oka := MemHeadroom(aReserved, aCapacity)
	hb, okb := MemHeadroom(bReserved, bCapacity)
	switch {
	case oka != okb:
		if oka {
			return -1
		}
		return 1
	case oka && ha != hb:
		if ha < hb {
			return -1
		}
		return 1
	case aReserved != bReserved:
		if aReserved > bReserved {
			return -1
		}
		return 1
	}
	return 0
}
