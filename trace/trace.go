// Package trace writes and reads tpsprof's Parquet traces: one directory per
// job with a folder per table (rank_steps, cluster_steps, gpu_samples,
// events), each a set of part files. docs/parquet.md documents every column.
//
// A part is written under a hidden temporary name (".part-….parquet.tmp"),
// synced, and renamed to "part-….parquet" only when complete, so a crash
// never leaves a torn file where readers look (readers, DuckDB's
// "rank_steps/*.parquet" included, ignore the hidden names).
//
// It owns the tables' files and their schemas. It never aggregates:
// figures are package tps's (live) and package report's (after the fact).
package trace

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/compress"
	"github.com/parquet-go/parquet-go/compress/zstd"
)

// SchemaVersion is written in every part's key-value metadata.
const SchemaVersion = "1"

// Table names.
const (
	RankSteps    = "rank_steps"
	ClusterSteps = "cluster_steps"
	GPUSamples   = "gpu_samples"
	Events       = "events"
	// RankWindows summarises rank_steps per rank and window of
	// tps.RankWindowSteps steps (tps.RankWindow).
	RankWindows = "rank_windows"
)

// tables are the table names, each a folder of a job.
var tables = []string{RankSteps, ClusterSteps, GPUSamples, Events, RankWindows}

// Metadata keys.
const (
	MetaSchemaVersion = "tpsprof.schema_version"
	MetaJob           = "tpsprof.job"
	MetaTable         = "tpsprof.table"
	MetaWriter        = "tpsprof.writer"
	MetaRun           = "tpsprof.run_meta" // JSON of tps.RunMeta: topology, model, GPU, peak
	// MetaClockOffsets is a JSON object of node → clock offset in ns
	// (the node's clock less rank 0's node's) that the part's cluster
	// rows were corrected by; absent when no node needed one.
	MetaClockOffsets = "tpsprof.clock_offsets_ns"
)

// WriterOptions bound parts and row groups.
type WriterOptions struct {
	// RowsPerGroup bounds a row group (memory held before a flush).
	RowsPerGroup int64
	// RowsPerPart and PartAge rotate parts, so data reaches readers while a
	// job runs and no part grows without bound.
	RowsPerPart int64
	PartAge     time.Duration
	// WriterID distinguishes the parts of several collectors in one folder.
	WriterID string
	// Codec compresses the pages: "zstd" (the default: smallest),
	// "zstd-fast" (about 1.3x faster to write, 9% larger), "snappy"
	// (1.6x faster, 1.6x larger) or "none" (2.3x faster, 5x larger), as
	// BenchmarkWriteRankSteps measures them. Compression is more than half
	// of the cost of writing rank rows with zstd.
	Codec string
	// Metadata is called when a part is finalised; its pairs are added to
	// the part's key-value metadata.
	Metadata func() map[string]string
}

// pageBufferSize is each column's page buffer (see open).
const pageBufferSize = 32 << 10

// codecs are the names WriterOptions.Codec accepts (Codecs).
var codecs = []string{"zstd", "zstd-fast", "snappy", "none"}

// Codecs are the names WriterOptions.Codec accepts.
func Codecs() []string { return slices.Clone(codecs) }

var zstdFast = zstd.Codec{Level: zstd.SpeedFastest}

// codec returns the parquet-go codec named, or an error listing the names.
func codec(name string) (compress.Codec, error) {
	switch name {
	case "", "zstd":
		return &parquet.Zstd, nil
	case "zstd-fast":
		return &zstdFast, nil
	case "snappy":
		return &parquet.Snappy, nil
	case "none":
		return &parquet.Uncompressed, nil
	}
	return nil, fmt.Errorf("trace: unknown Parquet codec %q (%s)", name, strings.Join(codecs, ", "))
}

// CheckCodec reports whether name is a codec WriterOptions accepts.
func CheckCodec(name string) error {
	_, err := codec(name)
	return err
}

