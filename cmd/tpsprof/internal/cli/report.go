package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tpsprof/tpsprof/internal/safefs"
	"github.com/tpsprof/tpsprof/report"
	"github.com/tpsprof/tpsprof/tps"
)

// reportFlags are the report command's flags.
type reportFlags struct {
	asJSON, asMD, compare, noPlots           *bool
	baseline, keep                           *string
	failAbove                                *float64
	plots, htmlOut, steps, since, until, src *string
	warmup, last                             *int
	attempt                                  *int64
	train, price                             quantity
	into                                     trackerTarget
}

func runReport(args []string, stdout, stderr io.Writer) int {
	const cmd = "report"
	fs := newFlagSet(cmd, "report [flags] JOB_DIR   |   report --compare JOB_DIR_A JOB_DIR_B   |   report --baseline NAME JOB_DIR", `  tpsprof report traces/llama-8b                 # summary, plus report.html and plots in traces/llama-8b/report/
  tpsprof report --json --warmup 10 traces/llama-8b
  tpsprof report --markdown --no-plots traces/llama-8b >> review.md
  tpsprof report --compare traces/run-a traces/run-b
  tpsprof report --compare --html ab.html traces/run-a traces/run-b
  tpsprof report --compare --fail-above 5 traces/run-a traces/run-b   # exit 3 when run-b is >5% slower, beyond noise
  tpsprof report --keep-baseline main traces/run-a                    # then, in CI:
  tpsprof report --baseline main --fail-above 5 traces/run-b
  tpsprof report --last 1000 traces/llama-8b      # the last 1,000 steps only, read from the row groups that hold them
  tpsprof report --attempt 3 --steps 50000:60000 traces/llama-8b
  tpsprof report --since 2h traces/llama-8b       # steps of the last two hours
`, stderr)
	f := reportFlagsOf(fs)
	// job folders may come before, between or after the flags
	dirs, code, ok := parseWithFolders(fs, args, stderr)
	if !ok {
		return code
	}
	if *f.keep != "" {
		if len(dirs) != 1 || *f.compare || *f.baseline != "" {
			return usageErr(stderr, cmd, "--keep-baseline NAME takes one job folder, and no --compare or --baseline")
		}
		path, err := keepBaseline(*f.keep, dirs[0])
		if err != nil {
			return usageErr(stderr, cmd, "%s", err)
		}
		fmt.Fprintf(stdout, "baseline %q is %s (kept in %s)\n", *f.keep, dirs[0], path)
		return exitOK
	}
	if *f.baseline != "" {
		if *f.compare || len(dirs) != 1 {
			return usageErr(stderr, cmd, "--baseline NAME compares one job folder with the run kept as NAME (no --compare)")
		}
		base, err := baselineDir(*f.baseline)
		if err != nil {
			return usageErr(stderr, cmd, "%s", err)
		}
		dirs, *f.compare = []string{base, dirs[0]}, true
	}
	if fa := *f.failAbove; math.IsNaN(fa) || math.IsInf(fa, 0) || (fa < 0 && fa != -1) {
		return usageErr(stderr, cmd, "--fail-above %v: a percentage of 0 or more (-1: off)", fa)
	}
	if *f.failAbove >= 0 && !*f.compare {
		return usageErr(stderr, cmd, "--fail-above gates a comparison: give --compare A B or --baseline NAME")
	}
	opt, err := f.options(dirs)
	if err != nil {
		return usageErr(stderr, cmd, "%s", err)
	}
	if isTerminal(stderr) {
		opt.Progress = progressPrinter(stderr)
	}
	if !*f.compare && !report.IsJobDir(dirs[0]) {
		if jobs, err := report.Jobs(dirs[0]); err == nil && len(jobs) > 0 {
			listJobs(stdout, dirs[0], jobs, *f.asJSON)
			return exitOK
		}
	}
	reps, pd, err := f.analyze(dirs, opt, stderr)
	if err == nil {
		if *f.compare {
			err = f.writeCompare(reps[0], reps[1], stdout, stderr)
			if err == nil && *f.failAbove >= 0 {
				return gate(report.CompareVerdict(reps[0], reps[1]), *f.failAbove, stderr)
			}
		} else {
			return f.writeOne(reps[0], pd, dirs[0], stdout, stderr)
		}
	}
	if err != nil {
		failErr(stderr, "report", err)
		return exitError
	}
	return exitOK
}

