package trace

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"unsafe"

	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/encoding"
)

// A flat layout decodes a row group of a struct of int64, int32, float64
// and string fields, and optional *int64 and *float64 ones (the cluster
// rows, the GPU samples), column by column, straight into the structs'
// fields: parquet-go rebuilds rows value by value through reflection,
// which was most of reading 156,250 cluster rows and about 1.5 µs a GPU
// sample (BENCHMARKS.md). ReadAll and Each use it when every field of T
// and its column in the part fit (flatLayoutOf), and parquet-go's rows
// otherwise.
type flatField struct {
	col  int          // leaf column index in the part
	off  uintptr      // field offset in T
	kind reflect.Kind // int64, int32, float64 or string (an optional string's nulls read as "")
	ptr  bool         // an optional *int64 or *float64: nil for a null
}

// flatLayoutOf maps T's fields to pf's columns, or says why it cannot
// (a field of another kind, a column of another type, nesting,
// repetition): such a T is read through parquet-go's rows. A field whose
// column the part lacks keeps its zero value, as parquet-go leaves it.
func flatLayoutOf[T any](pf *parquet.File) ([]flatField, bool) {
	t := reflect.TypeFor[T]()
	if t.Kind() != reflect.Struct {
		return nil, false
	}
	var out []flatField
	for i := range t.NumField() {
		f := t.Field(i)
		tag, ok := f.Tag.Lookup("parquet")
		if !ok || !f.IsExported() {
			return nil, false
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		optional := strings.Contains(","+opts+",", ",optional,")
		fk, ptr, ok := flatKind(f.Type, optional)
		if !ok {
			return nil, false
		}
		leaf, ok := pf.Schema().Lookup(name)
		if !ok {
			continue
		}
		if !flatLeafFits(leaf, fk, ptr, optional) {
			return nil, false
		}
		out = append(out, flatField{col: leaf.ColumnIndex, off: f.Offset, kind: fk, ptr: ptr})
	}
	return out, true
}

// flatKind is the kind a field of type t is read as, and whether through
// a pointer (an optional *int64 or *float64); ok false: not a flat field.
func flatKind(t reflect.Type, optional bool) (fk reflect.Kind, ptr, ok bool) {
	fk = t.Kind()
	if fk == reflect.Pointer {
		fk, ptr = t.Elem().Kind(), true
	}
	switch {
	case !ptr && (fk == reflect.Int64 || fk == reflect.Int32 || fk == reflect.Float64 || fk == reflect.String),
		ptr && optional && (fk == reflect.Int64 || fk == reflect.Float64):
		return fk, ptr, true
	}
	return fk, ptr, false
}

// flatLeafFits is whether a part's column can be read straight into a
// field of kind fk.
func flatLeafFits(leaf parquet.LeafColumn, fk reflect.Kind, ptr, optional bool) bool {
	if leaf.MaxRepetitionLevel > 0 || leaf.MaxDefinitionLevel > 1 || (leaf.MaxDefinitionLevel == 1) != optional {
		return false
	}
	kind := leaf.Node.Type().Kind()
	switch {
	case fk == reflect.Int64 && kind == parquet.Int64 && optional == ptr,
		fk == reflect.Int32 && kind == parquet.Int32 && !optional,
		fk == reflect.Float64 && kind == parquet.Double && optional == ptr,
		fk == reflect.String && kind == parquet.ByteArray && !ptr:
		return true
	}
	return false
}

// flatScratch holds a worker's decoded columns between row groups: fresh
// slices for every group of a 1.56 M-row table were ~700 MB of garbage.
type flatScratch struct {
	i64   [][]int64
	i32   [][]int32
	f64   [][]float64
	str   [][]string
	valid [][]bool // an optional field's: which rows have a value
}

// readGroupFlat decodes row group rg into dst (exactly its rows, zero:
// a fresh slice's) by the layout, decoding into sc's slices (nil: fresh
// ones).
func readGroupFlat[T any](rg parquet.RowGroup, layout []flatField, dst []T, path string, sc *flatScratch) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("trace: %s: %w: %v", path, errUnreadable, r)
		}
	}()
	if len(dst) == 0 {
		return nil
	}
	chunks := rg.ColumnChunks()
	// every column decoded first, then the rows filled a block at a time:
	// a column at a time over the whole group walked every row's cache
	// line once per column
	if sc == nil {
		sc = &flatScratch{}
	}
	sc.grow(len(layout))
	for k, f := range layout {
		if err := sc.decode(k, f, chunks[f.col], len(dst)); err != nil {
			return fmt.Errorf("trace: read %s: %w: column %d: %v", path, errUnreadable, f.col, err)
		}
	}
	base, size := unsafe.Pointer(&dst[0]), unsafe.Sizeof(dst[0])
	next := make([]int, len(layout)) // an optional field's next value
	const block = 256
	for lo := 0; lo < len(dst); lo += block {
		hi := min(lo+block, len(dst))
		for k, f := range layout {
			sc.fill(base, size, lo, hi, k, f, &next[k])
		}
	}
	return nil
}

