//go:build cgo

package agent

import (
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/nats-io/nats.go"

	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/wire"
)

// fakeNode is go-nvml's DGX A100 mock with the readings the agent asks for.
// Device 7 supports none of the optional fields.
type fakeNode struct {
	*dgxa100.Server
	energy   [8]uint64
	lost     [8]atomic.Bool
	utilHits atomic.Int64
	pcieHits atomic.Int64
	xids     []nvml.EventData
}

func newFakeNode(t *testing.T) *fakeNode {
	f := &fakeNode{Server: dgxa100.New()}
	notSup := func() (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	for i, dev := range f.Devices {
		d := dev.(*dgxa100.Device)
		d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			f.utilHits.Add(1)
			if f.lost[i].Load() {
				return nvml.Utilization{}, nvml.ERROR_GPU_IS_LOST
			}
			return nvml.Utilization{Gpu: 97, Memory: 41}, nvml.SUCCESS
		}
		d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 312_500, nvml.SUCCESS } // mW
		d.GetEnforcedPowerLimitFunc = func() (uint32, nvml.Return) { return 400_000, nvml.SUCCESS }
		d.GetTotalEnergyConsumptionFunc = func() (uint64, nvml.Return) { f.energy[i] += 312_500; return f.energy[i], nvml.SUCCESS }
		d.GetClockInfoFunc = func(c nvml.ClockType) (uint32, nvml.Return) {
			if c == nvml.CLOCK_SM {
				return 1410, nvml.SUCCESS
			}
			return 1215, nvml.SUCCESS
		}
		d.GetMaxClockInfoFunc = func(c nvml.ClockType) (uint32, nvml.Return) {
			if c == nvml.CLOCK_SM {
				return 1410, nvml.SUCCESS
			}
			return 1593, nvml.SUCCESS
		}
		d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 64, nvml.SUCCESS }
		d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) { return 0x20, nvml.SUCCESS } // SW thermal slowdown
		d.GetPcieThroughputFunc = func(c nvml.PcieUtilCounter) (uint32, nvml.Return) {
			f.pcieHits.Add(1)
			if c == nvml.PCIE_UTIL_TX_BYTES {
				return 1000, nvml.SUCCESS
			}
			return 2000, nvml.SUCCESS
		}
		d.GetTotalEccErrorsFunc = func(e nvml.MemoryErrorType, _ nvml.EccCounterType) (uint64, nvml.Return) {
			if e == nvml.MEMORY_ERROR_TYPE_CORRECTED {
				return 3, nvml.SUCCESS
			}
			return 0, nvml.SUCCESS
		}
		d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 1, 0, false, false, nvml.SUCCESS }
		d.GetFieldValuesFunc = func(fv []nvml.FieldValue) nvml.Return {
			for k := range fv {
				v := uint64(1 + k) // KiB
				for b := 0; b < 8; b++ {
					fv[k].Value[b] = byte(v >> (8 * b))
				}
			}
			return nvml.SUCCESS
		}
		d.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
		d.GpmSampleGetFunc = func(nvml.GpmSample) nvml.Return { return nvml.SUCCESS }
		if i == 7 { // an older board: none of the optional readings
			d.GetPcieThroughputFunc = func(nvml.PcieUtilCounter) (uint32, nvml.Return) { f.pcieHits.Add(1); return notSup() }
			d.GetTotalEnergyConsumptionFunc = func() (uint64, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
			d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
			d.GetFieldValuesFunc = func([]nvml.FieldValue) nvml.Return { return nvml.ERROR_NOT_SUPPORTED }
			d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 0, 0, false, false, nvml.ERROR_NOT_SUPPORTED }
			d.GetTotalEccErrorsFunc = func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) {
				return 0, nvml.ERROR_NOT_SUPPORTED
			}
			d.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.ERROR_NOT_SUPPORTED }
		}
	}
	f.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(uint32) (nvml.EventData, nvml.Return) {
				if len(f.xids) == 0 {
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
				e := f.xids[0]
				f.xids = f.xids[1:]
				return e, nvml.SUCCESS
			},
			FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	// GPM (Hopper and newer) on device 0 only.
	f.GpmQueryDeviceSupportFunc = func(d nvml.Device) (nvml.GpmSupport, nvml.Return) {
		if d == f.Devices[0] {
			return nvml.GpmSupport{IsSupportedDevice: 1}, nvml.SUCCESS
		}
		return nvml.GpmSupport{}, nvml.SUCCESS
	}
	f.GpmSampleAllocFunc = func() (nvml.GpmSample, nvml.Return) {
		return &mock.GpmSample{FreeFunc: func() nvml.Return { return nvml.SUCCESS }}, nvml.SUCCESS
	}
	f.GpmMetricsGetFunc = func(m *nvml.GpmMetricsGetType) nvml.Return {
		for i := 0; i < int(m.NumMetrics); i++ {
			m.Metrics[i].Value = float64(10 * (i + 1))
		}
		return nvml.SUCCESS
	}
	return f
}

