package trace

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/encoding"
)

// Columns holds one row group's worth of the columns EachColumns was asked
// for, row-aligned: Int64[i][k] and Strings[k] are of the same row.
type Columns struct {
	Rows    int
	Int64   [][]int64 // in the order of the names given
	Strings []string  // the (first) string column, when one was asked for
	// Str are the string columns EachColumnsStrs was asked for, in order
	// (Strings is the first).
	Str [][]string

	arenas [][]byte // per string column, for the Volatile ones
	// per int64 column, the constant its slice was last filled with and
	// how far: the next constant chunk of the same value is not refilled
	konst []konstFill
}

type konstFill struct {
	set bool
	v   int64
	n   int
}

// Cols names the int64 columns a pass reads, each once: Col gives a
// column's handle, by which Columns.Col reads it, so a pass never reads
// a column by its position in a list. Names holds them in order for
// EachColumns and its kin ("?name": optional, as they take).
type Cols struct{ names []string }

// Col is a column's handle in its Cols.
type Col int

// Col adds the column name and returns its handle; a name added before
// gets its handle again (each column is decoded once a row group: the
// report's rank pass named four columns twice, by name and among the
// blocking measures, and decoded them twice).
func (s *Cols) Col(name string) Col {
	if i := slices.Index(s.names, name); i >= 0 {
		return Col(i)
	}
	s.names = append(s.names, name)
	return Col(len(s.names) - 1)
}

// Names are the columns, in the order they were added.
func (s *Cols) Names() []string { return s.names }

// Col is the values of column h in this row group.
func (c *Columns) Col(h Col) []int64 { return c.Int64[h] }

// Constant says whether column h holds one value in this row group (its
// chunk's footer statistics said so, or it is an optional column the
// part lacks: zeros), and which: a pass may then take the group at once.
func (c *Columns) Constant(h Col) (int64, bool) {
	if int(h) >= len(c.konst) || !c.konst[h].set {
		return 0, false
	}
	return c.konst[h].v, true
}

// EachColumns streams required int64 columns (and at most one required
// string column, strCol, "" for none) of every part of a table folder
// through fn, one row group at a time, decoding pages straight into
// slices. It is several times faster than reading rows (BENCHMARKS.md):
// the report reads 10 M rank rows this way. The Columns passed to fn are
// reused. A part lacking a column, or holding it with another type or with
// nulls, is an error naming the part; a name that starts with "?" is an
// optional column (one added to the table later): a part without it reads
// as zeros.
func EachColumns(dir string, int64Cols []string, strCol string, fn func(*Columns) error) error {
	_, err := EachColumnsIn(dir, int64Cols, strCol, nil, fn)
	return err
}

// Range selects the row groups whose statistics for the int64 Column
// overlap [Min, Max]; a row group without statistics is read.
type Range struct {
	Column   string
	Min, Max int64
}

// Pruned counts what EachColumnsIn left unread.
type Pruned struct {
	RowGroups, Rows int64
}

// EachColumnsIn is EachColumns over the row groups whose column statistics
// overlap every range (a window of a long run reads what the window
// holds, from the parts' footers), saying what it skipped. fn may still
// see rows outside the ranges: statistics bound row groups, not rows.
func EachColumnsIn(dir string, int64Cols []string, strCol string, ranges []Range, fn func(*Columns) error, opts ...ReadOption) (Pruned, error) {
	var strCols []string
	if strCol != "" {
		strCols = []string{strCol}
	}
	return EachColumnsStrs(dir, int64Cols, strCols, ranges, fn, opts...)
}

