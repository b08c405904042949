package collector

import (
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/tpsprof/tpsprof/fleet"

	"github.com/tpsprof/tpsprof/tps"
)

// The metrics, one row each: name, help, labels, type, and what its value
// is, read from what the collector already publishes (a job's figures,
// the node pass's view, the collector's counters). Names follow
// Prometheus conventions: base units, _total for counters, _ratio for
// fractions. Labels are bounded: job (the jobs this collector serves),
// host (at most maxNodeGauges), reason (a fixed set); per-rank detail
// stays in Parquet. Describe and Collect walk the rows: a metric is its
// row and nothing else.

// put emits one value of a metric, with its labels past job or host.
type put func(v float64, labels ...string)

// when says which of a job's figures a job metric needs: a job's metric
// is exported only when they are there.
type when int

const (
	always  when = iota // every job
	ranked              // a known world size
	stepped             // a closed step
	fresh               // a closed step, the job not silent past StaleAfter (a silent job's rate gauges go: Prometheus marks them stale, so rate alerts neither fire on nor hide a hang; TrainingStalled watches the timestamp)
	window              // fresh, with closed steps in its live window
)

// jobMetric is a per-job metric (label job first).
type jobMetric struct {
	name, help string
	labels     []string // past job
	kind       prometheus.ValueType
	when       when
	val        func(f *liveFigures, put put)
	desc       *prometheus.Desc
}

var gauge, counter = prometheus.GaugeValue, prometheus.CounterValue

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

