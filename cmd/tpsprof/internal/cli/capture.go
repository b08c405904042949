package cli

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tpsprof/tpsprof/capture"
	"github.com/tpsprof/tpsprof/collector"
	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/wire"
)

func runTrace(args []string, stdout, stderr io.Writer) int {
	const cmd = "trace"
	fs := newFlagSet(cmd, "trace JOB [--steps N] [--at-step S] [--ranks LIST | --node NAME | --straggler] [--keep DIR] [--json] [flags]", `  # profile the next 2 steps on every rank of a running job; who made the others wait?
  tpsprof trace llama-8b
  # steps 1200-1203 of ranks 0-7 and 31, traces kept under ./captures/<capture id>/
  tpsprof trace llama-8b --at-step 1200 --steps 4 --ranks 0-7,31 --keep captures
  # the rank the collector flags as a straggler, and the fastest rank
  tpsprof trace llama-8b --straggler

Every targeted rank profiles the same step numbers with torch.profiler (its process
looks at the request only where a step begins); the node agents analyse the traces off
the training processes and send back, per rank, computation, communication, exposed
communication and idle time, and each collective call. The calls are matched across
ranks (process group and order), the ranks' clocks aligned by the collectives' ends,
and the rank the others waited for is named. The job's ranks must run tpsprof's Python
package (tpsprof.torch.instrument, the Trainer callback or launch --auto) with an agent.
`+natsEnvHelp, stderr)
	var no natsconn.Options
	natsFlags(fs, &no)
	steps := fs.Int64("steps", 2, fmt.Sprintf("steps to profile, 1 to %d", capture.MaxSteps))
	at := fs.Int64("at-step", -1, "first step to profile (default: about a second ahead of the job)")
	ranks := fs.String("ranks", "", "ranks to profile, e.g. 0-7,31 (default: all)")
	node := fs.String("node", "", "profile only the ranks of this node")
	straggler := fs.Bool("straggler", false, "profile the rank of the job's worst open straggler episode and the fastest rank (asked of the collector)")
	keep := fs.String("keep", "", "write the traces under DIR/<capture id>/ (gzipped, readable by tpsprof kineto, HTA, Perfetto)")
	asJSON := fs.Bool("json", false, "print the merged view as JSON")
	timeout := fs.Duration("timeout", time.Minute, "give up on ranks that have not answered after this long")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	// the job comes first; flags may follow it
	var job string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		job, args = args[0], args[1:]
	}
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	natsClientSecrets(&no)
	rl, err := checkTraceFlags(job, *steps, *timeout, *ranks, *node, *straggler)
	if err != nil {
		return usageErr(stderr, cmd, "%s", err)
	}
	if no.URL == "" {
		no.URL = "nats://127.0.0.1:4222"
	}
	no.Name = "tpsprof-trace"
	nc, err := connectNATS(no)
	if err != nil {
		fmt.Fprintf(stderr, "tpsprof trace: %v\n", err)
		return exitError
	}
	defer nc.Close()
	ctx, cancel := signalContext()
	defer cancel()
	if *straggler {
		rep, err := askStraggler(nc, job)
		if err != nil {
			fmt.Fprintf(stderr, "tpsprof trace: --straggler: %v\n", err)
			return exitError
		}
		rl = rep.Ranks
		if !*quiet {
			fmt.Fprintf(stderr, "tpsprof trace: straggler episode on %s (score %.2f): ranks %v\n", rep.Node, rep.Score, rep.Ranks)
		}
	}
	o := capture.Options{Job: job, Steps: *steps, AtStep: *at, Ranks: rl, Node: *node, KeepDir: *keep, Timeout: *timeout}
	if !*quiet {
		o.Progress = func(s string) { fmt.Fprintln(stderr, "tpsprof trace:", s) }
	}
	v, err := capture.Run(ctx, nc, o)
	if err != nil && v == nil {
		fmt.Fprintf(stderr, "tpsprof trace: %v\n", err)
		return exitError
	}
	if *asJSON {
		printJSON(stdout, v)
	} else {
		printCapture(stdout, v)
	}
	if err != nil {
		fmt.Fprintf(stderr, "tpsprof trace: %v\n", err)
		return exitError
	}
	if len(v.Ranks) == 0 {
		return exitError
	}
	return exitOK
}

// checkTraceFlags checks trace's flags and reads --ranks.
func checkTraceFlags(job string, steps int64, timeout time.Duration, ranks, node string, straggler bool) ([]int64, error) {
	if job == "" {
		return nil, errors.New("no job: tpsprof trace JOB (see --help)")
	}
	if !tps.ValidJobID(job) {
		return nil, fmt.Errorf("job %q: give 1-64 characters of [A-Za-z0-9_-]", job)
	}
	if steps < 1 || steps > capture.MaxSteps {
		return nil, fmt.Errorf("--steps %d: give 1 to %d", steps, capture.MaxSteps)
	}
	if timeout <= 0 {
		return nil, errors.New("--timeout must be positive")
	}
	var rl []int64
	if ranks != "" {
		var err error
		if rl, err = parseRanks(ranks); err != nil {
			return nil, fmt.Errorf("--ranks: %v", err)
		}
	}
	if n := btoi(ranks != "") + btoi(node != "") + btoi(straggler); n > 1 {
		return nil, errors.New("--ranks, --node and --straggler: choose one")
	}
	return rl, nil
}

