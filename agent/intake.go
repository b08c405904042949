package agent

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/tpsprof/tpsprof/mfu"
	"github.com/tpsprof/tpsprof/tps"
)

// MaxConnections is the default bound of concurrent intake connections
// (ranks of one node; Config.MaxConnections).
const MaxConnections = 4096

// lineType is the discriminator of an intake line; absent means "step".
type lineType struct {
	Type string `json:"type"`
}

var typeKey = []byte(`"type"`)

func (a *Agent) acceptLoop() {
	defer a.wg.Done()
	for {
		c, err := a.ln.Accept()
		if err != nil {
			select {
			case <-a.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			a.log.Warn("accept", "accept failed", "err", err)
			continue
		}
		uid := peerUID(c)
		a.mu.Lock()
		// another user (not root, not the agent's own) holds at most a
		// quarter of the connections: one user cannot lock the others out
		if limited := uid > 0 && uid != int64(os.Geteuid()); limited && a.connsOf[uid] >= max(a.cfg.MaxConnections/4, 1) {
			a.mu.Unlock()
			a.reject("conn:uid_limit")
			a.log.Warn("conn:uid_limit", "a user holds a quarter of the agent's connections; connection refused", "uid", uid, "connections", a.cfg.MaxConnections/4)
			c.Close()
			continue
		}
		full := len(a.conns) >= a.cfg.MaxConnections
		if full && !a.closeIdlest() {
			a.mu.Unlock()
			a.reject("conn:too_many")
			c.Close()
			continue
		}
		info := &connInfo{uid: uid}
		info.last.Store(time.Now().UnixNano())
		a.conns[c] = info
		a.connsOf[uid]++
		a.mu.Unlock()
		if full {
			a.reject("conn:idle_closed")
		}
		a.connections.Add(1)
		a.wg.Add(1)
		go a.serve(c)
	}
}

// closeIdlest closes the connection idle the longest if it has been idle
// for 10 s (or half the idle timeout, if shorter): a half-written line from
// a client that went quiet must not keep a rank out; mu held.
func (a *Agent) closeIdlest() bool {
	var idlest net.Conn
	oldest := time.Now().Add(-min(10*time.Second, a.cfg.IdleTimeout/2)).UnixNano()
	for c, info := range a.conns {
		if t := info.last.Load(); t < oldest {
			idlest, oldest = c, t
		}
	}
	if idlest == nil {
		return false
	}
	idlest.Close() // its serve goroutine sees the error and removes it
	a.dropConnOf(a.conns[idlest].uid)
	delete(a.conns, idlest)
	return true
}

// dropConnOf counts one connection of uid less; mu held.
func (a *Agent) dropConnOf(uid int64) {
	if a.connsOf[uid]--; a.connsOf[uid] <= 0 {
		delete(a.connsOf, uid)
	}
}

// serve reads JSON lines from one client until it hangs up.
func (a *Agent) serve(c net.Conn) {
	defer a.wg.Done()
	defer func() {
		a.mu.Lock()
		if info, ok := a.conns[c]; ok {
			delete(a.conns, c)
			a.dropConnOf(info.uid)
		}
		a.mu.Unlock()
		c.Close()
	}()
	r := bufio.NewReaderSize(c, a.cfg.MaxLineBytes)
	var limit *rate.Limiter
	if n := a.cfg.MaxLinesPerSec; n > 0 {
		limit = rate.NewLimiter(rate.Limit(n), n)
	}
	a.mu.Lock()
	info := a.conns[c]
	a.mu.Unlock()
	// The idle deadline moves only when half of it has passed: one clock
	// read per line, not a timer reset per line.
	deadline := time.Now().Add(a.cfg.IdleTimeout)
	c.SetReadDeadline(deadline)
	for {
		line, err := r.ReadSlice('\n')
		if limit != nil && len(line) > 0 && !limit.Allow() {
			a.reject("line:rate_limited")
			a.lines.Add(1)
			a.log.Warn("rate", "a rank sends more lines than the per-connection limit; dropping", "limit_per_s", a.cfg.MaxLinesPerSec)
			if errors.Is(err, bufio.ErrBufferFull) && !discardLine(r) {
				return
			}
			if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
				return
			}
			continue
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			a.reject("line:oversized")
			a.lines.Add(1)
			a.log.Warn("oversized", "intake line over the cap; skipped", "cap_bytes", a.cfg.MaxLineBytes)
			if !discardLine(r) {
				return
			}
			continue
		}
		// Only an accepted line is activity: blank lines or garbage every
		// few seconds must not keep a connection from counting as idle
		// (they used to lock new ranks out of a full intake for good).
		if len(line) > 0 && a.handleLineFrom(line, info) {
			now := time.Now()
			if info != nil {
				info.last.Store(now.UnixNano())
			}
			if deadline.Sub(now) < a.cfg.IdleTimeout/2 {
				deadline = now.Add(a.cfg.IdleTimeout)
				c.SetReadDeadline(deadline)
			}
		}
		if err != nil {
			switch {
			case errors.Is(err, os.ErrDeadlineExceeded):
				a.reject("conn:idle_timeout")
			case !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed):
				a.log.Warn("read", "intake read failed", "err", err)
			}
			return
		}
	}
}

