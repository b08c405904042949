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
	only     map[string]bool // nil: every part
	volatile map[string]bool // string columns whose values live as long as fn's call
	rowsOnly bool            // no flat layout (tests compare the two)
}

// parts is files less those Parts left out.
func (c *readConfig) parts(files []string) []string {
	if c.only == nil {
		return files
	}
	out := files[:0:0]
	for _, f := range files {
		if c.only[f] {
			out = append(out, f)
		}
	}
	return out
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
// rows).
func Within(ranges ...Range) ReadOption {
	return func(c *readConfig) { c.ranges = ranges }
}

// Volatile makes EachColumnsStrs' values of those string columns valid
// only during the call of fn that gets them (their pages' bytes are
// copied into one buffer a row group, reused, rather than each value
// allocated): for large unique values the reader does not keep, as the
// report's window sketches (a million of them a 100 M-row report).
func Volatile(cols ...string) ReadOption {
	return func(c *readConfig) {
		c.volatile = make(map[string]bool, len(cols))
		for _, col := range cols {
			c.volatile[col] = true
		}
	}
}

// Parts reads only those part files (paths as PartFiles gives them) of
// the folder: a reader that knows which parts hold what it wants (from
// PartRanges) saves opening the others, whose footers, past the few
// Footers keeps open, are read again each time.
func Parts(paths ...string) ReadOption {
	return func(c *readConfig) {
		c.only = make(map[string]bool, len(paths))
		for _, p := range paths {
			c.only[p] = true
		}
	}
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
	f  *os.File
	r  io.ReaderAt // f, or f metered
	pf *parquet.File
	fs *Footers // nil: closed when its read is done
	// under fs.mu:
	refs    int    // reads using it
	used    uint64 // fs.tick at its last use
	evicted bool   // out of fs: closed when refs falls to 0
}

// close ends a read's use of the part: closes it, or hands it back to
// its Footers.
func (p *openedPart) close() {
	if p.fs == nil {
		p.f.Close()
		return
	}
	p.fs.release(p)
}

// Footers keeps the parts a series of reads opened open, their footers
// read once, up to FootersKept of them not in use (the least recently
// used are closed past that): a report reads cluster_steps twice under a
// selection, and the footers of a long run's parts were a share of what a
// window of it costs; parsed, a part's footer takes about 33 KiB a row
// group, so they are not all kept (the parts a selection reads again are
// the few that hold it). Close closes them. Safe for concurrent reads.
type Footers struct {
	mu    sync.Mutex
	parts map[string]*openedPart
	tick  uint64
}

// FootersKept is how many idle parts a Footers keeps open.
const FootersKept = 4

// Close closes the parts kept open (those still in use when their reads
// end).
func (fs *Footers) Close() error {
	fs.mu.Lock()
	var done []*os.File
	for path, p := range fs.parts {
		delete(fs.parts, path)
		p.evicted = true
		if p.refs == 0 {
			done = append(done, p.f)
		}
	}
	fs.mu.Unlock()
	for _, f := range done {
		f.Close()
	}
	return nil
}

// release hands p back; parts past FootersKept idle ones are closed, the
// least recently used first.
func (fs *Footers) release(p *openedPart) {
	fs.mu.Lock()
	p.refs--
	var done []*os.File
	if p.refs == 0 && p.evicted {
		done = append(done, p.f)
	}
	for idle := fs.idle(); idle > FootersKept; idle-- {
		var old *openedPart
		var oldPath string
		for path, q := range fs.parts {
			if q.refs == 0 && (old == nil || q.used < old.used) {
				old, oldPath = q, path
			}
		}
		delete(fs.parts, oldPath)
		old.evicted = true
		done = append(done, old.f)
	}
	fs.mu.Unlock()
	for _, f := range done {
		f.Close() // not under the lock
	}
}

func (fs *Footers) idle() int {
	n := 0
	for _, q := range fs.parts {
		if q.refs == 0 {
			n++
		}
	}
	return n
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
	if p, ok := fs.parts[path]; ok {
		p.refs++
		fs.tick++
		p.used = fs.tick
		fs.mu.Unlock()
		return p, nil
	}
	fs.mu.Unlock()
	p, err := openNew(path, c) // not under the lock: it reads the footer
	if err != nil {
		return nil, err
	}
	fs.mu.Lock()
	fs.tick++
	if had, ok := fs.parts[path]; ok { // opened meanwhile by another read
		had.refs++
		had.used = fs.tick
		fs.mu.Unlock()
		p.f.Close()
		return had, nil
	}
	if fs.parts == nil {
		fs.parts = map[string]*openedPart{}
	}
	p.fs, p.refs, p.used = fs, 1, fs.tick
	fs.parts[path] = p
	fs.mu.Unlock()
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