var jobMetrics = []*jobMetric{
	{name: "tpsprof_cluster_tokens_per_second", help: "Training tokens per second of the job's last 10 closed steps: their tokens over their step time (tokens counted once per data-parallel replica); absent while they counted no token. Over any range: rate(tpsprof_tokens_total) / rate(tpsprof_step_seconds_total).",
		kind: gauge, when: window, val: func(f *liveFigures, put put) {
			if f.win.tpsUnknown == "" {
				put(f.win.tps)
			}
		}},
	{name: "tpsprof_cluster_tokens_per_second_per_gpu", help: "tpsprof_cluster_tokens_per_second divided by the world size.",
		kind: gauge, when: window, val: func(f *liveFigures, put put) {
			if f.win.tpsUnknown == "" {
				put(f.win.perGPU)
			}
		}},
	{name: "tpsprof_mfu_counted", help: "1 where tpsprof_mfu_ratio and tpsprof_hfu_ratio are from the FLOPs PyTorch counted on sampled steps (the job declares no model), 0 where from the analytic model.",
		kind: gauge, when: fresh, val: func(f *liveFigures, put put) {
			if f.win.hfu != nil {
				put(b2f(f.win.counted))
			}
		}},
	{name: "tpsprof_mfu_ratio", help: "Model FLOPs utilisation of the last 10 closed steps (each weighted by its step time); absent while it is unknown (no model or GPU, no tokens, a topology that does not match the ranks, or inputs that would exceed 100%: /api/summary says why).",
		kind: gauge, when: fresh, val: func(f *liveFigures, put put) {
			if f.win.mfu != nil {
				put(*f.win.mfu)
			}
		}},
	{name: "tpsprof_hfu_ratio", help: "Hardware FLOPs utilisation (with recompute) of the last 10 closed steps; absent while MFU is unknown.",
		kind: gauge, when: fresh, val: func(f *liveFigures, put put) {
			if f.win.hfu != nil {
				put(*f.win.hfu)
			}
		}},
	{name: "tpsprof_step_time_share_ratio", help: "Where the last 10 closed steps' time went, by part (compute, exposed_comm, waiting_for_peers, bubble, data_stall, checkpoint, host_other): each part's time, mean over ranks, over their step time; the parts add up to 1.",
		labels: []string{"part"}, kind: gauge, when: window, val: func(f *liveFigures, put put) {
			for _, p := range tps.ShareParts() {
				put(*p.Of(&f.win.shares), p.Key)
			}
		}},
	{name: "tpsprof_step_time_split_ratio", help: "Time a measure splits out of a part of tpsprof_step_time_share_ratio (part compute, split gc: the training thread's time in Python's garbage collector; part host_other, split host: its CPU work before the forward), last 10 closed steps, over their step time; at most its part's share, and not a part of its own.",
		labels: []string{"part", "split"}, kind: gauge, when: window, val: func(f *liveFigures, put put) {
			for _, sp := range tps.ShareSplits() {
				if v, ok := f.win.shares.Splits[sp.Name]; ok {
					put(v, sp.Part, strings.TrimSuffix(sp.Name, "_ns"))
				}
			}
		}},
	{name: "tpsprof_mfu_lost_points", help: "Where the last 10 closed steps' MFU went: points of the GPUs' peak lost to each bucket (the time outside compute at the window's MFU over compute time, by breakdown part; compute_efficiency the rest); with 100 × tpsprof_mfu_ratio they add up to 100.",
		labels: []string{"bucket"}, kind: gauge, when: window, val: func(f *liveFigures, put put) {
			if l, _ := f.win.ledger(); l != nil {
				for _, b := range l.Lost {
					put(b.Points, b.Key)
				}
			}
		}},
	{name: "tpsprof_waiting_for_peers_ratio", help: "Time ranks spent blocked in collectives until the slowest rank arrived, as a share of step time, last 10 closed steps (the part waiting_for_peers of tpsprof_step_time_share_ratio).",
		kind: gauge, when: window, val: func(f *liveFigures, put put) { put(f.win.shares.WaitingForPeers) }},
	{name: "tpsprof_step_seconds_total", help: "Step time of all closed steps (the period of each on the critical path): rate(tpsprof_tokens_total) / rate(tpsprof_step_seconds_total) is tokens over step time over any range.",
		kind: counter, val: func(f *liveFigures, put put) { put(f.stepSeconds) }},
	{name: "tpsprof_step_time_seconds", help: "Step time of the last closed step: its period on the critical path (docs/report.md).",
		kind: gauge, when: fresh, val: func(f *liveFigures, put put) { put(float64(f.last.StepTimeNs) / 1e9) }},
	{name: "tpsprof_last_step", help: "Step number of the last closed step.",
		kind: gauge, when: stepped, val: func(f *liveFigures, put put) { put(float64(f.last.Step)) }},
	{name: "tpsprof_job_running", help: "1 while the job runs, 0 once its last attempt ended (an attempt_end or job_end event, until its next record): a silent running job is hung, a silent ended one finished.",
		kind: gauge, when: stepped, val: func(f *liveFigures, put put) { put(b2f(!f.ended)) }},
	{name: "tpsprof_last_step_timestamp_seconds", help: "When the job's last step closed, on the collector's clock (Unix seconds): time() minus it is how long the job has been silent, what tells a hung or dead job from a running one.",
		kind: gauge, when: stepped, val: func(f *liveFigures, put put) { put(float64(f.lastClosedAt.UnixNano()) / 1e9) }},
	{name: "tpsprof_exposed_comm_ratio", help: "Exposed communication as a fraction of step time, mean over ranks, last closed step.",
		kind: gauge, when: fresh, val: func(f *liveFigures, put put) { put(f.last.CommFractionMean) }},
	{name: "tpsprof_pipeline_bubble_ratio", help: "Pipeline wait as a fraction of step time, mean over ranks, last closed step.",
		kind: gauge, when: fresh, val: func(f *liveFigures, put put) { put(f.last.BubbleFractionMean) }},
	{name: "tpsprof_data_stall_ratio", help: "Data-loader wait as a fraction of step time, mean over ranks, last closed step.",
		kind: gauge, when: fresh, val: func(f *liveFigures, put put) { put(f.last.DataStallFractionMean) }},
	{name: "tpsprof_job_records_duplicate_total", help: "The job's step records that repeated an (attempt, step, rank) already taken, dropped: above 0 while records arrive, two processes report one rank (rank and world size not set), and one's steps and tokens are not counted.",
		kind: counter, when: ranked, val: func(f *liveFigures, put put) { put(float64(f.duplicates)) }},
	{name: "tpsprof_world_size", help: "Ranks in the job.",
		kind: gauge, when: ranked, val: func(f *liveFigures, put put) { put(float64(f.world)) }},
	{name: "tpsprof_stragglers", help: "Ranks whose recent own time (compute, data wait and host work) is more than 1/0.75 of the fastest rank's.",
		kind: gauge, when: ranked, val: func(f *liveFigures, put put) { put(float64(f.stragglers)) }},
	{name: "tpsprof_straggler_episodes_open", help: "Straggler episodes under way: nodes (or ranks without a node) whose recent own time (compute, data wait and host work) has been more than 1/0.75 of the fastest rank's since the episode began (the live page lists them, with the cause).",
		kind: gauge, when: ranked, val: func(f *liveFigures, put put) { put(float64(f.episodesOpen)) }},
	{name: "tpsprof_straggler_episodes_ended_total", help: "Straggler episodes that ended.",
		kind: counter, when: ranked, val: func(f *liveFigures, put put) { put(float64(f.episodesEnded)) }},
	{name: "tpsprof_generation_output_tokens_per_second", help: "Generated tokens per second of the last closed step's generation phase (RL rollouts): tokens generated by all ranks over the slowest rank's generation time.",
		kind: gauge, when: fresh, val: func(f *liveFigures, put put) {
			if f.last.GenNsMax > 0 {
				put(f.last.GenOutputTPS)
			}
		}},
	{name: "tpsprof_generation_share_ratio", help: "Share of the last closed step's time ranks spent generating (mean over ranks).",
		kind: gauge, when: fresh, val: func(f *liveFigures, put put) {
			if f.last.GenNsMax > 0 {
				put(f.last.GenFractionMean)
			}
		}},
	{name: "tpsprof_mfu_training_ratio", help: "MFU of the last closed step's training phase alone (the update's FLOPs over the step time less the generation); absent without a generation phase or when MFU is unknown.",
		kind: gauge, when: fresh, val: func(f *liveFigures, put put) {
			if l := f.last; l.GenNsMax > 0 && l.MFUTraining > 0 && l.MFUUnknown == "" {
				put(l.MFUTraining)
			}
		}},
	{name: "tpsprof_bytes_per_second", help: "UTF-8 bytes of training text per second of the last closed step, when ranks report bytes: compares runs whose tokenizers differ.",
		kind: gauge, when: fresh, val: func(f *liveFigures, put put) {
			if f.last.BytesPerSecond > 0 {
				put(f.last.BytesPerSecond)
			}
		}},
	{name: "tpsprof_tokens_per_joule", help: "Tokens per joule of GPU energy, last closed step with GPU samples.",
		kind: gauge, when: fresh, val: func(f *liveFigures, put put) {
			if f.tokensPerJoule > 0 {
				put(f.tokensPerJoule)
			}
		}},
	{name: "tpsprof_steps_closed_total", help: "Cluster steps closed.",
		kind: counter, val: func(f *liveFigures, put put) { put(float64(f.closed)) }},
	{name: "tpsprof_steps_incomplete_total", help: "Cluster steps closed with ranks missing.",
		kind: counter, val: func(f *liveFigures, put put) { put(float64(f.incomplete)) }},
	{name: "tpsprof_tokens_total", help: "Training tokens of all closed steps.",
		kind: counter, val: func(f *liveFigures, put put) { put(float64(f.tokens)) }},
}

