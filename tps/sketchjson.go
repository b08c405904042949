package tps

import (
	"strconv"
	"unsafe"
)

// decodeSketchJSON reads the JSON json.Marshal writes for a Sketch (the
// rank_windows compute_sketch column) into s, reusing s.Bins: a report
// over a long run decodes a million of them, and encoding/json's
// reflection was a fifth of its work. It takes the keys in any order,
// numbers as JSON writes them and no whitespace; anything else (an
// unknown key, another layout) returns false, s undefined, for
// encoding/json to read instead.
func decodeSketchJSON(b []byte, s *Sketch) bool {
	*s = Sketch{Bins: s.Bins[:0]}
	p := jsonScan{b: b}
	if !p.byte('{') {
		return false
	}
	if p.byte('}') {
		return p.end()
	}
	for {
		key, ok := p.key()
		if !ok {
			return false
		}
		switch key {
		case "count":
			ok = p.int(&s.Count)
		case "zero":
			ok = p.int(&s.Zero)
		case "sum":
			ok = p.float(&s.Sum)
		case "min":
			ok = p.float(&s.Min)
		case "max":
			ok = p.float(&s.Max)
		case "offset":
			var v int64
			ok = p.int(&v) && v == int64(int32(v))
			s.Offset = int32(v)
		case "bins":
			s.Bins = s.Bins[:0]
			ok = p.bins(&s.Bins)
		default:
			return false
		}
		if !ok {
			return false
		}
		if p.byte('}') {
			return p.end()
		}
		if !p.byte(',') {
			return false
		}
	}
}

type jsonScan struct {
	b []byte
	i int
}

func (p *jsonScan) byte(c byte) bool {
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

func (p *jsonScan) end() bool { return p.i == len(p.b) }

// key reads "name": (no escapes in the names a Sketch has).
func (p *jsonScan) key() (string, bool) {
	if !p.byte('"') {
		return "", false
	}
	start := p.i
	for p.i < len(p.b) && p.b[p.i] != '"' {
		if c := p.b[p.i]; c == '\\' || c < 0x20 {
			return "", false
		}
		p.i++
	}
	key := unsafe.String(unsafe.SliceData(p.b[start:]), p.i-start)
	return key, p.byte('"') && p.byte(':')
}

// number reads a JSON number (RFC 8259's grammar, which strconv alone
// does not hold to: it takes "+1", "inf", hex) and returns its text.
func (p *jsonScan) number() (string, bool) {
	b, start := p.b, p.i
	digits := func() bool {
		n := 0
		for p.i < len(b) && b[p.i] >= '0' && b[p.i] <= '9' {
			p.i++
			n++
		}
		return n > 0
	}
	p.byte('-')
	switch {
	case p.byte('0'):
	case !digits():
		return "", false
	}
	if p.byte('.') && !digits() {
		return "", false
	}
	if p.byte('e') || p.byte('E') {
		_ = p.byte('+') || p.byte('-')
		if !digits() {
			return "", false
		}
	}
	return unsafe.String(unsafe.SliceData(b[start:]), p.i-start), true
}

func (p *jsonScan) int(v *int64) bool {
	t, ok := p.number()
	if !ok {
		return false
	}
	x, err := strconv.ParseInt(t, 10, 64)
	*v = x
	return err == nil
}

func (p *jsonScan) float(v *float64) bool {
	t, ok := p.number()
	if !ok {
		return false
	}
	x, err := strconv.ParseFloat(t, 64)
	*v = x
	return err == nil
}

// bins reads [n, ...] or null.
func (p *jsonScan) bins(out *[]int64) bool {
	if p.i+4 <= len(p.b) && string(p.b[p.i:p.i+4]) == "null" {
		p.i += 4
		*out = nil
		return true
	}
	if !p.byte('[') {
		return false
	}
	if p.byte(']') {
		return true
	}
	for {
		var v int64
		if !p.int(&v) || len(*out) >= SketchMaxBins {
			return false // (more bins than a sketch holds: Check refuses it)
		}
		*out = append(*out, v)
		if p.byte(']') {
			return true
		}
		if !p.byte(',') {
			return false
		}
	}
}