func TestNVMLReaderFields(t *testing.T) {
	f := newFakeNode(t)
	f.xids = []nvml.EventData{{Device: f.Devices[2], EventType: nvml.EventTypeXidCriticalError, EventData: 79}}
	r, err := newNVMLReader(f)
	if err != nil {
		t.Fatal(err)
	}
	devs := r.Devices()
	if len(devs) != 8 || devs[0].Name != "Mock NVIDIA A100-SXM4-40GB" || devs[0].UUID == "" {
		t.Fatalf("devices: %+v", devs)
	}
	s, err := r.Sample(0)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"gpu_util_pct", *s.GPUUtilPct, 97.0}, {"mem_util_pct", *s.MemUtilPct, 41.0},
		{"mem_total_bytes", *s.MemTotalBytes, int64(40 * 1024 * 1024 * 1024)},
		{"power_w", *s.PowerW, 312.5}, {"power_limit_w", *s.PowerLimitW, 400.0},
		{"energy_mj", *s.EnergyMJ, int64(312_500)},
		{"sm_clock_mhz", *s.SMClockMHz, int64(1410)}, {"mem_clock_max_mhz", *s.MemClockMaxMHz, int64(1593)},
		{"temp_c", *s.TempC, int64(64)}, {"clock_event_reasons", *s.ClockEventReason, int64(0x20)},
		{"pcie_tx_bytes_per_s", *s.PCIeTxBps, int64(1000 * 1024)}, {"pcie_rx_bytes_per_s", *s.PCIeRxBps, int64(2000 * 1024)},
		{"nvlink_tx_bytes", *s.NVLinkTxBytes, int64(1024)}, {"nvlink_rx_bytes", *s.NVLinkRxBytes, int64(2048)},
		{"ecc_corrected", *s.ECCCorrected, int64(3)}, {"remapped_rows_correctable", *s.RemappedCorr, int64(1)},
		{"xid_events", *s.XIDEvents, int64(0)},
		{"gpm_sm_util_pct", *s.GPMSMUtilPct, 10.0}, {"gpm_tensor_pct", *s.GPMTensorPct, 20.0}, {"gpm_dram_bw_pct", *s.GPMDRAMBWPct, 30.0},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
	s.UnixNs = 1_760_000_000_000_000_000 // the agent stamps the time
	if err := s.Validate(); err != nil {
		t.Errorf("sample does not validate: %v", err)
	}
	// The XID event landed on device 2.
	s2, _ := r.Sample(2)
	if s2.XIDEvents == nil || *s2.XIDEvents != 1 || s2.LastXID == nil || *s2.LastXID != 79 {
		t.Errorf("device 2 XID: %v %v", s2.XIDEvents, s2.LastXID)
	}
	if s2.GPMSMUtilPct != nil {
		t.Errorf("device 2 has no GPM support but got a GPM reading")
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil { // idempotent: no double free
		t.Fatal(err)
	}
	if _, err := r.Sample(0); !errors.Is(err, ErrNoNVML) {
		t.Errorf("sample after close: %v", err)
	}
}