func (sc *flatScratch) grow(n int) {
	for len(sc.i64) < n {
		sc.i64, sc.i32, sc.f64, sc.str, sc.valid = append(sc.i64, nil), append(sc.i32, nil), append(sc.f64, nil), append(sc.str, nil), append(sc.valid, nil)
	}
}

// decode reads field k's column chunk of a group of rows rows.
func (sc *flatScratch) decode(k int, f flatField, chunk parquet.ColumnChunk, rows int) (err error) {
	n := 0
	switch {
	case f.ptr && f.kind == reflect.Int64:
		// the values stay the rows': fresh for every group
		if sc.i64[k], sc.valid[k], err = readOptionalChunk(chunk, make([]int64, 0, rows), sc.valid[k][:0], (*encoding.Values).Int64, parquet.Value.Int64); err == nil {
			n = len(sc.valid[k])
		}
	case f.ptr && f.kind == reflect.Float64:
		if sc.f64[k], sc.valid[k], err = readOptionalChunk(chunk, make([]float64, 0, rows), sc.valid[k][:0], (*encoding.Values).Double, parquet.Value.Double); err == nil {
			n = len(sc.valid[k])
		}
	case f.kind == reflect.Int64:
		if sc.i64[k], err = readInt64Chunk(chunk, slices.Grow(sc.i64[k][:0], rows)); err == nil {
			n = len(sc.i64[k])
		}
	case f.kind == reflect.Int32:
		if sc.i32[k], err = readRequiredChunk(chunk, slices.Grow(sc.i32[k][:0], rows), (*encoding.Values).Int32); err == nil {
			n = len(sc.i32[k])
		}
	case f.kind == reflect.Float64:
		if sc.f64[k], err = readFloat64Chunk(chunk, slices.Grow(sc.f64[k][:0], rows)); err == nil {
			n = len(sc.f64[k])
		}
	case f.kind == reflect.String:
		sc.str[k], err = readStringChunk(chunk, sc.str[k][:0]) // nulls of an optional one read as ""
		n = len(sc.str[k])
	}
	if err == nil && n != rows {
		err = fmt.Errorf("%d values for %d rows", n, rows)
	}
	return err
}

// fill stores field k of rows [lo, hi) of the rows at base (each size
// bytes; zero before), an optional field's values from *next on.
func (sc *flatScratch) fill(base unsafe.Pointer, size uintptr, lo, hi, k int, f flatField, next *int) {
	at := func(i int) unsafe.Pointer { return unsafe.Add(base, uintptr(lo+i)*size+f.off) }
	switch {
	case f.ptr && f.kind == reflect.Int64:
		for i, ok := range sc.valid[k][lo:hi] {
			if ok {
				*(**int64)(at(i)) = &sc.i64[k][*next]
				*next++
			}
		}
	case f.ptr && f.kind == reflect.Float64:
		for i, ok := range sc.valid[k][lo:hi] {
			if ok {
				*(**float64)(at(i)) = &sc.f64[k][*next]
				*next++
			}
		}
	case f.kind == reflect.Int32:
		for i, v := range sc.i32[k][lo:hi] {
			*(*int32)(at(i)) = v
		}
	case f.kind == reflect.Int64:
		for i, v := range sc.i64[k][lo:hi] {
			*(*int64)(at(i)) = v
		}
	case f.kind == reflect.Float64:
		for i, v := range sc.f64[k][lo:hi] {
			*(*float64)(at(i)) = v
		}
	case f.kind == reflect.String:
		for i, v := range sc.str[k][lo:hi] {
			if v != "" { // dst is zero: an empty string needs no store
				*(*string)(at(i)) = v
			}
		}
	}
}