func reportFlagsOf(fs *flagSet) *reportFlags {
	f := &reportFlags{
		asJSON:  fs.Bool("json", false, "print the report as JSON (keys documented in docs/report.md)"),
		asMD:    fs.Bool("markdown", false, "print the report as Markdown"),
		compare: fs.Bool("compare", false, "compare two job folders side by side, with a verdict: is the second slower, beyond the runs' own noise"),
		plots:   fs.String("plots", "", "folder for the plots (PNG and SVG); default JOB_DIR/report"),
		noPlots: fs.Bool("no-plots", false, "do not draw plots (nor the HTML report)"),
		htmlOut: fs.String("html", "", "where to write the HTML report, one self-contained file to open or share (default PLOTS/report.html; with --compare, only when given)"),
		warmup:  fs.Int("warmup", tps.AutoWarmup, "leading steps of each attempt to exclude (-1: automatic rule)"),
	}
	f.failAbove = fs.Float64("fail-above", -1, "with --compare or --baseline: exit 3 when the second run is more than this many percent slower than the first, beyond the two runs' own step-to-step noise; exit 4 (inconclusive) when a run has no throughput or the noise is wider than this (a CI gate; -1: off)")
	f.baseline = fs.String("baseline", "", "compare the job folder with the run kept under this name (--keep-baseline)")
	f.keep = fs.String("keep-baseline", "", "keep the job folder as the baseline NAME, for later --baseline NAME (its Parquet must stay where it is)")
	fs.Var(&f.train, "train-tokens", "token budget, for the time to finish it at the measured wall TPS")
	fs.Var(&f.price, "gpu-hour-usd", "price of a GPU-hour (overrides the run metadata)")
	f.steps = fs.String("steps", "", "report only steps A:B (inclusive; A: or :B for open ends)")
	f.last = fs.Int("last", 0, "report only the last N steps")
	f.attempt = fs.Int64("attempt", -1, "report only this attempt (-1: all)")
	f.since = fs.String("since", "", "report only steps ending at or after this time (RFC 3339, or a duration before now: 2h)")
	f.until = fs.String("until", "", "report only steps starting at or before this time (RFC 3339, or a duration before now)")
	f.src = fs.String("rank-source", "auto", "per-rank figures from rank_steps (steps), from rank_windows (windows: one row per rank and 100 steps, for very long runs) or auto (windows past 50 million rank rows)")
	into := &f.into
	fs.StringVar(&into.tensorboard, "tensorboard", "", "also write the whole-run figures, the report as text and its plots into TensorBoard event files in DIR (docs/trackers.md)")
	fs.StringVar(&into.mlflow, "mlflow", "", "also write them into this existing MLflow run (RUN_ID; the store from $MLFLOW_TRACKING_URI)")
	fs.StringVar(&into.wandb, "wandb", "", "also write them into this W&B run (RUN_ID, resumed; offline with WANDB_MODE=offline)")
	fs.StringVar(&into.wandbProject, "wandb-project", os.Getenv("WANDB_PROJECT"), "the W&B run's project (default $WANDB_PROJECT)")
	fs.StringVar(&into.python, "python", envOr("TPSPROF_PYTHON", "python3"), "the Python that has the tracker's package, for --tensorboard, --mlflow and --wandb (default $TPSPROF_PYTHON, else python3)")
	return f
}

