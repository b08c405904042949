package tps

import (
	"encoding/json"
	"math"
	"strings"
)

// Shares is where step time went: each part a share of the step time in
// [0, 1], the parts adding up to 1. It is the one breakdown every view
// draws (the report's text, Markdown, HTML, plots and --compare, the live
// page and /metrics): computed here, formatted there.
type Shares struct {
	Compute     float64 `json:"compute"`
	ExposedComm float64 `json:"exposed_comm"`
	// WaitingForPeers is time blocked in collectives until the critical
	// (slowest) rank arrived: imbalance, not the network.
	WaitingForPeers float64 `json:"waiting_for_peers"`
	Bubble          float64 `json:"bubble"`
	DataStall       float64 `json:"data_stall"`
	Checkpoint      float64 `json:"checkpoint"`
	// Other is what the parts leave of the step time: host time outside
	// the ranks' own steps, and their measured host work before the
	// forward (host_ns, a blocking measure no other part holds: its split).
	Other float64 `json:"other"`
	// Splits are the shares of step time that measures split out of a
	// part (ShareSplits: Python GC out of compute), by measure name;
	// each at most its part's share, and not a part of its own (the
	// parts add up to 1 without them). Nil when none was measured.
	Splits map[string]float64 `json:"splits,omitempty"`
}

// SharePart names one part of Shares, as /metrics labels it and the
// views list it, in this order.
type SharePart struct {
	Key, Label string
	Of         func(*Shares) *float64
}

// shareParts are the breakdown's parts in the order every view shows them
// (ShareParts).
var shareParts = [...]SharePart{
	{"compute", "compute", func(s *Shares) *float64 { return &s.Compute }},
	{"exposed_comm", "exposed comm", func(s *Shares) *float64 { return &s.ExposedComm }},
	{"waiting_for_peers", "waiting for slower peers", func(s *Shares) *float64 { return &s.WaitingForPeers }},
	{"bubble", "bubble", func(s *Shares) *float64 { return &s.Bubble }},
	{"data_stall", "data stall", func(s *Shares) *float64 { return &s.DataStall }},
	{"checkpoint", "checkpoint", func(s *Shares) *float64 { return &s.Checkpoint }},
	{"host_other", "host/other", func(s *Shares) *float64 { return &s.Other }},
}

// ShareParts are the breakdown's parts in the order every view shows them
// (a copy).
func ShareParts() [len(shareParts)]SharePart { return shareParts }

// Sum is the parts added up (1 for a step's or a run's shares, 0 for
// none).
func (s Shares) Sum() float64 {
	var t float64
	for _, p := range shareParts {
		t += *p.Of(&s)
	}
	return t
}

// Shares is the step's breakdown. The blocking parts are the row's
// fractions (over the step's period, or over the ranks' parts where those
// add up to more: StepAccumulator.ResultIn); compute is the ranks' mean
// compute over the step time, at most what the blocking parts leave (rows
// written when the fractions were over the period alone: their compute
// takes the rest); Other is what remains. A row whose blocking fractions
// add up past 1 (written before that rule) has them scaled to 1.
func (c *ClusterStep) Shares() Shares {
	s := c.parts()
	for j, i := range splitMeasures {
		if v := c.split(j, &s); v > 0 {
			if s.Splits == nil {
				s.Splits = map[string]float64{}
			}
			s.Splits[measures[i].Name] = v
		}
	}
	return s
}

// parts is the step's breakdown without its splits (what ShareSum adds
// up step by step: no map a step).
func (c *ClusterStep) parts() Shares {
	if c.StepTimeNs <= 0 {
		return Shares{}
	}
	s := Shares{
		ExposedComm:     unitShare(c.CommFractionMean),
		WaitingForPeers: unitShare(c.WaitFractionMean),
		Bubble:          unitShare(c.BubbleFractionMean),
		DataStall:       unitShare(c.DataStallFractionMean),
		Checkpoint:      unitShare(c.CkptFractionMean),
	}
	blocking := s.ExposedComm + s.WaitingForPeers + s.Bubble + s.DataStall + s.Checkpoint
	if blocking > 1 {
		for _, p := range shareParts {
			*p.Of(&s) /= blocking
		}
		return s
	}
	s.Compute = min(unitShare(c.ComputeNsMean/float64(c.StepTimeNs)), 1-blocking)
	if s.Other = 1 - blocking - s.Compute; s.Other < 1e-12 {
		s.Other = 0 // rounding, not host time
	}
	return s
}

