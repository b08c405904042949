package wire

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/tpsprof/tpsprof/tps"
)

// partialMagic starts a binary partials message: "TPP" and the layout
// version. Node partials are what an aggregator handles per message
// (docs/scale.md); JSON made them cost ~15 µs each to decode, the binary
// form about a tenth of that.
var partialMagic = [4]byte{'T', 'P', 'P', 4}

// Earlier layouts, still decoded: 3 listed the sums by hand, 2 also
// lacked the node spans, 1 bytes and the generation phase as well.
var (
	partialMagic3 = [4]byte{'T', 'P', 'P', 3}
	partialMagic2 = [4]byte{'T', 'P', 'P', 2}
	partialMagic1 = [4]byte{'T', 'P', 'P', 1}
)

// keptMeasure is a measure partials carry (one that tps.Measures keeps
// over ranks: Over not 0), by its index there.
type keptMeasure struct {
	i    int
	over tps.Over
}

var kept = func() []keptMeasure {
	var out []keptMeasure
	all := tps.Measures()
	for i := range all {
		if o := all[i].Over; o != 0 {
			out = append(out, keptMeasure{i, o})
		}
	}
	return out
}()

// The measures layouts 1-3 carried, by index in tps.Measures.
var (
	legacyDuration  = tps.MeasureIndex("duration_ns")
	legacyStart     = tps.MeasureIndex("start_unix_ns")
	legacyEnd       = tps.MeasureIndex("end_unix_ns")
	legacyExposed   = tps.MeasureIndex("exposed_comm_ns")
	legacyComm      = tps.MeasureIndex("comm_ns")
	legacyPP        = tps.MeasureIndex("pp_wait_ns")
	legacyData      = tps.MeasureIndex("data_wait_ns")
	legacyCkpt      = tps.MeasureIndex("ckpt_ns")
	legacyGen       = tps.MeasureIndex("gen_ns")
	legacyGenReqs   = tps.MeasureIndex("gen_requests")
	legacyGenPrompt = tps.MeasureIndex("gen_prompt_tokens")
	legacyGenOutput = tps.MeasureIndex("gen_output_tokens")
)

// maxPartialNodes bounds the node spans of one partial (an agent's has
// one).
const maxPartialNodes = 1024

// MaxPartials bounds one partials message.
const MaxPartials = 4096

// AppendPartials appends the binary encoding of ps to dst.
//
// Layout: magic, uvarint count, then per partial: job (uvarint length and
// bytes); attempt, step, world size (zig-zag varints); the ranks as a
// uvarint count, the first rank and the gaps to the next (uvarints, at
// least 1: ranks are sorted and distinct); the replicas as a uvarint count
// and per replica its index, tokens, FLOPs (float64 little endian), lowest
// rank, a mismatch byte, its bytes of text and its Σ document length²
// (the lowest rank's; layout 4); then the merged sums: five varints (the
// critical rank's busy time, the critical rank, losses, skipped ranks,
// ranks that generated), two float64 (Σ compute, Σ loss), a uvarint count
// of measures and, for each measure tps.Measures keeps over ranks
// (Over not 0, in its order), what its Over keeps: a float64 Σ, a varint
// largest, a varint smallest; then the node spans: a uvarint count and per
// node its name, earliest start, latest end, ranks and lowest rank
// (varints), which clock offsets between nodes are estimated from. A
// partial from an agent that keeps fewer measures decodes with the rest
// zero; one that keeps more is refused.
func AppendPartials(dst []byte, ps []tps.Partial) []byte {
	dst = append(dst, partialMagic[:]...)
	dst = binary.AppendUvarint(dst, uint64(len(ps)))
	for i := range ps {
		p := &ps[i]
		dst = appendString(dst, p.Job)
		for _, v := range [...]int64{p.Attempt, p.Step, p.WorldSize} {
			dst = binary.AppendVarint(dst, v)
		}
		dst = binary.AppendUvarint(dst, uint64(len(p.Ranks)))
		prev := int64(-1)
		for _, r := range p.Ranks {
			dst = binary.AppendUvarint(dst, uint64(r-prev))
			prev = r
		}
		dst = binary.AppendUvarint(dst, uint64(len(p.Replicas)))
		for _, x := range p.Replicas {
			dst = binary.AppendVarint(dst, x.Replica)
			dst = binary.AppendVarint(dst, x.Tokens)
			dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(x.FLOPs))
			dst = binary.AppendVarint(dst, x.LowestRank)
			dst = append(dst, boolByte(x.Mismatch))
			dst = binary.AppendVarint(dst, x.Bytes)
			dst = binary.AppendVarint(dst, x.SeqSqSum)
		}
		for _, v := range [...]int64{p.MaxComputeNs, p.SlowestRank, p.NLoss, p.Skipped, p.GenRanks} {
			dst = binary.AppendVarint(dst, v)
		}
		for _, f := range [...]float64{p.SumCompute, p.SumLoss} {
			dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(f))
		}
		dst = binary.AppendUvarint(dst, uint64(len(kept)))
		for _, k := range kept {
			if k.over&tps.OverSum != 0 {
				dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(p.Sum[k.i]))
			}
			if k.over&tps.OverMax != 0 {
				dst = binary.AppendVarint(dst, p.Max[k.i])
			}
			if k.over&tps.OverMin != 0 {
				dst = binary.AppendVarint(dst, p.Min[k.i])
			}
		}
		dst = binary.AppendUvarint(dst, uint64(len(p.Nodes)))
		for _, n := range p.Nodes {
			dst = appendString(dst, n.Node)
			for _, v := range [...]int64{n.MinStartNs, n.MaxEndNs, n.Ranks, n.LowestRank} {
				dst = binary.AppendVarint(dst, v)
			}
		}
	}
	return dst
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// EncodePartials encodes step partials in the binary layout.
func EncodePartials(ps []tps.Partial) []byte { return AppendPartials(nil, ps) }