// discardLine skips to the end of the current line; false at end of input.
func discardLine(r *bufio.Reader) bool {
	for {
		_, err := r.ReadSlice('\n')
		if err == nil {
			return true
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return false
		}
	}
}

// connInfo is what the agent knows of one intake connection: when it last
// sent an accepted line, and the rank whose step records it carries (for
// on-demand captures, which are written back on the connection).
type connInfo struct {
	uid  int64        // the peer's user (SO_PEERCRED), -1 if not known
	last atomic.Int64 // unix ns
	// owned is the job this connection's user holds that it last wrote a
	// step record for (ownerClaim)
	owned atomic.Pointer[string]
	rank  atomic.Pointer[rankSeen]
	// the latest step of the connection's records and when it ended (unix
	// ns, the record's own end: the rank's clock is this node's; a record's
	// arrival is not, since the package sends them in batches): atomics,
	// so a record costs no allocation
	step, at atomic.Int64
}

// rankSeen is who a connection's step records come from, from which step
// and when that began; replaced only when that changes.
type rankSeen struct {
	job                  string
	attempt, rank, world int64
	firstStep, firstAt   int64
}

// saw notes an accepted step record of the connection (serve goroutine)
// and says whether it is the first from its job, attempt and rank.
func (c *connInfo) saw(r *tps.StepRecord) bool {
	now := time.Now().UnixNano()
	if end := r.EndUnixNs; end > 0 && end < now {
		now = end // (a step that ends in the future is not this node's clock: its arrival instead)
	}
	if old := c.rank.Load(); old != nil && old.job == r.Job && old.rank == r.Rank && old.attempt == r.Attempt && old.world == r.WorldSize {
		if r.Step > c.step.Load() {
			c.step.Store(r.Step)
			c.at.Store(now)
		}
		return false
	}
	c.step.Store(r.Step)
	c.at.Store(now)
	c.rank.Store(&rankSeen{job: r.Job, attempt: r.Attempt, rank: r.Rank, world: r.WorldSize, firstStep: r.Step, firstAt: now})
	return true
}

