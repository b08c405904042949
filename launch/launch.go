// Package launch runs a training command under tpsprof: the rank
// environment (socket, job, attempt, node, topology, the Python package on
// PYTHONPATH), an agent started in process when none serves the node, and
// the attempt's start and end events.
//
// It owns the command's environment and its signals. It never measures:
// the ranks do (the Python package, package client), through the agent.
package launch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/client"
	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/python"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/wire"
)

// Environment variables a launched rank reads (the Python hook and
// RecorderConfigFromEnv use them).
const (
	EnvSocket   = "TPSPROF_SOCKET"
	EnvJob      = "TPSPROF_JOB"
	EnvAttempt  = "TPSPROF_ATTEMPT"
	EnvTopology = "TPSPROF_TOPOLOGY" // "dp=4,tp=8,pp=2,cp=1,ep=1"
	EnvNode     = "TPSPROF_NODE"
	EnvAuto     = "TPSPROF_AUTO" // "1": zero-code capture in Python (launch --auto)
	// EnvTokensPerStep declares the tokens each rank trains a step
	// (launch --tokens-per-step): the Python package counts them for
	// every step whose tokens the job's code does not declare itself.
	EnvTokensPerStep = "TPSPROF_TOKENS_PER_STEP"
	// EnvFlopsEvery is the steps between the Python package's FLOP counts
	// (launch --flops-every; 0: none).
	EnvFlopsEvery = "TPSPROF_FLOPS_EVERY"
	// EnvTensorBoard is a folder the Python package writes TensorBoard
	// event files of tpsprof's per-step figures into (one run a rank:
	// DIR/rank<N>), beside the trackers the job has active.
	EnvTensorBoard = "TPSPROF_TENSORBOARD"
	// EnvTrackers "0" keeps the Python package's figures out of the job's
	// W&B, TensorBoard and MLflow runs (docs/trackers.md).
	EnvTrackers = "TPSPROF_TRACKERS"
)

// JoinWindow is how recently an attempt that is still running must have
// started for a new launch to join it (the other nodes of one multi-node
// launch) rather than start the next attempt.
const JoinWindow = 5 * time.Minute

// Config describes a command to run under tpsprof.
type Config struct {
	Job     string
	Attempt int64
	// ChooseAttempt asks the collector which attempt this launch is
	// (ChooseAttempt, docs/capture.md): the running attempt when other
	// nodes of the same launch started it within JoinWindow, else one past
	// the job's highest, so that a new launch under a job id that has data
	// is a new attempt and never merges with or duplicates the old rows.
	// Attempt is then ignored.
	ChooseAttempt bool
	// Auto turns on zero-code capture in Python commands (TPSPROF_AUTO=1
	// and the package's boot folder on PYTHONPATH).
	Auto bool
	// TokensPerStep, when positive, is the tokens each rank trains a step
	// (its micro-batches times their sequence length, summed over
	// gradient accumulation), exported as EnvTokensPerStep: for loops
	// whose tokens no DataLoader or forward input shows.
	TokensPerStep int64
	// FlopsEvery, when set (not nil), is exported as EnvFlopsEvery: PyTorch
	// counts the FLOPs of the third step, then every FlopsEvery steps (0:
	// never; the package's default when nil).
	FlopsEvery *int64
	// TensorBoard, when set, is exported as EnvTensorBoard (made absolute);
	// NoTrackers exports EnvTrackers=0.
	TensorBoard string
	NoTrackers  bool
	// PythonDir is where the tpsprof Python package is extracted to be put
	// on PYTHONPATH (default: the user's cache directory); "-" leaves
	// PYTHONPATH alone.
	PythonDir string
	// Meta is published before the command starts (topology, model, GPU…).
	Meta tps.RunMeta
	// Agent configures the in-process agent started when no agent serves
	// Agent.Socket yet. Its NATS URL is needed only then.
	Agent          agent.Config
	Command        []string
	Stdout, Stderr io.Writer
	// Env is added to the command's environment.
	Env []string
}

// FormatTopology writes a topology as TPSPROF_TOPOLOGY holds it.
func FormatTopology(t tps.Topology) string {
	return fmt.Sprintf("dp=%d,tp=%d,pp=%d,cp=%d,ep=%d", max(t.DP, 1), max(t.TP, 1), max(t.PP, 1), max(t.CP, 1), max(t.EP, 1))
}