// Unsupported fields are absent, not zero, and not asked again.
func TestNVMLReaderUnsupportedFields(t *testing.T) {
	f := newFakeNode(t)
	r, err := newNVMLReader(f)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for k := 0; k < 3; k++ {
		s, err := r.Sample(7)
		if err != nil {
			t.Fatal(err)
		}
		for name, p := range map[string]bool{"pcie_tx": s.PCIeTxBps != nil, "energy": s.EnergyMJ != nil,
			"clock_events": s.ClockEventReason != nil, "nvlink": s.NVLinkTxBytes != nil, "remapped": s.RemappedCorr != nil,
			"ecc": s.ECCCorrected != nil, "xid": s.XIDEvents != nil} {
			if p {
				t.Errorf("%s: present on a device that does not support it", name)
			}
		}
		if s.PowerW == nil || *s.PowerW != 312.5 {
			t.Errorf("supported field missing: power %v", s.PowerW)
		}
	}
	if n := f.pcieHits.Load(); n != 2 {
		t.Errorf("PCIe throughput asked %d times on an unsupporting device over 3 samples, want 2 (TX and RX once each)", n)
	}
}

// With no driver, Init fails and nothing else may be called: not even
// Shutdown, which kills the process with the real library.
func TestNVMLMissingDriver(t *testing.T) {
	lib := &mock.Interface{
		InitFunc:     func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND },
		ShutdownFunc: func() nvml.Return { t.Fatal("Shutdown called after a failed Init"); return nvml.SUCCESS },
		DeviceGetCountFunc: func() (int, nvml.Return) {
			t.Fatal("DeviceGetCount called after a failed Init")
			return 0, nvml.SUCCESS
		},
	}
	_, err := newNVMLReader(lib)
	if !errors.Is(err, ErrNoNVML) {
		t.Fatalf("got %v, want ErrNoNVML", err)
	}
}

// A device that starts failing mid-run makes only its own readings fail.
func TestNVMLDeviceLostMidRun(t *testing.T) {
	f := newFakeNode(t)
	r, err := newNVMLReader(f)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Sample(3); err != nil {
		t.Fatal(err)
	}
	f.lost[3].Store(true)
	if _, err := r.Sample(3); !errors.Is(err, errDeviceLost) {
		t.Errorf("lost device: got %v, want errDeviceLost", err)
	}
	if _, err := r.Sample(4); err != nil {
		t.Errorf("healthy device failed: %v", err)
	}
	f.lost[3].Store(false) // it came back (reset)
	if _, err := r.Sample(3); err != nil {
		t.Errorf("recovered device: %v", err)
	}
}

// The agent's periodic sampler reads the (mocked) NVML every interval and
// publishes the samples on the job's gpu subject.
func TestAgentSamplesPeriodically(t *testing.T) {
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	msgs := make(chan *nats.Msg, 64)
	nc.ChanSubscribe(wire.GPUSubject("gpujob", "n7"), msgs)
	nc.Flush()
	r, err := newNVMLReader(newFakeNode(t))
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := os.MkdirTemp("", "tpsprof-gpu")
	defer os.RemoveAll(dir)
	a, err := Start(Config{Socket: filepath.Join(dir, "a.sock"), NATS: natsconn.Options{URL: srv.URL()}, Node: "n7",
		GPU: r, GPUInterval: 10 * time.Millisecond, FlushInterval: 5 * time.Millisecond, ResubscribeGrace: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := a.SubmitMeta(tps.RunMeta{Job: "gpujob"}); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-msgs:
		s, err := wire.DecodeGPUSamples(m.Data)
		if err != nil || len(s) != 8 || s[0].Node != "n7" || s[0].PowerW == nil || s[0].Validate() != nil {
			t.Fatalf("samples: %v %+v", err, s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no GPU samples published")
	}
	if a.Stats().GPUSamples < 8 {
		t.Errorf("stats: %+v", a.Stats())
	}
}
