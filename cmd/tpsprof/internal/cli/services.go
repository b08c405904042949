package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/client"
	"github.com/tpsprof/tpsprof/cmd/tpsprof/internal/demo"
	"github.com/tpsprof/tpsprof/collector"
	"github.com/tpsprof/tpsprof/launch"
	"github.com/tpsprof/tpsprof/mfu"
	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/report"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// natsFlags registers the connection flags agent, collector and launch share.
// Secrets can come from the environment instead of the command line, where
// other users could read them.
func natsFlags(fs *flagSet, o *natsconn.Options) {
	fs.StringVar(&o.URL, "nats", "", "NATS server URL, e.g. nats://10.0.0.5:4222 (tls:// for TLS)")
	fs.StringVar(&o.User, "nats-user", "", "NATS user name")
	fs.StringVar(&o.CredsFile, "nats-creds", "", "NATS credentials file (JWT and NKey seed)")
	fs.StringVar(&o.NKeyFile, "nats-nkey", "", "NATS NKey seed file")
	fs.StringVar(&o.TLSCA, "nats-tls-ca", "", "CA certificate that signed the NATS server's certificate")
	fs.StringVar(&o.TLSCert, "nats-tls-cert", "", "client certificate for mutual TLS")
	fs.StringVar(&o.TLSKey, "nats-tls-key", "", "client key for mutual TLS")
}

// natsSecrets reads password and token from the environment.
func natsSecrets(o *natsconn.Options) {
	o.Password = os.Getenv("TPSPROF_NATS_PASSWORD")
	o.Token = os.Getenv("TPSPROF_NATS_TOKEN")
}

// natsClientSecrets is natsSecrets for agents and launch: with no
// credentials given at all, the token a collector of the same user wrote
// for its embedded server (natsconn.TokenPath) is used.
func natsClientSecrets(o *natsconn.Options) {
	natsSecrets(o)
	if o.User == "" && o.Token == "" && o.CredsFile == "" && o.NKeyFile == "" {
		o.Token = natsconn.LocalToken()
	}
}

const natsEnvHelp = "\nSecrets come from the environment, never from flags: TPSPROF_NATS_PASSWORD (with --nats-user), TPSPROF_NATS_TOKEN.\n" +
	"With none given, agents and launch use the token a collector of the same user wrote for its embedded server (~/.config/tpsprof/nats-token).\n"

func newLogger(w io.Writer, verbose bool) *slog.Logger {
	lvl := slog.LevelInfo
	if verbose {
		lvl = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: lvl}))
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

func printJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

