package cli

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/kineto"
)

func runKineto(args []string, stdout, stderr io.Writer) int {
	const cmd = "kineto"
	fs := newFlagSet(cmd, "kineto [--json] [--steps N] TRACE...", `  # one rank's trace, as torch.profiler wrote it (.json, .json.gz, .pt.trace.json)
  tpsprof kineto rank0.1712195495.pt.trace.json.gz

  # every rank of a job: the per-rank table and the spread of exposed communication
  tpsprof kineto traces/*.pt.trace.json.gz --json > overlap.json

Per ProfilerStep#N and over the whole trace: computation, communication and memory time as
unions of their kernel intervals on every stream, the communication no computation kernel
overlaps (exposed), the overlap percentage (overlapped communication / communication, as
Holistic Trace Analysis computes it) and GPU idle time; the collectives by kind with count,
time and message bytes. Kernels are classified by name as HTA does: NCCL/RCCL kernels of
every naming generation are communication, memcpy/memset memory, the rest computation.
Traces without GPU events (gloo on CPU) give CPU-side figures and say so. Bad or truncated
files: one error line each, exit 1. See docs/kineto.md.
`, stderr)
	asJSON := fs.Bool("json", false, "one JSON object per file (an array when several)")
	maxSteps := fs.Int("steps", 20, "steps shown per trace in the text table (0: all)")
	htaRound := fs.Bool("hta-rounding", false, "round events to whole microseconds as Holistic Trace Analysis does (to reproduce its figures)")
	maxEvents := fs.Int64("max-events", agent.DefaultTraceMaxEvents, "analyse no trace with more events in a step than this (the analysis holds a step's events, about 270 B each), as the agent does; 0: no bound")
	maxBytes := fs.Int64("max-bytes", agent.MaxTraceUncompressedBytes, "read no more than this of a trace once uncompressed (a small gzip can unpack to gigabytes), as the agent does; 0: no bound")
	files, flags := splitFilesAndFlags(fs.FlagSet, args)
	if code, ok := parseFlags(fs, flags, stderr); !ok {
		return code
	}
	if len(files) == 0 {
		return usageErr(stderr, cmd, "no trace files given")
	}
	var results []*kineto.Result
	failed := 0
	for _, f := range files {
		r, err := kineto.AnalyzeFileWith(f, kineto.Options{HTARounding: *htaRound, MaxEvents: max(*maxEvents, 0), MaxBytes: max(*maxBytes, 0)})
		if err != nil {
			failErr(stderr, "kineto", err)
			failed++
			continue
		}
		results = append(results, r)
	}
	if *asJSON {
		if err := printKinetoJSON(stdout, results, len(files)); err != nil {
			failErr(stderr, "kineto", err)
			return exitError
		}
	} else {
		for _, r := range results {
			printKineto(stdout, r, *maxSteps)
		}
		if len(results) > 1 {
			printSpread(stdout, results)
		}
	}
	if failed > 0 {
		return exitError
	}
	return exitOK
}

// splitFilesAndFlags takes the files and the flags of args, in any order
// (shells expand globs first): a flag that takes a value (not a bool, no
// "=") takes the next word; everything after "--" is a file.
func splitFilesAndFlags(fs *flag.FlagSet, args []string) (files, flags []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return append(files, args[i+1:]...), flags
		case len(a) > 1 && a[0] == '-':
			flags = append(flags, a)
			name := strings.TrimLeft(a, "-")
			if f := fs.Lookup(name); f != nil && !strings.Contains(name, "=") && !isBoolFlag(f) && i+1 < len(args) {
				flags = append(flags, args[i+1])
				i++
			}
		default:
			files = append(files, a)
		}
	}
	return files, flags
}

// printKinetoJSON prints one object for one file given, else an array.
func printKinetoJSON(w io.Writer, results []*kineto.Result, files int) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	var v any = results
	if files == 1 && len(results) == 1 {
		v = results[0]
	}
	if results == nil {
		v = []*kineto.Result{}
	}
	return enc.Encode(v)
}

func pct(p *float64) string {
	if p == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.1f%%", *p)
}

func rankOf(r *kineto.Result) string {
	if r.Rank == nil {
		return "?"
	}
	if r.WorldSize == nil {
		return fmt.Sprint(*r.Rank)
	}
	return fmt.Sprintf("%d of %d", *r.Rank, *r.WorldSize)
}

func printKineto(w io.Writer, r *kineto.Result, maxSteps int) {
	fmt.Fprintf(w, "%s: rank %s, %s trace, %d events (%d GPU)\n", r.File, rankOf(r), r.Device, r.Events, r.GPUEvents)
	for _, n := range r.Notes {
		fmt.Fprintf(w, "  note: %s\n", n)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "  step\tduration ms\tcompute ms\tcomm ms\texposed comm ms\tmemory ms\tidle ms\toverlap\t")
	row := func(name string, s kineto.StepStats) {
		fmt.Fprintf(tw, "  %s\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%s\t\n", name, s.DurationUs/1e3, s.ComputeUs/1e3, s.CommUs/1e3,
			s.ExposedCommUs/1e3, s.MemoryUs/1e3, s.IdleUs/1e3, pct(s.OverlapPct))
	}
	for i, s := range r.Steps {
		if maxSteps > 0 && i == maxSteps {
			fmt.Fprintf(tw, "  … %d more\t\t\t\t\t\t\t\t\n", len(r.Steps)-maxSteps)
			break
		}
		row(fmt.Sprint(s.Step), s)
	}
	row("total", r.Total)
	tw.Flush()
	if len(r.Collectives) > 0 {
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "  collective\tgroup\tcount\ttime ms\tunion ms\tbytes\t")
		for _, c := range r.Collectives {
			b := "n/a"
			if c.Bytes > 0 {
				b = fmt.Sprint(c.Bytes)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%.3f\t%.3f\t%s\t\n", c.Kind, c.Group, c.Count, c.TimeUs/1e3, c.UnionUs/1e3, b)
		}
		tw.Flush()
	}
	fmt.Fprintln(w)
}

// printSpread compares ranks: exposed communication of the slowest rank
// against the median.
func printSpread(w io.Writer, rs []*kineto.Result) {
	type rk struct {
		name    string
		exposed float64
	}
	var all []rk
	for _, r := range rs {
		all = append(all, rk{rankOf(r) + " (" + r.File + ")", r.Total.ExposedCommUs})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].exposed < all[j].exposed })
	med := all[len(all)/2].exposed
	if len(all)%2 == 0 {
		med = (all[len(all)/2-1].exposed + all[len(all)/2].exposed) / 2
	}
	worst := all[len(all)-1]
	fmt.Fprintf(w, "exposed communication across %d traces: median %.3f ms, most %.3f ms on rank %s", len(all), med/1e3, worst.exposed/1e3, worst.name)
	if med > 0 {
		fmt.Fprintf(w, " (%.2f× the median)", worst.exposed/med)
	}
	fmt.Fprintln(w)
}

// isBoolFlag says whether f is set without a value (--json).
func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}