// handleLineFrom processes a line from connection info (nil: not from a
// connection) and says whether it was accepted.
func (a *Agent) handleLineFrom(line []byte, info *connInfo) bool {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return false
	}
	// counted once its outcome is: whoever sees Lines reach n sees the
	// records and refusals of those n lines
	defer a.lines.Add(1)
	if line[0] != '{' {
		a.reject("line:not_json_object")
		a.log.Warn("json", "intake line is not a JSON object", "prefix", prefix(line))
		return false
	}
	if err := tps.CheckKeys(line); err != nil {
		a.reject("line:key_case")
		a.log.Warn("key", "intake line with a key not in lower case (keys would match case-insensitively)", "err", err)
		return false
	}
	kind := "step"
	if bytes.Contains(line, typeKey) {
		var t lineType
		if err := json.Unmarshal(line, &t); err != nil {
			a.reject("line:json")
			a.log.Warn("json", "intake line is not valid JSON", "err", err)
			return false
		}
		if t.Type != "" {
			kind = t.Type
		}
	}
	switch kind {
	case "step":
		return a.stepLineFrom(line, info)
	case "event":
		var e tps.Event
		if err := json.Unmarshal(line, &e); err != nil {
			a.reject("line:json")
			return false
		}
		if tps.AgentEvent(e.Kind) {
			a.reject("event:agent_kind")
			a.log.Warn("event:agent_kind", "an event of a kind only the agent writes was refused", "kind", e.Kind, "job", prefix([]byte(e.Job)))
			return false
		}
		return a.ownerAllows(info, e.Job) && a.SubmitEvent(e) == nil
	case "trace":
		var n TraceNote
		if err := json.Unmarshal(line, &n); err != nil {
			a.reject("line:json")
			return false
		}
		return a.ownerAllows(info, n.Job) && a.SubmitTrace(n) == nil
	case "capture":
		var s captureState
		if err := json.Unmarshal(line, &s); err != nil {
			a.reject("line:json")
			return false
		}
		return a.ownerAllows(info, s.Job) && a.captureStateLine(s) == nil
	case "meta":
		return a.metaLineFrom(line, info)
	default:
		a.reject("line:unknown_type")
		a.log.Warn("type", "intake line of unknown type", "type", prefix([]byte(kind)))
		return false
	}
}

// stepLineFrom takes a step line; a record claims its job for the
// connection's user only once it is valid: junk lines squat nothing.
func (a *Agent) stepLineFrom(line []byte, info *connInfo) bool {
	var sl stepLine
	if err := json.Unmarshal(line, &sl); err != nil {
		a.reject("line:json")
		a.log.Warn("json", "step line does not decode", "err", err)
		return false
	}
	r := sl.StepRecord
	if !a.ownerAllows(info, r.Job) || a.checkStep(&r) != nil || !a.ownerClaim(info, r.Job) { // counted inside
		return false
	}
	a.queueStep(r)
	if sl.BatchFP != "" {
		a.checkBatches(&r, sl.BatchFP)
	}
	if info != nil && info.saw(&r) {
		a.watchCaptures(r.Job, info.uid)
		a.claimRank(info, &r)
	}
	return true
}

// metaLineFrom takes a run metadata line, its model from a Hugging Face
// config when it gives one.
func (a *Agent) metaLineFrom(line []byte, info *connInfo) bool {
	var m metaLine
	if err := json.Unmarshal(line, &m); err != nil {
		a.reject("line:json")
		return false
	}
	if !a.ownerAllows(info, m.Job) {
		return false
	}
	if len(m.HFConfig) > 0 && m.Model == nil && m.ModelPreset == "" {
		model, err := mfu.FromHFConfig(m.HFConfig)
		if err != nil {
			a.reject("meta:hf_config")
			a.log.Warn("meta:hf_config", "run metadata: model config not understood", "err", err)
			return false
		}
		m.Model = &model
	}
	return a.SubmitMeta(m.RunMeta) == nil
}

// stepLine is a step line: the record, and for a job's first steps a
// fingerprint of the step's batch (batches.go), not forwarded.
type stepLine struct {
	tps.StepRecord
	BatchFP string `json:"batch_fp"`
}

// metaLine is a meta line: run metadata, and optionally the model's Hugging
// Face config (hf_config, as config.json holds it), which the agent turns
// into the model's shape (mfu.FromHFConfig) when the line names no model.
type metaLine struct {
	tps.RunMeta
	HFConfig json.RawMessage `json:"hf_config"`
}

func prefix(b []byte) string {
	if len(b) > 40 {
		b = b[:40]
	}
	return string(bytes.ToValidUTF8(b, []byte("?")))
}
