package cli

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/client"
	"github.com/tpsprof/tpsprof/natsconn"
)

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
