package kineto

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// The scanner reads a Chrome trace one event at a time: the top-level
// object's other values are skipped as they stream by, and each element of
// traceEvents is copied into one reused buffer and parsed in place. It keeps
// no more than one event's bytes.

// maxEventBytes bounds one event (a kernel with every argument is ~1 KiB).
const maxEventBytes = 16 << 20

var errTooBig = errors.New("kineto: an event is larger than 16 MiB")

type scanner struct {
	r   *bufio.Reader
	off int64 // bytes consumed, for errors
	buf []byte
}

func (s *scanner) byte() (byte, error) {
	c, err := s.r.ReadByte()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return 0, io.ErrUnexpectedEOF
		}
		return 0, err
	}
	s.off++
	return c, nil
}

func (s *scanner) nonSpace() (byte, error) {
	for {
		c, err := s.byte()
		if err != nil {
			return 0, err
		}
		if c != ' ' && c != '\n' && c != '\r' && c != '\t' {
			return c, nil
		}
	}
}

func (s *scanner) syntax(format string, a ...any) error {
	return fmt.Errorf("kineto: not a Chrome trace at byte %d: %s", s.off, fmt.Sprintf(format, a...))
}

// value copies the JSON value whose first byte is c into s.buf (appending)
// when keep is set, else skips it.
func (s *scanner) value(c byte, keep bool) error {
	if keep {
		s.buf = append(s.buf, c)
	}
	switch c {
	case '"':
		return s.str(keep)
	case '{', '[':
		return s.nested(keep)
	default: // number, true, false, null: up to a delimiter
		for {
			b, err := s.r.ReadByte()
			if err != nil {
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
			if b == ',' || b == '}' || b == ']' || b == ' ' || b == '\n' || b == '\r' || b == '\t' {
				return s.r.UnreadByte()
			}
			s.off++
			if keep {
				if len(s.buf) >= maxEventBytes {
					return errTooBig
				}
				s.buf = append(s.buf, b)
			}
		}
	}
}

// nested consumes the rest of an object or array (after its opening
// bracket), appended to s.buf when keep is set, scanning the reader's
// buffer a chunk at a time rather than a byte per call.
func (s *scanner) nested(keep bool) error {
	depth, inStr, esc := 1, false, false
	for {
		chunk, err := s.r.Peek(max(s.r.Buffered(), 1))
		if len(chunk) == 0 {
			if errors.Is(err, io.EOF) {
				return io.ErrUnexpectedEOF
			}
			return err
		}
		for i, b := range chunk {
			switch {
			case esc:
				esc = false
			case inStr:
				if b == '\\' {
					esc = true
				} else if b == '"' {
					inStr = false
				}
			case b == '"':
				inStr = true
			case b == '{' || b == '[':
				depth++
			case b == '}' || b == ']':
				depth--
				if depth == 0 {
					if keep {
						s.buf = append(s.buf, chunk[:i+1]...)
					}
					s.off += int64(i + 1)
					_, _ = s.r.Discard(i + 1)
					return nil
				}
			}
		}
		if keep {
			if len(s.buf)+len(chunk) > maxEventBytes {
				return errTooBig
			}
			s.buf = append(s.buf, chunk...)
		}
		s.off += int64(len(chunk))
		_, _ = s.r.Discard(len(chunk))
	}
}

// str consumes a string's rest after its opening quote.
func (s *scanner) str(keep bool) error {
	for {
		b, err := s.byte()
		if err != nil {
			return err
		}
		if keep {
			if len(s.buf) >= maxEventBytes {
				return errTooBig
			}
			s.buf = append(s.buf, b)
		}
		switch b {
		case '\\':
			e, err := s.byte()
			if err != nil {
				return err
			}
			if keep {
				s.buf = append(s.buf, e)
			}
		case '"':
			return nil
		}
	}
}

// key reads an object key (after its opening quote) and the colon.
func (s *scanner) key() (string, error) {
	s.buf = s.buf[:0]
	if err := s.str(true); err != nil {
		return "", err
	}
	k := string(s.buf[:len(s.buf)-1])
	c, err := s.nonSpace()
	if err != nil {
		return "", err
	}
	if c != ':' {
		return "", s.syntax("want ':' after key %q", k)
	}
	return k, nil
}

// trace walks a whole trace: fn gets each event's bytes (valid until the
// next call), info the distributedInfo value's bytes.
func (s *scanner) trace(fn func(ev []byte) error, info func([]byte) error) error {
	c, err := s.nonSpace()
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return errors.New("kineto: empty file")
		}
		return err
	}
	switch c {
	case '[': // the legacy profiler's export: a bare array of events
		return s.events(fn)
	case '{':
	default:
		return s.syntax("starts with %q, not '{' or '['", c)
	}
	sawEvents := false
	for {
		c, err := s.nonSpace()
		if err != nil {
			return err
		}
		if c == '}' {
			if !sawEvents {
				return errors.New("kineto: no traceEvents in the trace")
			}
			return nil
		}
		if c == ',' {
			continue
		}
		if c != '"' {
			return s.syntax("want a key, got %q", c)
		}
		k, err := s.key()
		if err != nil {
			return err
		}
		v, err := s.nonSpace()
		if err != nil {
			return err
		}
		switch k {
		case "traceEvents":
			if v != '[' {
				return s.syntax("traceEvents is not an array")
			}
			sawEvents = true
			if err := s.events(fn); err != nil {
				return err
			}
		case "distributedInfo":
			s.buf = s.buf[:0]
			if err := s.value(v, true); err != nil {
				return err
			}
			if err := info(s.buf); err != nil {
				return err
			}
		default:
			if err := s.value(v, false); err != nil {
				return err
			}
		}
	}
}

