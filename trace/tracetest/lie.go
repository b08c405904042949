package tracetest

import (
	"encoding/binary"
	"fmt"
	"os"

	"github.com/parquet-go/parquet-go/encoding/thrift"
	"github.com/parquet-go/parquet-go/format"
)

// LieRows rewrites a Parquet file's footer so that each of its row groups
// claims rows rows (the data pages unchanged), as a hostile or corrupted
// file would. With values, each column chunk claims as many values too,
// so that only the bytes the chunks take can show the lie.
func LieRows(path string, rows int64, values bool) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if len(b) < 12 {
		return fmt.Errorf("tracetest: %s: not Parquet", path)
	}
	n := int(binary.LittleEndian.Uint32(b[len(b)-8:]))
	if n > len(b)-12 {
		return fmt.Errorf("tracetest: %s: footer of %d bytes", path, n)
	}
	var md format.FileMetaData
	if err := thrift.Unmarshal(new(thrift.CompactProtocol), b[len(b)-8-n:len(b)-8], &md); err != nil {
		return err
	}
	md.NumRows = rows * int64(len(md.RowGroups))
	for i := range md.RowGroups {
		md.RowGroups[i].NumRows = rows
		if values {
			for c := range md.RowGroups[i].Columns {
				md.RowGroups[i].Columns[c].MetaData.NumValues = rows
			}
		}
	}
	foot, err := thrift.Marshal(new(thrift.CompactProtocol), &md)
	if err != nil {
		return err
	}
	out := append(b[:len(b)-8-n:len(b)-8-n], foot...)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(foot)))
	return os.WriteFile(path, append(out, "PAR1"...), 0o644)
}