// EachColumnsStrs is EachColumnsIn with any number of required string
// (or byte array) columns. A column of a nested field is named by its
// path, the names joined by dots ("compute_ns.sum").
func EachColumnsStrs(dir string, int64Cols, strCols []string, ranges []Range, fn func(*Columns) error, opts ...ReadOption) (Pruned, error) {
	var pr Pruned
	c := readOptions(opts)
	files, err := PartFiles(dir)
	if err != nil {
		return pr, err
	}
	// Decoding (pages, zstd) runs on a goroutine of its own, one row group
	// ahead of fn, in two buffers that take turns: on a 10 M-row report it
	// overlaps the report's own loop (BENCHMARKS.md). The goroutine ends
	// before EachColumnsIn returns, whatever fn returns.
	type group struct {
		cols *Columns
		path string
		err  error // the part's: unreadable, or fn's stop
	}
	free := make(chan *Columns, 2)
	for range 2 {
		free <- &Columns{Int64: make([][]int64, len(int64Cols)), Str: make([][]string, len(strCols)), arenas: make([][]byte, len(strCols))}
	}
	ready := make(chan group, 1)
	stop := make(chan struct{})
	go func() {
		defer close(ready)
		for _, path := range c.parts(files) {
			err := columnsOfFile(path, c, int64Cols, strCols, ranges, &pr, func() *Columns {
				select {
				case c := <-free:
					return c
				case <-stop:
					return nil
				}
			}, func(c *Columns) bool {
				select {
				case ready <- group{cols: c, path: path}:
					return true
				case <-stop:
					return false
				}
			}, func(c *Columns) { free <- c }) // a buffer a failed decode took: never blocks (two buffers, room for two)
			if errors.Is(err, errStopped) {
				return
			}
			if err != nil {
				select {
				case ready <- group{path: path, err: err}:
				case <-stop:
					return
				}
			}
		}
	}()
	var bad UnreadableParts
	var ferr error
	for g := range ready {
		switch {
		case ferr != nil: // draining after a stop
		case g.err != nil:
			if !bad.add(g.path, g.err) {
				ferr = g.err
				close(stop)
			}
		default:
			if err := fn(g.cols); err != nil {
				ferr = err
				close(stop)
			}
			free <- g.cols
		}
	}
	if ferr != nil {
		return pr, ferr
	}
	return pr, bad.err()
}

// errStopped ends a decoding goroutine whose reader stopped.
var errStopped = errors.New("trace: stopped")

// overlaps reports whether row group rg of pf may hold rows in every range.
func overlaps(pf *parquet.File, rg int, ranges []Range) bool {
	md := pf.Metadata()
	if rg >= len(md.RowGroups) {
		return true
	}
	for _, r := range ranges {
		mn, mx, ok := groupRange(pf, rg, r.Column)
		if ok && (mx < r.Min || mn > r.Max) {
			return false
		}
	}
	return true
}

// groupRange is the least and greatest value of int64 column col in row
// group rg of pf by its statistics; ok false when it has none.
func groupRange(pf *parquet.File, rg int, col string) (lo, hi int64, ok bool) {
	md := pf.Metadata()
	leaf, found := pf.Schema().Lookup(col)
	if rg >= len(md.RowGroups) || !found || leaf.Node.Type().Kind() != parquet.Int64 || leaf.ColumnIndex >= len(md.RowGroups[rg].Columns) {
		return 0, 0, false
	}
	st := md.RowGroups[rg].Columns[leaf.ColumnIndex].MetaData.Statistics
	mn, mx := st.MinValue, st.MaxValue
	if len(mn) != 8 || len(mx) != 8 {
		mn, mx = st.Min, st.Max // written by older writers
	}
	if len(mn) != 8 || len(mx) != 8 {
		return 0, 0, false
	}
	return int64(binary.LittleEndian.Uint64(mn)), int64(binary.LittleEndian.Uint64(mx)), true
}

