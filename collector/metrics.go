package collector

import (
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/tpsprof/tpsprof/tps"
)

// Metric descriptions. Names follow Prometheus conventions: base units,
// _total for counters, _ratio for fractions. Labels are bounded: job (the
// jobs this collector serves) and reason (a fixed set); per-rank detail
// stays in Parquet.
var (
	descTPS        = newDesc("tpsprof_cluster_tokens_per_second", "Training tokens per second of the job's last 10 closed steps: their tokens over their step time (tokens counted once per data-parallel replica); absent while they counted no token. Over any range: rate(tpsprof_tokens_total) / rate(tpsprof_step_seconds_total).", []string{"job"}, nil)
	descTPSPerGPU  = newDesc("tpsprof_cluster_tokens_per_second_per_gpu", "tpsprof_cluster_tokens_per_second divided by the world size.", []string{"job"}, nil)
	descMFUCounted = newDesc("tpsprof_mfu_counted", "1 where tpsprof_mfu_ratio and tpsprof_hfu_ratio are from the FLOPs PyTorch counted on sampled steps (the job declares no model), 0 where from the analytic model.", []string{"job"}, nil)
	descMFU        = newDesc("tpsprof_mfu_ratio", "Model FLOPs utilisation of the last 10 closed steps (each weighted by its step time); absent while it is unknown (no model or GPU, no tokens, a topology that does not match the ranks, or inputs that would exceed 100%: /api/summary says why).", []string{"job"}, nil)
	descHFU        = newDesc("tpsprof_hfu_ratio", "Hardware FLOPs utilisation (with recompute) of the last 10 closed steps; absent while MFU is unknown.", []string{"job"}, nil)
	descShare      = newDesc("tpsprof_step_time_share_ratio", "Where the last 10 closed steps' time went, by part (compute, exposed_comm, waiting_for_peers, bubble, data_stall, checkpoint, host_other): each part's time, mean over ranks, over their step time; the parts add up to 1.", []string{"job", "part"}, nil)
	descSplit      = newDesc("tpsprof_step_time_split_ratio", "Time a measure splits out of a part of tpsprof_step_time_share_ratio (part compute, split gc: the training thread's time in Python's garbage collector), last 10 closed steps, over their step time; at most its part's share, and not a part of its own.", []string{"job", "part", "split"}, nil)
	descMFULost    = newDesc("tpsprof_mfu_lost_points", "Where the last 10 closed steps' MFU went: points of the GPUs' peak lost to each bucket (the time outside compute at the window's MFU over compute time, by breakdown part; compute_efficiency the rest); with 100 × tpsprof_mfu_ratio they add up to 100.", []string{"job", "bucket"}, nil)
	descWait       = newDesc("tpsprof_waiting_for_peers_ratio", "Time ranks spent blocked in collectives until the slowest rank arrived, as a share of step time, last 10 closed steps (the part waiting_for_peers of tpsprof_step_time_share_ratio).", []string{"job"}, nil)
	descStepSecs   = newDesc("tpsprof_step_seconds_total", "Step time of all closed steps (the period of each on the critical path): rate(tpsprof_tokens_total) / rate(tpsprof_step_seconds_total) is tokens over step time over any range.", []string{"job"}, nil)
	descStepTime   = newDesc("tpsprof_step_time_seconds", "Step time of the last closed step: its period on the critical path (docs/report.md).", []string{"job"}, nil)
	descStep       = newDesc("tpsprof_last_step", "Step number of the last closed step.", []string{"job"}, nil)
	descRunning    = newDesc("tpsprof_job_running", "1 while the job runs, 0 once its last attempt ended (an attempt_end or job_end event, until its next record): a silent running job is hung, a silent ended one finished.", []string{"job"}, nil)
	descStepAt     = newDesc("tpsprof_last_step_timestamp_seconds", "When the job's last step closed, on the collector's clock (Unix seconds): time() minus it is how long the job has been silent, what tells a hung or dead job from a running one.", []string{"job"}, nil)
	descComm       = newDesc("tpsprof_exposed_comm_ratio", "Exposed communication as a fraction of step time, mean over ranks, last closed step.", []string{"job"}, nil)
	descBubble     = newDesc("tpsprof_pipeline_bubble_ratio", "Pipeline wait as a fraction of step time, mean over ranks, last closed step.", []string{"job"}, nil)
	descData       = newDesc("tpsprof_data_stall_ratio", "Data-loader wait as a fraction of step time, mean over ranks, last closed step.", []string{"job"}, nil)
	descWorld      = newDesc("tpsprof_world_size", "Ranks in the job.", []string{"job"}, nil)
	descStraggler  = newDesc("tpsprof_stragglers", "Ranks whose recent own time (compute and data wait) is more than 1/0.75 of the fastest rank's.", []string{"job"}, nil)
	descEpOpen     = newDesc("tpsprof_straggler_episodes_open", "Straggler episodes under way: nodes (or ranks without a node) whose recent own time (compute and data wait) has been more than 1/0.75 of the fastest rank's since the episode began (the live page lists them, with the cause).", []string{"job"}, nil)
	descEpEnded    = newDesc("tpsprof_straggler_episodes_ended_total", "Straggler episodes that ended.", []string{"job"}, nil)
	descGenTPS     = newDesc("tpsprof_generation_output_tokens_per_second", "Generated tokens per second of the last closed step's generation phase (RL rollouts): tokens generated by all ranks over the slowest rank's generation time.", []string{"job"}, nil)
	descGenShare   = newDesc("tpsprof_generation_share_ratio", "Share of the last closed step's time ranks spent generating (mean over ranks).", []string{"job"}, nil)
	descMFUTrain   = newDesc("tpsprof_mfu_training_ratio", "MFU of the last closed step's training phase alone (the update's FLOPs over the step time less the generation); absent without a generation phase or when MFU is unknown.", []string{"job"}, nil)
	descTTFT       = newDesc("tpsprof_generation_ttft_seconds", "Time to first token of generated requests over the recent rollout events of all ranks (merged sketches: quantiles within 1% relative accuracy).", []string{"job"}, nil)
	descITL        = newDesc("tpsprof_generation_itl_seconds", "Inter-token latency of generated requests over the recent rollout events of all ranks (merged sketches: quantiles within 1% relative accuracy).", []string{"job"}, nil)
	descBytesPS    = newDesc("tpsprof_bytes_per_second", "UTF-8 bytes of training text per second of the last closed step, when ranks report bytes: compares runs whose tokenizers differ.", []string{"job"}, nil)
	descTPJ        = newDesc("tpsprof_tokens_per_joule", "Tokens per joule of GPU energy, last closed step with GPU samples.", []string{"job"}, nil)
	descClosed     = newDesc("tpsprof_steps_closed_total", "Cluster steps closed.", []string{"job"}, nil)
	// the fleet's node health across finished jobs (docs/nodes.md)
	descNodeScore  = newDesc("tpsprof_node_excess_ratio", "A host's own time (its slowest rank's compute and data time) over its jobs' median ranks, minus 1: a mean decayed over the finished jobs that ran on it, newest weighing most (0.03: 3% slower than the median rank).", []string{"host"}, nil)
	descNodeCost   = newDesc("tpsprof_node_cost_gpu_hours", "GPU-hours a host's excess own time cost the finished jobs that ran on it, the other ranks' waiting for it included.", []string{"host"}, nil)
	descNodeJobs   = newDesc("tpsprof_node_jobs", "Finished jobs that ran on a host (job), and those that found it slow (slow: 2% or more over the job's median rank).", []string{"host", "kind"}, nil)
	descNodeDrain  = newDesc("tpsprof_node_drain_candidate", "1 for a host to drain: slow in 3 or more jobs, or one job's strong hardware evidence (a GPU throttling in a quarter of its samples, XID or uncorrectable ECC events); `tpsprof nodes` and the live page say why.", []string{"host"}, nil)
	descIncomplete = newDesc("tpsprof_steps_incomplete_total", "Cluster steps closed with ranks missing.", []string{"job"}, nil)
	descTokens     = newDesc("tpsprof_tokens_total", "Training tokens of all closed steps.", []string{"job"}, nil)
	descAccepted   = newDesc("tpsprof_records_accepted_total", "Step records accepted (first copies).", nil, nil)
	descDuplicate  = newDesc("tpsprof_records_duplicate_total", "Step records that repeated (job, attempt, step, rank).", nil, nil)
	descLate       = newDesc("tpsprof_records_late_total", "Step records that arrived after their step closed.", nil, nil)
	descRedeliv    = newDesc("tpsprof_records_redelivered_total", "Durable mode: step records of messages handed back after a part could not be written, handled again (not counted again as accepted, duplicate or late).", nil, nil)
	descRejected   = newDesc("tpsprof_records_rejected_total", "Records and messages rejected, by reason.", []string{"reason"}, nil)
	descWriteErr   = newDesc("tpsprof_parquet_write_errors_total", "Failed Parquet writes.", nil, nil)
	descRowsLost   = newDesc("tpsprof_rows_lost_total", "Rows of any table that failed to reach a finalised Parquet part (write errors, folders that could not be created).", nil, nil)
	descSlowCons   = newDesc("tpsprof_nats_slow_consumer_drops_total", "Messages NATS dropped because the collector fell behind.", nil, nil)
	descStaleParts = newDesc("tpsprof_stale_parts_removed_total", "Unfinished part files of a writer that died (kill -9, crash) removed at start-up; their rows were lost then.", nil, nil)
	descStateBytes = newDesc("tpsprof_collector_state_bytes", "Memory the jobs' declared world sizes claim (open steps, recent rank bits, per-rank figures); past --max-state-bytes records are rejected (world_size:memory).", nil, nil)
	descNATS       = newDesc("tpsprof_nats_connected", "1 when the collector is connected to NATS.", nil, nil)
)