func runCollector(args []string, stdout, stderr io.Writer) int {
	const cmd = "collector"
	fs := newFlagSet(cmd, "collector --out DIR [--nats URL | --listen HOST:PORT] [flags]", `  # embedded NATS on port 4222, traces under ./traces
  tpsprof collector --out traces

  # an existing NATS cluster, with a credentials file and TLS
  tpsprof collector --out /data/tpsprof --nats tls://nats.internal:4222 --nats-creds agent.creds --nats-tls-ca ca.pem
`+natsEnvHelp, stderr)
	var no natsconn.Options
	natsFlags(fs, &no)
	out := fs.String("out", "", "output directory; one folder per job (required)")
	listen := fs.String("listen", "127.0.0.1:4222", "address of the embedded NATS server when --nats is not given")
	noAuth := fs.Bool("nats-no-auth", false, "embedded server: accept clients without credentials (by default it requires --nats-user with TPSPROF_NATS_PASSWORD, TPSPROF_NATS_TOKEN, or a token it keeps in ~/.config/tpsprof/nats-token); anyone who reaches it can then read, forge and delete records")
	grace := fs.Duration("grace", 30*time.Second, "how long a step waits for missing ranks")
	metaFile := fs.String("meta", "", "run metadata JSON (topology, model, gpu, dtype, gpu_hour_usd) applied to every job")
	live := fs.Duration("live", 5*time.Second, "interval of the live line (0 to silence it)")
	partAge := fs.Duration("part-age", time.Minute, "finalise Parquet parts at least this often")
	quietAfter := fs.Duration("quiet-after", 10*time.Second, "finalise a job's parts once it has sent no step for this long (and at once when an attempt ends)")
	metaWait := fs.Duration("meta-wait", 2*time.Second, "hold the steps of a job that has sent no run metadata yet this long after its first record, so they are aggregated under its topology and model when it comes (negative: do not hold)")
	var streamBytes quantity = 8e9
	fs.Var(&streamBytes, "stream-max-bytes", "durable mode: the most the stream may hold, e.g. 2G (messages not yet in Parquet; past it the oldest go)")
	replicas := fs.Int("stream-replicas", 1, "durable mode: servers of a NATS cluster that hold the stream (3 on a three-server cluster survives losing one; docs/scale.md)")
	maxState := fs.Int64("max-state-bytes", 0, "memory the jobs' declared world sizes may claim (open steps sized to the world); past it records are rejected (world_size:memory); 0: a quarter of the machine's or cgroup's memory, at most 4 GiB")
	maxJobs := fs.Int("max-jobs", 1024, "jobs held at once; past it a new job evicts the longest-idle one, or is rejected (job:limit) when all are active")
	evictAfter := fs.Duration("evict-after", 10*time.Minute, "close and forget a job idle this long (its parts finalised; it starts new parts if it returns)")
	codec := fs.String("parquet-codec", "zstd", "Parquet compression: zstd (smallest), zstd-fast (~1.3x faster to write, ~9% larger), snappy (~1.6x faster, ~1.6x larger) or none (~2.3x faster, ~5x larger); see BENCHMARKS.md")
	httpAddr := fs.String("http", "127.0.0.1:9465", "address of /metrics (Prometheus), /api/summary and the live page (empty: off)")
	role := fs.String("role", "all", "all; or, to scale past one collector (docs/scale.md): aggregator (merges the node partials agents send with --partials) or rank-writer (a queue group writing rank_steps)")
	partition := fs.String("partition", "", "I/N: this is collector I (0-based) of N of the same role, each keeping the share of the traffic that hashes to it: jobs for all and aggregator, a job's nodes for rank-writer (which then drops resent rank rows exactly); docs/scale.md")
	durable := fs.Bool("durable", false, "read through a JetStream stream and acknowledge only what is in finalised Parquet parts: a restart or crash loses nothing (the embedded server stores the stream under OUT/.jetstream; with --role, give every role the same --nats server with JetStream: docs/reliability.md)")
	autoCapture := fs.Bool("auto-capture", false, "when a straggler episode opens, profile one step on its rank and the fastest rank (as tpsprof trace does) and link the capture to the episode")
	autoEvery := fs.Duration("auto-capture-every", 10*time.Minute, "at most one automatic capture per job this often")
	verbose := fs.Bool("v", false, "verbose logging")
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	natsSecrets(&no)
	if *out == "" {
		return usageErr(stderr, cmd, "--out is required")
	}
	if err := trace.CheckCodec(*codec); err != nil {
		return usageErr(stderr, cmd, "--parquet-codec: %v", err)
	}
	part, parts := 0, 0
	if *partition != "" {
		i, n, ok := strings.Cut(*partition, "/")
		a, errA := strconv.Atoi(i)
		b, errB := strconv.Atoi(n)
		if !ok || errA != nil || errB != nil || b < 1 || a < 0 || a >= b {
			return usageErr(stderr, cmd, "--partition %q: want I/N with 0 <= I < N, e.g. 0/4", *partition)
		}
		if *durable && b > 1 {
			return usageErr(stderr, cmd, "--partition does not combine with --durable")
		}
		part, parts = a, b
	}
	log := newLogger(stderr, *verbose)
	var meta *tps.RunMeta
	if *metaFile != "" {
		b, err := os.ReadFile(*metaFile)
		if err != nil {
			return usageErr(stderr, cmd, "read --meta: %v", err)
		}
		var m tps.RunMeta
		if err := json.Unmarshal(b, &m); err != nil {
			return usageErr(stderr, cmd, "--meta %s: %v", *metaFile, err)
		}
		meta = &m
	}
	if no.URL == "" {
		host, port, err := splitHostPort(*listen)
		if err != nil {
			return usageErr(stderr, cmd, "--listen: %v", err)
		}
		store := ""
		if *durable {
			store = filepath.Join(*out, ".jetstream")
		}
		// The embedded server requires the collector's credentials, or a
		// token of the user's own: without, any local user (or anyone on
		// the network with --listen 0.0.0.0) could read every record,
		// forge records and delete the durable stream.
		auth := natsconn.Auth{User: no.User, Password: no.Password, Token: no.Token}
		tokenPath := ""
		if auth.User == "" && auth.Token == "" && !*noAuth {
			tok, path, err := natsconn.EnsureToken()
			if err != nil {
				failErr(stderr, "collector", fmt.Errorf("%w (or give TPSPROF_NATS_TOKEN, or --nats-no-auth)", err))
				return exitError
			}
			auth.Token, no.Token, tokenPath = tok, tok, path
		}
		if *noAuth {
			where := "any user of this machine"
			if !natsconn.IsLoopback(host) {
				where = "anyone who reaches " + *listen
			}
			fmt.Fprintf(stderr, "tpsprof collector: warning: --nats-no-auth: %s can read every record, forge records and delete the stream\n", where)
		}
		srv, err := natsconn.StartEmbeddedAuth(host, port, store, auth)
		if err != nil {
			failErr(stderr, "collector", err)
			return exitError
		}
		defer srv.Shutdown()
		no.URL = srv.URL()
		urls, local := natsconn.AgentURLs(host, srv.Server().Addr().(*net.TCPAddr).Port)
		fmt.Fprintf(stdout, "embedded NATS server listening on %s; agents connect with: --nats %s\n", *listen, strings.Join(urls, " (or) "))
		if tokenPath != "" {
			fmt.Fprintf(stdout, "  it requires the token in %s: agents of this user read it there (a shared home included); elsewhere give it as TPSPROF_NATS_TOKEN\n", tokenPath)
		}
		if local {
			fmt.Fprintf(stdout, "  (this machine only: give --listen 0.0.0.0:%d for agents on other nodes)\n", srv.Server().Addr().(*net.TCPAddr).Port)
		}
	}
	cfg := collector.Config{OutDir: *out, NATS: no, Grace: *grace, Meta: meta, Logger: log, Durable: *durable, Role: collector.Role(*role),
		Partition: part, Partitions: parts}
	cfg.AutoCapture, cfg.AutoCaptureEvery = *autoCapture, *autoEvery
	cfg.Writer.PartAge, cfg.Writer.Codec = *partAge, *codec
	cfg.QuietAfter, cfg.MaxJobs, cfg.EvictAfter, cfg.MaxStateBytes = *quietAfter, *maxJobs, *evictAfter, *maxState
	cfg.MetaWait = *metaWait
	if cfg.MetaWait == 0 {
		cfg.MetaWait = -1 // 0 on the command line: not held
	}
	cfg.StreamReplicas, cfg.StreamMaxBytes = *replicas, int64(streamBytes)
	if *live > 0 {
		cfg.Live, cfg.LiveInterval = stdout, *live
	}
	c, err := collector.New(cfg)
	if err != nil {
		failErr(stderr, "collector", err)
		return exitError
	}
	if *httpAddr != "" {
		url, stop, err := serveHTTP(*httpAddr, c.Handler())
		if err != nil {
			c.Close()
			fmt.Fprintf(stderr, "tpsprof collector: --http: %v\n", err)
			return exitError
		}
		defer stop()
		fmt.Fprintf(stdout, "live page %s · metrics %smetrics\n", url, url)
	}
	fmt.Fprintf(stdout, "collecting into %s (Ctrl-C to stop)\n", *out)
	ctx, cancel := signalContext()
	defer cancel()
	<-ctx.Done()
	fmt.Fprintln(stdout, "stopping: closing open steps and finalising Parquet parts")
	err = c.Close()
	st := c.Stats()
	fmt.Fprintf(stdout, "stopped: %d records accepted (%d duplicate, %d late), %d steps closed (%d incomplete), %d jobs; %d rows lost, %d write errors, %d slow-consumer drops\n",
		st.Records, st.Duplicates, st.Late, st.StepsClosed, st.Incomplete, st.Jobs, st.RowsLost, st.WriteErrors, st.SlowConsumer)
	if len(st.Rejected) > 0 {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(st.Rejected)) {
			parts = append(parts, fmt.Sprintf("%s %d", k, st.Rejected[k]))
		}
		fmt.Fprintf(stdout, "rejected: %s\n", strings.Join(parts, ", "))
	}
	if err != nil {
		failErr(stderr, "collector", err)
		return exitError
	}
	return exitOK
}

