package wire

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
)

// samplePartials: two nodes of a 16-rank job with TP=2 (8 replicas), one
// replica whose ranks disagree on tokens, losses and a skipped rank.
func samplePartials(t testing.TB) []tps.Partial {
	topo := tps.Topology{TP: 2, DP: 8, PP: 1, CP: 1}
	var out []tps.Partial
	for node := int64(0); node < 2; node++ {
		var recs []tps.StepRecord
		for r := node * 8; r < node*8+8; r++ {
			loss := 2.5 + float64(r)/100
			recs = append(recs, tps.StepRecord{Job: "j-1", Attempt: 1, Step: 42, Rank: r, WorldSize: 16, Node: fmt.Sprintf("node-%d", node),
				StartUnixNs: 1_760_000_000_000_000_000 + r, EndUnixNs: 1_760_000_001_000_000_000, DurationNs: 1e9 - r*1e6,
				Tokens: 4096 + r%2*int64(node), FLOPs: 1.5e15, ExposedCommNs: 1e8, CommNs: 3e8, DataWaitNs: r * 1e5,
				PPWaitNs: 2e7, CkptNs: 0, Loss: &loss, Skipped: r == 3, Bytes: 16384 + r,
				GenNs: 4e8 + r*1e6, GenRequests: 2, GenPromptTokens: 64, GenOutputTokens: 512 + r, SeqSqSum: 3_000_000 + r})
		}
		p, err := tps.NewPartial(recs, topo)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

func TestPartialsRoundTrip(t *testing.T) {
	ps := samplePartials(t)
	b := EncodePartials(ps)
	got, err := DecodePartials(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, ps) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, ps)
	}
	js, _ := json.Marshal(ps)
	if len(b)*3 > len(js) {
		t.Errorf("binary %d bytes, JSON %d: expected at least 3× smaller", len(b), len(js))
	}
	// JSON, as older agents send it, still decodes to the same partials.
	fromJSON, err := DecodePartials(js)
	if err != nil || !reflect.DeepEqual(fromJSON, ps) {
		t.Fatalf("JSON: %v\n got %+v", err, fromJSON)
	}
	// Every truncation is an error, never a panic or a short result.
	for n := 0; n < len(b); n++ {
		if _, err := DecodePartials(b[:n]); err == nil {
			t.Fatalf("truncated at %d of %d decoded", n, len(b))
		}
	}
}

// Layouts 1 (before bytes and the generation phase) and 3 (the sums
// listed by hand, maxima as float64) still decode: the same partials,
// layout 1's without those figures.
func TestPartialsLegacyLayouts(t *testing.T) {
	for _, layout := range []byte{1, 3} {
		ps := samplePartials(t)
		var b []byte
		b = append(b, 'T', 'P', 'P', layout)
		b = binary.AppendUvarint(b, uint64(len(ps)))
		for i := range ps {
			p := &ps[i]
			b = appendString(b, p.Job)
			for _, v := range [...]int64{p.Attempt, p.Step, p.WorldSize} {
				b = binary.AppendVarint(b, v)
			}
			b = binary.AppendUvarint(b, uint64(len(p.Ranks)))
			prev := int64(-1)
			for _, r := range p.Ranks {
				b = binary.AppendUvarint(b, uint64(r-prev))
				prev = r
			}
			b = binary.AppendUvarint(b, uint64(len(p.Replicas)))
			for k := range p.Replicas {
				x := &p.Replicas[k]
				b = binary.AppendVarint(b, x.Replica)
				b = binary.AppendVarint(b, x.Tokens)
				b = binary.LittleEndian.AppendUint64(b, math.Float64bits(x.FLOPs))
				b = binary.AppendVarint(b, x.LowestRank)
				b = append(b, boolByte(x.Mismatch))
				x.SeqSqSum = 0 // not before layout 4
				if layout == 1 {
					x.Bytes = 0 // not in layout 1
				} else {
					b = binary.AppendVarint(b, x.Bytes)
				}
			}
			for _, v := range [...]int64{p.Max[legacyDuration], p.MaxComputeNs, p.SlowestRank, p.Min[legacyStart], p.Max[legacyEnd], p.NLoss, p.Skipped} {
				b = binary.AppendVarint(b, v)
			}
			for _, f := range [...]float64{8e9 /* Σ duration, unused */, p.SumCompute, p.Sum[legacyExposed], float64(p.Max[legacyExposed]), p.Sum[legacyComm],
				p.Sum[legacyPP], float64(p.Max[legacyPP]), p.Sum[legacyData], float64(p.Max[legacyData]), p.Sum[legacyCkpt], p.SumLoss} {
				b = binary.LittleEndian.AppendUint64(b, math.Float64bits(f))
			}
			if layout == 1 {
				p.Sum[legacyGen], p.Max[legacyGen], p.GenRanks = 0, 0, 0
				p.Sum[legacyGenReqs], p.Sum[legacyGenPrompt], p.Sum[legacyGenOutput] = 0, 0, 0
				p.Nodes = nil // not before layout 3
				continue
			}
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(p.Sum[legacyGen]))
			for _, v := range [...]int64{p.Max[legacyGen], int64(p.Sum[legacyGenReqs]), int64(p.Sum[legacyGenPrompt]), int64(p.Sum[legacyGenOutput]), p.GenRanks} {
				b = binary.AppendVarint(b, v)
			}
			b = binary.AppendUvarint(b, uint64(len(p.Nodes)))
			for _, n := range p.Nodes {
				b = appendString(b, n.Node)
				for _, v := range [...]int64{n.MinStartNs, n.MaxEndNs, n.Ranks, n.LowestRank} {
					b = binary.AppendVarint(b, v)
				}
			}
		}
		got, err := DecodePartials(b)
		if err != nil || !reflect.DeepEqual(got, ps) {
			t.Fatalf("layout %d: %v\n got %+v\nwant %+v", layout, err, got, ps)
		}
	}
}

