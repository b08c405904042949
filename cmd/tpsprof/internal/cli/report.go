package cli

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tpsprof/tpsprof/report"
	"github.com/tpsprof/tpsprof/tps"
)

func runReport(args []string, stdout, stderr io.Writer) int {
	const cmd = "report"
	fs := newFlagSet(cmd, "report [flags] JOB_DIR   |   report --compare JOB_DIR_A JOB_DIR_B", `  tpsprof report traces/llama-8b                 # summary, plus report.html and plots in traces/llama-8b/report/
  tpsprof report --json --warmup 10 traces/llama-8b
  tpsprof report --markdown --no-plots traces/llama-8b >> review.md
  tpsprof report --compare traces/run-a traces/run-b
  tpsprof report --compare --html ab.html traces/run-a traces/run-b
  tpsprof report --last 1000 traces/llama-8b      # the last 1,000 steps only, read from the row groups that hold them
  tpsprof report --attempt 3 --steps 50000:60000 traces/llama-8b
  tpsprof report --since 2h traces/llama-8b       # steps of the last two hours
`, stderr)
	asJSON := fs.Bool("json", false, "print the report as JSON (keys documented in docs/report.md)")
	asMD := fs.Bool("markdown", false, "print the report as Markdown")
	compare := fs.Bool("compare", false, "compare two job folders side by side")
	plots := fs.String("plots", "", "folder for the plots (PNG and SVG); default JOB_DIR/report")
	noPlots := fs.Bool("no-plots", false, "do not draw plots (nor the HTML report)")
	htmlOut := fs.String("html", "", "where to write the HTML report, one self-contained file to open or share (default PLOTS/report.html; with --compare, only when given)")
	warmup := fs.Int("warmup", tps.AutoWarmup, "leading steps of each attempt to exclude (-1: automatic rule)")
	var train, price quantity
	fs.Var(&train, "train-tokens", "token budget, for the time to finish it at the measured wall TPS")
	fs.Var(&price, "gpu-hour-usd", "price of a GPU-hour (overrides the run metadata)")
	stepsSel := fs.String("steps", "", "report only steps A:B (inclusive; A: or :B for open ends)")
	last := fs.Int("last", 0, "report only the last N steps")
	attempt := fs.Int64("attempt", -1, "report only this attempt (-1: all)")
	since := fs.String("since", "", "report only steps ending at or after this time (RFC 3339, or a duration before now: 2h)")
	until := fs.String("until", "", "report only steps starting at or before this time (RFC 3339, or a duration before now)")
	rankSrc := fs.String("rank-source", "auto", "per-rank figures from rank_steps (steps), from rank_windows (windows: one row per rank and 100 steps, for very long runs) or auto (windows past 50 million rank rows)")
	var into trackerTarget
	fs.StringVar(&into.tensorboard, "tensorboard", "", "also write the whole-run figures, the report as text and its plots into TensorBoard event files in DIR (docs/trackers.md)")
	fs.StringVar(&into.mlflow, "mlflow", "", "also write them into this existing MLflow run (RUN_ID; the store from $MLFLOW_TRACKING_URI)")
	fs.StringVar(&into.wandb, "wandb", "", "also write them into this W&B run (RUN_ID, resumed; offline with WANDB_MODE=offline)")
	fs.StringVar(&into.wandbProject, "wandb-project", os.Getenv("WANDB_PROJECT"), "the W&B run's project (default $WANDB_PROJECT)")
	fs.StringVar(&into.python, "python", envOr("TPSPROF_PYTHON", "python3"), "the Python that has the tracker's package, for --tensorboard, --mlflow and --wandb (default $TPSPROF_PYTHON, else python3)")
	// job folders may come before, between or after the flags
	var dirs, rest []string
	for _, a := range args {
		if !strings.HasPrefix(a, "-") && (len(rest) == 0 || !needsValue(fs.FlagSet, rest[len(rest)-1])) {
			dirs = append(dirs, a)
		} else {
			rest = append(rest, a)
		}
	}
	if code, ok := parseFlags(fs, rest, stderr); !ok {
		return code
	}
	if *asJSON && *asMD {
		return usageErr(stderr, cmd, "--json and --markdown both given: choose one")
	}
	want := 1
	if *compare {
		want = 2
	}
	if len(dirs) != want {
		return usageErr(stderr, cmd, "give %d job folder(s) (OUT/JOB), got %d", want, len(dirs))
	}
	opt := report.Options{Warmup: *warmup, TrainTokens: float64(train), GPUHourUSD: float64(price)}
	switch *rankSrc {
	case "auto":
	case "steps":
		opt.RankSource = report.RankSourceSteps
	case "windows":
		opt.RankSource = report.RankSourceWindows
	default:
		return usageErr(stderr, cmd, "--rank-source %q: want auto, steps or windows", *rankSrc)
	}
	if *stepsSel != "" {
		from, to, err := report.ParseSteps(*stepsSel)
		if err != nil {
			return usageErr(stderr, cmd, "--steps: %v", err)
		}
		opt.Select.StepFrom, opt.Select.StepTo = from, to
	}
	if *last < 0 {
		return usageErr(stderr, cmd, "--last %d: give a positive number of steps", *last)
	}
	opt.Select.Last = *last
	if *attempt >= 0 {
		opt.Select.Attempt = attempt
	}
	for _, t := range []struct {
		name, v string
		dst     *time.Time
	}{{"since", *since, &opt.Select.Since}, {"until", *until, &opt.Select.Until}} {
		if t.v == "" {
			continue
		}
		v, err := report.ParseTime(t.v, time.Now())
		if err != nil {
			return usageErr(stderr, cmd, "--%s: %v", t.name, err)
		}
		*t.dst = v
	}
	if *compare && opt.Select.Active() {
		return usageErr(stderr, cmd, "a selection (--steps, --last, --attempt, --since, --until) applies to one job's report, not to --compare")
	}
	if n := into.count(); n > 1 || (n == 1 && *compare) {
		return usageErr(stderr, cmd, "--tensorboard, --mlflow and --wandb: one at a time, for one job's report")
	}
	if isTerminal(stderr) {
		opt.Progress = progressPrinter(stderr)
	}
	if !*compare && !report.IsJobDir(dirs[0]) {
		if jobs, err := report.Jobs(dirs[0]); err == nil && len(jobs) > 0 {
			if *asJSON {
				printJSON(stdout, jobs)
				return exitOK
			}
			fmt.Fprintf(stdout, "%s is a collector's output folder with %d job(s), most recent first:\n", dirs[0], len(jobs))
			for _, j := range jobs {
				state := "finished"
				if j.OpenParts > 0 {
					state = "running"
				}
				fmt.Fprintf(stdout, "  %-32s %s, %d cluster part(s), last written %s\n", j.Name, state, j.Parts, j.Modified.Format("2006-01-02 15:04:05"))
			}
			fmt.Fprintf(stdout, "report one with: tpsprof report %s\n", filepath.Join(dirs[0], jobs[0].Name))
			return exitOK
		}
	}
	var reps []*report.Report
	var pd *report.Plots // the first job's, when plots are drawn
	for _, d := range dirs {
		var rep *report.Report
		var err error
		if !*noPlots && !*compare && len(reps) == 0 {
			rep, pd, err = report.AnalyzeWithPlots(d, opt)
		} else {
			rep, err = report.Analyze(d, opt)
		}
		if opt.Progress != nil {
			fmt.Fprint(stderr, "\r\033[K")
		}
		if err != nil {
			failErr(stderr, "report", err)
			return exitError
		}
		reps = append(reps, rep)
	}
	if *compare {
		switch {
		case *asJSON:
			printJSON(stdout, report.Compare(reps[0], reps[1]))
		case *asMD:
			report.WriteCompareMarkdown(stdout, reps[0], reps[1])
		default:
			report.WriteCompare(stdout, reps[0], reps[1])
		}
		if *htmlOut != "" {
			if err := writeHTMLFile(*htmlOut, func(w io.Writer) error { return report.WriteCompareHTML(w, reps[0], reps[1]) }); err != nil {
				failErr(stderr, "report", err)
				return exitError
			}
			fmt.Fprintf(stderr, "HTML comparison written to %s\n", *htmlOut)
		}
		return exitOK
	}
	rep := reps[0]
	switch {
	case *asJSON:
		printJSON(stdout, rep)
	case *asMD:
		report.WriteMarkdown(stdout, rep)
	default:
		report.WriteText(stdout, rep)
	}
	if *noPlots {
		return into.write(rep, nil, stdout, stderr)
	}
	dir := *plots
	if dir == "" {
		dir = filepath.Join(dirs[0], "report")
	}
	figs, err := pd.Figures(rep)
	var paths []string
	if err == nil {
		paths, err = report.SaveFigures(figs, dir)
		if err == nil && !*asJSON && !*asMD {
			fmt.Fprintf(stdout, "\n%d plots written to %s\n", len(paths), dir)
		}
	}
	if err == nil {
		page := *htmlOut
		if page == "" {
			page = filepath.Join(dir, "report.html")
		}
		if err = writeHTMLFile(page, func(w io.Writer) error { return report.WriteHTML(w, rep, figs) }); err == nil && !*asJSON && !*asMD {
			fmt.Fprintf(stdout, "HTML report (one file, open it in a browser): %s\n", page)
		}
	}
	if err != nil {
		failErr(stderr, "report", err)
		return exitError
	}
	return into.write(rep, paths, stdout, stderr)
}

// writeHTMLFile writes a page under a temporary name and renames it into
// place, so a browser never opens half of one.
func writeHTMLFile(path string, write func(io.Writer) error) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	err = write(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// needsValue reports whether a flag takes the next argument as its value.
func needsValue(fs *flag.FlagSet, flagArg string) bool {
	name := strings.TrimLeft(flagArg, "-")
	if strings.Contains(name, "=") {
		return false
	}
	f := fs.Lookup(name)
	if f == nil {
		return false
	}
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return !ok || !b.IsBoolFlag()
}