// connectNATS connects to no's server, and says now, not as "no agent",
// when no server is there.
func connectNATS(no natsconn.Options) (*nats.Conn, error) {
	var dialErr atomic.Pointer[error]
	nc, err := natsconn.Connect(no, nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
		if err != nil {
			dialErr.Store(&err)
		}
	}))
	if err != nil {
		return nil, err
	}
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		why := nc.LastError()
		if p := dialErr.Load(); why == nil && p != nil {
			why = *p
		}
		if why == nil {
			why = err
		}
		nc.Close()
		return nil, fmt.Errorf("NATS at %s: %s (give the collector's with --nats)", natsconn.Redacted(no.URL), natsconn.Cause(why))
	}
	return nc, nil
}

// askStraggler asks the collector for the ranks of the job's worst open
// straggler episode and the fastest rank.
func askStraggler(nc *nats.Conn, job string) (collector.StragglerReply, error) {
	var rep collector.StragglerReply
	msg, err := nc.Request(wire.StragglerSubject(job), nil, 5*time.Second)
	if err != nil {
		return rep, fmt.Errorf("no collector answered (%v)", err)
	}
	if err := json.Unmarshal(msg.Data, &rep); err != nil || rep.Err != "" || len(rep.Ranks) == 0 {
		return rep, errors.New(cmp.Or(rep.Err, "the collector's answer is not understood"))
	}
	return rep, nil
}

// parseRanks reads "0-7,31".
func parseRanks(s string) ([]int64, error) {
	var out []int64
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.ParseInt(lo, 10, 64)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("%q is not a rank or range", part)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseInt(hi, 10, 64); err != nil || b < a {
				return nil, fmt.Errorf("%q is not a rank range", part)
			}
		}
		if b-a > 1<<16 || len(out) > 1<<16 {
			return nil, fmt.Errorf("%q: too many ranks", part)
		}
		for r := a; r <= b; r++ {
			out = append(out, r)
		}
	}
	return out, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func printCapture(w io.Writer, v *capture.View) {
	fmt.Fprintf(w, "capture %s of job %s", v.ID, v.Job)
	if len(v.Steps) > 0 {
		fmt.Fprintf(w, ", steps %d-%d", v.Steps[0], v.Steps[len(v.Steps)-1])
	}
	fmt.Fprintf(w, ": %d ranks traced\n\n", len(v.Ranks))
	if len(v.Ranks) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "rank\tnode\tsteps\tstep ms\tcompute ms\tcomm ms\t(waited\ttransfer)\texposed ms\tidle ms\tlast at\theld back ms\t")
		for _, r := range v.Ranks {
			n := float64(max(r.Steps, 1))
			fmt.Fprintf(tw, "%d\t%s\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%d\t%.1f\t\n", r.Rank, r.Node, r.Steps,
				r.DurationUs/1e3/n, r.ComputeUs/1e3/n, r.CommUs/1e3/n, r.WaitUs/1e3/n, r.TransferUs/1e3/n, r.ExposedCommUs/1e3/n, r.IdleUs/1e3/n, r.LastArrivals, r.HeldBackUs/1e3/n)
		}
		tw.Flush()
		fmt.Fprintln(w, "(per step; comm splits into waiting at collectives for the last rank to arrive and transfer after it;")
		fmt.Fprintln(w, " last at: collectives it arrived last at; held back: the others' wait for it beyond the second-latest rank)")
	}
	fmt.Fprintln(w)
	switch c := v.Culprit; {
	case c == nil && strings.HasPrefix(v.Verdict, "not established"):
		fmt.Fprintln(w, "waited for: not established (see the verdict)")
	case c != nil:
		fmt.Fprintf(w, "waited for: rank %d (node %s), last to arrive at %d of %d collectives; the others waited %.1f ms each for it over the captured steps, %.1f ms of it beyond the second-latest rank\n",
			c.Rank, c.Node, c.LastArrivals, c.Collectives, c.OthersWaitUs/1e3, c.HeldBackUs/1e3)
		if c.WaitDoubt != "" {
			fmt.Fprintf(w, "  (%s)\n", c.WaitDoubt)
		}
	case len(v.Collectives) > 0:
		fmt.Fprintf(w, "waited for: no rank (%d collectives matched; no rank arrived last by more than 0.05 ms)\n", len(v.Collectives))
	default:
		fmt.Fprintln(w, "waited for: unknown (no collective call was matched across ranks)")
	}
	if v.Verdict != "" {
		fmt.Fprintln(w, "verdict:", v.Verdict)
	}
	for _, m := range v.Missing {
		fmt.Fprintf(w, "rank %d: not traced: %s\n", m.Rank, m.Why)
	}
	for _, n := range v.Notes {
		fmt.Fprintln(w, "note:", n)
	}
	if len(v.Kept) > 0 {
		fmt.Fprintf(w, "traces kept: %d files in %s (with the ranks' analysed reports, %s)\n", len(v.Kept), filepath.Dir(v.Kept[0]), capture.ReportsFile)
	}
}