// latencyMetrics are the per-job summaries of generation latencies.
var latencyMetrics = []struct {
	name, help string
	of         func(f *liveFigures) *latencySummary
	desc       *prometheus.Desc
}{
	{name: "tpsprof_generation_ttft_seconds", help: "Time to first token of generated requests over the recent rollout events of all ranks (merged sketches: quantiles within 1% relative accuracy).",
		of: func(f *liveFigures) *latencySummary { return f.ttft }},
	{name: "tpsprof_generation_itl_seconds", help: "Inter-token latency of generated requests over the recent rollout events of all ranks (merged sketches: quantiles within 1% relative accuracy).",
		of: func(f *liveFigures) *latencySummary { return f.itl }},
}

// nodeMetric is a per-host metric of the fleet's node health across
// finished jobs (docs/nodes.md; label host first).
type nodeMetric struct {
	name, help string
	labels     []string
	val        func(n *fleet.Node, put put)
	desc       *prometheus.Desc
}

var nodeMetrics = []*nodeMetric{
	{name: "tpsprof_node_excess_ratio", help: "A host's own time (its slowest rank's compute and data time) over its jobs' median ranks, minus 1: a mean decayed over the finished jobs that ran on it, newest weighing most (0.03: 3% slower than the median rank).",
		val: func(n *fleet.Node, put put) { put(n.Score) }},
	{name: "tpsprof_node_cost_gpu_hours", help: "GPU-hours a host's excess own time cost the finished jobs that ran on it, the other ranks' waiting for it included.",
		val: func(n *fleet.Node, put put) { put(n.CostGPUHours) }},
	{name: "tpsprof_node_jobs", help: "Finished jobs that ran on a host (job), and those that found it slow (slow: 2% or more over the job's median rank).",
		labels: []string{"kind"}, val: func(n *fleet.Node, put put) { put(float64(n.Jobs), "job"); put(float64(n.SlowJobs), "slow") }},
	{name: "tpsprof_node_drain_candidate", help: "1 for a host to drain: slow in 3 or more jobs, or one job's strong hardware evidence (a GPU throttling in a quarter of its samples, XID or uncorrectable ECC events); `tpsprof nodes` and the live page say why.",
		val: func(n *fleet.Node, put put) { put(b2f(n.Drain)) }},
}