func (o *WriterOptions) defaults() {
	if o.RowsPerGroup <= 0 {
		o.RowsPerGroup = 64 * 1024
	}
	if o.RowsPerPart <= 0 {
		o.RowsPerPart = 4 * 1024 * 1024
	}
	if o.PartAge <= 0 {
		o.PartAge = time.Minute
	}
	if o.WriterID == "" {
		h, _ := os.Hostname()
		o.WriterID = fmt.Sprintf("%s-%d", sanitize(h), os.Getpid())
	}
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, s)
}

// PartWriter writes rows of T into rotating part files of one table folder.
// Not safe for concurrent use.
type PartWriter[T any] struct {
	dir, table, job string
	opt             WriterOptions
	codec           compress.Codec
	seq             int

	f       *os.File
	w       *parquet.GenericWriter[T]
	staged  []T // the open part's first rows, before a Parquet writer is made for them
	tmp     string
	rows    int64
	opened  time.Time
	written int64
	lost    int64
	parts   []string
}

// NewPartWriter writes table parts under root/job/table.
func NewPartWriter[T any](root, job, table string, opt WriterOptions) (*PartWriter[T], error) {
	opt.defaults()
	c, err := codec(opt.Codec)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(root, job, table)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	return &PartWriter[T]{dir: dir, table: table, job: job, opt: opt, codec: c}, nil
}

// Dir is the table folder.
func (p *PartWriter[T]) Dir() string { return p.dir }

// Parts lists the finalised part files so far.
func (p *PartWriter[T]) Parts() []string { return slices.Clone(p.parts) }

// Rows is the number of rows in finalised parts.
func (p *PartWriter[T]) Rows() int64 { return p.written }

// Lost is the number of rows that failed to reach a finalised part (an
// error writing, finalising or renaming it), since the writer was made.
func (p *PartWriter[T]) Lost() int64 { return p.lost }

// Pending is the number of rows written to the open part.
func (p *PartWriter[T]) Pending() int64 { return p.rows }

func (p *PartWriter[T]) open() error {
	p.seq++
	now := time.Now()
	name := fmt.Sprintf("part-%s-%s-%05d.parquet", now.UTC().Format("20060102T150405.000000000Z"), p.opt.WriterID, p.seq)
	p.tmp = filepath.Join(p.dir, "."+name+".tmp")
	f, err := os.OpenFile(p.tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("trace: create part: %w", err)
	}
	p.f, p.opened, p.rows = f, now, 0
	p.w = parquet.NewGenericWriter[T](f,
		parquet.Compression(p.codec),
		parquet.MaxRowsPerRowGroup(p.opt.RowsPerGroup),
		// Column buffers start at this size and grow with the rows: the
		// default (256 KiB a column) made every open part of a quiet job
		// hold ~6 MiB (a collector with many jobs, docs/reliability.md).
		parquet.PageBufferSize(pageBufferSize),
		parquet.KeyValueMetadata(MetaSchemaVersion, SchemaVersion),
		parquet.KeyValueMetadata(MetaJob, p.job),
		parquet.KeyValueMetadata(MetaTable, p.table),
		parquet.KeyValueMetadata(MetaWriter, p.opt.WriterID),
	)
	return nil
}

// stageRows is how many rows a part gathers in memory before its Parquet
// writer is made: the writer's column buffers cost ~1.2 MiB a table at
// once, so a job that sent a record or two (most of a collector's jobs
// when many come and go) cost ~3 MiB before; now it costs its rows.
const stageRows = 512

// Write appends rows to the open part, opening one if needed, and rotates
// the part when it is full. On error the open part is discarded (its rows
// are lost, the error says how many) and no file is left behind. Rows are
// copied: the caller may reuse the slice.
func (p *PartWriter[T]) Write(rows []T) error {
	if len(rows) == 0 {
		return nil
	}
	if p.w == nil {
		if int64(len(p.staged)+len(rows)) < min(stageRows, p.opt.RowsPerPart) {
			if len(p.staged) == 0 {
				p.opened = time.Now()
			}
			p.staged = append(p.staged, rows...)
			p.rows += int64(len(rows))
			return nil
		}
		if err := p.flushStaged(); err != nil {
			p.lost += int64(len(rows))
			return err
		}
	}
	if _, err := p.w.Write(rows); err != nil {
		lost := p.rows + int64(len(rows))
		p.lost += lost
		p.discard()
		return fmt.Errorf("trace: write %s: %w (%d rows of the open part lost)", p.table, err, lost)
	}
	p.rows += int64(len(rows))
	if p.rows >= p.opt.RowsPerPart {
		return p.Rotate()
	}
	return nil
}