// Run runs the command with what a rank needs in its environment,
// starting an agent in process if none serves the node, and records
// attempt_start and attempt_end events. SIGINT and SIGTERM are forwarded to
// the command. It returns the command's exit code (128+signal when killed
// by one).
func Run(ctx context.Context, cfg Config) (int, error) {
	if err := cfg.check(); err != nil {
		return 2, err
	}
	if cfg.ChooseAttempt {
		a, note := ChooseAttempt(cfg.Agent.NATS, cfg.Job, time.Now())
		cfg.Attempt = a
		fmt.Fprintf(cfg.Stderr, "tpsprof launch: %s\n", note)
	}
	pyEnv, err := pythonEnv(cfg)
	if err != nil {
		fmt.Fprintf(cfg.Stderr, "tpsprof launch: the Python package is not on PYTHONPATH: %v\n", err)
	}
	ag, code, err := nodeAgent(cfg)
	if err != nil {
		return code, err
	}
	defer ag.stop()
	cmd := exec.CommandContext(ctx, cfg.Command[0], cfg.Command[1:]...)
	cmd.Stdin = os.Stdin
	cmd.Stdout, cmd.Stderr = cfg.Stdout, cfg.Stderr
	if cmd.Env, err = cfg.rankEnv(ag.node, pyEnv); err != nil {
		return 0, err
	}
	// Signals go to the command, which decides how to stop; we wait for it.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second

	start := time.Now()
	ag.send(tps.Event{Job: cfg.Job, Attempt: cfg.Attempt, Kind: tps.EventAttemptStart, Node: ag.node, Rank: -1,
		StartUnixNs: start.UnixNano(), Detail: truncateDetail(fmt.Sprint(cfg.Command))})
	if err := cmd.Start(); err != nil {
		ag.send(tps.Event{Job: cfg.Job, Attempt: cfg.Attempt, Kind: tps.EventAttemptEnd, Node: ag.node, Rank: -1,
			StartUnixNs: start.UnixNano(), EndUnixNs: time.Now().UnixNano(), ExitCode: 127, Detail: truncateDetail(err.Error())})
		return 127, fmt.Errorf("launch: %w", err)
	}
	sig, waitErr := waitForwarding(cmd)
	code = exitCode(cmd, waitErr)
	ag.send(tps.Event{Job: cfg.Job, Attempt: cfg.Attempt, Kind: tps.EventAttemptEnd, Node: ag.node, Rank: -1,
		StartUnixNs: start.UnixNano(), EndUnixNs: time.Now().UnixNano(), ExitCode: int64(code), Detail: stoppedDetail(sig, code)})
	if ag.records != nil && ag.records() == 0 && time.Since(start) > silentAfter {
		// (a job that sent nothing was silent: the collector has no job)
		hint := "import tpsprof.torch and call instrument(), or launch with --auto"
		if cfg.Auto {
			hint = "--auto found no optimizer step: does the script train with torch.optim?"
		}
		fmt.Fprintf(cfg.Stderr, "tpsprof launch: the command ran %s and sent no step record: is it instrumented? (%s)\n",
			time.Since(start).Round(time.Second), hint)
	}
	return code, nil
}

// silentAfter is how long a command must have run for its silence to be
// said (a command that fails at once has said why itself).
const silentAfter = 2 * time.Second

// stoppedDetail says, for an attempt_end, that the command was stopped by
// a signal the launch was sent and forwarded (nil: none): under Slurm a
// SIGTERM is its requeue or preemption (or scancel), not a crash of the
// job's (a requeue's first attempt read "crashed (exit 1)").
func stoppedDetail(sig os.Signal, code int) string {
	if sig == nil || code == 0 {
		return ""
	}
	if sig == syscall.SIGTERM && underSlurm() {
		return tps.StoppedPrefix + "stopped by Slurm (preempted, requeued or cancelled)"
	}
	return tps.StoppedPrefix + "stopped by " + sig.String() + " sent to the launch"
}

// check checks the configuration and fills in its defaults.
func (cfg *Config) check() error {
	if !tps.ValidJobID(cfg.Job) {
		return fmt.Errorf("launch: invalid job id %q (1-64 characters of [A-Za-z0-9_-])", cfg.Job)
	}
	if len(cfg.Command) == 0 {
		return errors.New("launch: no command")
	}
	if cfg.Attempt < 0 {
		return fmt.Errorf("launch: attempt %d is negative", cfg.Attempt)
	}
	if cfg.TokensPerStep < 0 || cfg.TokensPerStep > tps.MaxTokens {
		return fmt.Errorf("launch: tokens per step %d: give 1 to %d", cfg.TokensPerStep, tps.MaxTokens)
	}
	if cfg.Agent.Socket == "" {
		cfg.Agent.Socket = client.DefaultSocket()
	}
	cfg.Meta.Job = cfg.Job
	if cfg.Stderr == nil {
		cfg.Stderr = io.Discard
	}
	return nil
}