// A partial from an agent that keeps fewer measures over ranks decodes
// with the rest zero (no rank for a minimum); one from an agent that keeps
// more is refused with what to do.
func TestPartialsMeasureCount(t *testing.T) {
	ps := samplePartials(t)[:1]
	all := kept
	defer func() { kept = all }()
	kept = append(all[:len(all):len(all)], keptMeasure{i: all[0].i, over: tps.OverSum})
	enc := EncodePartials(ps)
	kept = all
	if _, err := DecodePartials(enc); err == nil || !strings.Contains(err.Error(), "newer than the collector") {
		t.Errorf("a partial keeping one measure more: %v", err)
	}
	last := all[len(all)-1]
	kept = all[:len(all)-1]
	enc = EncodePartials(ps)
	kept = all
	got, err := DecodePartials(enc)
	if err != nil {
		t.Fatal(err)
	}
	want := ps[0]
	want.Sum[last.i], want.Max[last.i], want.Min[last.i] = 0, 0, 0
	if last.over&tps.OverMin != 0 {
		want.Min[last.i] = math.MaxInt64
	}
	if !reflect.DeepEqual(got[0], want) {
		t.Errorf("a partial keeping one measure less:\n got %+v\nwant %+v", got[0], want)
	}
}

func TestPartialsRejectsCorrupt(t *testing.T) {
	ps := samplePartials(t)[:1]
	ps[0].Ranks = []int64{3, 3} // not distinct: cannot be encoded as gaps ≥ 1
	if _, err := DecodePartials(EncodePartials(ps)); err == nil || !strings.Contains(err.Error(), "sorted and distinct") {
		t.Errorf("repeated rank: %v", err)
	}
	ps = samplePartials(t)[:1]
	b := EncodePartials(ps)
	if _, err := DecodePartials(append(b, 0)); err == nil {
		t.Error("trailing byte accepted")
	}
	huge := append([]byte("TPP\x01"), 0xff, 0xff, 0x03)
	if _, err := DecodePartials(huge); err == nil || !strings.Contains(err.Error(), "too large") {
		t.Errorf("huge count: %v", err)
	}
}

func FuzzDecodePartials(f *testing.F) {
	f.Add(EncodePartials(samplePartials(f)))
	js, _ := json.Marshal(samplePartials(f))
	f.Add(js)
	f.Add([]byte("TPP\x01\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ps, err := DecodePartials(data)
		if err != nil {
			return
		}
		if data[0] == '[' {
			return // JSON is decoded by encoding/json; the checks below are for the binary layout
		}
		// Whatever decodes re-encodes and decodes to the same partials
		// (compared as bytes: NaN defeats DeepEqual), with ranks strictly
		// increasing and no more replicas than ranks.
		enc := EncodePartials(ps)
		again, err := DecodePartials(enc)
		if err != nil || string(EncodePartials(again)) != string(enc) {
			t.Fatalf("re-encode: %v", err)
		}
		for _, p := range ps {
			for i := 1; i < len(p.Ranks); i++ {
				if p.Ranks[i] <= p.Ranks[i-1] {
					t.Fatalf("ranks %v", p.Ranks)
				}
			}
			if len(p.Replicas) > len(p.Ranks) {
				t.Fatalf("%d replicas, %d ranks", len(p.Replicas), len(p.Ranks))
			}
		}
	})
}