// flushStaged opens the part's file and writes the staged rows to it.
func (p *PartWriter[T]) flushStaged() error {
	staged, opened := p.staged, p.opened
	p.staged = nil
	if err := p.open(); err != nil {
		p.lost += int64(len(staged))
		p.rows = 0
		return err
	}
	if len(staged) > 0 {
		p.opened = opened // the part's age runs from its first row
		if _, err := p.w.Write(staged); err != nil {
			p.lost += int64(len(staged))
			p.discard()
			return fmt.Errorf("trace: write %s: %w (%d rows of the open part lost)", p.table, err, len(staged))
		}
		p.rows = int64(len(staged))
	}
	return nil
}

// Due reports whether the open part is older than PartAge.
func (p *PartWriter[T]) Due(now time.Time) bool {
	return (p.w != nil || len(p.staged) > 0) && now.Sub(p.opened) >= p.opt.PartAge
}

// Rotate finalises the open part: footer, sync, rename into place.
func (p *PartWriter[T]) Rotate() error {
	if p.w == nil {
		if len(p.staged) == 0 {
			return nil
		}
		if err := p.flushStaged(); err != nil {
			return err
		}
	}
	if p.opt.Metadata != nil {
		for k, v := range p.opt.Metadata() {
			p.w.SetKeyValueMetadata(k, v)
		}
	}
	rows := p.rows
	err := p.w.Close()
	if err == nil {
		err = p.f.Sync()
	}
	if cerr := p.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(p.tmp)
		p.w, p.f, p.rows = nil, nil, 0
		p.lost += rows
		return fmt.Errorf("trace: finalise %s part: %w (%d rows lost)", p.table, err, rows)
	}
	final := filepath.Join(p.dir, strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p.tmp), "."), ".tmp"))
	if err := os.Rename(p.tmp, final); err != nil {
		os.Remove(p.tmp)
		p.w, p.f, p.rows = nil, nil, 0
		p.lost += rows
		return fmt.Errorf("trace: rename %s part: %w (%d rows lost)", p.table, err, rows)
	}
	syncDir(p.dir)
	p.parts = append(p.parts, final)
	p.written += rows
	p.w, p.f, p.rows = nil, nil, 0
	return nil
}

func (p *PartWriter[T]) discard() {
	if p.f != nil {
		p.f.Close()
		os.Remove(p.tmp)
	}
	p.w, p.f, p.rows, p.staged = nil, nil, 0, nil
}

// Close finalises the open part.
func (p *PartWriter[T]) Close() error { return p.Rotate() }

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// PartFiles lists the complete part files of a table folder, in name order
// (which is creation order per writer). Temporary files are skipped.
func PartFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("trace: %w", err)
	}
	var out []string
	for _, e := range entries {
		n := e.Name()
		if e.Type().IsRegular() && !strings.HasPrefix(n, ".") && strings.HasSuffix(n, ".parquet") {
			out = append(out, filepath.Join(dir, n))
		}
	}
	slices.Sort(out)
	return out, nil
}

// Each streams the rows of every part of a table folder through fn, a row
// group's worth at a time, so memory stays bounded whatever the trace size.
// The slice passed to fn is reused.
//
// A part that is not readable Parquet (empty, truncated, another format)
// is skipped: the other parts are read, and the error returned at the end
// is an *UnreadableParts naming the skipped ones.
func Each[T any](dir string, fn func(rows []T) error, opts ...ReadOption) error {
	files, err := PartFiles(dir)
	if err != nil {
		return err
	}
	c := readOptions(opts)
	buf := make([]T, 4096)
	var bad UnreadableParts
	for _, path := range c.parts(files) {
		if err := eachInFile(path, buf, fn, c); err != nil {
			if !bad.add(path, err) {
				return err
			}
		}
	}
	return bad.err()
}