// serveHTTP serves h on addr and returns its base URL and a stop function.
func serveHTTP(addr string, h http.Handler) (string, func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, err
	}
	srv, lim := collector.NewHTTPServer(h, ln, 0)
	go srv.Serve(lim)
	return "http://" + ln.Addr().String() + "/", func() { srv.Close() }, nil
}

func splitHostPort(s string) (string, int, error) {
	i := strings.LastIndex(s, ":")
	if i < 0 {
		return "", 0, fmt.Errorf("%q is not HOST:PORT", s)
	}
	var port int
	if _, err := fmt.Sscanf(s[i+1:], "%d", &port); err != nil || port < -1 || port > 65535 {
		return "", 0, fmt.Errorf("%q: bad port", s)
	}
	return s[:i], port, nil
}

func runAgent(args []string, stdout, stderr io.Writer) int {
	const cmd = "agent"
	fs := newFlagSet(cmd, "agent --nats URL [--socket PATH] [flags]", `  tpsprof agent --nats nats://collector-host:4222
  tpsprof agent --nats nats://collector-host:4222 --socket /run/tpsprof.sock --node gpu-node-17
`+natsEnvHelp, stderr)
	var no natsconn.Options
	natsFlags(fs, &no)
	socket := fs.String("socket", client.DefaultSocket(), "intake unix socket the ranks write JSON lines to")
	mode := fs.Uint("socket-mode", 0o600, "permission bits of the socket (default owner only; 0660 lets the group write)")
	traceDir := fs.String("trace-dir", "", "folder where ranks write sampled profiler traces for the agent to analyse (default SOCKET.traces)")
	keepTraces := fs.Bool("keep-traces", false, "keep sampled profiler traces after analysing them")
	traceMaxEvents := fs.Int64("trace-max-events", agent.DefaultTraceMaxEvents, "analyse no trace with more events than this: the analysis holds its densest step's events, about 270 B each (the default peaked at 535 MB); a larger trace is skipped and counted as trace:unreadable")
	node := fs.String("node", "", "node name stamped on records (default: host name)")
	buffer := fs.Int("buffer-mb", 64, "MiB of batches held while NATS is unreachable; older ones are dropped past it")
	idle := fs.Duration("idle-timeout", 30*time.Minute, "close an intake connection that sends nothing for this long")
	forget := fs.Duration("forget-after", time.Hour, "stop republishing a job's metadata (every 10 s) and sending GPU samples for it once it has sent nothing for this long; on a socket shared between users, a job no connection has carried this long may be taken by another user")
	stats := fs.Duration("stats", time.Minute, "interval of the counters line (0 to silence it)")
	gpuEvery := fs.Duration("gpu-interval", time.Second, "GPU sampling interval through NVML (0 turns GPU telemetry off)")
	httpAddr := fs.String("http", "", "address of the agent's /metrics, e.g. 127.0.0.1:9466 (empty: off)")
	durable := fs.Bool("durable", false, "publish through JetStream and wait for the stream's acknowledgements (for a collector run with --durable)")
	partials := fs.Bool("partials", false, "also publish per-step node partials, for collectors run with --role aggregator")
	verbose := fs.Bool("v", false, "verbose logging")
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	natsClientSecrets(&no)
	if no.URL == "" {
		return usageErr(stderr, cmd, "--nats is required (the URL the collector printed)")
	}
	if *mode > 0o777 {
		return usageErr(stderr, cmd, "--socket-mode %o is not a permission mode", *mode)
	}
	log := newLogger(stderr, *verbose)
	var gpu agent.GPUReader
	if *gpuEvery > 0 {
		r, err := agent.OpenNVML()
		if err != nil {
			log.Warn("GPU telemetry is off; step records are served as usual", "why", err)
		} else {
			gpu = r
			log.Info("GPU telemetry on", "gpus", len(r.Devices()), "interval", *gpuEvery)
		}
	}
	a, err := agent.Start(agent.Config{Socket: *socket, SocketMode: os.FileMode(*mode), NATS: no, Node: *node,
		TraceDir: *traceDir, KeepTraces: *keepTraces, TraceMaxEvents: *traceMaxEvents,
		BufferBytes: *buffer << 20, IdleTimeout: *idle, ForgetAfter: *forget, Logger: log, GPU: gpu, GPUInterval: *gpuEvery, Durable: *durable, Partials: *partials})
	if err != nil {
		failErr(stderr, "agent", err)
		return exitError
	}
	fmt.Fprintf(stdout, "agent for node %s: ranks write to %s, publishing to %s\n", a.Node(), a.Socket(), natsconn.Redacted(no.URL))
	if *httpAddr != "" {
		url, stop, err := serveHTTP(*httpAddr, a.Handler())
		if err != nil {
			a.Close()
			fmt.Fprintf(stderr, "tpsprof agent: --http: %v\n", err)
			return exitError
		}
		defer stop()
		fmt.Fprintf(stdout, "metrics at %smetrics\n", url)
	}
	ctx, cancel := signalContext()
	defer cancel()
	var tick <-chan time.Time
	if *stats > 0 {
		t := time.NewTicker(*stats)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			a.Close()
			s := a.Stats()
			var rejected int64
			for _, n := range s.Rejected {
				rejected += n
			}
			fmt.Fprintf(stdout, "stopped: %d records received, %d published, %d dropped, %d rejected\n", s.Records, s.Published, s.Dropped, rejected)
			return exitOK
		case <-tick:
			s := a.Stats()
			log.Info("agent", "records", s.Records, "published", s.Published, "dropped", s.Dropped, "rejected", s.Rejected, "nats_connected", s.NATSConnected)
		}
	}
}