// collectorMetric is one of the collector's own (no job label).
type collectorMetric struct {
	name, help string
	labels     []string
	kind       prometheus.ValueType
	val        func(c *Collector, st *Stats, put put)
	desc       *prometheus.Desc
}

var collectorMetrics = []*collectorMetric{
	{name: "tpsprof_records_accepted_total", help: "Step records accepted (first copies).",
		kind: counter, val: func(_ *Collector, st *Stats, put put) { put(float64(st.Records)) }},
	{name: "tpsprof_records_duplicate_total", help: "Step records that repeated (job, attempt, step, rank).",
		kind: counter, val: func(_ *Collector, st *Stats, put put) { put(float64(st.Duplicates)) }},
	{name: "tpsprof_records_late_total", help: "Step records that arrived after their step closed.",
		kind: counter, val: func(_ *Collector, st *Stats, put put) { put(float64(st.Late)) }},
	{name: "tpsprof_records_redelivered_total", help: "Durable mode: step records of messages handed back after a part could not be written, handled again (not counted again as accepted, duplicate or late).",
		kind: counter, val: func(_ *Collector, st *Stats, put put) { put(float64(st.Redelivered)) }},
	{name: "tpsprof_node_files_unreadable_total", help: "Kept node files (OUT/nodes/<job>.parquet) the node passes could not read: corrupt, lying or out of range; each was recomputed from its job's folder.",
		kind: counter, val: func(_ *Collector, st *Stats, put put) { put(float64(st.NodeFilesUnreadable)) }},
	{name: "tpsprof_node_keep_failures_total", help: "Jobs whose node rows a node pass could not keep in OUT/nodes/ (a full disk): the view still holds them, computed again next pass.",
		kind: counter, val: func(_ *Collector, st *Stats, put put) { put(float64(st.NodeKeepFailed)) }},
	{name: "tpsprof_records_rejected_total", help: "Records and messages rejected, by reason.",
		labels: []string{"reason"}, kind: counter, val: func(_ *Collector, st *Stats, put put) {
			for reason, n := range st.Rejected {
				put(float64(n), reason)
			}
		}},
	{name: "tpsprof_parquet_write_errors_total", help: "Failed Parquet writes.",
		kind: counter, val: func(_ *Collector, st *Stats, put put) { put(float64(st.WriteErrors)) }},
	{name: "tpsprof_rows_lost_total", help: "Rows of any table that failed to reach a finalised Parquet part (write errors, folders that could not be created).",
		kind: counter, val: func(_ *Collector, st *Stats, put put) { put(float64(st.RowsLost)) }},
	{name: "tpsprof_nats_slow_consumer_drops_total", help: "Messages NATS dropped because the collector fell behind.",
		kind: counter, val: func(_ *Collector, st *Stats, put put) { put(float64(st.SlowConsumer)) }},
	{name: "tpsprof_stale_parts_removed_total", help: "Unfinished part files of a writer that died (kill -9, crash) removed at start-up; their rows were lost then.",
		kind: counter, val: func(_ *Collector, st *Stats, put put) { put(float64(st.StaleParts)) }},
	{name: "tpsprof_collector_state_bytes", help: "Memory the jobs' declared world sizes claim (open steps, recent rank bits, per-rank figures); past --max-state-bytes records are rejected (world_size:memory).",
		kind: gauge, val: func(_ *Collector, st *Stats, put put) { put(float64(st.StateBytes)) }},
	{name: "tpsprof_nats_connected", help: "1 when the collector is connected to NATS.",
		kind: gauge, val: func(c *Collector, _ *Stats, put put) { put(b2f(c.nc.IsConnected())) }},
}