// UnreadableParts lists part files that could not be read as Parquet and
// were skipped; the rest of the table was read.
type UnreadableParts struct {
	Paths  []string
	Errors []error
}

var errUnreadable = errors.New("not a readable Parquet part")

// MaxGroupRows is the most rows a row group of a readable part may claim.
const MaxGroupRows = 1 << 22

func (u *UnreadableParts) add(path string, err error) bool {
	if !errors.Is(err, errUnreadable) {
		return false
	}
	u.Paths, u.Errors = append(u.Paths, path), append(u.Errors, err)
	return true
}

func (u *UnreadableParts) err() error {
	if len(u.Paths) == 0 {
		return nil
	}
	return u
}

func (u *UnreadableParts) Error() string {
	return fmt.Sprintf("trace: %d unreadable part(s) skipped: %v", len(u.Paths), errors.Join(u.Errors...))
}

// checkPart opens a part's footer: parquet-go panics on a file that is not
// Parquet when a reader is made from it, so every reader checks first. A
// part whose metadata names another table than its folder is unreadable
// here too.
func checkPart(f *os.File, r io.ReaderAt, path string) (*parquet.File, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	pf, err := openParquet(r, st.Size())
	if err != nil {
		return nil, fmt.Errorf("trace: %s: %w: %v", path, errUnreadable, err)
	}
	// A footer's counts are checked before anything is sized by them: a
	// row group past MaxGroupRows (no writer of these tables makes one:
	// tpsprof's hold 64 Ki rows, DuckDB's about 123 Ki), a negative count,
	// or a total that is not the groups' sum is a lying footer, and the
	// part is skipped, named (a footer claiming 1e9 rows made the report
	// allocate 8 GB for one column).
	var sum int64
	for g, rg := range pf.RowGroups() {
		n := rg.NumRows()
		if n < 0 || n > MaxGroupRows {
			return nil, fmt.Errorf("trace: %s: %w: row group %d claims %d rows (at most %d)", path, errUnreadable, g, n, MaxGroupRows)
		}
		sum += n
	}
	if sum != pf.NumRows() {
		return nil, fmt.Errorf("trace: %s: %w: the footer claims %d rows, its row groups %d", path, errUnreadable, pf.NumRows(), sum)
	}
	if err := footerFits(pf, st.Size()); err != nil {
		return nil, fmt.Errorf("trace: %s: %w: %v", path, errUnreadable, err)
	}
	// A part of another table (a rank_steps part copied into
	// cluster_steps) would decode into zeros and defaults: skip it, named.
	if table, ok := pf.Lookup(MetaTable); ok && table != "" {
		if dir := filepath.Base(filepath.Dir(path)); slices.Contains(tables, dir) && dir != table {
			return nil, fmt.Errorf("trace: %s: %w: a %s part in the %s folder", path, errUnreadable, table, dir)
		}
	}
	return pf, nil
}

// MaxRowsPerByte bounds the rows a row group may claim by the bytes its
// column chunks take: the densest part tpsprof writes (events whose every
// field is zero, zstd) holds 4 rows a byte, 64-byte rows of real events
// 0.15 (6.8 bytes a row), GPU samples 0.28; a footer claiming more rows
// than 16 a byte is lying, and a reader sizing its rows by it would
// allocate what the file cannot hold (a 124 KB file claiming 64 row groups
// of 4 Mi rows asked for tens of GB).
const MaxRowsPerByte = 16

