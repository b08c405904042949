package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/tps"
)

func sample() []tps.StepRecord {
	dp, tp, lr := int32(3), int32(7), int32(5)
	loss := 2.125
	return []tps.StepRecord{
		{Job: "llama", Attempt: 1, Step: 100, Rank: 63, WorldSize: 64, DPRank: &dp, TPRank: &tp, LocalRank: &lr,
			Node: "node-7", GPUUUID: "GPU-1234", StartUnixNs: 1_760_000_000_000_000_000, EndUnixNs: 1_760_000_001_000_000_000,
			DurationNs: 1e9, Tokens: 131072, PaddedTokens: 140000, Samples: 16, DataWaitNs: 1, FwdNs: 2, BwdNs: 3, OptimNs: 4,
			CommNs: 5, ExposedCommNs: 4, PPWaitNs: 6, CkptNs: 7, FLOPs: 1.5e16, Loss: &loss, Skipped: true,
			TraceComputeNs: 900, TraceCommNs: 80, TraceExposedCommNs: 30, SeqSqSum: 123456,
			Bytes: 524288, GenNs: 4e8, GenRequests: 8, GenPromptTokens: 4096, GenOutputTokens: 16384,
			CaptureNs: 31000, CaptureCPUNs: 52000, MemPeakAllocatedBytes: 40 << 30, MemPeakReservedBytes: 44 << 30, MemCapacityBytes: 80 << 30},
		{Job: "llama", Step: 100, Rank: 0, WorldSize: 64, StartUnixNs: 1, EndUnixNs: 2, Tokens: -5}, // decoded, not validated
	}
}

func TestStepsRoundTrip(t *testing.T) {
	in := sample()
	b := AppendSteps(nil, in)
	out, err := DecodeSteps(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", out, in)
	}
	js, _ := json.Marshal(in[0])
	one := AppendSteps(nil, in[:1])
	if len(one)*2 > len(js) {
		t.Errorf("binary record is %d bytes, JSON %d: expected well under half", len(one), len(js))
	}
}

func TestDecodeRejectsCorruptAtomically(t *testing.T) {
	b := AppendSteps(nil, sample())
	prev := []tps.StepRecord{{Job: "kept"}}
	for cut := 0; cut < len(b); cut++ {
		out, err := DecodeSteps(b[:cut], prev)
		if err == nil {
			t.Fatalf("truncated at %d of %d accepted", cut, len(b))
		}
		if len(out) != 1 || out[0].Job != "kept" {
			t.Fatalf("truncated at %d: dst changed to %d records", cut, len(out))
		}
	}
	if _, err := DecodeSteps([]byte(`{"job":"x"}`), nil); !errors.Is(err, ErrBadMagic) {
		t.Errorf("JSON on the step subject: got %v, want ErrBadMagic", err)
	}
	huge := append(magic[:], 0xff, 0xff, 0xff, 0xff, 0x0f)
	if _, err := DecodeSteps(huge, nil); !errors.Is(err, ErrTooLarge) {
		t.Errorf("huge count: got %v, want ErrTooLarge", err)
	}
	if _, err := DecodeSteps(append(b, 0), nil); err == nil {
		t.Error("trailing byte accepted")
	}
}