// descs are every metric's description (Describe sends them), built from
// the rows once.
var descs = func() []*prometheus.Desc {
	var out []*prometheus.Desc
	add := func(name, help string, labels []string) *prometheus.Desc {
		d := prometheus.NewDesc(name, help, labels, nil)
		out = append(out, d)
		return d
	}
	for _, m := range jobMetrics {
		m.desc = add(m.name, m.help, append([]string{"job"}, m.labels...))
	}
	for i := range latencyMetrics {
		m := &latencyMetrics[i]
		m.desc = add(m.name, m.help, []string{"job"})
	}
	for _, m := range nodeMetrics {
		m.desc = add(m.name, m.help, append([]string{"host"}, m.labels...))
	}
	for _, m := range collectorMetrics {
		m.desc = add(m.name, m.help, m.labels)
	}
	return out
}()

// metricsCollector reads the collector's state at scrape time, so the
// metrics never drift from what the collector counts.
type metricsCollector struct{ c *Collector }

func (m metricsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range descs {
		ch <- d
	}
}

// Collect walks the rows. Scrapes take no job's lock: each job publishes
// its figures at every closed step (job.settle), the counters are atomics.
func (m metricsCollector) Collect(ch chan<- prometheus.Metric) {
	c := m.c
	emit := func(d *prometheus.Desc, kind prometheus.ValueType, first string) put {
		return func(v float64, labels ...string) {
			if first != "" {
				labels = append([]string{first}, labels...)
			}
			ch <- prometheus.MustNewConstMetric(d, kind, v, labels...)
		}
	}
	for _, j := range c.jobList() {
		f := j.live.Load()
		id := j.st.id
		var has [window + 1]bool
		has[always], has[ranked], has[stepped] = true, f.world > 0, f.last != nil
		has[fresh] = has[stepped] && time.Since(f.lastClosedAt) <= c.cfg.StaleAfter
		has[window] = has[fresh] && f.win.steps > 0
		for _, jm := range jobMetrics {
			if has[jm.when] {
				jm.val(f, emit(jm.desc, jm.kind, id))
			}
		}
		for _, l := range latencyMetrics {
			if s := l.of(f); s != nil {
				ch <- prometheus.MustNewConstSummary(l.desc, s.count, s.sum, s.quantiles, id)
			}
		}
	}
	if v := c.Nodes(); v != nil {
		for i := range v.Nodes[:min(len(v.Nodes), maxNodeGauges)] {
			n := &v.Nodes[i]
			for _, nm := range nodeMetrics {
				nm.val(n, emit(nm.desc, gauge, n.Host))
			}
		}
	}
	st := c.Stats()
	for _, cm := range collectorMetrics {
		cm.val(c, &st, emit(cm.desc, cm.kind, ""))
	}
}

// Registry returns a Prometheus registry holding the collector's metrics
// (and Go runtime and process metrics).
func (c *Collector) Registry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(metricsCollector{c}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}