// footerFits checks a footer's claims against the file: each column
// chunk within the file, a group's chunks' bytes no more than the file's,
// a flat column's values as many as its group's rows, and a group's rows
// at most MaxRowsPerByte a byte of its chunks (and 4,096 for any group, however small).
func footerFits(pf *parquet.File, size int64) error {
	md := pf.Metadata()
	leaves := pf.Schema().Columns()
	flat := make([]bool, len(leaves))
	for i, path := range leaves {
		if leaf, ok := pf.Schema().Lookup(path...); ok {
			flat[i] = leaf.MaxRepetitionLevel == 0
		}
	}
	var all int64
	for g, rg := range md.RowGroups {
		var bytes int64
		for c, cc := range rg.Columns {
			m := cc.MetaData
			off := m.DataPageOffset
			if m.DictionaryPageOffset > 0 && m.DictionaryPageOffset < off {
				off = m.DictionaryPageOffset
			}
			if m.TotalCompressedSize < 0 || off < 0 || off > size || m.TotalCompressedSize > size-off {
				return fmt.Errorf("row group %d column %d claims bytes %d-%d of a %d-byte file", g, c, off, off+m.TotalCompressedSize, size)
			}
			if c < len(flat) && flat[c] && m.NumValues != rg.NumRows {
				return fmt.Errorf("row group %d column %d claims %d values for %d rows", g, c, m.NumValues, rg.NumRows)
			}
			bytes += m.TotalCompressedSize
		}
		if all += bytes; all > size {
			return fmt.Errorf("the row groups' column chunks claim %d bytes of a %d-byte file", all, size)
		}
		if rg.NumRows > 4096 && rg.NumRows > MaxRowsPerByte*bytes {
			return fmt.Errorf("row group %d claims %d rows in %d bytes (at most %d a byte)", g, rg.NumRows, bytes, MaxRowsPerByte)
		}
	}
	return nil
}

func openParquet(f io.ReaderAt, size int64) (pf *parquet.File, err error) {
	defer func() {
		if r := recover(); r != nil {
			pf, err = nil, fmt.Errorf("%v", r)
		}
	}()
	return parquet.OpenFile(f, size, parquet.SkipPageIndex(true), parquet.SkipBloomFilters(true))
}

func eachInFile[T any](path string, buf []T, fn func([]T) error, c *readConfig) error {
	p, err := openPart(path, c)
	if err != nil {
		return err
	}
	defer p.close()
	if err := schemaFits[T](p.pf, path); err != nil {
		return err
	}
	if layout, ok := flatLayoutOf[T](p.pf); ok && !c.rowsOnly && !slices.ContainsFunc(p.pf.RowGroups(), func(rg parquet.RowGroup) bool {
		return rg.NumRows() > 1<<22 // as only a lying footer says: not held as one slice
	}) {
		return eachGroupFlat(p.pf, path, layout, fn, c.ranges)
	}
	if len(c.ranges) == 0 {
		return readRows(p.pf, path, buf, fn) // the footer read once
	}
	return eachGroupIn(p.pf, path, buf, fn, c.ranges)
}

// eachGroupFlat streams the row groups of f that can hold rows within
// ranges (all when none) through fn, a row group at a time, each decoded
// by the flat layout into one slice of rows reused (a part with a row
// group past 4 Mi rows is read through parquet-go's rows).
func eachGroupFlat[T any](f *parquet.File, path string, layout []flatField, fn func([]T) error, ranges []Range) error {
	var sc flatScratch
	var rows []T
	for g, rg := range f.RowGroups() {
		if len(ranges) > 0 && !overlaps(f, g, ranges) {
			continue
		}
		n := rg.NumRows()
		if n <= 0 {
			continue
		}
		if int64(cap(rows)) < n {
			rows = make([]T, n)
		} else {
			rows = rows[:n]
			clear(rows)
		}
		if err := readGroupFlat(rg, layout, rows, path, &sc); err != nil {
			return err
		}
		if err := fn(rows); err != nil {
			return err
		}
	}
	return nil
}

// eachGroupIn streams the row groups of f that can hold rows within
// ranges through fn, with one reader over the file that seeks to each
// (a reader a row group cost about 18 ms each, whatever its size: what
// parquet-go sets up for a reader).
func eachGroupIn[T any](f *parquet.File, path string, buf []T, fn func([]T) error, ranges []Range) (err error) {
	defer unreadableOnPanic(&err, path)
	var r *parquet.GenericReader[T]
	defer func() {
		if r != nil {
			r.Close()
		}
	}()
	var at int64
	for g, rg := range f.RowGroups() {
		n := rg.NumRows()
		if !overlaps(f, g, ranges) {
			at += n
			continue
		}
		if r == nil {
			r = parquet.NewGenericReader[T](f)
		}
		if err := r.SeekToRow(at); err != nil {
			return fmt.Errorf("trace: read %s: %w: %v", path, errUnreadable, err)
		}
		for left := n; left > 0; {
			k, err := r.Read(buf[:min(int64(len(buf)), left)])
			if k > 0 {
				if ferr := fn(buf[:k]); ferr != nil {
					return ferr
				}
				left -= int64(k)
			}
			if err != nil {
				if errors.Is(err, io.EOF) && left == 0 {
					break
				}
				return fmt.Errorf("trace: read %s: %w: %v", path, errUnreadable, err)
			}
		}
		at += n
	}
	return nil
}

