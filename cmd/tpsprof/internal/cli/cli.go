// Package cli wires tpsprof's subcommands: it parses flags and calls the
// packages that do the work. Main is separate from package main so tests can
// run every command in process.
// One file per command (collector.go, agent.go, launch.go, report.go, …).
// It owns flags and output; it never computes a figure.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the command ran and failed
	exitUsage = 2 // bad or contradictory flags or input
)

type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

func commands() []command {
	return []command{
		{"demo", "run a simulated 64-GPU job through the whole product and print its report", runDemo},
		{"collector", "aggregate steps from NATS and write Parquet traces (embedded NATS by default)", runCollector},
		{"agent", "serve the node's intake socket and publish records to NATS", runAgent},
		{"launch", "run a training command under tpsprof (starts an agent when none runs)", runLaunch},
		{"report", "analyse a job's Parquet traces", runReport},
		{"nodes", "rank the hosts that slow job after job, with the GPU-hours they cost and why to drain them", runNodes},
		{"trace", "profile the same steps on every rank of a running job and name the rank the others waited for", runTrace},
		{"kineto", "analyse torch.profiler traces: compute, communication, exposed communication, collectives", runKineto},
		{"gpus", "print what this node's GPUs report through NVML", runGPUs},
		{"mfu", "compute FLOPs per token, MFU and HFU, time and cost to train", runMFU},
		{"version", "print the version", runVersion},
	}
}

// Main runs tpsprof with args (without the program name) and returns the
// process exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		if len(args) > 1 {
			return Main([]string{args[1], "--help"}, stdout, stderr)
		}
		usage(stdout)
		return exitOK
	}
	if args[0] == "--version" || args[0] == "-version" || args[0] == "-v" {
		return runVersion(nil, stdout, stderr)
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "tpsprof: unknown command %q (run \"tpsprof help\")\n", args[0])
	return exitUsage
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "tpsprof measures the training throughput of distributed jobs: tokens/s per step,")
	fmt.Fprintln(w, "per GPU and cluster-wide, MFU and HFU, and where the lost time goes.")
	fmt.Fprintln(w, "\nUsage: tpsprof COMMAND [flags]\n\nCommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun \"tpsprof COMMAND --help\" for a command's flags.")
}

func runVersion(args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stdout, "tpsprof", version())
	return exitOK
}

// flagSet is a command's flags with its help text.
type flagSet struct {
	*flag.FlagSet
	help func()
}

// newFlagSet returns a flag set whose errors go to stderr as one line and
// whose --help prints the summary, the flags and the examples.
func newFlagSet(name, synopsis, examples string, stderr io.Writer) *flagSet {
	fs := &flagSet{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError)}
	fs.SetOutput(io.Discard)
	fs.Usage = func() {} // the flag package calls it on every error; help is printed by parse
	fs.help = func() {
		w := stderr
		fmt.Fprintf(w, "Usage: tpsprof %s\n\n", synopsis)
		fmt.Fprintln(w, "Flags:")
		fs.SetOutput(w)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
		if examples != "" {
			fmt.Fprintf(w, "\nExamples:\n%s", examples)
		}
	}
	return fs
}

// parseFlags parses args, printing help for --help (exit 0) or one error
// line (exit 2). ok is false when the caller should return code.
func parseFlags(fs *flagSet, args []string, stderr io.Writer) (code int, ok bool) {
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fs.help()
		return exitOK, false
	}
	if err != nil {
		fmt.Fprintf(stderr, "tpsprof %s: %v (see --help)\n", fs.Name(), err)
		return exitUsage, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "tpsprof %s: unexpected argument %q (see --help)\n", fs.Name(), fs.Arg(0))
		return exitUsage, false
	}
	return 0, true
}

// usageErr prints one error line and returns the usage exit code.
func usageErr(stderr io.Writer, cmd string, format string, args ...any) int {
	fmt.Fprintf(stderr, "tpsprof %s: %s\n", cmd, fmt.Sprintf(format, args...))
	return exitUsage
}

// setFlags returns the names of the flags given on the command line.
func setFlags(fs *flagSet) map[string]bool {
	m := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { m[f.Name] = true })
	return m
}

// quantity is a float flag that accepts SI-like suffixes: 8B, 1.5T, 400k, 2e6.
type quantity float64

func (q *quantity) String() string { return strconv.FormatFloat(float64(*q), 'g', -1, 64) }

func (q *quantity) Set(s string) error {
	v, err := parseQuantity(s)
	if err != nil {
		return err
	}
	*q = quantity(v)
	return nil
}

func parseQuantity(s string) (float64, error) {
	t := strings.TrimSpace(strings.ReplaceAll(s, "_", ""))
	mult := 1.0
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'k', 'K':
			mult = 1e3
		case 'm', 'M':
			mult = 1e6
		case 'b', 'B', 'g', 'G':
			mult = 1e9
		case 't', 'T':
			mult = 1e12
		}
		if mult != 1 {
			t = t[:n-1]
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a number (suffixes k, M, B, T allowed)", s)
	}
	return v * mult, nil
}

// seconds is a duration flag that accepts Go durations ("1.5s", "850ms")
// or plain seconds ("1.5").
type seconds time.Duration

func (d *seconds) String() string { return time.Duration(*d).String() }

func (d *seconds) Set(s string) error {
	if v, err := strconv.ParseFloat(s, 64); err == nil {
		*d = seconds(v * float64(time.Second))
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is not a duration (e.g. 1.5s, 850ms, or seconds as a number)", s)
	}
	*d = seconds(v)
	return nil
}

// failErr prints err as one line under the command's name, without the
// package prefixes the error picked up on its way ("report: ", "trace: ").
func failErr(stderr io.Writer, cmd string, err error) {
	msg := err.Error()
	for changed := true; changed; {
		changed = false
		for _, p := range []string{cmd + ": ", "report: ", "collector: ", "agent: ", "trace: ", "natsconn: ", "kineto: ", "mfu: ", "demo: ", "tps: "} {
			if strings.HasPrefix(msg, p) {
				msg, changed = msg[len(p):], true
			}
		}
	}
	fmt.Fprintf(stderr, "tpsprof %s: %s\n", cmd, msg)
}

// version is the module version, or the VCS revision a development build
// was made from.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	v := bi.Main.Version
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if (v == "" || v == "(devel)") && rev != "" {
		v = "devel " + rev[:min(12, len(rev))] + dirty
	}
	if v == "" {
		v = "(devel)"
	}
	return v + " " + bi.GoVersion
}

// fraction is a quantity that also takes a percentage ("40%" is 0.4).
type fraction quantity

func (f *fraction) String() string { return (*quantity)(f).String() }

func (f *fraction) Set(s string) error {
	if t := strings.TrimSpace(s); strings.HasSuffix(t, "%") {
		v, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(t, "%")), 64)
		if err != nil {
			return fmt.Errorf("%q is not a percentage", s)
		}
		*f = fraction(v / 100)
		return nil
	}
	return (*quantity)(f).Set(s)
}
