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
		fk, ptr := f.Type.Kind(), false
		if fk == reflect.Pointer {
			fk, ptr = f.Type.Elem().Kind(), true
		}
		switch {
		case !ptr && (fk == reflect.Int64 || fk == reflect.Int32 || fk == reflect.Float64 || fk == reflect.String),
			ptr && optional && (fk == reflect.Int64 || fk == reflect.Float64):
		default:
			return nil, false
		}
		leaf, ok := pf.Schema().Lookup(name)
		if !ok {
			continue
		}
		if leaf.MaxRepetitionLevel > 0 || leaf.MaxDefinitionLevel > 1 || (leaf.MaxDefinitionLevel == 1) != optional {
			return nil, false
		}
		kind := leaf.Node.Type().Kind()
		switch {
		case fk == reflect.Int64 && kind == parquet.Int64 && optional == ptr,
			fk == reflect.Int32 && kind == parquet.Int32 && !optional,
			fk == reflect.Float64 && kind == parquet.Double && optional == ptr,
			fk == reflect.String && kind == parquet.ByteArray && !ptr:
		default:
			return nil, false
		}
		out = append(out, flatField{col: leaf.ColumnIndex, off: f.Offset, kind: fk, ptr: ptr})
	}
	return out, true
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
	for len(sc.i64) < len(layout) {
		sc.i64, sc.i32, sc.f64, sc.str, sc.valid = append(sc.i64, nil), append(sc.i32, nil), append(sc.f64, nil), append(sc.str, nil), append(sc.valid, nil)
	}
	i64, i32, f64, str, valid := sc.i64, sc.i32, sc.f64, sc.str, sc.valid
	for k, f := range layout {
		n := 0
		switch {
		case f.ptr && f.kind == reflect.Int64:
			// the values stay the rows': fresh for every group
			if i64[k], valid[k], err = readOptionalChunk(chunks[f.col], make([]int64, 0, len(dst)), valid[k][:0], (*encoding.Values).Int64, parquet.Value.Int64); err == nil {
				n = len(valid[k])
			}
		case f.ptr && f.kind == reflect.Float64:
			if f64[k], valid[k], err = readOptionalChunk(chunks[f.col], make([]float64, 0, len(dst)), valid[k][:0], (*encoding.Values).Double, parquet.Value.Double); err == nil {
				n = len(valid[k])
			}
		case f.kind == reflect.Int64:
			if i64[k], err = readInt64Chunk(chunks[f.col], slices.Grow(i64[k][:0], len(dst))); err == nil {
				n = len(i64[k])
			}
		case f.kind == reflect.Int32:
			if i32[k], err = readRequiredChunk(chunks[f.col], slices.Grow(i32[k][:0], len(dst)), (*encoding.Values).Int32); err == nil {
				n = len(i32[k])
			}
		case f.kind == reflect.Float64:
			if f64[k], err = readFloat64Chunk(chunks[f.col], slices.Grow(f64[k][:0], len(dst))); err == nil {
				n = len(f64[k])
			}
		case f.kind == reflect.String:
			str[k], err = readStringChunk(chunks[f.col], str[k][:0]) // nulls of an optional one read as ""
			n = len(str[k])
		}
		if err == nil && n != len(dst) {
			err = fmt.Errorf("%d values for %d rows", n, len(dst))
		}
		if err != nil {
			return fmt.Errorf("trace: read %s: %w: column %d: %v", path, errUnreadable, f.col, err)
		}
	}
	base, size := unsafe.Pointer(&dst[0]), unsafe.Sizeof(dst[0])
	next := make([]int, len(layout)) // an optional field's next value
	const block = 256
	for lo := 0; lo < len(dst); lo += block {
		hi := min(lo+block, len(dst))
		for k, f := range layout {
			switch {
			case f.ptr && f.kind == reflect.Int64:
				for i, ok := range valid[k][lo:hi] {
					if ok {
						*(**int64)(unsafe.Add(base, uintptr(lo+i)*size+f.off)) = &i64[k][next[k]]
						next[k]++
					}
				}
			case f.ptr && f.kind == reflect.Float64:
				for i, ok := range valid[k][lo:hi] {
					if ok {
						*(**float64)(unsafe.Add(base, uintptr(lo+i)*size+f.off)) = &f64[k][next[k]]
						next[k]++
					}
				}
			case f.kind == reflect.Int32:
				for i, v := range i32[k][lo:hi] {
					*(*int32)(unsafe.Add(base, uintptr(lo+i)*size+f.off)) = v
				}
			case f.kind == reflect.Int64:
				for i, v := range i64[k][lo:hi] {
					*(*int64)(unsafe.Add(base, uintptr(lo+i)*size+f.off)) = v
				}
			case f.kind == reflect.Float64:
				for i, v := range f64[k][lo:hi] {
					*(*float64)(unsafe.Add(base, uintptr(lo+i)*size+f.off)) = v
				}
			case f.kind == reflect.String:
				for i, v := range str[k][lo:hi] {
					if v != "" { // dst is zero: an empty string needs no store
						*(*string)(unsafe.Add(base, uintptr(lo+i)*size+f.off)) = v
					}
				}
			}
		}
	}
	return nil
}
