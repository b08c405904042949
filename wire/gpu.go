package wire

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"

	"github.com/tpsprof/tpsprof/tps"
)

// gpuMagic starts a binary GPU-sample message: "TPG" and the layout
// version. An agent sends one per node and sampling tick; at one sample per
// GPU per second a 100,000-GPU cluster sends 100,000 a second, and JSON
// decoding them took most of a collector (BENCHMARKS.md).
var gpuMagic = [4]byte{'T', 'P', 'G', 1}

// MaxGPUSamples bounds one GPU message (a node's GPUs over a few intervals).
const MaxGPUSamples = 4096

// AppendGPUSamples appends the binary encoding of samples to dst.
//
// Layout: magic, uvarint count, then per sample: node, uuid, name
// (uvarint length and bytes), index and unix_ns (zig-zag varints), the
// uvarint presence bits (bits 0-6 the float fields, 7-25 the integer
// fields, in the order of docs/wire.md), then the present floats (float64
// little endian) and integers (zig-zag varints). The job is the subject's
// and is not encoded.
func AppendGPUSamples(dst []byte, samples []tps.GPUSample) []byte {
	dst = append(dst, gpuMagic[:]...)
	dst = binary.AppendUvarint(dst, uint64(len(samples)))
	for i := range samples {
		s := &samples[i]
		dst = appendString(dst, s.Node)
		dst = appendString(dst, s.UUID)
		dst = appendString(dst, s.Name)
		dst = binary.AppendVarint(dst, int64(s.Index))
		dst = binary.AppendVarint(dst, s.UnixNs)
		fs, is := s.OptionalFloats(), s.OptionalInts()
		var bits uint64
		for k, p := range fs {
			if *p != nil {
				bits |= 1 << k
			}
		}
		for k, p := range is {
			if *p != nil {
				bits |= 1 << (len(fs) + k)
			}
		}
		dst = binary.AppendUvarint(dst, bits)
		for _, p := range fs {
			if *p != nil {
				dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(**p))
			}
		}
		for _, p := range is {
			if *p != nil {
				dst = binary.AppendVarint(dst, **p)
			}
		}
	}
	return dst
}

// EncodeGPUSamples encodes samples in the binary layout.
func EncodeGPUSamples(s []tps.GPUSample) []byte { return AppendGPUSamples(nil, s) }

const gpuFields = 7 + 19

// DecodeGPUSamples decodes a GPU-sample message, binary or (as agents before
// the binary layout sent it) a JSON array. Samples are decoded, not
// validated (tps.GPUSample.Validate).
func DecodeGPUSamples(data []byte) ([]tps.GPUSample, error) {
	if len(data) > 0 && data[0] == '[' {
		var s []tps.GPUSample
		if err := json.Unmarshal(data, &s); err != nil {
			return nil, fmt.Errorf("wire: gpu samples: %w", err)
		}
		if len(s) > MaxGPUSamples {
			return nil, fmt.Errorf("%w: %d gpu samples (limit %d)", ErrTooLarge, len(s), MaxGPUSamples)
		}
		return s, nil
	}
	if len(data) < len(gpuMagic) || [4]byte(data[:4]) != gpuMagic {
		return nil, fmt.Errorf("wire: gpu samples: not a GPU-sample message (bad magic or version)")
	}
	d := decoder{b: data[4:]}
	n := d.uvarint()
	if d.err != nil {
		return nil, d.err
	}
	if n > MaxGPUSamples {
		return nil, fmt.Errorf("%w: %d gpu samples (limit %d)", ErrTooLarge, n, MaxGPUSamples)
	}
	// A sample takes at least 6 bytes.
	if n*6 > uint64(len(d.b)) {
		return nil, ErrTruncated
	}
	out := make([]tps.GPUSample, n)
	// The present values of the whole message share two allocations; each
	// takes at least one byte, so the message length bounds them.
	g := gpuValues{floats: make([]float64, 0, min(int(n)*7, len(d.b)/8)), ints: make([]int64, 0, min(int(n)*19, len(d.b)))}
	for i := range out {
		if err := d.gpuSample(&out[i], &g); err != nil {
			return nil, fmt.Errorf("wire: gpu sample %d: %w", i, err)
		}
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("wire: %d bytes after the last gpu sample", len(d.b))
	}
	return out, nil
}

// gpuValues hold the present optional values of a message's samples.
type gpuValues struct {
	floats []float64
	ints   []int64
}

// gpuSample decodes one sample into s, its optional values into g.
func (d *decoder) gpuSample(s *tps.GPUSample, g *gpuValues) error {
	s.Node = d.string(tps.MaxStringLen)
	s.UUID = d.string(tps.MaxStringLen)
	s.Name = d.string(tps.MaxStringLen)
	idx := d.varint()
	if d.err == nil && (idx < math.MinInt32 || idx > math.MaxInt32) {
		return fmt.Errorf("index %d out of int32 range", idx)
	}
	s.Index = int32(idx)
	s.UnixNs = d.varint()
	bits := d.uvarint()
	if d.err == nil && bits >= 1<<gpuFields {
		return fmt.Errorf("unknown field bits %#x", bits)
	}
	fs, is := s.OptionalFloats(), s.OptionalInts()
	for k, p := range fs {
		if bits&(1<<k) != 0 {
			if len(g.floats) == cap(g.floats) {
				g.floats = make([]float64, 0, 64)
			}
			g.floats = append(g.floats, d.float())
			*p = &g.floats[len(g.floats)-1]
		}
	}
	for k, p := range is {
		if bits&(1<<(len(fs)+k)) != 0 {
			if len(g.ints) == cap(g.ints) {
				g.ints = make([]int64, 0, 64)
			}
			g.ints = append(g.ints, d.varint())
			*p = &g.ints[len(g.ints)-1]
		}
	}
	return d.err
}
