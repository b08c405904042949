package cli

import (
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/tpsprof/tpsprof/cmd/tpsprof/internal/demo"
	"github.com/tpsprof/tpsprof/report"
	"github.com/tpsprof/tpsprof/tps"
)

func runDemo(args []string, stdout, stderr io.Writer) int {
	const cmd = "demo"
	d := demo.Defaults()
	fs := newFlagSet(cmd, "demo [--out DIR] [--steps N] [--dp N --tp N --pp N] [flags]", `  # the whole product on this machine: embedded NATS, a collector, 8 agents, 64 simulated ranks
  tpsprof demo

  # a bigger job, faster
  tpsprof demo --out /tmp/demo --steps 300 --dp 16 --tp 8 --pp 2 --step-interval 20ms

  # the scale-out path: node partials to an aggregator, rank rows by two rank writers
  tpsprof demo --split
`, stderr)
	fs.StringVar(&d.Out, "out", d.Out, "output directory")
	fs.StringVar(&d.Job, "job", d.Job, "job id")
	fs.IntVar(&d.Steps, "steps", d.Steps, "optimizer steps to simulate")
	fs.IntVar(&d.Topology.DP, "dp", d.Topology.DP, "data-parallel size")
	fs.IntVar(&d.Topology.TP, "tp", d.Topology.TP, "tensor-parallel size")
	fs.IntVar(&d.Topology.PP, "pp", d.Topology.PP, "pipeline-parallel size")
	fs.IntVar(&d.GPUsPerNode, "gpus-per-node", d.GPUsPerNode, "GPUs (ranks) per simulated node")
	fs.IntVar(&d.MicroBatches, "micro-batches", d.MicroBatches, "micro-batches per replica per step")
	fs.StringVar(&d.Model, "model", d.Model, "model preset")
	fs.StringVar(&d.GPU, "gpu", d.GPU, "GPU of the simulated nodes")
	fs.IntVar(&d.StragglerNode, "straggler-node", d.StragglerNode, "node slowed down from a fifth of the run on (-1: none)")
	fs.Float64Var(&d.StragglerSlowdown, "straggler-slowdown", d.StragglerSlowdown, "how much slower the straggler node computes")
	fs.DurationVar(&d.StepInterval, "step-interval", d.StepInterval, "real time between simulated steps")
	fs.Uint64Var(&d.Seed, "seed", d.Seed, "random seed")
	fs.StringVar(&d.HTTP, "http", "127.0.0.1:0", "address of the live page and /metrics during the run (empty: off)")
	fs.BoolVar(&d.Split, "split", false, "run the scale-out path (docs/scale.md): agents send node partials to an aggregator, two rank writers in a queue group write rank_steps")
	verbose := fs.Bool("v", false, "verbose logging")
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	if d.Steps <= 0 || d.Steps > 1_000_000 {
		return usageErr(stderr, cmd, "--steps %d: give 1 to 1,000,000", d.Steps)
	}
	if d.StragglerSlowdown < 1 {
		return usageErr(stderr, cmd, "--straggler-slowdown %g must be at least 1", d.StragglerSlowdown)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"dp", d.Topology.DP}, {"tp", d.Topology.TP}, {"pp", d.Topology.PP}, {"gpus-per-node", d.GPUsPerNode}, {"micro-batches", d.MicroBatches}} {
		if f.v < 1 {
			return usageErr(stderr, cmd, "--%s %d must be at least 1", f.name, f.v)
		}
	}
	d.Live, d.Progress = stdout, stdout
	if *verbose {
		d.Logger = newLogger(stderr, true)
	}
	ctx, cancel := signalContext()
	defer cancel()
	res, err := demo.Run(ctx, d)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(stderr, "tpsprof demo: interrupted")
			return exitError
		}
		failErr(stderr, "demo", err)
		return exitError
	}
	who := "by the collector"
	if d.Split {
		who = "by the aggregator (from node partials)"
	}
	fmt.Fprintf(stdout, "\n%d rank records sent (%d dropped), %d accepted %s, %d rank rows written, %d cluster steps, in %s\n\n",
		res.Records, res.Dropped, res.Stats.Records, who, res.RowsWritten, res.Stats.StepsClosed, res.Duration.Round(100*time.Millisecond))
	rep, pd, err := report.AnalyzeWithPlots(res.JobDir, report.Options{Warmup: tps.AutoWarmup})
	if err != nil {
		failErr(stderr, "demo", err)
		return exitError
	}
	report.WriteText(stdout, rep)
	abs, _ := filepath.Abs(res.JobDir)
	if figs, err := pd.Figures(rep); err == nil {
		if paths, err := report.SaveFigures(figs, filepath.Join(res.JobDir, "report")); err == nil {
			fmt.Fprintf(stdout, "\n%d plots (PNG and SVG): %s/report/\n", len(paths), abs)
		}
		page := filepath.Join(abs, "report", "report.html")
		if err := writeHTMLFile(page, func(w io.Writer) error { return report.WriteHTML(w, rep, figs) }); err == nil {
			fmt.Fprintf(stdout, "HTML report (one file, open it in a browser): %s\n", page)
		}
	}
	fmt.Fprintf(stdout, "\nParquet traces: %s/{rank_steps,cluster_steps,gpu_samples,events}/*.parquet\n", abs)
	fmt.Fprintf(stdout, "e.g. duckdb -c \"select step, tps, mfu, comm_fraction_mean from '%s/cluster_steps/*.parquet' order by step\"\n", abs)
	return exitOK
}