// unreadableOnPanic makes a panic of the Parquet reader the part's error.
func unreadableOnPanic(err *error, path string) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("trace: %s: %w: %v", path, errUnreadable, r)
	}
}

// drainRows passes what r reads to fn, len(buf) rows at a time, to the end.
func drainRows[T any](r interface{ Read([]T) (int, error) }, buf []T, fn func([]T) error, path string) error {
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if ferr := fn(buf[:n]); ferr != nil {
				return ferr
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("trace: read %s: %w: %v", path, errUnreadable, err)
		}
	}
}

// schemaFits refuses a part whose columns have other types than T's (a
// part written by another program under a table's name, or a footer that
// lies): read, its values would be converted wrongly or make the reader
// fail half-way; skipped as unreadable, the other parts are read.
func schemaFits[T any](pf *parquet.File, path string) error {
	want := parquet.SchemaOf(new(T))
	have := pf.Schema()
	for _, col := range want.Columns() {
		wl, ok := want.Lookup(col...)
		if !ok {
			continue
		}
		hl, ok := have.Lookup(col...)
		if !ok {
			continue // a column added since: its zero value
		}
		if wk, hk := wl.Node.Type().Kind(), hl.Node.Type().Kind(); wk != hk {
			return fmt.Errorf("trace: %s: %w: column %s is %v, want %v", path, errUnreadable, strings.Join(col, "."), hk, wk)
		}
	}
	return nil
}

// readRows streams a checked part's rows; a failure of the Parquet reader
// (a panic included) makes the part unreadable, not the whole table.
func readRows[T any](f io.ReaderAt, path string, buf []T, fn func([]T) error) (err error) {
	defer unreadableOnPanic(&err, path)
	r := parquet.NewGenericReader[T](f)
	defer r.Close()
	return drainRows(r, buf, fn, path)
}

// ReadFile reads every row of one part file.
func ReadFile[T any](path string) ([]T, error) {
	var out []T
	buf := make([]T, 4096)
	err := eachInFile(path, buf, func(rows []T) error {
		out = append(out, rows...)
		return nil
	}, &readConfig{})
	return out, err
}

// ReadAll reads every row of a table folder into memory, in part and row
// order; for tables that fit (cluster rows, events, tests). Use Each for
// large ones. Row groups are decoded in parallel (up to GOMAXPROCS), each
// straight into its place in one slice sized from the footers: appending
// row by row grew the slice ~20 times for 156,250 cluster rows, and one
// goroutine decoding them was a third of a 10 M-row report (BENCHMARKS.md).
// Unreadable parts are skipped and named (UnreadableParts), as by Each.
func ReadAll[T any](dir string, opts ...ReadOption) ([]T, error) {
	return ReadAllInto[T](nil, dir, opts...)
}

// ReadAllInto is ReadAll into buf's array when it holds the rows
// (cleared first: a part without a field reads its zero value), else a
// new one: a reader of chunks (the report's cluster rows) reuses one
// array, where a new one each chunk was most of its garbage.
func ReadAllInto[T any](buf []T, dir string, opts ...ReadOption) ([]T, error) {
	files, err := PartFiles(dir)
	if err != nil {
		return nil, err
	}
	c := readOptions(opts)
	var bad UnreadableParts
	parts, total, err := planRead[T](c.parts(files), c, &bad)
	defer func() {
		for _, p := range parts {
			p.op.close()
		}
	}()
	if err != nil {
		return nil, err
	}
	var out []T
	if total <= cap(buf) {
		out = buf[:total]
		clear(out)
	} else {
		out = make([]T, total)
		populate(out)
	}
	decodeAll(out, parts)
	return keepRead(out, parts, &bad)
}

