package trace

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/parquet-go/parquet-go"

	"github.com/tpsprof/tpsprof/tps"
)

const benchRows = 1_000_000

// benchRecords makes a million distinct rows of 64 ranks with measured-like
// jitter in every duration, so compression sees realistic entropy.
func benchRecords() []tps.StepRecord {
	rng := rand.New(rand.NewPCG(1, 2))
	out := make([]tps.StepRecord, benchRows)
	coords := make([]int32, 2*64)
	for i := range coords {
		coords[i] = int32(i % 8)
	}
	for i := range out {
		step, rank := int64(i/64), int64(i%64)
		start := 1_760_000_000_000_000_000 + step*1_000_000_000 + rng.Int64N(500_000)
		dur := 900_000_000 + rng.Int64N(20_000_000)
		out[i] = tps.StepRecord{Job: "bench", Step: step, Rank: rank, WorldSize: 64, DPRank: &coords[rank%4], TPRank: &coords[64+rank%8],
			Node: "node-" + string(rune('0'+rank/8)), StartUnixNs: start, EndUnixNs: start + dur, DurationNs: dur, Tokens: 131072,
			DataWaitNs: 4_000_000 + rng.Int64N(1_000_000), ExposedCommNs: 90_000_000 + rng.Int64N(10_000_000), CommNs: 300_000_000 + rng.Int64N(10_000_000),
			PPWaitNs: 50_000_000 + rng.Int64N(1_000_000), FwdNs: 300_000_000 + rng.Int64N(5_000_000), BwdNs: 500_000_000 + rng.Int64N(5_000_000)}
	}
	return out
}