// BenchmarkDecodePartials compares the binary partials with their JSON.
//
//	go test -run '^$' -bench DecodePartials ./wire/
func BenchmarkDecodePartials(b *testing.B) {
	ps := samplePartials(b)
	js, _ := json.Marshal(ps)
	benchBinaryAndJSON(b, EncodePartials(ps), js, len(ps), "partial", func(d []byte) error { _, err := DecodePartials(d); return err })
}

// benchBinaryAndJSON decodes the same n items as binary and as JSON,
// reporting bytes per item.
func benchBinaryAndJSON(b *testing.B, bin, js []byte, n int, item string, decode func([]byte) error) {
	for _, tc := range []struct {
		name string
		data []byte
	}{{"binary", bin}, {"json", js}} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(tc.data)))
			for b.Loop() {
				if err := decode(tc.data); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(tc.data))/float64(n), "bytes/"+item)
		})
	}
}

// docs/wire.md's partial layout lists the kept measures as the encoder
// walks them.
func TestPartialsLayoutDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/wire.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := KeptLayout(); !strings.Contains(string(doc), "\n"+want+"\n") {
		t.Errorf("docs/wire.md's partial layout does not list the kept measures as tps.Measures keeps them; the line is:\n%s", want)
	}
	if n := fmt.Sprintf("(%d measures kept over ranks)", len(kept)); !strings.Contains(string(doc), n) {
		t.Errorf("docs/wire.md does not say %s", n)
	}
}

// The JSON older agents sent (before the binary layout: maxima as
// floats, no generation phase) decodes into the table's sums.
func TestPartialsLegacyJSON(t *testing.T) {
	js := `[{"job":"j","attempt":0,"step":3,"world_size":2,"ranks":[0,1],"replicas":[{"replica":0,"tokens":10,"lowest_rank":0},{"replica":1,"tokens":10,"lowest_rank":1}],
	"max_duration_ns":1000000000,"max_compute_ns":800000000,"slowest_rank":1,"min_start_unix_ns":1760000000000000001,"max_end_unix_ns":1760000001000000000,
	"sum_duration_ns":2e9,"sum_compute_ns":1.5e9,"sum_exposed_comm_ns":3e8,"max_exposed_comm_ns":2e+08,"sum_comm_ns":5e8,"sum_pp_wait_ns":0,"max_pp_wait_ns":0,
	"sum_data_wait_ns":4e7,"max_data_wait_ns":3e+07,"sum_ckpt_ns":0,"sum_loss":5,"n_loss":2,"skipped":0}]`
	ps, err := DecodePartials([]byte(js))
	if err != nil || len(ps) != 1 {
		t.Fatal(ps, err)
	}
	p := ps[0]
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"max duration", float64(p.Max[legacyDuration]), 1e9}, {"min start", float64(p.Min[legacyStart] - 1760000000000000000), 1},
		{"max end", float64(p.Max[legacyEnd] - 1760000000000000000), 1e9}, {"Σ exposed", p.Sum[legacyExposed], 3e8},
		{"max exposed", float64(p.Max[legacyExposed]), 2e8}, {"Σ comm", p.Sum[legacyComm], 5e8}, {"Σ data", p.Sum[legacyData], 4e7},
		{"max data", float64(p.Max[legacyData]), 3e7}, {"Σ compute", p.SumCompute, 1.5e9}, {"critical", float64(p.SlowestRank), 1},
	} {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.name, c.got, c.want)
		}
	}
	for _, bad := range []string{`"x"`, `30000000.5`} {
		if _, err := DecodePartials([]byte(strings.Replace(js, `"max_data_wait_ns":3e+07`, `"max_data_wait_ns":`+bad, 1))); err == nil {
			t.Errorf("a maximum of %s decoded", bad)
		}
	}
}