// readPart is a part ReadAll reads: its row groups, where each one's rows
// go, and its error.
type readPart struct {
	path   string
	op     *openedPart
	flat   []flatField // nil: read through parquet-go's rows
	groups []parquet.RowGroup
	off    []int // where each row group's rows go
	rows   int
	err    error
}

// planRead opens the parts and places their row groups (those the ranges
// select) in one slice of total rows; unreadable parts go to bad. The
// parts are returned, to be closed, also with an error.
func planRead[T any](files []string, c *readConfig, bad *UnreadableParts) (parts []*readPart, total int, err error) {
	for _, path := range files {
		op, err := openPart(path, c)
		if err == nil {
			if err = schemaFits[T](op.pf, path); err != nil {
				op.close()
			}
		}
		if err != nil {
			if !bad.add(path, err) {
				return parts, 0, err
			}
			continue
		}
		p := &readPart{path: path, op: op}
		parts = append(parts, p)
		if layout, ok := flatLayoutOf[T](op.pf); ok && !c.rowsOnly {
			p.flat = layout
		}
		for g, rg := range op.pf.RowGroups() {
			n := rg.NumRows()
			if len(c.ranges) > 0 && !overlaps(op.pf, g, c.ranges) {
				continue
			}
			if n < 0 || int64(total)+n > 1<<31 {
				return parts, 0, fmt.Errorf("trace: %s: %d rows: too many to hold in memory (use Each)", path, n)
			}
			p.groups = append(p.groups, rg)
			p.off = append(p.off, total+p.rows)
			p.rows += int(n)
		}
		total += p.rows
	}
	return parts, total, nil
}

// decodeAll decodes every part's row groups into their places in out, in
// parallel (up to GOMAXPROCS, at most 8); a group's error goes to its part.
func decodeAll[T any](out []T, parts []*readPart) {
	type task struct {
		p *readPart
		g int
	}
	tasks := make(chan task)
	var wg sync.WaitGroup
	var mu sync.Mutex // guards each part's err
	for range min(runtime.GOMAXPROCS(0), max(len(out)/65536, 1), 8) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var sc flatScratch
			for t := range tasks {
				n := int(t.p.groups[t.g].NumRows())
				dst := out[t.p.off[t.g] : t.p.off[t.g]+n]
				var err error
				if t.p.flat != nil {
					err = readGroupFlat(t.p.groups[t.g], t.p.flat, dst, t.p.path, &sc)
				} else {
					err = readGroup(t.p.groups[t.g], dst, t.p.path)
				}
				if err != nil {
					mu.Lock()
					if t.p.err == nil {
						t.p.err = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for _, p := range parts {
		for g := range p.groups {
			tasks <- task{p, g}
		}
	}
	close(tasks)
	wg.Wait()
}

// keepRead drops a part that failed half-way whole, named in bad, as Each
// skips it.
func keepRead[T any](out []T, parts []*readPart, bad *UnreadableParts) ([]T, error) {
	if !slices.ContainsFunc(parts, func(p *readPart) bool { return p.err != nil }) {
		return out, bad.err()
	}
	kept := out[:0]
	for _, p := range parts {
		start := 0
		if len(p.off) > 0 {
			start = p.off[0]
		}
		if p.err != nil {
			if !bad.add(p.path, p.err) {
				return nil, p.err
			}
			continue
		}
		kept = append(kept, out[start:start+p.rows]...)
	}
	return kept, bad.err()
}

// readGroup decodes one row group into dst, which holds exactly its rows.
func readGroup[T any](rg parquet.RowGroup, dst []T, path string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("trace: %s: %w: %v", path, errUnreadable, r)
		}
	}()
	r := parquet.NewGenericRowGroupReader[T](rg)
	defer r.Close()
	for done := 0; done < len(dst); {
		// 4,096 rows a call: parquet-go sizes its row buffers by the
		// request, and a whole row group's worth grew them ~15 times
		n, err := r.Read(dst[done:min(done+4096, len(dst))])
		done += n
		if err != nil {
			if errors.Is(err, io.EOF) && done == len(dst) {
				return nil
			}
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("trace: read %s: %w: %d rows of a row group of %d", path, errUnreadable, done, len(dst))
			}
			return fmt.Errorf("trace: read %s: %w: %v", path, errUnreadable, err)
		}
		if n == 0 {
			return fmt.Errorf("trace: read %s: %w: no progress", path, errUnreadable)
		}
	}
	return nil
}

