package wire

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"

	"github.com/tpsprof/tpsprof/tps"
)

// partialMagic starts a binary partials message: "TPP" and the layout
// version. Node partials are what an aggregator handles per message
// (docs/scale.md); JSON made them cost ~15 µs each to decode, the binary
// form about a tenth of that.
var partialMagic = [4]byte{'T', 'P', 'P', 3}

// partialMagic2 is layout 2, without the node spans, and partialMagic1
// layout 1, without bytes and the generation phase as well; both are
// still decoded.
var (
	partialMagic2 = [4]byte{'T', 'P', 'P', 2}
	partialMagic1 = [4]byte{'T', 'P', 'P', 1}
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
// rank, a mismatch byte and its bytes of text; then the merged sums:
// seven varints (max duration, max compute, slowest rank, min start, max
// end, losses, skipped), eleven float64 (the sums and maxima of
// docs/wire.md), and the generation phase: a float64 (Σ generation time)
// and five varints (the slowest generation, requests, prompt and output
// tokens, ranks that generated); then the node spans (layout 3): a uvarint
// count and per node its name, earliest start, latest end and ranks
// and lowest rank (varints), which clock offsets between nodes are
// estimated from.
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
		}
		for _, v := range [...]int64{p.MaxDurationNs, p.MaxComputeNs, p.SlowestRank, p.MinStartNs, p.MaxEndNs, p.NLoss, p.Skipped} {
			dst = binary.AppendVarint(dst, v)
		}
		for _, f := range [...]float64{p.SumDuration, p.SumCompute, p.SumExposed, p.MaxExposed, p.SumComm, p.SumPP, p.MaxPP,
			p.SumData, p.MaxData, p.SumCkpt, p.SumLoss, p.SumGen} {
			dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(f))
		}
		for _, v := range [...]int64{p.MaxGen, p.GenRequests, p.GenPrompt, p.GenOutput, p.GenRanks} {
			dst = binary.AppendVarint(dst, v)
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
		var p []tps.Partial
		if err := json.Unmarshal(data, &p); err != nil {
			return nil, fmt.Errorf("wire: partials: %w", err)
		}
		if len(p) > MaxPartials {
			return nil, fmt.Errorf("%w: %d partials (limit %d)", ErrTooLarge, len(p), MaxPartials)
		}
		return p, nil
	}
	if len(data) < len(partialMagic) {
		return nil, fmt.Errorf("wire: partials: not a partials message (bad magic or version)")
	}
	var v2, v3 bool
	switch [4]byte(data[:4]) {
	case partialMagic:
		v2, v3 = true, true
	case partialMagic2:
		v2 = true
	case partialMagic1:
	default:
		return nil, fmt.Errorf("wire: partials: not a partials message (bad magic or version)")
	}

	d := decoder{b: data[4:]}
	n := d.uvarint()
	if d.err != nil {
		return nil, d.err
	}
	if n > MaxPartials {
		return nil, fmt.Errorf("%w: %d partials (limit %d)", ErrTooLarge, n, MaxPartials)
	}
	// A partial takes at least 108 bytes (18 numbers, 11 of them 8 bytes).
	if n*108 > uint64(len(d.b)) {
		return nil, ErrTruncated
	}
	out := make([]tps.Partial, n)
	for i := range out {
		p := &out[i]
		p.Job = d.string(64)
		p.Attempt, p.Step, p.WorldSize = d.varint(), d.varint(), d.varint()
		nr := d.uvarint()
		// Each rank takes at least one byte.
		if d.err == nil && (nr > tps.MaxWorldSize || nr > uint64(len(d.b))) {
			return nil, fmt.Errorf("partial %d: %w: %d ranks", i, ErrTooLarge, nr)
		}
		p.Ranks = make([]int64, nr)
		prev := int64(-1)
		for k := range p.Ranks {
			gap := d.uvarint()
			if d.err == nil && (gap == 0 || gap > tps.MaxWorldSize) {
				return nil, fmt.Errorf("wire: partial %d: ranks not sorted and distinct, or out of range", i)
			}
			prev += int64(gap)
			p.Ranks[k] = prev
		}
		nx := d.uvarint()
		// A replica has at least one rank, and takes at least 12 bytes.
		if d.err == nil && (nx > nr || nx*12 > uint64(len(d.b))) {
			return nil, fmt.Errorf("wire: partial %d: %d replicas for %d ranks", i, nx, nr)
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
			if v2 {
				x.Bytes = d.varint()
			}
		}
		for _, v := range [...]*int64{&p.MaxDurationNs, &p.MaxComputeNs, &p.SlowestRank, &p.MinStartNs, &p.MaxEndNs, &p.NLoss, &p.Skipped} {
			*v = d.varint()
		}
		for _, f := range [...]*float64{&p.SumDuration, &p.SumCompute, &p.SumExposed, &p.MaxExposed, &p.SumComm, &p.SumPP, &p.MaxPP,
			&p.SumData, &p.MaxData, &p.SumCkpt, &p.SumLoss} {
			*f = d.float()
		}
		if v2 {
			p.SumGen = d.float()
			for _, v := range [...]*int64{&p.MaxGen, &p.GenRequests, &p.GenPrompt, &p.GenOutput, &p.GenRanks} {
				*v = d.varint()
			}
		}
		if v3 {
			nn := d.uvarint()
			// A node span takes at least five bytes.
			if d.err == nil && (nn > maxPartialNodes || nn > nr || nn*5 > uint64(len(d.b))) {
				return nil, fmt.Errorf("wire: partial %d: %d node spans for %d ranks", i, nn, nr)
			}
			if nn > 0 && d.err == nil {
				p.Nodes = make([]tps.NodeSpan, nn)
				for k := range p.Nodes {
					n := &p.Nodes[k]
					n.Node = d.string(tps.MaxStringLen)
					n.MinStartNs, n.MaxEndNs, n.Ranks, n.LowestRank = d.varint(), d.varint(), d.varint(), d.varint()
				}
			}
		}
		if d.err != nil {
			return nil, fmt.Errorf("wire: partial %d: %w", i, d.err)
		}
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("wire: %d bytes after the last partial", len(d.b))
	}
	return out, nil
}
