package kineto

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// A spill holds the compact records of a trace between the JSON pass and
// the passes that assign them to steps: in memory up to spillMem records,
// then in an unlinked temporary file, so that the analysis holds a bounded
// number of records whatever the size of the trace.
type spill struct {
	mem []gpuEvent
	dir string
	f   *os.File
	w   *bufio.Writer
	n   int64
	buf [recSize]byte
}

// spillMem is how many records stay in memory before the spill moves to
// disk (4 MiB at 40 bytes each); tests lower it.
var spillMem = 1 << 17

const recSize = 40

// Record kinds.
const (
	kindGPU    uint8 = iota // a kernel, memcpy or memset
	kindLaunch              // a runtime call with a correlation id
	kindCPU                 // a gloo collective or aten operator (CPU traces)
)

func (s *spill) add(e gpuEvent) error {
	s.n++
	if s.f == nil && len(s.mem) < spillMem {
		s.mem = append(s.mem, e)
		return nil
	}
	if s.f == nil {
		f, err := os.CreateTemp(s.dir, "tpsprof-kineto-*")
		if err != nil {
			return fmt.Errorf("kineto: spill: %w", err)
		}
		// unlinked at once: nothing is left behind if the process dies
		os.Remove(f.Name())
		s.f, s.w = f, bufio.NewWriterSize(f, 1<<16)
		for _, m := range s.mem {
			if err := s.write(m); err != nil {
				return err
			}
		}
		s.mem = nil
	}
	return s.write(e)
}

func (s *spill) write(e gpuEvent) error {
	b := s.buf[:]
	binary.LittleEndian.PutUint64(b[0:], uint64(e.start))
	binary.LittleEndian.PutUint64(b[8:], uint64(e.end))
	binary.LittleEndian.PutUint64(b[16:], uint64(e.corr))
	binary.LittleEndian.PutUint64(b[24:], uint64(e.bytes))
	b[32], b[33], b[34] = byte(e.cls), e.coll, e.kind
	binary.LittleEndian.PutUint16(b[35:], e.group)
	if _, err := s.w.Write(b); err != nil {
		return fmt.Errorf("kineto: spill: %w", err)
	}
	return nil
}

// each calls fn for every record in the order they were added.
func (s *spill) each(fn func(e gpuEvent)) error {
	if s.f == nil {
		for _, e := range s.mem {
			fn(e)
		}
		return nil
	}
	if err := s.w.Flush(); err != nil {
		return fmt.Errorf("kineto: spill: %w", err)
	}
	if _, err := s.f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("kineto: spill: %w", err)
	}
	r := bufio.NewReaderSize(s.f, 1<<16)
	b := s.buf[:]
	for i := int64(0); i < s.n; i++ {
		if _, err := io.ReadFull(r, b); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("kineto: spill: %w", err)
		}
		fn(gpuEvent{
			span:  span{int64(binary.LittleEndian.Uint64(b[0:])), int64(binary.LittleEndian.Uint64(b[8:]))},
			corr:  int64(binary.LittleEndian.Uint64(b[16:])),
			bytes: int64(binary.LittleEndian.Uint64(b[24:])),
			cls:   class(b[32]), coll: b[33], kind: b[34],
			group: binary.LittleEndian.Uint16(b[35:]),
		})
	}
	return nil
}

func (s *spill) close() {
	if s.f != nil {
		s.f.Close()
		s.f = nil
	}
	s.mem = nil
}