// RowCount is the rows the parts under dir hold, from their footers alone
// (unreadable parts count 0).
func RowCount(dir string, opts ...ReadOption) int64 {
	n, _ := RowCountChecked(dir, opts...)
	return n
}

// RowCountChecked is RowCount, and the parts it left out (their footer
// check failed: a footer claiming 1e9 rows, not Parquet) with why, as an
// UnreadableParts error (nil when none).
func RowCountChecked(dir string, opts ...ReadOption) (int64, error) {
	files, _ := PartFiles(dir)
	c := readOptions(opts)
	var n int64
	var u UnreadableParts
	for _, path := range c.parts(files) {
		p, err := openPart(path, c)
		if err != nil {
			u.add(path, err)
			continue
		}
		n += p.pf.NumRows()
		p.close()
	}
	return n, u.err()
}

// RowGroupRows is the rows of each row group of the parts under dir, in
// the order the readers visit them, from their footers alone (unreadable
// parts are left out).
func RowGroupRows(dir string, opts ...ReadOption) []int64 {
	files, _ := PartFiles(dir)
	c := readOptions(opts)
	var out []int64
	for _, path := range c.parts(files) {
		if p, err := openPart(path, c); err == nil {
			for _, rg := range p.pf.RowGroups() {
				out = append(out, rg.NumRows())
			}
			p.close()
		}
	}
	return out
}

// PartRange is what a part's footer says of some int64 columns: for each,
// the least and greatest value over its row groups' statistics.
type PartRange struct {
	Path     string
	Min, Max []int64 // by column, as asked
	// Known is false when some row group has no statistics for some of
	// the columns (the part may hold any value).
	Known bool
}

// PartRanges is the PartRange of every readable part of dir (footers
// alone).
func PartRanges(dir string, cols []string, opts ...ReadOption) []PartRange {
	files, _ := PartFiles(dir)
	c := readOptions(opts)
	var out []PartRange
	for _, path := range c.parts(files) {
		p, err := openPart(path, c)
		if err != nil {
			continue
		}
		pr := PartRange{Path: path, Min: make([]int64, len(cols)), Max: make([]int64, len(cols)), Known: true}
		for k, col := range cols {
			pr.Min[k], pr.Max[k] = math.MaxInt64, math.MinInt64
			for g := range p.pf.RowGroups() {
				lo, hi, ok := groupRange(p.pf, g, col)
				if !ok {
					pr.Known = false
					break
				}
				pr.Min[k], pr.Max[k] = min(pr.Min[k], lo), max(pr.Max[k], hi)
			}
		}
		p.close()
		out = append(out, pr)
	}
	return out
}

// FileMetadata returns the key-value metadata of one part file.
func FileMetadata(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	pf, err := openParquet(f, st.Size())
	if err != nil {
		return nil, fmt.Errorf("trace: open %s: %w", path, err)
	}
	out := map[string]string{}
	for _, kv := range pf.Metadata().KeyValueMetadata {
		out[kv.Key] = kv.Value
	}
	return out, nil
}

// OpenParts counts the parts of a table folder still being written (their
// hidden temporary files): a writer has it open.
func OpenParts(dir string) int {
	entries, _ := os.ReadDir(dir)
	n := 0
	for _, e := range entries {
		if name := e.Name(); strings.HasPrefix(name, ".part-") && strings.HasSuffix(name, ".tmp") {
			n++
		}
	}
	return n
}

// IsUnreadable reports whether err is about a part that is not readable
// Parquet (from ReadFile), or lists such parts (from Each, ReadAll,
// EachColumns, whose other parts were read).
func IsUnreadable(err error) bool {
	var u *UnreadableParts
	return errors.Is(err, errUnreadable) || errors.As(err, &u)
}