// options checks the flags against each other and the job folders given,
// and makes the analysis' options.
func (f *reportFlags) options(dirs []string) (report.Options, error) {
	opt := report.Options{Warmup: *f.warmup, TrainTokens: float64(f.train), GPUHourUSD: float64(f.price)}
	if *f.asJSON && *f.asMD {
		return opt, errors.New("--json and --markdown both given: choose one")
	}
	want := 1
	if *f.compare {
		want = 2
	}
	if len(dirs) != want {
		return opt, fmt.Errorf("give %d job folder(s) (OUT/JOB), got %d", want, len(dirs))
	}
	switch *f.src {
	case "auto":
	case "steps":
		opt.RankSource = report.RankSourceSteps
	case "windows":
		opt.RankSource = report.RankSourceWindows
	default:
		return opt, fmt.Errorf("--rank-source %q: want auto, steps or windows", *f.src)
	}
	var err error
	if opt.Select, err = f.selection(); err != nil {
		return opt, err
	}
	if *f.compare && opt.Select.Active() {
		return opt, errors.New("a selection (--steps, --last, --attempt, --since, --until) applies to one job's report, not to --compare")
	}
	if n := f.into.count(); n > 1 || (n == 1 && *f.compare) {
		return opt, errors.New("--tensorboard, --mlflow and --wandb: one at a time, for one job's report")
	}
	return opt, nil
}

// selection is the part of the run the flags select.
func (f *reportFlags) selection() (report.Selection, error) {
	var sel report.Selection
	if *f.steps != "" {
		from, to, err := report.ParseSteps(*f.steps)
		if err != nil {
			return sel, fmt.Errorf("--steps: %v", err)
		}
		sel.StepFrom, sel.StepTo = from, to
	}
	if *f.last < 0 {
		return sel, fmt.Errorf("--last %d: give a positive number of steps", *f.last)
	}
	sel.Last = *f.last
	if *f.attempt >= 0 {
		sel.Attempt = f.attempt
	}
	for _, t := range []struct {
		name, v string
		dst     *time.Time
	}{{"since", *f.since, &sel.Since}, {"until", *f.until, &sel.Until}} {
		if t.v == "" {
			continue
		}
		v, err := report.ParseTime(t.v, time.Now())
		if err != nil {
			return sel, fmt.Errorf("--%s: %v", t.name, err)
		}
		*t.dst = v
	}
	return sel, nil
}

// listJobs prints the jobs of a collector's output folder given instead
// of a job's.
func listJobs(stdout io.Writer, dir string, jobs []report.JobInfo, asJSON bool) {
	if asJSON {
		printJSON(stdout, jobs)
		return
	}
	fmt.Fprintf(stdout, "%s is a collector's output folder with %d job(s), most recent first:\n", dir, len(jobs))
	for _, j := range jobs {
		state := "finished"
		if j.Running {
			state = "running (" + j.RunningWhy + ")"
		}
		fmt.Fprintf(stdout, "  %-32s %s, %d cluster part(s), last written %s\n", j.Name, state, j.Parts, j.Modified.Format("2006-01-02 15:04:05"))
	}
	fmt.Fprintf(stdout, "report one with: tpsprof report %s\n", filepath.Join(dir, jobs[0].Name))
}

// analyze reports each job folder; the first one's plots when drawn.
func (f *reportFlags) analyze(dirs []string, opt report.Options, stderr io.Writer) ([]*report.Report, *report.Plots, error) {
	var reps []*report.Report
	var pd *report.Plots
	for _, d := range dirs {
		var rep *report.Report
		var err error
		if !*f.noPlots && !*f.compare && len(reps) == 0 {
			rep, pd, err = report.AnalyzeWithPlots(d, opt)
		} else {
			rep, err = report.Analyze(d, opt)
		}
		if opt.Progress != nil {
			fmt.Fprint(stderr, "\r\033[K")
		}
		if err != nil {
			return nil, nil, err
		}
		reps = append(reps, rep)
	}
	return reps, pd, nil
}

// exitGate is the exit status of a comparison the gate fails;
// exitInconclusive of one it cannot decide (never 0: a gate that cannot
// tell a regression from noise, or has no throughput to compare, must not
// pass).
const (
	exitGate         = 3
	exitInconclusive = 4
)