// ServeOthers bounds how long a launch's own agent, once its command has
// ended, still serves the connections open to it (other launches that
// joined it, their ranks).
var ServeOthers = time.Minute

// launchAgent is the agent the launch writes its events to: the node's,
// or one of its own.
type launchAgent struct {
	send func(tps.Event)
	stop func()
	node string
	// records is how many step records its agent took (nil: another
	// process's agent, which the launch cannot ask)
	records func() int64
}

// nodeAgent uses the node's agent if one serves the socket, else starts
// one in process; on an error, the exit code.
func nodeAgent(cfg Config) (launchAgent, int, error) {
	hasMeta := cfg.Meta.Topology != (tps.Topology{}) || cfg.Meta.ModelPreset != "" || cfg.Meta.Model != nil
	if err := client.CheckSocket(cfg.Agent.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return launchAgent{}, 2, fmt.Errorf("launch: %w", err)
	}
	join := func() (launchAgent, bool) {
		c, err := net.DialTimeout("unix", cfg.Agent.Socket, 200*time.Millisecond)
		if err != nil {
			return launchAgent{}, false
		}
		c.Close()
		cl := client.New(cfg.Agent.Socket, client.Options{})
		if hasMeta {
			cl.SendMeta(cfg.Meta)
		}
		// (the serving agent stamps its own node on what it relays)
		return launchAgent{send: cl.SendEvent, stop: func() { cl.Close(5 * time.Second) }, node: cfg.node()}, true
	}
	if ag, ok := join(); ok {
		return ag, 0, nil
	}
	if cfg.Agent.NATS.URL == "" {
		return launchAgent{}, 2, fmt.Errorf("launch: no agent serves %s and no NATS URL was given to start one (run a collector and pass its URL)", cfg.Agent.Socket)
	}
	agentCfg := cfg.Agent
	agentCfg.Node = cfg.node()
	a, err := agent.Start(agentCfg)
	if err != nil {
		// Launches started together on one node (srun, a task a rank)
		// race to serve the socket: the one that loses uses the winner's
		// agent, as it would one already serving.
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if ag, ok := join(); ok {
				return ag, 0, nil
			}
		}
		return launchAgent{}, 1, err
	}
	if hasMeta {
		if err := a.SubmitMeta(cfg.Meta); err != nil {
			a.Close()
			return launchAgent{}, 2, err
		}
	}
	stop := func() {
		// Other launches on this node may have joined this agent (srun's
		// tasks, each a launch): it serves them until they are done, at
		// most ServeOthers (their last records and attempt_end were lost
		// when the first launch to end closed it)
		for deadline := time.Now().Add(ServeOthers); a.OpenConnections() > 0 && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
		a.Close()
	}
	return launchAgent{send: func(e tps.Event) { _ = a.SubmitEvent(e) }, stop: stop, node: a.Node(),
		records: func() int64 { return a.Stats().Records }}, 0, nil
}

// node is the launch's node name: --node (Agent.Node), else the slurmd's
// name for the node under Slurm, else the host name.
func (cfg Config) node() string {
	if cfg.Agent.Node != "" {
		return cfg.Agent.Node
	}
	if s, ok := SlurmEnv(os.Getenv); ok && s.Node != "" {
		return s.Node
	}
	h, _ := os.Hostname()
	return h
}

// rankEnv is the command's environment: the launch's, less its secrets,
// and what a rank needs.
func (cfg Config) rankEnv(node string, pyEnv []string) ([]string, error) {
	env := append(rankEnviron(os.Environ()),
		EnvSocket+"="+cfg.Agent.Socket,
		EnvJob+"="+cfg.Job,
		EnvAttempt+"="+strconv.FormatInt(cfg.Attempt, 10),
		EnvNode+"="+node,
		agent.EnvTraceDir+"="+traceDir(cfg.Agent),
	)
	if cfg.Meta.Topology != (tps.Topology{}) {
		env = append(env, EnvTopology+"="+FormatTopology(cfg.Meta.Topology))
	}
	if cfg.FlopsEvery != nil {
		env = append(env, EnvFlopsEvery+"="+strconv.FormatInt(max(*cfg.FlopsEvery, 0), 10))
	}
	if cfg.TokensPerStep > 0 {
		env = append(env, EnvTokensPerStep+"="+strconv.FormatInt(cfg.TokensPerStep, 10))
	}
	if cfg.TensorBoard != "" {
		dir, err := filepath.Abs(cfg.TensorBoard)
		if err != nil {
			return nil, fmt.Errorf("--tensorboard %s: %w", cfg.TensorBoard, err)
		}
		env = append(env, EnvTensorBoard+"="+dir)
	}
	if cfg.NoTrackers {
		env = append(env, EnvTrackers+"=0")
	}
	env = append(env, pyEnv...)
	return append(env, cfg.Env...), nil
}