func runLaunch(args []string, stdout, stderr io.Writer) int {
	const cmd = "launch"
	fs := newFlagSet(cmd, "launch --job ID [flags] -- COMMAND [ARGS...]", `  # torchrun under tpsprof: ranks find the agent through TPSPROF_SOCKET
  tpsprof launch --job llama-8b --nats nats://collector:4222 --dp 4 --tp 8 --pp 2 --model llama3-8b --gpu h100-sxm \
      -- torchrun --nproc-per-node 8 train.py

  # an unmodified PyTorch script, measured (data wait, forward, backward, optimizer, communication)
  tpsprof launch --auto --job llama-8b --nats nats://collector:4222 -- torchrun --nproc-per-node 8 train.py

It starts an agent in process when none serves the socket, exports TPSPROF_SOCKET, TPSPROF_JOB,
TPSPROF_ATTEMPT, TPSPROF_TOPOLOGY and TPSPROF_NODE, puts the tpsprof Python package on
PYTHONPATH (import tpsprof works with nothing installed), forwards SIGINT and SIGTERM, records
attempt_start and attempt_end events and exits with the command's exit code.

Attempts: without --attempt, launch asks the collector. Nodes of one launch join the attempt
the first of them started; a new launch under a job id that has data becomes the next attempt,
so it is reported apart and never dropped as duplicates. torchrun's elastic restarts add their
restart count to the attempt inside the ranks.
`+natsEnvHelp, stderr)
	var no natsconn.Options
	natsFlags(fs, &no)
	job := fs.String("job", os.Getenv(launch.EnvJob), "job id, 1-64 characters of [A-Za-z0-9_-] (default $TPSPROF_JOB)")
	attempt := fs.Int64("attempt", -1, "attempt of this launch (default: asked of the collector, see below)")
	auto := fs.Bool("auto", false, "zero-code capture: instrument the Python training script without changing it")
	flopsEvery := fs.Int64("flops-every", -1, "steps between FLOP counts by PyTorch's FlopCounterMode (torch >= 2.1): the third step is counted, then every N; the counted steps are left out of the figures; 0 for none (default: the package's, 1000)")
	tokensPerStep := fs.Int64("tokens-per-step", 0, "tokens each rank trains a step (micro-batches × sequence length, over gradient accumulation), for loops whose tokens no DataLoader or model input shows; the job's own tokens= or add_tokens win")
	tensorboard := fs.String("tensorboard", "", "also write each rank's per-step figures as TensorBoard event files into DIR/rank<N> (the job's own W&B, TensorBoard and MLflow runs get them anyway: docs/trackers.md)")
	noTrackers := fs.Bool("no-trackers", false, "keep tpsprof's figures out of the job's W&B, TensorBoard and MLflow runs")
	pyDir := fs.String("python-dir", "", "where the Python package is unpacked for PYTHONPATH (default: the user cache dir; - for none)")
	socket := fs.String("socket", client.DefaultSocket(), "intake socket of the node's agent")
	var topo tps.Topology
	fs.IntVar(&topo.DP, "dp", 0, "data-parallel size")
	fs.IntVar(&topo.TP, "tp", 0, "tensor-parallel size")
	fs.IntVar(&topo.PP, "pp", 0, "pipeline-parallel size")
	fs.IntVar(&topo.CP, "cp", 0, "context-parallel size")
	fs.IntVar(&topo.EP, "ep", 0, "expert-parallel size (carved out of dp)")
	micro := fs.Int("micro-batches", 0, "micro-batches per step (for the theoretical pipeline bubble)")
	model := fs.String("model", "", "model preset, for MFU")
	hfConfig := fs.String("hf-config", "", "Hugging Face config.json of the model, for MFU (instead of --model)")
	seq := fs.Int("seq", 0, "training sequence length (the attention term of MFU; default: the preset's)")
	attention := fs.String("attention", "", "causal-attention FLOPs convention: full (default) or causal")
	gpu := fs.String("gpu", "", "GPU name or table key, for MFU (default: what NVML reports)")
	dtype := fs.String("dtype", "", "training dtype (default bf16)")
	price := fs.Float64("gpu-hour-usd", 0, "price of a GPU-hour, for cost per million tokens")
	dash := len(args)
	for i, a := range args {
		if a == "--" {
			dash = i
			break
		}
	}
	if code, ok := parseFlags(fs, args[:dash], stderr); !ok {
		return code
	}
	natsClientSecrets(&no)
	if dash >= len(args)-1 {
		return usageErr(stderr, cmd, "no command: put it after --")
	}
	if !tps.ValidJobID(*job) {
		return usageErr(stderr, cmd, "--job %q: give 1-64 characters of [A-Za-z0-9_-]", *job)
	}
	if topo != (tps.Topology{}) {
		if err := topo.Validate(0); err != nil {
			return usageErr(stderr, cmd, "%v", err)
		}
	}
	if *model != "" && *hfConfig != "" {
		return usageErr(stderr, cmd, "--model and --hf-config both given: choose one")
	}
	if *seq < 0 {
		return usageErr(stderr, cmd, "--seq %d must not be negative", *seq)
	}
	var flops *int64
	if *flopsEvery >= 0 {
		flops = flopsEvery
	} else if *flopsEvery != -1 {
		return usageErr(stderr, cmd, "--flops-every %d: give 0 (never) or the steps between counts", *flopsEvery)
	}
	if *tokensPerStep < 0 || *tokensPerStep > tps.MaxTokens {
		return usageErr(stderr, cmd, "--tokens-per-step %d: give the tokens one rank trains a step, 1 to %d", *tokensPerStep, tps.MaxTokens)
	}
	if *attention != "" && *attention != "full" && *attention != "causal" {
		return usageErr(stderr, cmd, "--attention %q: want full or causal", *attention)
	}
	meta := tps.RunMeta{Topology: topo, MicroBatches: *micro, ModelPreset: *model, Seq: *seq, Attention: *attention, GPU: *gpu, DType: *dtype, GPUHourUSD: *price}
	if *hfConfig != "" {
		b, err := os.ReadFile(*hfConfig)
		if err != nil {
			return usageErr(stderr, cmd, "--hf-config: %v", err)
		}
		m, err := mfu.FromHFConfig(b)
		if err != nil {
			return usageErr(stderr, cmd, "--hf-config %s: %v", *hfConfig, err)
		}
		if *seq == 0 {
			return usageErr(stderr, cmd, "--hf-config needs --seq: config.json gives the model's context limit, not the length it is trained at")
		}
		meta.Model = &m
	}
	if meta.Model != nil || meta.ModelPreset != "" {
		model, _, err := meta.ResolvedModel()
		if err == nil {
			_, err = model.Count(mfu.Attention(meta.Attention), mfu.RecomputeNone)
		}
		if err != nil {
			return usageErr(stderr, cmd, "%v", err)
		}
	}
	log := newLogger(stderr, false)
	acfg := agent.Config{Socket: *socket, NATS: no, Logger: log}
	if r, err := agent.OpenNVML(); err == nil {
		acfg.GPU = r // used only if launch starts its own agent
	} else {
		log.Debug("GPU telemetry off", "why", err)
	}
	if *attempt < -1 {
		return usageErr(stderr, cmd, "--attempt %d: give 0 or more", *attempt)
	}
	code, err := launch.Run(context.Background(), launch.Config{Job: *job, Attempt: max(*attempt, 0),
		ChooseAttempt: *attempt < 0, Auto: *auto, TokensPerStep: *tokensPerStep, FlopsEvery: flops, PythonDir: *pyDir, Meta: meta,
		TensorBoard: *tensorboard, NoTrackers: *noTrackers,
		Agent: acfg, Command: args[dash+1:], Stdout: stdout, Stderr: stderr})
	if acfg.GPU != nil {
		acfg.GPU.Close() // the agent Launch started has closed it already; Close is idempotent
	}
	if err != nil {
		failErr(stderr, "launch", err)
	}
	return code
}

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

// envOr is the environment variable's value, or def where it is unset.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progressPrinter redraws one progress line at most ten times a second.
func progressPrinter(w io.Writer) func(done, total int64) {
	var last time.Time
	return func(done, total int64) {
		if time.Since(last) < 100*time.Millisecond && done < total {
			return
		}
		last = time.Now()
		if total > 0 {
			fmt.Fprintf(w, "\rreading rank_steps: %d of %d rows (%.0f%%)", done, total, 100*float64(done)/float64(total))
		} else {
			fmt.Fprintf(w, "\rreading rank_steps: %d rows", done)
		}
	}
}