// columnsOfFile decodes the row groups of one part, each into a buffer
// take gives (nil: stop), and hands it on with give (false: stop), or back
// when its decoding failed.
func columnsOfFile(path string, c *readConfig, int64Cols, strCols []string, ranges []Range, pr *Pruned, take func() *Columns, give func(*Columns) bool, back func(*Columns)) (err error) {
	p, err := openPart(path, c)
	if err != nil {
		return err
	}
	defer p.close()
	pf := p.pf
	idx, strIdx, volatile, err := columnIndexes(pf, path, c, int64Cols, strCols)
	if err != nil {
		return err
	}
	for g, rg := range pf.RowGroups() {
		rows := int(rg.NumRows())
		if len(ranges) > 0 && !overlaps(pf, g, ranges) {
			pr.RowGroups++
			pr.Rows += int64(rows)
			continue
		}
		cols := take()
		if cols == nil {
			return errStopped
		}
		if err := decodeGroup(rg.ColumnChunks(), idx, strIdx, volatile, rows, cols); err != nil {
			back(cols)
			return fmt.Errorf("trace: %s: %w: column %s: %v", path, errUnreadable, columnName(err, int64Cols, strCols), err)
		}
		cols.Rows = rows
		if len(cols.Str) > 0 {
			cols.Strings = cols.Str[0]
		}
		if !give(cols) {
			return errStopped
		}
	}
	return nil
}

// columnIndexes looks the columns asked for up in the part's schema: a
// required int64 column ("?name": optional, -1 when the part lacks it),
// a required string column.
func columnIndexes(pf *parquet.File, path string, c *readConfig, int64Cols, strCols []string) (idx, strIdx []int, volatile []bool, err error) {
	idx = make([]int, len(int64Cols))
	for i, name := range int64Cols {
		name, optional := strings.CutPrefix(name, "?")
		leaf, ok := pf.Schema().Lookup(strings.Split(name, ".")...)
		if !ok && optional {
			idx[i] = -1 // a part written before the column existed: zeros
			continue
		}
		if !ok || leaf.Node.Type().Kind() != parquet.Int64 || leaf.MaxDefinitionLevel > 0 || leaf.MaxRepetitionLevel > 0 {
			return nil, nil, nil, fmt.Errorf("trace: %s: %w: no required int64 column %q", path, errUnreadable, name)
		}
		idx[i] = leaf.ColumnIndex
	}
	strIdx, volatile = make([]int, len(strCols)), make([]bool, len(strCols))
	for i, name := range strCols {
		volatile[i] = c.volatile[name]
		leaf, ok := pf.Schema().Lookup(strings.Split(name, ".")...)
		if !ok || leaf.Node.Type().Kind() != parquet.ByteArray || leaf.MaxDefinitionLevel > 0 || leaf.MaxRepetitionLevel > 0 {
			return nil, nil, nil, fmt.Errorf("trace: %s: %w: no required string column %q", path, errUnreadable, name)
		}
		strIdx[i] = leaf.ColumnIndex
	}
	return idx, strIdx, volatile, nil
}

// columnName names the column a decoding error is of ("" when it names
// none).
func columnName(err error, int64Cols, strCols []string) string {
	var ce *columnError
	if !errors.As(err, &ce) {
		return ""
	}
	if ce.col < len(int64Cols) {
		return int64Cols[ce.col]
	}
	if k := ce.col - len(int64Cols); k < len(strCols) {
		return strCols[k]
	}
	return ""
}

// chunkErr is column col's decoding failure (nil when it decoded n values
// for a group of rows rows).
func chunkErr(col, n, rows int, err error) error {
	switch {
	case err != nil:
		return &columnError{col, err}
	case n != rows:
		return &columnError{col, fmt.Errorf("%d values for %d rows", n, rows)}
	}
	return nil
}

// columnError is a column's decoding failure; col indexes the int64
// columns asked for, then the string columns.
type columnError struct {
	col int
	err error
}

func (e *columnError) Error() string { return e.err.Error() }

