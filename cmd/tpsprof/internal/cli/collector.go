package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tpsprof/tpsprof/collector"
	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

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
	nodesRetention := fs.Duration("nodes-retention", 0, "leave the jobs whose folders last changed longer ago than this out of the node view, and remove their kept rows from OUT/nodes/ (0: keep every job)")
	nodesEvery := fs.Duration("nodes-every", time.Minute, "bring the node health across finished jobs up to date this often (OUT/nodes/, /api/nodes, tpsprof_node_* metrics; 0: never)")
	evictAfter := fs.Duration("evict-after", 10*time.Minute, "close and forget a job idle this long (its parts finalised; it starts new parts if it returns)")
	codec := fs.String("parquet-codec", "zstd", "Parquet compression: zstd (smallest), zstd-fast (~1.3x faster to write, ~9% larger), snappy (~1.6x faster, ~1.6x larger) or none (~2.3x faster, ~5x larger); see BENCHMARKS.md")
	httpAddr := fs.String("http", "127.0.0.1:9465", "address of /metrics (Prometheus), /api/summary and the live page (empty: off)")
	role := fs.String("role", "all", "all; or, to scale past one collector (docs/scale.md): aggregator (merges the node partials agents send with --partials) or rank-writer (a queue group writing rank_steps)")
	partition := fs.String("partition", "", "I/N: this is collector I (0-based) of N of the same role, each keeping the share of the traffic that hashes to it: jobs for all and aggregator, a job's nodes for rank-writer (which then drops resent rank rows exactly); docs/scale.md")
	durable := fs.Bool("durable", false, "read through a JetStream stream and acknowledge only what is in finalised Parquet parts: a restart or crash loses nothing (the embedded server stores the stream under OUT/.jetstream; with --role, give every role the same --nats server with JetStream: docs/reliability.md)")
	autoCapture := fs.Bool("auto-capture", false, "when a straggler episode has stayed open 5 steps, profile one step on its rank and the fastest rank (as tpsprof trace does) and link the capture to the episode")
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
	part, parts, err := parsePartition(*partition, *durable)
	if err != nil {
		return usageErr(stderr, cmd, "%s", err)
	}
	log := newLogger(stderr, *verbose)
	meta, err := readMetaFile(*metaFile)
	if err != nil {
		return usageErr(stderr, cmd, "%s", err)
	}
	if no.URL == "" {
		shutdown, code, ok := embeddedNATS(&no, *listen, *out, *durable, *noAuth, stdout, stderr)
		if !ok {
			return code
		}
		defer shutdown()
	}
	cfg := collector.Config{OutDir: *out, NATS: no, Grace: *grace, Meta: meta, Logger: log, Durable: *durable, Role: collector.Role(*role),
		Partition: part, Partitions: parts}
	cfg.AutoCapture, cfg.AutoCaptureEvery = *autoCapture, *autoEvery
	cfg.Writer.PartAge, cfg.Writer.Codec = *partAge, *codec
	cfg.QuietAfter, cfg.MaxJobs, cfg.EvictAfter, cfg.MaxStateBytes = *quietAfter, *maxJobs, *evictAfter, *maxState
	cfg.MetaWait = *metaWait
	cfg.NodesEvery, cfg.NodesRetention = *nodesEvery, *nodesRetention
	if *nodesRetention < 0 {
		return usageErr(stderr, cmd, "--nodes-retention: 0 or more")
	}
	if cfg.NodesEvery == 0 {
		cfg.NodesEvery = -1 // 0 on the command line: never
	}
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
	printStopped(stdout, c.Stats())
	if err != nil {
		failErr(stderr, "collector", err)
		return exitError
	}
	return exitOK
}