// gate says the verdict against the allowed slowdown, and its status.
func gate(v report.Verdict, pct float64, stderr io.Writer) int {
	switch {
	case v.Fails(pct):
		fmt.Fprintf(stderr, "gate: FAIL: %s (allowed %.1f%%, noise ±%.1f%%)\n", v.Text, pct, v.NoisePct)
		return exitGate
	case v.ChangePct == nil:
		fmt.Fprintf(stderr, "gate: INCONCLUSIVE: %s\n", v.Text)
		return exitInconclusive
	case !v.Beyond && v.NoisePct > pct:
		// a slowdown of pct would hide in the runs' noise: not a pass
		fmt.Fprintf(stderr, "gate: INCONCLUSIVE: %s: the runs' noise (±%.1f%%) is wider than the %.1f%% allowed, so a slowdown past it could not be told from noise (longer runs, or steadier ones, narrow it)\n",
			v.Text, v.NoisePct, pct)
		return exitInconclusive
	}
	fmt.Fprintf(stderr, "gate: pass: %s (allowed %.1f%% slower)\n", v.Text, pct)
	return exitOK
}

// writeCompare prints the comparison of a and b, and its page when asked.
func (f *reportFlags) writeCompare(a, b *report.Report, stdout, stderr io.Writer) error {
	switch {
	case *f.asJSON:
		printJSON(stdout, report.Compare(a, b))
	case *f.asMD:
		report.WriteCompareMarkdown(stdout, a, b)
	default:
		report.WriteCompare(stdout, a, b)
	}
	if *f.htmlOut == "" {
		return nil
	}
	if err := writeHTMLFile(*f.htmlOut, func(w io.Writer) error { return report.WriteCompareHTML(w, a, b) }); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "HTML comparison written to %s\n", *f.htmlOut)
	return nil
}

// writeOne prints a job's report, draws its plots and page, and writes it
// into a tracker when asked.
func (f *reportFlags) writeOne(rep *report.Report, pd *report.Plots, jobDir string, stdout, stderr io.Writer) int {
	switch {
	case *f.asJSON:
		printJSON(stdout, rep)
	case *f.asMD:
		report.WriteMarkdown(stdout, rep)
	default:
		report.WriteText(stdout, rep)
	}
	if *f.noPlots {
		return f.into.write(rep, nil, stdout, stderr)
	}
	paths, err := f.drawPlots(rep, pd, jobDir, stdout)
	if err != nil {
		failErr(stderr, "report", err)
		return exitError
	}
	return f.into.write(rep, paths, stdout, stderr)
}

// drawPlots saves the figures and the HTML page.
func (f *reportFlags) drawPlots(rep *report.Report, pd *report.Plots, jobDir string, stdout io.Writer) ([]string, error) {
	text := !*f.asJSON && !*f.asMD
	dir := *f.plots
	if dir == "" {
		dir = filepath.Join(jobDir, "report")
	}
	figs, err := pd.Figures(rep)
	if err != nil {
		return nil, err
	}
	paths, err := report.SaveFigures(figs, dir)
	if err != nil {
		return nil, err
	}
	if text {
		fmt.Fprintf(stdout, "\n%d plots written to %s\n", len(paths), dir)
	}
	page := *f.htmlOut
	if page == "" {
		page = filepath.Join(dir, "report.html")
	}
	if err := writeHTMLFile(page, func(w io.Writer) error { return report.WriteHTML(w, rep, figs) }); err != nil {
		return nil, err
	}
	if text {
		fmt.Fprintf(stdout, "HTML report (one file, open it in a browser): %s\n", page)
	}
	return paths, nil
}

// writeHTMLFile writes a page under a temporary name and renames it into
// place, so a browser never opens half of one.
func writeHTMLFile(path string, write func(io.Writer) error) error {
	if err := safefs.OutputDir(filepath.Dir(path)); err != nil {
		return err
	}
	return safefs.WriteFileAtomic(path, func(f *os.File) error { return write(f) })
}

// needsValue reports whether a flag takes the next argument as its value.
// parseWithFolders parses args whose folders may come before, between or
// after the flags: the folders, and parseFlags' outcome.
func parseWithFolders(fs *flagSet, args []string, stderr io.Writer) (dirs []string, code int, ok bool) {
	var rest []string
	for _, a := range args {
		if !strings.HasPrefix(a, "-") && (len(rest) == 0 || !needsValue(fs.FlagSet, rest[len(rest)-1])) {
			dirs = append(dirs, a)
		} else {
			rest = append(rest, a)
		}
	}
	code, ok = parseFlags(fs, rest, stderr)
	return dirs, code, ok
}

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