// events reads array elements after the '['.
func (s *scanner) events(fn func([]byte) error) error {
	for {
		c, err := s.nonSpace()
		if err != nil {
			return err
		}
		switch c {
		case ']':
			return nil
		case ',':
			continue
		case '{':
			s.buf = append(s.buf[:0], c)
			if err := s.nested(true); err != nil {
				return err
			}
			if err := fn(s.buf); err != nil {
				return err
			}
		default:
			return s.syntax("an event is not an object (%q)", c)
		}
	}
}

// -- parsing one event in place ------------------------------------------

// field calls fn for each key and raw value of the object in b (b[0] == '{').
func fields(b []byte, fn func(key, val []byte) error) error {
	i := 1
	for {
		i = skipSpace(b, i)
		if i >= len(b) {
			return errors.New("kineto: truncated object")
		}
		switch b[i] {
		case '}':
			return nil
		case ',':
			i++
			continue
		case '"':
		default:
			return fmt.Errorf("kineto: bad object key at %d", i)
		}
		ke := strEnd(b, i+1)
		if ke < 0 {
			return errors.New("kineto: truncated key")
		}
		key := b[i+1 : ke]
		i = skipSpace(b, ke+1)
		if i >= len(b) || b[i] != ':' {
			return errors.New("kineto: want ':'")
		}
		i = skipSpace(b, i+1)
		ve := valueEnd(b, i)
		if ve < 0 {
			return errors.New("kineto: truncated value")
		}
		if err := fn(key, b[i:ve]); err != nil {
			return err
		}
		i = ve
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t') {
		i++
	}
	return i
}

// strEnd is the index of the closing quote of a string whose body starts at i.
func strEnd(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case '\\':
			i += 2
			continue
		case '"':
			return i
		}
		i++
	}
	return -1
}

// valueEnd is the index just past the value starting at i.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		e := strEnd(b, i+1)
		if e < 0 {
			return -1
		}
		return e + 1
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				e := strEnd(b, j+1)
				if e < 0 {
					return -1
				}
				j = e
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	default:
		j := i
		for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\n' {
			j++
		}
		return j
	}
}

// unquote is a string value's body (escapes left as they are: names are
// matched by prefix and shown as written).
func unquote(v []byte) []byte {
	if len(v) >= 2 && v[0] == '"' {
		return v[1 : len(v)-1]
	}
	return v
}

// microsToNs reads a number of microseconds (as Chrome traces write ts and
// dur, integer or with a fraction) as integer nanoseconds.
func microsToNs(v []byte) (int64, bool) {
	v = unquote(v)
	if len(v) == 0 {
		return 0, false
	}
	neg := false
	i := 0
	if v[0] == '-' {
		neg, i = true, 1
	}
	var whole int64
	digits := 0
	for ; i < len(v) && v[i] >= '0' && v[i] <= '9'; i++ {
		if whole > (1<<62)/10 {
			return 0, false
		}
		whole = whole*10 + int64(v[i]-'0')
		digits++
	}
	var frac int64
	scale := int64(1000)
	if i < len(v) && v[i] == '.' {
		for i++; i < len(v) && v[i] >= '0' && v[i] <= '9'; i++ {
			if scale > 1 {
				scale /= 10
				frac += int64(v[i]-'0') * scale
			}
			digits++
		}
	}
	if i != len(v) { // an exponent or junk: the slow path
		f, err := strconv.ParseFloat(string(v), 64)
		if err != nil || f != f || f > 9e15 || f < -9e15 {
			return 0, false
		}
		return int64(f * 1000), true
	}
	if digits == 0 || whole > (1<<62)/1000 {
		return 0, false
	}
	n := whole*1000 + frac
	if neg {
		n = -n
	}
	return n, true
}

func atoi(v []byte) (int64, bool) {
	v = unquote(v)
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		f, ferr := strconv.ParseFloat(string(v), 64)
		if ferr != nil || f != f || f > 9e18 || f < -9e18 {
			return 0, false
		}
		return int64(f), true
	}
	return n, true
}
