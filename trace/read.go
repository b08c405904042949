package trace

import (
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"github.com/parquet-go/parquet-go"
)

// ReadOption changes what a read of a table folder takes: the row groups
// it reads (Within) and where it counts its bytes (Metered).
type ReadOption func(*readConfig)

type readConfig struct {
	meter    *Meter
	footers  *Footers
	ranges   []Range
	pruned   *Pruned
	rowsOnly bool // no flat layout (tests compare the two)
}

func readOptions(opts []ReadOption) *readConfig {
	c := &readConfig{}
	for _, o := range opts {
		o(c)
	}
	return c
}

// All is opts as one option.
func All(opts ...ReadOption) ReadOption {
	return func(c *readConfig) {
		for _, o := range opts {
			o(c)
		}
	}
}

// Meter counts the bytes reads took from part files, footers included:
// what a report cost in I/O (safe for concurrent reads).
type Meter struct{ n atomic.Int64 }

// Bytes is what the reads metered so far took.
func (m *Meter) Bytes() int64 { return m.n.Load() }

// Metered counts the read's bytes in m.
func Metered(m *Meter) ReadOption { return func(c *readConfig) { c.meter = m } }

// Within reads only the row groups whose statistics overlap every range
// (rows outside them may still come: statistics bound row groups, not
// rows), counting what it skipped in pr (nil: not counted).
func Within(pr *Pruned, ranges ...Range) ReadOption {
	return func(c *readConfig) { c.ranges, c.pruned = ranges, pr }
}

// meteredFile counts what is read through it.
type meteredFile struct {
	f *os.File
	m *Meter
}

func (r meteredFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := r.f.ReadAt(p, off)
	r.m.n.Add(int64(n))
	return n, err
}

// openedPart is an open, checked part file.
type openedPart struct {
	f      *os.File
	r      io.ReaderAt // f, or f metered
	pf     *parquet.File
	shared bool // kept open by a Footers, which closes it
}

// close closes the part unless a Footers keeps it.
func (p *openedPart) close() {
	if !p.shared {
		p.f.Close()
	}
}

// Footers keeps the parts a series of reads opened open, their footers
// read once: a report reads some tables in more than one pass, and a long
// run's footers are a share of what a window of it costs. Close closes
// them. Safe for concurrent reads.
type Footers struct {
	mu    sync.Mutex
	parts map[string]*openedPart
}

// Close closes the parts kept open.
func (fs *Footers) Close() error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for _, p := range fs.parts {
		p.f.Close()
	}
	fs.parts = nil
	return nil
}

// Reuse keeps the parts the read opens in fs, and takes those it already
// holds from there.
func Reuse(fs *Footers) ReadOption { return func(c *readConfig) { c.footers = fs } }

// openPart opens and checks one part (checkPart), reading through the
// meter c names, or takes it from c's Footers.
func openPart(path string, c *readConfig) (*openedPart, error) {
	if c == nil || c.footers == nil {
		return openNew(path, c)
	}
	fs := c.footers
	fs.mu.Lock()
	p, ok := fs.parts[path]
	fs.mu.Unlock()
	if ok {
		return p, nil
	}
	p, err := openNew(path, c) // not under the lock: it reads the footer
	if err != nil {
		return nil, err
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if had, ok := fs.parts[path]; ok { // opened meanwhile by another read
		p.f.Close()
		return had, nil
	}
	if fs.parts == nil {
		fs.parts = map[string]*openedPart{}
	}
	p.shared = true
	fs.parts[path] = p
	return p, nil
}

func openNew(path string, c *readConfig) (*openedPart, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	var r io.ReaderAt = f
	if c != nil && c.meter != nil {
		r = meteredFile{f, c.meter}
	}
	pf, err := checkPart(f, r, path)
	if err != nil {
		f.Close()
		return nil, err
	}
	return &openedPart{f: f, r: r, pf: pf}, nil
}

// TableBytes is the size of a table folder's part files.
func TableBytes(dir string) int64 {
	files, _ := PartFiles(dir)
	var n int64
	for _, p := range files {
		if st, err := os.Stat(p); err == nil {
			n += st.Size()
		}
	}
	return n
}

func (c *readConfig) prune(rows int) {
	if c.pruned != nil {
		c.pruned.RowGroups++
		c.pruned.Rows += int64(rows)
	}
}