// decodeGroup decodes a row group's columns into cols: the int64 columns
// split between this goroutine and one more (column chunks decode
// independently: pages and zstd were most of a large report's time), the
// string column here.
func decodeGroup(chunks []parquet.ColumnChunk, idx, strIdx []int, volatile []bool, rows int, cols *Columns) error {
	errs := make([]error, len(idx)+len(strIdx))
	if len(cols.konst) != len(idx) {
		cols.konst = make([]konstFill, len(idx))
	}
	one := func(i int) {
		c, ok := int64(0), idx[i] < 0 // a missing optional column reads as zeros
		if !ok {
			c, ok = constantInt64(chunks[idx[i]], rows)
		}
		if ok {
			v := cols.Int64[i]
			if k := cols.konst[i]; k.set && k.v == c && cap(v) >= rows && k.n >= rows {
				cols.Int64[i] = v[:rows] // (the last group's fill holds)
				return
			}
			v = slices.Grow(v[:0], rows)[:rows]
			if c == 0 {
				clear(v)
			} else {
				for j := range v {
					v[j] = c
				}
			}
			cols.Int64[i], cols.konst[i] = v, konstFill{set: true, v: c, n: rows}
			return
		}
		cols.konst[i].set = false
		v, err := readInt64Chunk(chunks[idx[i]], slices.Grow(cols.Int64[i][:0], rows)) // one allocation, not a doubling series
		if errs[i] = chunkErr(i, len(v), rows, err); errs[i] == nil {
			cols.Int64[i] = v
		}
	}
	half := len(idx) / 2
	var wg sync.WaitGroup
	if len(idx)-half > 0 && rows >= 4096 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := half; i < len(idx); i++ {
				one(i)
			}
		}()
	} else {
		half = len(idx)
	}
	for i := range half {
		one(i)
	}
	for k, si := range strIdx {
		e := len(idx) + k
		var arena *[]byte
		if volatile[k] {
			cols.arenas[k] = cols.arenas[k][:0]
			arena = &cols.arenas[k]
		}
		v, err := readStringChunkIn(chunks[si], slices.Grow(cols.Str[k][:0], rows), arena)
		if errs[e] = chunkErr(e, len(v), rows, err); errs[e] == nil {
			cols.Str[k] = v
		}
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// constantInt64 is the one value of a required int64 column chunk whose
// statistics say every one of its rows holds it (min = max, as many
// values as rows, no nulls): such a chunk is not decoded. A run's rank
// rows hold many (memory peaks on CPU, pipeline waits without a pipeline,
// checkpoints on most steps, padding): a tenth of a 10 M-row report went
// to decoding them. A chunk without statistics is decoded.
func constantInt64(chunk parquet.ColumnChunk, rows int) (int64, bool) {
	fc, ok := chunk.(*parquet.FileColumnChunk)
	if !ok || fc.NumValues() != int64(rows) || fc.NullCount() != 0 || fc.Type().Kind() != parquet.Int64 || !fc.Node().Required() {
		return 0, false
	}
	lo, hi, ok := fc.Bounds()
	if !ok || lo.Kind() != parquet.Int64 || hi.Kind() != parquet.Int64 || lo.Int64() != hi.Int64() {
		return 0, false
	}
	return lo.Int64(), true
}

func readInt64Chunk(chunk parquet.ColumnChunk, dst []int64) ([]int64, error) {
	return readRequiredChunk(chunk, dst, (*encoding.Values).Int64)
}

func readFloat64Chunk(chunk parquet.ColumnChunk, dst []float64) ([]float64, error) {
	return readRequiredChunk(chunk, dst, (*encoding.Values).Double)
}

// readRequiredChunk appends a required fixed-size column's values, page by
// page, as values gives them from a page's decoded data.
func readRequiredChunk[T any](chunk parquet.ColumnChunk, dst []T, values func(*encoding.Values) []T) ([]T, error) {
	pages := chunk.Pages()
	defer pages.Close()
	for {
		p, err := pages.ReadPage()
		if errors.Is(err, io.EOF) {
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
		if p.NumNulls() != 0 {
			parquet.Release(p)
			return dst, errors.New("nulls in a required column")
		}
		data := p.Data()
		dst = append(dst, values(&data)...)
		parquet.Release(p)
	}
}

// readOptionalChunk appends an optional fixed-size column's values to
// vals (its non-null ones, in order) and to valid whether each row has
// one: a page's values as values gives them from its decoded data and its
// definition levels, or, for a dictionary page, value by value (of).
func readOptionalChunk[T any](chunk parquet.ColumnChunk, vals []T, valid []bool, values func(*encoding.Values) []T, of func(parquet.Value) T) ([]T, []bool, error) {
	pages := chunk.Pages()
	defer pages.Close()
	var buf [256]parquet.Value
	for {
		p, err := pages.ReadPage()
		if errors.Is(err, io.EOF) {
			return vals, valid, nil
		}
		if err != nil {
			return vals, valid, err
		}
		if p.Dictionary() == nil {
			data := p.Data()
			vs := values(&data)
			if defs := p.DefinitionLevels(); defs == nil {
				for range vs {
					valid = append(valid, true)
				}
			} else {
				n := 0
				for _, d := range defs {
					valid = append(valid, d > 0)
					if d > 0 {
						n++
					}
				}
				if n != len(vs) {
					parquet.Release(p)
					return vals, valid, fmt.Errorf("%d values for %d defined rows", len(vs), n)
				}
			}
			vals = append(vals, vs...)
		} else {
			r := p.Values()
			for {
				k, err := r.ReadValues(buf[:])
				for _, v := range buf[:k] {
					valid = append(valid, !v.IsNull())
					if !v.IsNull() {
						vals = append(vals, of(v))
					}
				}
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					parquet.Release(p)
					return vals, valid, err
				}
			}
		}
		parquet.Release(p)
	}
}

// readStringChunk decodes a string column; dictionary pages without nulls
// are resolved through the chunk's dictionary, each distinct value
// allocated once; other pages value by value, a null read as "" (an
// optional column).
func readStringChunk(chunk parquet.ColumnChunk, dst []string) ([]string, error) {
	return readStringChunkIn(chunk, dst, nil)
}

// readStringChunkIn is readStringChunk; with arena, the values of pages
// that are not dictionary pages are copied into it, one after another,
// rather than allocated one by one: those strings stay valid until the
// arena is written again.
func readStringChunkIn(chunk parquet.ColumnChunk, dst []string, arena *[]byte) ([]string, error) {
	pages := chunk.Pages()
	defer pages.Close()
	var dict parquet.Dictionary
	var dictStrings []string
	var buf [256]parquet.Value
	interned := map[string]string{}
	for {
		p, err := pages.ReadPage()
		if errors.Is(err, io.EOF) {
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
		if d := p.Dictionary(); d != nil && p.NumNulls() == 0 {
			if d != dict {
				dict, dictStrings = d, make([]string, d.Len())
				for i := range dictStrings {
					dictStrings[i] = d.Index(int32(i)).String()
				}
			}
			data := p.Data()
			for _, k := range data.Int32() {
				if k < 0 || int(k) >= len(dictStrings) {
					parquet.Release(p)
					return dst, fmt.Errorf("dictionary index %d out of %d", k, len(dictStrings))
				}
				dst = append(dst, dictStrings[k])
			}
		} else {
			vr := p.Values()
			for {
				n, err := vr.ReadValues(buf[:])
				for _, v := range buf[:n] {
					if v.IsNull() {
						dst = append(dst, "")
						continue
					}
					b := v.ByteArray()
					if arena != nil {
						if len(*arena)+len(b) > cap(*arena) {
							// a new array: the strings made so far keep the old one
							*arena = make([]byte, 0, max(2*cap(*arena), len(b), 1<<16))
						}
						at := len(*arena)
						*arena = append(*arena, b...)
						dst = append(dst, unsafe.String(unsafe.SliceData((*arena)[at:]), len(b)))
						continue
					}
					s, ok := interned[string(b)]
					if !ok {
						s = string(b)
						if len(interned) < 4096 {
							interned[s] = s
						}
					}
					dst = append(dst, s)
				}
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					parquet.Release(p)
					return dst, err
				}
			}
		}
		parquet.Release(p)
	}
}
