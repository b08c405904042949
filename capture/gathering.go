package capture

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tpsprof/tpsprof/internal/safefs"
)

// gathering is a started capture's last phase: the ranks' answers
// (accepted, failed, a step traced) and the pieces of their kept traces,
// taken within budgets, until every rank expected has traced its steps,
// failed, or the time is up.
type gathering struct {
	id      string
	at      int64
	o       Options
	expect  map[int64]string // rank → node
	keeping bool

	state   map[int64]*rankState
	reports []Report
	chunks  map[traceKey][][]byte // a kept trace's pieces, in order
	want    map[traceKey]int      // how many pieces a kept trace has

	budget                 int64 // of the answers' bytes
	reportBytes, keptBytes int64
	overReports, overKept  bool
	timedOut               bool
}

// rankState is what a rank said of the capture.
type rankState struct {
	accepted bool
	failed   string
	traced   map[int64]bool
}

type traceKey struct{ rank, step int64 }

func newGathering(id string, at int64, o Options, expect map[int64]string, keeping bool) *gathering {
	g := &gathering{id: id, at: at, o: o, expect: expect, keeping: keeping, state: map[int64]*rankState{},
		chunks: map[traceKey][][]byte{}, want: map[traceKey]int{}, budget: reportsBudget}
	if o.MaxReportsBytes > 0 {
		g.budget = min(g.budget, o.MaxReportsBytes)
	}
	for r := range expect {
		g.state[r] = &rankState{traced: map[int64]bool{}}
	}
	return g
}

// run takes the answers from ch until done or ctx ends. A rank running
// the package accepts within about one 50 ms batch of its sender thread,
// whatever its step time: one silent after AcceptWait does not take
// requests, and is not waited for.
func (g *gathering) run(ctx context.Context, ch <-chan *nats.Msg) {
	acceptBy := time.NewTimer(g.o.AcceptWait)
	defer acceptBy.Stop()
	for !g.done() && !g.timedOut {
		select {
		case <-ctx.Done():
			g.timedOut = true
		case <-acceptBy.C:
			g.acceptExpired()
		case m := <-ch:
			g.take(m)
		}
	}
}

// done is whether every rank not failed has traced its steps, and each
// kept trace has all its pieces.
func (g *gathering) done() bool {
	for r, s := range g.state {
		if s.failed != "" {
			continue
		}
		if int64(len(s.traced)) < g.o.Steps {
			return false
		}
		for st := range s.traced {
			k := traceKey{r, st}
			if n := g.want[k]; n > 0 && len(g.chunks[k]) < n {
				return false
			}
		}
	}
	return true
}

// acceptExpired fails the ranks that said nothing within AcceptWait.
func (g *gathering) acceptExpired() {
	for r, s := range g.state {
		if !s.accepted && s.failed == "" && len(s.traced) == 0 {
			s.failed = fmt.Sprintf("did not accept the request within %s: the rank does not take capture requests (a process without tpsprof's Python package, or an older one)", g.o.AcceptWait)
			g.o.say(fmt.Sprintf("rank %d (%s): %s", r, g.expect[r], s.failed))
		}
	}
}

// take is one message on the reply subject: a piece of a kept trace or a
// rank's report.
func (g *gathering) take(m *nats.Msg) {
	if c := m.Header.Get(HeaderChunk); c != "" {
		g.takePiece(m, c)
		return
	}
	if g.reportBytes+int64(len(m.Data)) > g.budget {
		g.overReports = true
		return
	}
	var r Report
	if json.Unmarshal(m.Data, &r) != nil || r.ID != g.id {
		return
	}
	g.reportBytes += int64(len(m.Data))
	if len(r.Calls) > MaxReportCalls {
		r.CallsDropped += int64(len(r.Calls) - MaxReportCalls)
		r.Calls = r.Calls[:MaxReportCalls]
	}
	s := g.state[r.Rank]
	if s == nil {
		return
	}
	switch r.State {
	case StateAccepted:
		s.accepted = true
	case StateFailed:
		s.failed = r.Why
		g.o.say(fmt.Sprintf("rank %d (%s): %s", r.Rank, r.Node, r.Why))
	case StateTraced:
		g.traced(s, r)
	}
}

// traced takes a rank's report of a step of the capture, once.
func (g *gathering) traced(s *rankState, r Report) {
	if r.Step < g.at || r.Step >= g.at+g.o.Steps || s.traced[r.Step] {
		return
	}
	s.traced[r.Step] = true
	g.reports = append(g.reports, r)
	if r.Chunks > 0 && g.keeping {
		g.want[traceKey{r.Rank, r.Step}] = min(r.Chunks, maxPiecesATrace)
	}
	if r.Why != "" {
		g.o.say(fmt.Sprintf("rank %d step %d: %s", r.Rank, r.Step, r.Why))
	}
	g.o.say(fmt.Sprintf("rank %d step %d traced on %s: %.1f ms, communication %.1f ms", r.Rank, r.Step, r.Node, r.Figures.DurationUs/1e3, r.Figures.CommUs/1e3))
}