// descs are every metric description, in the order declared: Describe
// sends them all (a metric is its newDesc line and its value in Collect).
var descs []*prometheus.Desc

func newDesc(name, help string, labels []string, constLabels prometheus.Labels) *prometheus.Desc {
	d := prometheus.NewDesc(name, help, labels, constLabels)
	descs = append(descs, d)
	return d
}

// metricsCollector reads the collector's state at scrape time, so the
// metrics never drift from what the collector counts.
type metricsCollector struct{ c *Collector }

func (m metricsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range descs {
		ch <- d
	}
}

func (m metricsCollector) Collect(ch chan<- prometheus.Metric) {
	c := m.c
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	counter := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, l...)
	}
	// Scrapes take no job's lock: each job publishes its figures at every
	// closed step (job.settle), the counters are atomics.
	for _, j := range c.jobList() {
		f := j.live.Load()
		counter(descClosed, float64(f.closed), j.st.id)
		counter(descIncomplete, float64(f.incomplete), j.st.id)
		counter(descTokens, float64(f.tokens), j.st.id)
		counter(descStepSecs, f.stepSeconds, j.st.id)
		if f.world > 0 {
			gauge(descWorld, float64(f.world), j.st.id)
			gauge(descStraggler, float64(f.stragglers), j.st.id)
			gauge(descEpOpen, float64(f.episodesOpen), j.st.id)
			counter(descEpEnded, float64(f.episodesEnded), j.st.id)
		}
		for _, l := range []struct {
			d *prometheus.Desc
			s *latencySummary
		}{{descTTFT, f.ttft}, {descITL, f.itl}} {
			if l.s != nil {
				ch <- prometheus.MustNewConstSummary(l.d, l.s.count, l.s.sum, l.s.quantiles, j.st.id)
			}
		}
		last := f.last
		if last == nil {
			continue
		}
		gauge(descStepAt, float64(f.lastClosedAt.UnixNano())/1e9, j.st.id)
		running := 1.0
		if f.ended {
			running = 0
		}
		gauge(descRunning, running, j.st.id)
		gauge(descStep, float64(last.Step), j.st.id)
		if time.Since(f.lastClosedAt) > m.c.cfg.StaleAfter {
			// A silent job's last step is not its current rate: its
			// throughput gauges go (Prometheus marks them stale), so
			// rate alerts neither fire on nor hide a hang;
			// TrainingStalled watches the timestamp above.
			continue
		}
		if w := f.win; w.tpsUnknown == "" && w.steps > 0 {
			gauge(descTPS, w.tps, j.st.id)
			gauge(descTPSPerGPU, w.perGPU, j.st.id)
		}
		if w := f.win; w.mfu != nil {
			gauge(descMFU, *w.mfu, j.st.id)
		}
		if w := f.win; w.hfu != nil {
			gauge(descHFU, *w.hfu, j.st.id)
			counted := 0.0
			if w.counted {
				counted = 1
			}
			gauge(descMFUCounted, counted, j.st.id)
		}
		if w := f.win; w.steps > 0 {
			for _, p := range tps.ShareParts() {
				gauge(descShare, *p.Of(&w.shares), j.st.id, p.Key)
			}
			for _, sp := range tps.ShareSplits() {
				if v, ok := w.shares.Splits[sp.Name]; ok {
					gauge(descSplit, v, j.st.id, sp.Part, strings.TrimSuffix(sp.Name, "_ns"))
				}
			}
			gauge(descWait, w.shares.WaitingForPeers, j.st.id)
			if l, _ := w.ledger(); l != nil {
				for _, b := range l.Lost {
					gauge(descMFULost, b.Points, j.st.id, b.Key)
				}
			}
		}
		gauge(descStepTime, float64(last.StepTimeNs)/1e9, j.st.id)
		gauge(descComm, last.CommFractionMean, j.st.id)
		gauge(descBubble, last.BubbleFractionMean, j.st.id)
		gauge(descData, last.DataStallFractionMean, j.st.id)
		if f.tokensPerJoule > 0 {
			gauge(descTPJ, f.tokensPerJoule, j.st.id)
		}
		if last.GenNsMax > 0 {
			gauge(descGenTPS, last.GenOutputTPS, j.st.id)
			gauge(descGenShare, last.GenFractionMean, j.st.id)
			if last.MFUTraining > 0 && last.MFUUnknown == "" {
				gauge(descMFUTrain, last.MFUTraining, j.st.id)
			}
		}
		if last.BytesPerSecond > 0 {
			gauge(descBytesPS, last.BytesPerSecond, j.st.id)
		}
	}
	if v := c.Nodes(); v != nil {
		for i, n := range v.Nodes {
			if i == maxNodeGauges {
				break
			}
			gauge(descNodeScore, n.Score, n.Host)
			gauge(descNodeCost, n.CostGPUHours, n.Host)
			gauge(descNodeJobs, float64(n.Jobs), n.Host, "job")
			gauge(descNodeJobs, float64(n.SlowJobs), n.Host, "slow")
			drain := 0.0
			if n.Drain {
				drain = 1
			}
			gauge(descNodeDrain, drain, n.Host)
		}
	}
	st := c.Stats()
	counter(descAccepted, float64(st.Records))
	counter(descDuplicate, float64(st.Duplicates))
	counter(descLate, float64(st.Late))
	counter(descRedeliv, float64(st.Redelivered))
	counter(descWriteErr, float64(st.WriteErrors))
	counter(descRowsLost, float64(st.RowsLost))
	counter(descSlowCons, float64(st.SlowConsumer))
	counter(descStaleParts, float64(st.StaleParts))
	gauge(descStateBytes, float64(st.StateBytes))
	for reason, n := range st.Rejected {
		counter(descRejected, float64(n), reason)
	}
	conn := 0.0
	if c.nc.IsConnected() {
		conn = 1
	}
	gauge(descNATS, conn)
}

// Registry returns a Prometheus registry holding the collector's metrics
// (and Go runtime and process metrics).
func (c *Collector) Registry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(metricsCollector{c}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}