func TestSubjects(t *testing.T) {
	job, kind, node, err := ParseSubject(StepsSubject("j-1", NodeToken("gpu.node 3")))
	if err != nil || job != "j-1" || kind != "steps" || node != "gpu_node_3" {
		t.Errorf("got %q %q %q %v", job, kind, node, err)
	}
	for _, good := range []string{EventsSubject("j"), MetaSubject("j"), GPUSubject("j", "n"), PartialSubject("j", "n")} {
		if _, _, _, err := ParseSubject(good); err != nil {
			t.Errorf("%q: %v", good, err)
		}
	}
	for _, bad := range []string{"tpsprof.v2.j.steps.n", "tpsprof.v1.j.steps", "tpsprof.v1.j.events.x", "other.v1.j.meta", "tpsprof.v1.j$.meta",
		"tpsprof.v1.j.steps.n.x", "tpsprof.v1.j.steps.", "tpsprof.v1..meta", "tpsprof.v1.j", "tpsprof.v1", "tpsprof.v1.j.other.n", ""} {
		if _, _, _, err := ParseSubject(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func FuzzDecodeSteps(f *testing.F) {
	f.Add(AppendSteps(nil, sample()))
	f.Add(AppendSteps(nil, nil))
	f.Add([]byte("TPS\x01\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		recs, err := DecodeSteps(data, nil)
		if err != nil {
			if len(recs) != 0 {
				t.Fatalf("error %v with %d records returned", err, len(recs))
			}
			return
		}
		// Whatever decodes must re-encode to the same records (compared as
		// bytes: NaN floats defeat DeepEqual).
		enc := AppendSteps(nil, recs)
		again, err := DecodeSteps(enc, nil)
		if err != nil || string(AppendSteps(nil, again)) != string(enc) {
			t.Fatalf("re-encode: %v", err)
		}
		for i := range recs {
			_ = recs[i].Validate() // must not panic
		}
	})
}

func BenchmarkDecodeSteps(b *testing.B) {
	recs := make([]tps.StepRecord, 512)
	for i := range recs {
		recs[i] = sample()[0]
		recs[i].Rank = int64(i)
	}
	data := AppendSteps(nil, recs)
	var dst []tps.StepRecord
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		var err error
		dst, err = DecodeSteps(data, dst[:0])
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(recs))*float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

func BenchmarkDecodeJSONBaseline(b *testing.B) {
	recs := make([]tps.StepRecord, 512)
	var lines [][]byte
	for i := range recs {
		recs[i] = sample()[0]
		recs[i].Rank = int64(i)
		l, _ := json.Marshal(recs[i])
		lines = append(lines, l)
	}
	b.ReportAllocs()
	for b.Loop() {
		for _, l := range lines {
			var r tps.StepRecord
			if err := json.Unmarshal(l, &r); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(len(recs))*float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

func FuzzDecodeGPUSamples(f *testing.F) {
	f.Add([]byte(`[{"node":"n","index":0,"uuid":"GPU-1","name":"NVIDIA H100 80GB HBM3","unix_ns":1760000000000000000,"power_w":650.5,"energy_mj":12345}]`))
	f.Add([]byte(`[{"power_w":-1}]`))
	f.Add([]byte(`{}`))
	f.Add(EncodeGPUSamples(sampleGPUs()))
	f.Add([]byte("TPG\x01\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := DecodeGPUSamples(data)
		if err != nil {
			return
		}
		for i := range s {
			if s[i].Validate() == nil && s[i].PowerW != nil && *s[i].PowerW < 0 {
				t.Fatalf("negative power validated: %+v", s[i])
			}
		}
		// Whatever decodes re-encodes and decodes to the same samples
		// (compared as bytes: NaN defeats DeepEqual).
		enc := EncodeGPUSamples(s)
		again, err := DecodeGPUSamples(enc)
		if err != nil || string(EncodeGPUSamples(again)) != string(enc) {
			t.Fatalf("re-encode: %v", err)
		}
	})
}

// The launch rule: join a running attempt started recently, else the next
// attempt after the job's highest, 0 for a new job.
func TestAttemptReplyChoose(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for _, c := range []struct {
		r    AttemptReply
		want int64
	}{
		{AttemptReply{Running: -1}, 0},
		{AttemptReply{HasData: true, MaxAttempt: 3, Running: -1}, 4},
		{AttemptReply{HasData: true, MaxAttempt: 3, Running: 3, RunningSinceUnixNs: now.Add(-time.Minute).UnixNano()}, 3},
		// started too long ago: a launch that died without its attempt_end
		{AttemptReply{HasData: true, MaxAttempt: 3, Running: 3, RunningSinceUnixNs: now.Add(-time.Hour).UnixNano()}, 4},
		// a collector that never bounded attempts answers 2^63-1: no overflow
		{AttemptReply{HasData: true, MaxAttempt: math.MaxInt64, Running: -1}, tps.MaxAttempt},
	} {
		if got, why := c.r.Choose(now, 5*time.Minute); got != c.want || why == "" {
			t.Errorf("%+v: attempt %d (%s), want %d", c.r, got, why, c.want)
		}
	}
}

// The step batch's bytes, written out here field by field in the order
// docs/wire.md gives, not from tps.Measures: a change to that table's
// order (which drives the encoder and decoder) that would change layout 1
// fails here.
func TestStepLayoutFixed(t *testing.T) {
	r := sample()[0]
	var b []byte
	b = append(b, 'T', 'P', 'S', 1)
	b = binary.AppendUvarint(b, 1)
	b = binary.AppendUvarint(b, hasDP|hasTP|hasLocalRank|hasLoss|isSkipped|hasTrace|hasSeqSq|hasBytes|hasGen|hasCost|hasMem)
	b = binary.AppendUvarint(b, uint64(len(r.Job)))
	b = append(b, r.Job...)
	for _, v := range []int64{r.Attempt, r.Step, r.Rank, r.WorldSize, int64(*r.DPRank), int64(*r.TPRank), int64(*r.LocalRank)} {
		b = binary.AppendVarint(b, v)
	}
	for _, s := range []string{r.Node, r.GPUUUID} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	for _, v := range []int64{r.StartUnixNs, r.EndUnixNs, r.DurationNs, r.Tokens, r.PaddedTokens, r.Samples,
		r.DataWaitNs, r.FwdNs, r.BwdNs, r.OptimNs, r.CommNs, r.ExposedCommNs, r.PPWaitNs, r.CkptNs} {
		b = binary.AppendVarint(b, v)
	}
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(r.FLOPs))
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(*r.Loss))
	for _, v := range []int64{r.TraceComputeNs, r.TraceCommNs, r.TraceExposedCommNs, r.SeqSqSum, r.Bytes,
		r.GenNs, r.GenRequests, r.GenPromptTokens, r.GenOutputTokens, r.CaptureNs, r.CaptureCPUNs,
		r.MemPeakAllocatedBytes, r.MemPeakReservedBytes, r.MemCapacityBytes} {
		b = binary.AppendVarint(b, v)
	}
	if got := AppendSteps(nil, []tps.StepRecord{r}); !bytes.Equal(got, b) {
		t.Fatalf("layout 1 changed:\n got %x\nwant %x", got, b)
	}
}