// takePiece holds a piece of a kept trace (header "rank/step/seq"), in
// order, within the kept budget; pieces nobody asked for are not held.
func (g *gathering) takePiece(m *nats.Msg, header string) {
	var k traceKey
	var seq int
	if _, err := fmt.Sscanf(header, "%d/%d/%d", &k.rank, &k.step, &seq); err != nil || m.Header.Get(HeaderID) != g.id || !g.keeping {
		return
	}
	if g.state[k.rank] == nil || k.step < g.at || k.step >= g.at+g.o.Steps || seq >= maxPiecesATrace || len(m.Data) > ChunkBytes {
		return
	}
	if g.keptBytes+int64(len(m.Data)) > keptBudget {
		g.overKept = true
		return
	}
	if seq == len(g.chunks[k]) {
		g.chunks[k] = append(g.chunks[k], m.Data)
		g.keptBytes += int64(len(m.Data))
	}
}

// view merges the reports and says which ranks are missing and why.
func (g *gathering) view() *View {
	v := Merge(g.id, g.o.Job, g.reports)
	for r, s := range g.state {
		switch {
		case s.failed != "":
			v.Missing = append(v.Missing, Missing{Rank: r, Why: s.failed})
		case int64(len(s.traced)) < g.o.Steps && !s.accepted:
			v.Missing = append(v.Missing, Missing{Rank: r, Why: fmt.Sprintf("no answer within %s: the rank does not take capture requests (a process without tpsprof.torch, or an older one)", g.o.Timeout)})
		case int64(len(s.traced)) < g.o.Steps:
			v.Missing = append(v.Missing, Missing{Rank: r, Why: fmt.Sprintf("traced %d of %d steps within %s (the rank did not reach step %d, or its traces were not analysed)", len(s.traced), g.o.Steps, g.o.Timeout, g.at+g.o.Steps-1)})
		}
	}
	slices.SortFunc(v.Missing, func(a, b Missing) int { return int(a.Rank - b.Rank) })
	v.withholdForMissing()
	if g.overReports {
		v.Notes = append(v.Notes, fmt.Sprintf("the answers passed %d MiB: the rest were not read (a capture this large, or forged answers)", g.budget>>20))
	}
	if g.overKept {
		v.Notes = append(v.Notes, fmt.Sprintf("the kept traces passed %d MiB: the rest were not kept", keptBudget>>20))
	}
	return v
}

// notATrace says why data is not a gzipped profiler trace ("" when it
// is): a whole gzip stream (its checksum read at the end) of JSON that
// opens as a trace does, an object or an array.
func notATrace(data []byte) string {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return "not gzip: " + err.Error()
	}
	var head [64]byte
	n, err := io.ReadFull(zr, head[:])
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return "gzip: " + err.Error()
	}
	if t := bytes.TrimLeft(head[:n], " \t\r\n"); len(t) == 0 || (t[0] != '{' && t[0] != '[') {
		return "not JSON of a trace"
	}
	if _, err := io.Copy(io.Discard, zr); err != nil {
		return "gzip: " + err.Error()
	}
	return ""
}

// keep writes the whole traces into the capture's folder (root, at dir),
// and the ranks' reports as analysed, so the capture can be merged again
// (Merge) without the ranks; v lists the files kept.
func (g *gathering) keep(v *View, root *os.Root, dir string) error {
	for k, n := range g.want {
		parts := g.chunks[k]
		if len(parts) < n {
			v.Notes = append(v.Notes, fmt.Sprintf("rank %d step %d: the trace arrived incomplete (%d of %d pieces): not kept", k.rank, k.step, len(parts), n))
			continue
		}
		data := slices.Concat(parts...)
		if why := notATrace(data); why != "" {
			// (26 bytes of text were kept as a .json.gz)
			v.Notes = append(v.Notes, fmt.Sprintf("rank %d step %d: the trace that arrived is not one (%s): rejected, not kept", k.rank, k.step, why))
			continue
		}
		// the name is made here from two numbers, never the sender's
		name := fmt.Sprintf("rank%d.step%d.pt.trace.json.gz", k.rank, k.step)
		if err := safefs.CreateNew(root, name, data); err != nil {
			return fmt.Errorf("capture: keep traces: %w", err)
		}
		v.Kept = append(v.Kept, filepath.Join(dir, name))
	}
	if b, err := json.Marshal(g.reports); err == nil {
		if err := safefs.CreateNew(root, ReportsFile, b); err != nil {
			return fmt.Errorf("capture: keep reports: %w", err)
		}
	}
	slices.Sort(v.Kept)
	return nil
}