// waitForwarding waits for the started command, forwarding SIGINT and
// SIGTERM to it, and says the first it forwarded (nil: none).
func waitForwarding(cmd *exec.Cmd) (os.Signal, error) {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	waitErr := make(chan error, 1)
	go func() { waitErr <- cmd.Wait() }()
	var first os.Signal
	for {
		select {
		case s := <-sigs:
			if first == nil {
				first = s
			}
			cmd.Process.Signal(s)
		case err := <-waitErr:
			return first, err
		}
	}
}

// secretEnv are the variables that carry NATS secrets. Ranks write to the
// node's agent over its socket and need none of them; with one, any rank
// (and whatever it runs) could forge records into any job or delete the
// durable stream, so launch keeps them out of the command's environment.
var secretEnv = []string{"TPSPROF_NATS_TOKEN", "TPSPROF_NATS_PASSWORD"}

// rankEnviron is env without secretEnv.
func rankEnviron(env []string) []string {
	return slices.DeleteFunc(env, func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.Contains(secretEnv, name)
	})
}

func exitCode(cmd *exec.Cmd, err error) int {
	if cmd.ProcessState == nil {
		return 1
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	if c := cmd.ProcessState.ExitCode(); c >= 0 {
		return c
	}
	if err != nil {
		return 1
	}
	return 0
}

// truncateDetail makes s a valid event detail: printable, bounded.
func truncateDetail(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
	if len(s) > 1000 {
		s = strings.ToValidUTF8(s[:1000], "")
	}
	return s
}

// PackageDir extracts the tpsprof Python package the binary carries under
// root (default: the user's cache directory) and returns the folder to put
// on PYTHONPATH.
func PackageDir(root string) (string, error) {
	if root == "" {
		if c, err := os.UserCacheDir(); err == nil {
			root = filepath.Join(c, "tpsprof")
		} else {
			root = filepath.Join(os.TempDir(), fmt.Sprintf("tpsprof-%d", os.Getuid()))
		}
	}
	return python.Extract(root)
}

// pythonEnv puts the tpsprof Python package (extracted from the binary) on
// PYTHONPATH, and with Auto its zero-code boot folder too.
func pythonEnv(cfg Config) ([]string, error) {
	if cfg.PythonDir == "-" {
		if cfg.Auto {
			return []string{EnvAuto + "=1"}, errors.New("--auto without the package on PYTHONPATH: install it (pip install python/)")
		}
		return nil, nil
	}
	dir, err := PackageDir(cfg.PythonDir)
	if err != nil {
		return nil, err
	}
	paths := []string{dir}
	var env []string
	if cfg.Auto {
		paths = append(paths, python.Boot(dir))
		env = append(env, EnvAuto+"=1")
	}
	if old := os.Getenv("PYTHONPATH"); old != "" {
		paths = append(paths, old)
	}
	return append(env, "PYTHONPATH="+strings.Join(paths, string(os.PathListSeparator))), nil
}

// ChooseAttempt asks the collector reachable through o which attempt a new
// launch of job is, and says why in a sentence. Without an answer (no NATS
// URL, no collector, an older collector) it is 0, and the sentence warns
// that a rerun under this job id would then reuse attempt 0.
func ChooseAttempt(o natsconn.Options, job string, now time.Time) (int64, string) {
	if o.URL == "" {
		return 0, "attempt 0 (no --nats to ask the collector which attempt this launch is; a second launch under this job id would reuse attempt 0: pass --attempt)"
	}
	if o.Name == "" {
		o.Name = "tpsprof-launch"
	}
	nc, err := natsconn.Connect(o, nats.Timeout(2*time.Second), nats.MaxReconnects(0))
	if err != nil {
		return 0, fmt.Sprintf("attempt 0 (cannot ask the collector: %v; pass --attempt if this job id has data)", err)
	}
	defer nc.Close()
	msg, err := nc.Request(wire.AttemptSubject(job), nil, 3*time.Second)
	if err != nil {
		return 0, fmt.Sprintf("attempt 0 (the collector did not answer which attempt this is: %v; pass --attempt if this job id has data)", err)
	}
	var r wire.AttemptReply
	if err := json.Unmarshal(msg.Data, &r); err != nil {
		return 0, fmt.Sprintf("attempt 0 (undecodable answer from the collector: %v)", err)
	}
	return r.Choose(now, JoinWindow)
}

// traceDir is the trace folder of the agent a launch uses.
func traceDir(c agent.Config) string {
	if c.TraceDir != "" {
		return c.TraceDir
	}
	return agent.DefaultTraceDir(c.Socket)
}
