package tps

import (
	"math"
	"reflect"
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
	v := reflect.ValueOf(s).Elem()
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := v.Field(i)
		if f.Kind() != reflect.Pointer || f.IsNil() {
			continue
		}
		name := t.Field(i).Tag.Get("parquet")
		for j := 0; j < len(name); j++ {
			if name[j] == ',' {
				name = name[:j]
				break
			}
		}
		switch e := f.Elem(); e.Kind() {
		case reflect.Float64:
			x := e.Float()
			if math.IsNaN(x) || math.IsInf(x, 0) || x < 0 {
				return fieldErr(name, x, ReasonOutOfRange, "must be a finite, non-negative number")
			}
		case reflect.Int64:
			if e.Int() < 0 {
				return fieldErr(name, e.Int(), ReasonNegative, "must not be negative")
			}
		}
	}
	return nil
}
