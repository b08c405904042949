package wire

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
)

// sampleGPUs: a node's 8 GPUs, one with every field, one with none of the
// optional ones, the rest in between.
func sampleGPUs() []tps.GPUSample {
	f := func(v float64) *float64 { return &v }
	i := func(v int64) *int64 { return &v }
	out := make([]tps.GPUSample, 8)
	for g := range out {
		out[g] = tps.GPUSample{Node: "node-3", Index: int32(g), UUID: "GPU-" + strings.Repeat(string(rune('a'+g)), 8), Name: "NVIDIA H100 80GB HBM3",
			UnixNs: 1_760_000_000_123_456_789 + int64(g)}
		if g == 1 {
			continue
		}
		s := &out[g]
		s.PowerW, s.EnergyMJ, s.SMClockMHz, s.ClockEventReason = f(612.25+float64(g)), i(987_654_321_000+int64(g)), i(1980), i(0)
		if g == 0 {
			s.GPUUtilPct, s.MemUtilPct, s.MemUsedBytes, s.MemTotalBytes, s.PowerLimitW = f(97.5), f(41), i(71<<30), i(80<<30), f(700)
			s.SMClockMaxMHz, s.MemClockMHz, s.MemClockMaxMHz, s.TempC = i(1980), i(2619), i(2619), i(63)
			s.PCIeTxBps, s.PCIeRxBps, s.NVLinkTxBytes, s.NVLinkRxBytes = i(1<<28), i(1<<27), i(1<<40), i(1<<41)
			s.ECCCorrected, s.ECCUncorrected, s.RemappedCorr, s.RemappedUncorr, s.XIDEvents, s.LastXID = i(3), i(0), i(1), i(0), i(2), i(79)
			s.GPMSMUtilPct, s.GPMTensorPct, s.GPMDRAMBWPct = f(88.5), f(61), f(35)
		}
	}
	return out
}

func TestGPUSamplesRoundTrip(t *testing.T) {
	in := sampleGPUs()
	b := EncodeGPUSamples(in)
	got, err := DecodeGPUSamples(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, in) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, in)
	}
	js, _ := json.Marshal(in)
	if len(b)*3 > len(js) {
		t.Errorf("binary %d bytes, JSON %d: expected at least 3× smaller", len(b), len(js))
	}
	// JSON, as older agents send it, still decodes to the same samples.
	if fromJSON, err := DecodeGPUSamples(js); err != nil || !reflect.DeepEqual(fromJSON, in) {
		t.Fatalf("JSON: %v\n got %+v", err, fromJSON)
	}
	for n := 0; n < len(b); n++ {
		if _, err := DecodeGPUSamples(b[:n]); err == nil {
			t.Fatalf("truncated at %d of %d decoded", n, len(b))
		}
	}
	if _, err := DecodeGPUSamples(append(b, 0)); err == nil {
		t.Error("trailing byte accepted")
	}
	for _, bad := range [][]byte{[]byte("TPG\x01\xff\xff\x03"), []byte("TPS\x01\x00"), []byte("{}")} {
		if _, err := DecodeGPUSamples(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// BenchmarkDecodeGPUSamples compares the binary samples with their JSON.
//
//	go test -run '^$' -bench DecodeGPUSamples ./wire/
func BenchmarkDecodeGPUSamples(b *testing.B) {
	in := sampleGPUs()
	for g := range in { // every field, as an H100 reports
		in[g] = sampleGPUs()[0]
		in[g].Index = int32(g)
	}
	js, _ := json.Marshal(in)
	benchBinaryAndJSON(b, EncodeGPUSamples(in), js, len(in), "sample", func(d []byte) error { _, err := DecodeGPUSamples(d); return err })
}