// parsePartition reads --partition I/N (0, 0 when not given).
func parsePartition(s string, durable bool) (part, parts int, err error) {
	if s == "" {
		return 0, 0, nil
	}
	i, n, ok := strings.Cut(s, "/")
	a, errA := strconv.Atoi(i)
	b, errB := strconv.Atoi(n)
	if !ok || errA != nil || errB != nil || b < 1 || a < 0 || a >= b {
		return 0, 0, fmt.Errorf("--partition %q: want I/N with 0 <= I < N, e.g. 0/4", s)
	}
	if durable && b > 1 {
		return 0, 0, errors.New("--partition does not combine with --durable")
	}
	return a, b, nil
}

// readMetaFile reads --meta (nil when not given).
func readMetaFile(path string) (*tps.RunMeta, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read --meta: %v", err)
	}
	var m tps.RunMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("--meta %s: %v", path, err)
	}
	return &m, nil
}

// embeddedNATS starts the collector's embedded server on listen and sets
// no's URL (and token) to it; ok false: the exit code.
func embeddedNATS(no *natsconn.Options, listen, out string, durable, noAuth bool, stdout, stderr io.Writer) (shutdown func(), code int, ok bool) {
	host, port, err := splitHostPort(listen)
	if err != nil {
		return nil, usageErr(stderr, "collector", "--listen: %v", err), false
	}
	store := ""
	if durable {
		store = filepath.Join(out, ".jetstream")
	}
	// The embedded server requires the collector's credentials, or a
	// token of the user's own: without, any local user (or anyone on
	// the network with --listen 0.0.0.0) could read every record,
	// forge records and delete the durable stream.
	auth := natsconn.Auth{User: no.User, Password: no.Password, Token: no.Token}
	tokenPath := ""
	if auth.User == "" && auth.Token == "" && !noAuth {
		tok, path, err := natsconn.EnsureToken()
		if err != nil {
			failErr(stderr, "collector", fmt.Errorf("%w (or give TPSPROF_NATS_TOKEN, or --nats-no-auth)", err))
			return nil, exitError, false
		}
		auth.Token, no.Token, tokenPath = tok, tok, path
	}
	if noAuth {
		where := "any user of this machine"
		if !natsconn.IsLoopback(host) {
			where = "anyone who reaches " + listen
		}
		fmt.Fprintf(stderr, "tpsprof collector: warning: --nats-no-auth: %s can read every record, forge records and delete the stream\n", where)
	}
	srv, err := natsconn.StartEmbeddedAuth(host, port, store, auth)
	if err != nil {
		failErr(stderr, "collector", err)
		return nil, exitError, false
	}
	no.URL = srv.URL()
	urls, local := natsconn.AgentURLs(host, srv.Server().Addr().(*net.TCPAddr).Port)
	fmt.Fprintf(stdout, "embedded NATS server listening on %s; agents connect with: --nats %s\n", listen, strings.Join(urls, " (or) "))
	if tokenPath != "" {
		fmt.Fprintf(stdout, "  it requires the token in %s: agents of this user read it there (a shared home included); elsewhere give it as TPSPROF_NATS_TOKEN\n", tokenPath)
	}
	if local {
		fmt.Fprintf(stdout, "  (this machine only: give --listen 0.0.0.0:%d for agents on other nodes)\n", srv.Server().Addr().(*net.TCPAddr).Port)
	}
	return srv.Shutdown, exitOK, true
}

// printStopped prints what a stopped collector did.
func printStopped(stdout io.Writer, st collector.Stats) {
	fmt.Fprintf(stdout, "stopped: %d records accepted (%d duplicate, %d late), %d steps closed (%d incomplete), %d jobs; %d rows lost, %d write errors, %d slow-consumer drops\n",
		st.Records, st.Duplicates, st.Late, st.StepsClosed, st.Incomplete, st.Jobs, st.RowsLost, st.WriteErrors, st.SlowConsumer)
	if len(st.Rejected) > 0 {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(st.Rejected)) {
			parts = append(parts, fmt.Sprintf("%s %d", k, st.Rejected[k]))
		}
		fmt.Fprintf(stdout, "rejected: %s\n", strings.Join(parts, ", "))
	}
}