// split is the share of step c the j-th split measure splits out, at most
// its part's share in s (c's parts).
func (c *ClusterStep) split(j int, s *Shares) float64 {
	m := &measures[splitMeasures[j]]
	return min(unitShare(*m.columnOf(c)), *m.part(s))
}

// unitShare is a fraction as a share: not a number, or below 0, is 0.
func unitShare(x float64) float64 {
	if math.IsNaN(x) || x < 0 {
		return 0
	}
	return min(x, math.MaxFloat64)
}

// ShareSum adds up steps' shares weighted by their step time, so a run's
// breakdown is each part's time over the run's step time (a slow step
// weighs what it lasted, as it does in tokens ÷ time), and their
// throughput: tokens over step time. The zero value is ready.
type ShareSum struct {
	sum     Shares
	splits  [maxSplits]float64 // Σ step time × each split's share (splitMeasures' order)
	seconds float64
	tokens  int64
	steps   int
}

// Add takes one step (a step without a step time adds nothing).
func (a *ShareSum) Add(c *ClusterStep) {
	if c.StepTimeNs <= 0 {
		return
	}
	w := float64(c.StepTimeNs) / 1e9
	s := c.parts()
	for _, p := range shareParts {
		*p.Of(&a.sum) += w * *p.Of(&s)
	}
	for j := range splitMeasures {
		a.splits[j] += w * c.split(j, &s)
	}
	a.seconds += w
	a.tokens += c.Tokens
	a.steps++
}

// Steps is how many steps were added.
func (a *ShareSum) Steps() int { return a.steps }

// Shares is the steps' breakdown (zero when none was added).
func (a *ShareSum) Shares() Shares {
	if a.seconds <= 0 {
		return Shares{}
	}
	var s Shares
	for _, p := range shareParts {
		*p.Of(&s) = *p.Of(&a.sum) / a.seconds
	}
	for j, i := range splitMeasures {
		if v := a.splits[j]; v > 0 {
			if s.Splits == nil {
				s.Splits = map[string]float64{}
			}
			s.Splits[measures[i].Name] = v / a.seconds
		}
	}
	return s
}

// TPS is the steps' tokens over their step time; ok is false when no
// token was counted (or no time passed): throughput is then unknown, not
// zero.
func (a *ShareSum) TPS() (tps float64, ok bool) {
	if a.seconds <= 0 || a.tokens <= 0 {
		return 0, false
	}
	return float64(a.tokens) / a.seconds, true
}

// NoTokens is what every view says in place of a throughput, MFU or
// tokens-per-joule figure when no step counted a token.
const NoTokens = "n/a: no tokens counted (every step reported 0 tokens: give instrument() the data loader or tokens=, call prof.add_tokens(n) each step, or prof.end(tokens=n))"

// MarshalJSON writes the summary with its throughput figures null where
// no token was counted (TPSUnknown says why), never 0 or a non-number.
func (s Summary) MarshalJSON() ([]byte, error) {
	type plain Summary
	out := struct {
		plain
		AggregateTPS *float64 `json:"aggregate_tps"`
		TPSPerGPU    *float64 `json:"tps_per_gpu"`
		WallTPS      *float64 `json:"wall_tps"`
		TPS          *Dist    `json:"tps"`
	}{plain: plain(s)}
	if s.TPSUnknown == "" {
		out.AggregateTPS, out.TPSPerGPU, out.TPS = &s.AggregateTPS, &s.TPSPerGPU, &s.TPS
		if s.WallTPS > 0 {
			out.WallTPS = &s.WallTPS
		}
	}
	return json.Marshal(out)
}

// SplitsText is what the measures split out of part, for the views'
// breakdown: " (Python GC 1.2%)" after compute's share, with pct formatting a share; "" where
// none was measured.
func (s *Shares) SplitsText(part string, pct func(float64) string) string {
	var w []string
	for _, sp := range ShareSplits() {
		if v, ok := s.Splits[sp.Name]; ok && sp.Part == part {
			w = append(w, sp.Label+" "+pct(v))
		}
	}
	if len(w) == 0 {
		return ""
	}
	return " (" + strings.Join(w, ", ") + ")"
}