// DecodePartials decodes a partials message, binary or (as agents before
// the binary layout sent it) a JSON array. Partials are decoded, not
// validated: StepAccumulator.AddPartial checks ranks and replicas.
func DecodePartials(data []byte) ([]tps.Partial, error) {
	if len(data) > 0 && data[0] == '[' {
		return decodePartialsJSON(data)
	}
	lay, err := partialsLayoutOf(data)
	if err != nil {
		return nil, err
	}
	d := decoder{b: data[4:]}
	n := d.uvarint()
	if d.err != nil {
		return nil, d.err
	}
	if n > MaxPartials {
		return nil, fmt.Errorf("%w: %d partials (limit %d)", ErrTooLarge, n, MaxPartials)
	}
	// A partial takes at least 108 bytes in layouts 1-3 (18 numbers, 11
	// of them 8 bytes), 28 in layout 4.
	least := uint64(108)
	if lay.v4 {
		least = 28
	}
	if n*least > uint64(len(d.b)) {
		return nil, ErrTruncated
	}
	out := make([]tps.Partial, n)
	for i := range out {
		if err := d.partial(&out[i], lay); err != nil {
			return nil, fmt.Errorf("wire: partial %d: %w", i, err)
		}
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("wire: %d bytes after the last partial", len(d.b))
	}
	return out, nil
}

// decodePartialsJSON decodes partials as agents before the binary layout
// sent them.
func decodePartialsJSON(data []byte) ([]tps.Partial, error) {
	var p []tps.Partial
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, fmt.Errorf("wire: partials: %w", err)
	}
	if len(p) > MaxPartials {
		return nil, fmt.Errorf("%w: %d partials (limit %d)", ErrTooLarge, len(p), MaxPartials)
	}
	return p, nil
}

// partialsLayout is what a version of the binary layout holds: bytes
// (2), node spans (3), the kept sums and document lengths (4).
type partialsLayout struct{ v2, v3, v4 bool }

func partialsLayoutOf(data []byte) (partialsLayout, error) {
	if len(data) >= len(partialMagic) {
		switch [4]byte(data[:4]) {
		case partialMagic:
			return partialsLayout{true, true, true}, nil
		case partialMagic3:
			return partialsLayout{true, true, false}, nil
		case partialMagic2:
			return partialsLayout{true, false, false}, nil
		case partialMagic1:
			return partialsLayout{}, nil
		}
	}
	return partialsLayout{}, fmt.Errorf("wire: partials: not a partials message (bad magic or version)")
}

// partial decodes one partial into p.
func (d *decoder) partial(p *tps.Partial, lay partialsLayout) error {
	p.Job = d.string(64)
	p.Attempt, p.Step, p.WorldSize = d.varint(), d.varint(), d.varint()
	if err := d.partialRanks(p); err != nil {
		return err
	}
	if err := d.replicaParts(p, lay); err != nil {
		return err
	}
	if lay.v4 {
		d.keptSums(p)
	} else {
		d.legacySums(p, lay.v2)
	}
	if lay.v3 {
		if err := d.nodeSpans(p); err != nil {
			return err
		}
	}
	return d.err
}

// partialRanks decodes the partial's ranks, sorted and distinct, as gaps.
func (d *decoder) partialRanks(p *tps.Partial) error {
	nr := d.uvarint()
	// Each rank takes at least one byte.
	if d.err == nil && (nr > tps.MaxWorldSize || nr > uint64(len(d.b))) {
		return fmt.Errorf("%w: %d ranks", ErrTooLarge, nr)
	}
	p.Ranks = make([]int64, nr)
	prev := int64(-1)
	for k := range p.Ranks {
		gap := d.uvarint()
		if d.err == nil && (gap == 0 || gap > tps.MaxWorldSize) {
			return errors.New("ranks not sorted and distinct, or out of range")
		}
		prev += int64(gap)
		p.Ranks[k] = prev
	}
	return nil
}

