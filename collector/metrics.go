package collector

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metric descriptions. Names follow Prometheus conventions: base units,
// _total for counters, _ratio for fractions. Labels are bounded: job (the
// jobs this collector serves) and reason (a fixed set); per-rank detail
// stays in Parquet.
var (
	descTPS        = prometheus.NewDesc("tpsprof_cluster_tokens_per_second", "Training tokens per second of the job's last closed step (tokens counted once per data-parallel replica).", []string{"job"}, nil)
	descTPSPerGPU  = prometheus.NewDesc("tpsprof_cluster_tokens_per_second_per_gpu", "Tokens per second of the last closed step divided by the world size.", []string{"job"}, nil)
	descMFU        = prometheus.NewDesc("tpsprof_mfu_ratio", "Model FLOPs utilisation of the last closed step; absent while it is unknown (no model or GPU, a topology that does not match the ranks, or inputs that would exceed 100%: /api/summary says why).", []string{"job"}, nil)
	descHFU        = prometheus.NewDesc("tpsprof_hfu_ratio", "Hardware FLOPs utilisation (with recompute) of the last closed step; absent while MFU is unknown.", []string{"job"}, nil)
	descStepTime   = prometheus.NewDesc("tpsprof_step_time_seconds", "Duration of the last closed step (slowest rank).", []string{"job"}, nil)
	descStep       = prometheus.NewDesc("tpsprof_last_step", "Step number of the last closed step.", []string{"job"}, nil)
	descComm       = prometheus.NewDesc("tpsprof_exposed_comm_ratio", "Exposed communication as a fraction of step time, mean over ranks, last closed step.", []string{"job"}, nil)
	descBubble     = prometheus.NewDesc("tpsprof_pipeline_bubble_ratio", "Pipeline wait as a fraction of step time, mean over ranks, last closed step.", []string{"job"}, nil)
	descData       = prometheus.NewDesc("tpsprof_data_stall_ratio", "Data-loader wait as a fraction of step time, mean over ranks, last closed step.", []string{"job"}, nil)
	descWorld      = prometheus.NewDesc("tpsprof_world_size", "Ranks in the job.", []string{"job"}, nil)
	descStraggler  = prometheus.NewDesc("tpsprof_stragglers", "Ranks whose recent compute time is more than 1/0.75 of the fastest rank's.", []string{"job"}, nil)
	descEpOpen     = prometheus.NewDesc("tpsprof_straggler_episodes_open", "Straggler episodes under way: nodes (or ranks without a node) whose recent compute time has been more than 1/0.75 of the fastest rank's since the episode began (the live page lists them).", []string{"job"}, nil)
	descEpEnded    = prometheus.NewDesc("tpsprof_straggler_episodes_ended_total", "Straggler episodes that ended.", []string{"job"}, nil)
	descTPJ        = prometheus.NewDesc("tpsprof_tokens_per_joule", "Tokens per joule of GPU energy, last closed step with GPU samples.", []string{"job"}, nil)
	descClosed     = prometheus.NewDesc("tpsprof_steps_closed_total", "Cluster steps closed.", []string{"job"}, nil)
	descIncomplete = prometheus.NewDesc("tpsprof_steps_incomplete_total", "Cluster steps closed with ranks missing.", []string{"job"}, nil)
	descTokens     = prometheus.NewDesc("tpsprof_tokens_total", "Training tokens of all closed steps.", []string{"job"}, nil)
	descAccepted   = prometheus.NewDesc("tpsprof_records_accepted_total", "Step records accepted (first copies).", nil, nil)
	descDuplicate  = prometheus.NewDesc("tpsprof_records_duplicate_total", "Step records that repeated (job, attempt, step, rank).", nil, nil)
	descLate       = prometheus.NewDesc("tpsprof_records_late_total", "Step records that arrived after their step closed.", nil, nil)
	descRejected   = prometheus.NewDesc("tpsprof_records_rejected_total", "Records and messages rejected, by reason.", []string{"reason"}, nil)
	descWriteErr   = prometheus.NewDesc("tpsprof_parquet_write_errors_total", "Failed Parquet writes.", nil, nil)
	descRowsLost   = prometheus.NewDesc("tpsprof_rows_lost_total", "Rows of any table that failed to reach a finalised Parquet part (write errors, folders that could not be created).", nil, nil)
	descSlowCons   = prometheus.NewDesc("tpsprof_nats_slow_consumer_drops_total", "Messages NATS dropped because the collector fell behind.", nil, nil)
	descStaleParts = prometheus.NewDesc("tpsprof_stale_parts_removed_total", "Unfinished part files of a writer that died (kill -9, crash) removed at start-up; their rows were lost then.", nil, nil)
	descStateBytes = prometheus.NewDesc("tpsprof_collector_state_bytes", "Memory the jobs' declared world sizes claim (open steps, recent rank bits, per-rank figures); past --max-state-bytes records are rejected (world_size:memory).", nil, nil)
	descNATS       = prometheus.NewDesc("tpsprof_nats_connected", "1 when the collector is connected to NATS.", nil, nil)
)

// metricsCollector reads the collector's state at scrape time, so the
// metrics never drift from what the collector counts.
type metricsCollector struct{ c *Collector }

func (m metricsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descTPS, descTPSPerGPU, descMFU, descHFU, descStepTime, descStep, descComm, descBubble, descData,
		descWorld, descStraggler, descEpOpen, descEpEnded, descTPJ, descClosed, descIncomplete, descTokens, descAccepted, descDuplicate, descLate, descRejected, descWriteErr, descRowsLost, descSlowCons, descStaleParts, descStateBytes, descNATS} {
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
		counter(descClosed, float64(f.closed), j.id)
		counter(descIncomplete, float64(f.incomplete), j.id)
		counter(descTokens, float64(f.tokens), j.id)
		if f.world > 0 {
			gauge(descWorld, float64(f.world), j.id)
			gauge(descStraggler, float64(f.stragglers), j.id)
			gauge(descEpOpen, float64(f.episodesOpen), j.id)
			counter(descEpEnded, float64(f.episodesEnded), j.id)
		}
		last := f.last
		if last == nil {
			continue
		}
		gauge(descTPS, last.TPS, j.id)
		gauge(descTPSPerGPU, last.TPSPerGPU, j.id)
		if last.MFUUnknown == "" && last.MFU > 0 {
			gauge(descMFU, last.MFU, j.id)
			gauge(descHFU, last.HFU, j.id)
		}
		gauge(descStepTime, float64(last.StepTimeNs)/1e9, j.id)
		gauge(descStep, float64(last.Step), j.id)
		gauge(descComm, last.CommFractionMean, j.id)
		gauge(descBubble, last.BubbleFractionMean, j.id)
		gauge(descData, last.DataStallFractionMean, j.id)
		if f.tokensPerJoule > 0 {
			gauge(descTPJ, f.tokensPerJoule, j.id)
		}
	}
	st := c.Stats()
	counter(descAccepted, float64(st.Records))
	counter(descDuplicate, float64(st.Duplicates))
	counter(descLate, float64(st.Late))
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
