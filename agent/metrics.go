package agent

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tpsprof/tpsprof/natsconn"
)

var (
	descRecv      = prometheus.NewDesc("tpsprof_agent_records_received_total", "Step records accepted from the intake.", nil, nil)
	descSent      = prometheus.NewDesc("tpsprof_agent_records_published_total", "Step records handed to NATS.", nil, nil)
	descDropped   = prometheus.NewDesc("tpsprof_agent_records_dropped_total", "Step records dropped past the buffer bound while NATS was unreachable.", nil, nil)
	descRejected  = prometheus.NewDesc("tpsprof_agent_records_rejected_total", "Intake lines rejected, by reason.", []string{"reason"}, nil)
	descLines     = prometheus.NewDesc("tpsprof_agent_lines_total", "Intake lines read.", nil, nil)
	descBuffer    = prometheus.NewDesc("tpsprof_agent_buffer_bytes", "Encoded batches held while NATS is unreachable.", nil, nil)
	descBufferMax = prometheus.NewDesc("tpsprof_agent_buffer_limit_bytes", "Bound of that buffer.", nil, nil)
	descGPU       = prometheus.NewDesc("tpsprof_agent_gpu_samples_total", "GPU samples taken, by device index.", []string{"gpu"}, nil)
	descGPUErr    = prometheus.NewDesc("tpsprof_agent_gpu_errors_total", "Failed GPU readings.", nil, nil)
	descConnected = prometheus.NewDesc("tpsprof_agent_nats_connected", "1 when the agent is connected to NATS.", nil, nil)
	descClaims    = prometheus.NewDesc("tpsprof_agent_claims_replaced_total", "Records and events that named another node or a GPU this node lacks, stamped with this agent's own.", nil, nil)
	descRefused   = prometheus.NewDesc("tpsprof_agent_nats_credentials_refused", "1 while NATS refuses the agent's credentials (wrong token, user or password): not an outage, fix the credentials.", nil, nil)
)

type agentMetrics struct{ a *Agent }

func (m agentMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRecv, descSent, descDropped, descRejected, descLines, descBuffer, descBufferMax, descGPU, descGPUErr, descConnected, descRefused, descClaims} {
		ch <- d
	}
}

func (m agentMetrics) Collect(ch chan<- prometheus.Metric) {
	s := m.a.Stats()
	c := func(d *prometheus.Desc, v int64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), l...)
	}
	g := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	c(descRecv, s.Records)
	c(descSent, s.Published)
	c(descDropped, s.Dropped)
	c(descLines, s.Lines)
	for reason, n := range s.Rejected {
		c(descRejected, n, reason)
	}
	g(descBuffer, float64(s.BufferedBytes))
	g(descBufferMax, float64(m.a.cfg.BufferBytes))
	for i, n := range m.a.gpuPerDevice() {
		c(descGPU, n, strconv.Itoa(i))
	}
	c(descGPUErr, s.GPUErrors)
	c(descClaims, s.ClaimsReplaced)
	conn := 0.0
	if s.NATSConnected {
		conn = 1
	}
	g(descConnected, conn)
	refused := 0.0
	if !s.NATSConnected && m.a.nc != nil && natsconn.Refused(m.a.nc.LastError()) {
		refused = 1
	}
	g(descRefused, refused)
}

// Registry returns a Prometheus registry with the agent's metrics.
func (a *Agent) Registry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(agentMetrics{a})
	return r
}

// Handler serves /metrics.
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.Registry(), promhttp.HandlerOpts{}))
	return mux
}