// replicaParts decodes the partial's replicas.
func (d *decoder) replicaParts(p *tps.Partial, lay partialsLayout) error {
	nx, nr := d.uvarint(), uint64(len(p.Ranks))
	// A replica has at least one rank, and takes at least 12 bytes.
	if d.err == nil && (nx > nr || nx*12 > uint64(len(d.b))) {
		return fmt.Errorf("%d replicas for %d ranks", nx, nr)
	}
	p.Replicas = make([]tps.ReplicaPart, nx)
	for k := range p.Replicas {
		x := &p.Replicas[k]
		x.Replica, x.Tokens = d.varint(), d.varint()
		x.FLOPs = d.float()
		x.LowestRank = d.varint()
		switch m := d.byte(); m {
		case 0, 1:
			x.Mismatch = m == 1
		default:
			if d.err == nil {
				d.err = fmt.Errorf("mismatch flag %d", m)
			}
		}
		if lay.v2 {
			x.Bytes = d.varint()
		}
		if lay.v4 {
			x.SeqSqSum = d.varint()
		}
	}
	return nil
}

// nodeSpans decodes the partial's node spans (layout 3 on).
func (d *decoder) nodeSpans(p *tps.Partial) error {
	nn, nr := d.uvarint(), uint64(len(p.Ranks))
	// A node span takes at least five bytes.
	if d.err == nil && (nn > maxPartialNodes || nn > nr || nn*5 > uint64(len(d.b))) {
		return fmt.Errorf("%d node spans for %d ranks", nn, nr)
	}
	if nn > 0 && d.err == nil {
		p.Nodes = make([]tps.NodeSpan, nn)
		for k := range p.Nodes {
			n := &p.Nodes[k]
			n.Node = d.string(tps.MaxStringLen)
			n.MinStartNs, n.MaxEndNs, n.Ranks, n.LowestRank = d.varint(), d.varint(), d.varint(), d.varint()
		}
	}
	return nil
}

// keptSums reads layout 4's sums into p.
func (d *decoder) keptSums(p *tps.Partial) {
	for _, v := range [...]*int64{&p.MaxComputeNs, &p.SlowestRank, &p.NLoss, &p.Skipped, &p.GenRanks} {
		*v = d.varint()
	}
	p.SumCompute, p.SumLoss = d.float(), d.float()
	n := d.uvarint()
	if d.err == nil && n > uint64(len(kept)) {
		d.err = fmt.Errorf("%d measures kept over ranks, this build knows %d: the agent is newer than the collector", n, len(kept))
	}
	for j, k := range kept {
		if uint64(j) >= n {
			if k.over&tps.OverMin != 0 {
				p.Min[k.i] = math.MaxInt64 // an older agent's: no rank
			}
			continue
		}
		if k.over&tps.OverSum != 0 {
			p.Sum[k.i] = d.float()
		}
		if k.over&tps.OverMax != 0 {
			p.Max[k.i] = d.varint()
		}
		if k.over&tps.OverMin != 0 {
			p.Min[k.i] = d.varint()
		}
	}
}

// legacySums reads the sums of layouts 1-3 (listed by hand; maxima as
// float64) into p; v2 adds the generation phase.
func (d *decoder) legacySums(p *tps.Partial, v2 bool) {
	p.Max[legacyDuration] = d.varint()
	p.MaxComputeNs, p.SlowestRank = d.varint(), d.varint()
	p.Min[legacyStart], p.Max[legacyEnd] = d.varint(), d.varint()
	p.NLoss, p.Skipped = d.varint(), d.varint()
	_ = d.float() // Σ duration: no figure uses it
	p.SumCompute = d.float()
	p.Sum[legacyExposed], p.Max[legacyExposed] = d.float(), d.whole()
	p.Sum[legacyComm] = d.float()
	p.Sum[legacyPP], p.Max[legacyPP] = d.float(), d.whole()
	p.Sum[legacyData], p.Max[legacyData] = d.float(), d.whole()
	p.Sum[legacyCkpt] = d.float()
	p.SumLoss = d.float()
	if v2 {
		p.Sum[legacyGen] = d.float()
		p.Max[legacyGen] = d.varint()
		for _, i := range [...]int{legacyGenReqs, legacyGenPrompt, legacyGenOutput} {
			p.Sum[i] = float64(d.varint())
		}
		p.GenRanks = d.varint()
	}
}

// whole reads a float64 that must hold a whole number of nanoseconds (a
// maximum of layouts 1-3).
func (d *decoder) whole() int64 {
	f := d.float()
	if d.err == nil && (f != math.Trunc(f) || math.Abs(f) >= 1<<62) {
		d.err = fmt.Errorf("largest value %v is not a whole number of nanoseconds", f)
		return 0
	}
	return int64(f)
}

// KeptLayout is layout 4's kept measures as docs/wire.md lists them.
func KeptLayout() string {
	var w []string
	for _, k := range kept {
		name := tps.Measures()[k.i].Name
		if k.over&tps.OverSum != 0 {
			w = append(w, "float64le(sum_"+name+")")
		}
		if k.over&tps.OverMax != 0 {
			w = append(w, "varint(max_"+name+")")
		}
		if k.over&tps.OverMin != 0 {
			w = append(w, "varint(min_"+name+")")
		}
	}
	return strings.Join(w, " ")
}