func dirSize(t testing.TB, dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// BenchmarkWriteRankSteps compares, on the same million rows in the same
// run: our PartWriter (with each codec; zstd is the default), raw
// parquet-go writing to one file with the same options, and JSON lines.
//
//	go test -run '^$' -bench WriteRankSteps -benchtime 1x ./trace/
func BenchmarkWriteRankSteps(b *testing.B) {
	recs := benchRecords()
	write := func(b *testing.B, name string, fn func(dir string) error) {
		b.Run(name, func(b *testing.B) {
			dir := b.TempDir()
			b.ResetTimer()
			if err := fn(dir); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			b.ReportMetric(float64(benchRows)/b.Elapsed().Seconds(), "rows/s")
			b.ReportMetric(float64(dirSize(b, dir))/benchRows, "bytes/row")
		})
	}
	for _, codec := range Codecs() {
		name := "tpsprof"
		if codec != "zstd" {
			name += "-" + codec
		}
		write(b, name, func(dir string) error {
			w, err := NewPartWriter[tps.StepRecord](dir, "j", RankSteps, WriterOptions{WriterID: "b", Codec: codec})
			if err != nil {
				return err
			}
			for n := 0; n < benchRows; n += 8192 {
				if err := w.Write(recs[n:min(n+8192, benchRows)]); err != nil {
					return err
				}
			}
			return w.Close()
		})
	}
	write(b, "raw-parquet-go", func(dir string) error {
		f, err := os.Create(filepath.Join(dir, "raw.parquet"))
		if err != nil {
			return err
		}
		w := parquet.NewGenericWriter[tps.StepRecord](f, parquet.Compression(&parquet.Zstd), parquet.MaxRowsPerRowGroup(64*1024))
		for n := 0; n < benchRows; n += 8192 {
			if _, err := w.Write(recs[n:min(n+8192, benchRows)]); err != nil {
				return err
			}
		}
		if err := w.Close(); err != nil {
			return err
		}
		return f.Close()
	})
	write(b, "json-lines", func(dir string) error {
		f, err := os.Create(filepath.Join(dir, "rows.jsonl"))
		if err != nil {
			return err
		}
		bw := bufio.NewWriterSize(f, 1<<20)
		enc := json.NewEncoder(bw)
		for n := 0; n < benchRows; n++ {
			if err := enc.Encode(&recs[n]); err != nil {
				return err
			}
		}
		if err := bw.Flush(); err != nil {
			return err
		}
		return f.Close()
	})
}

// BenchmarkEachWithin reads 100,000 GPU samples written in row groups of
// 1,000, in 100 calls each selecting one row group by its unix_ns
// statistics (as the report's energy join reads a chunk's samples), against
// the whole part read in one call (the baseline). A reader a row group
// cost about 18 ms each (2.09 s, 15.6× the whole read, on 2026-11-25);
// one reader over the file that seeks to each costs its setup once a call
// (0.57-0.68 s, 4.9-5.4×).
//
//	go test -run '^$' -bench EachWithin ./trace/
func BenchmarkEachWithin(b *testing.B) {
	root := b.TempDir()
	w, err := NewPartWriter[tps.GPUSample](root, "g", GPUSamples, WriterOptions{WriterID: "g", RowsPerGroup: 1000})
	if err != nil {
		b.Fatal(err)
	}
	const rows, t0 = 100_000, int64(1_760_000_000_000_000_000)
	for i := range int64(rows) {
		u := 90.0
		if err := w.Write([]tps.GPUSample{{Job: "g", Node: "n", UnixNs: t0 + i*1e9, GPUUtilPct: &u}}); err != nil {
			b.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	dir := filepath.Join(root, "g", GPUSamples)
	count := func(opts ...ReadOption) int {
		n := 0
		if err := Each(dir, func(r []tps.GPUSample) error { n += len(r); return nil }, opts...); err != nil {
			b.Fatal(err)
		}
		return n
	}
	b.Run("whole", func(b *testing.B) {
		for b.Loop() {
			if count() != rows {
				b.Fatal("rows lost")
			}
		}
	})
	b.Run("100 windows", func(b *testing.B) {
		for b.Loop() {
			n := 0
			for k := range int64(100) {
				from := t0 + k*1000e9
				n += count(Within(Range{Column: "unix_ns", Min: from + 10e9, Max: from + 900e9}))
			}
			if n != rows {
				b.Fatalf("%d rows read of %d", n, rows)
			}
		}
	})
}

// BenchmarkEachGPUSamples reads 262,144 GPU samples (power, energy,
// clocks, temperature and utilisation set, the rest null, as the agent
// writes them without GPM or NVLink) through Each: decoded flat, column by
// column, against parquet-go's rows (the baseline, same run).
//
//	go test -run '^$' -bench EachGPUSamples -benchtime 3x ./trace/
func BenchmarkEachGPUSamples(b *testing.B) {
	root := b.TempDir()
	w, err := NewPartWriter[tps.GPUSample](root, "g", GPUSamples, WriterOptions{WriterID: "g"})
	if err != nil {
		b.Fatal(err)
	}
	const rows = 1 << 18
	rng := rand.New(rand.NewPCG(7, 8))
	batch := make([]tps.GPUSample, 0, 64)
	for i := range int64(rows) {
		p, u, e, clk, temp := 400+rng.Float64()*300, rng.Float64()*100, i*700_000, int64(1980), int64(60+rng.IntN(20))
		batch = append(batch, tps.GPUSample{Job: "g", Node: fmt.Sprintf("node-%d", i%64/8), UUID: fmt.Sprintf("GPU-%d", i%64), Index: int32(i % 8),
			UnixNs: 1_760_000_000_000_000_000 + (i/64)*1e9, PowerW: &p, GPUUtilPct: &u, EnergyMJ: &e, SMClockMHz: &clk, TempC: &temp})
		if len(batch) == cap(batch) {
			if err := w.Write(batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	dir := filepath.Join(root, "g", GPUSamples)
	read := func(opts ...ReadOption) {
		n := 0
		if err := Each(dir, func(r []tps.GPUSample) error { n += len(r); return nil }, opts...); err != nil || n != rows {
			b.Fatalf("%d rows: %v", n, err)
		}
	}
	b.Run("flat", func(b *testing.B) {
		for b.Loop() {
			read()
		}
	})
	b.Run("rows", func(b *testing.B) {
		for b.Loop() {
			read(func(c *readConfig) { c.rowsOnly = true })
		}
	})
}
