package collector

import (
	"bytes"
	"encoding/json"
	"math"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tpsprof/tpsprof/report"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/wire"
)

// viewsJob publishes a 4-rank data-parallel job on one node whose rank 2
// computes twice as long from step 10 on (the others wait for it in their
// collectives), steps of 500 ms (900 ms once slowed: the mean of the steps'
// rates is 6% above tokens ÷ time) with 20 ms of
// host time between them, tokensPerRank a rank a step. It returns the
// job's own truth: its tokens over the periods of the steps from step 1
// on, and over the last 10 steps.
func viewsJob(t *testing.T, nc *nats.Conn, job string, steps int64, tokensPerRank int64) (whole, last10 float64) {
	t.Helper()
	const ms = int64(1e6)
	at := time.Now().Add(-time.Hour).UnixNano()
	var recs []tps.StepRecord
	var tok, sec, tok10, sec10 float64
	prevEnd := int64(0)
	for s := range steps {
		d := 500 * ms
		if s >= 10 {
			d = 900 * ms
		}
		for r := range int64(4) {
			exposed := d - 400*ms // compute is the rest: 400 ms
			if r == 2 && s >= 10 {
				exposed = d - 800*ms
			}
			recs = append(recs, tps.StepRecord{Job: job, Step: s, Rank: r, WorldSize: 4, Node: "vm", Tokens: tokensPerRank,
				StartUnixNs: at, EndUnixNs: at + d, DurationNs: d, ExposedCommNs: exposed, CommNs: exposed + 50*ms})
		}
		if s >= 1 {
			period := float64(at+d-max(prevEnd, at)) / 1e9
			tok += float64(4 * tokensPerRank)
			sec += period
			if s >= steps-10 {
				tok10 += float64(4 * tokensPerRank)
				sec10 += period
			}
		}
		prevEnd = at + d
		at += d + 20*ms
	}
	if err := nc.Publish(wire.StepsSubject(job, "vm"), wire.AppendSteps(nil, recs)); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	return tok / sec, tok10 / sec10
}

// What people read first is true in every view: the live line, the live
// page's API and its DOM in a real browser, /metrics, and the report's
// text, JSON, HTML and --compare, over the collector's own Parquet. In
// each the headline is the job's own tokens over its step time (within
// 0.5%), the breakdown has every part (waiting for slower peers
// included) and adds up to 100%, and nothing reads NaN or Inf. A job that
// counted no token says so in each, with no figure. The loops (steps
// that are the loop's period, their data wait the time before the
// forward) likewise, their data stall in each view.
func TestEveryViewTellsTheHeadline(t *testing.T) {
	t.Run("straggler", everyViewStraggler)
	t.Run("loops", everyViewLoops)
}

func everyViewStraggler(t *testing.T) {
	out := t.TempDir()
	c, nc := startCollectorWith(t, Config{OutDir: out, Grace: time.Minute})
	whole, last10 := viewsJob(t, nc, "views", 40, 1000)
	viewsJob(t, nc, "notok", 20, 0)
	_, doneTPS := viewsJob(t, nc, "done", 20, 1000)
	if err := c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	// the third job finished: the page keeps its final figures
	ev, _ := json.Marshal(tps.Event{Job: "done", Kind: tps.EventAttemptEnd, Rank: -1, StartUnixNs: time.Now().UnixNano(), EndUnixNs: time.Now().UnixNano()})
	nc.Publish(wire.EventsSubject("done"), ev)
	// the collector's Sync flushes its own connection: this one's first
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 0.005*want {
			t.Errorf("%s: %v tokens/s, the job's own tokens ÷ time %v", what, got, want)
		}
	}
	noNumber := regexp.MustCompile(`\bNaN\b|\bInfinity\b|[+-]Inf\b`)
	clean := func(view, text string) {
		t.Helper()
		if m := noNumber.FindString(text); m != "" {
			t.Errorf("%s holds %q", view, m)
		}
	}

	// the live line
	var line string
	for _, j := range c.jobList() {
		if j.st.id == "views" {
			j.mu.Lock()
			j.st.newSinceLog = true
			line = j.st.liveLine(time.Now())
			j.mu.Unlock()
		}
	}
	if !strings.Contains(line, "TPS "+tps.SI(last10)+" ") || !strings.Contains(line, "waiting for rank 2 on vm") {
		t.Errorf("live line %q, want TPS %s and the wait for rank 2", line, tps.SI(last10))
	}

	// /api/summary
	var sum LiveSummary
	body := get(t, c, "/api/summary")
	clean("/api/summary", body)
	if err := json.Unmarshal([]byte(body), &sum); err != nil {
		t.Fatal(err)
	}
	byJob := map[string]LiveJob{}
	for _, j := range sum.Jobs {
		byJob[j.Job] = j
	}
	lj := byJob["views"]
	if lj.TPS == nil || lj.WindowSteps != LiveWindowSteps {
		t.Fatalf("live job %+v", lj)
	}
	near("live TPS", *lj.TPS, last10)
	checkShares(t, "live breakdown", lj.Breakdown)
	if w := lj.Breakdown["waiting_for_peers"]; w < 0.05 {
		t.Errorf("live waiting for peers %v: the slow rank's 400 ms a step is not there", w)
	}
	// rank 2 explains the waiting: the headroom is its 3 waiters' share
	// (the mean over 4 ranks counts rank 2, which does not wait), the
	// report's rule
	waiters, _ := tps.WaitersShare(lj.Breakdown["waiting_for_peers"], 4, 1)
	if len(lj.Findings) == 0 || lj.Findings[0].Key != "waiting_for_peers" || lj.Findings[0].Who != "rank 2" ||
		math.Abs(lj.Findings[0].HeadroomPct-100*(1/(1-waiters)-1)) > 1e-9 {
		t.Errorf("live findings %+v: want the waiting for rank 2 first, +%.1f%%", lj.Findings, 100*(1/(1-waiters)-1))
	}
	if nt := byJob["notok"]; nt.TPS != nil || nt.TPSPerGPU != nil || !strings.Contains(nt.TPSUnknown, "no tokens counted") {
		t.Errorf("a job without tokens: tps %v, tps_unknown %q", nt.TPS, nt.TPSUnknown)
	}

	// /metrics
	m := get(t, c, "/metrics")
	clean("/metrics", m)
	metric := func(name, labels string) (float64, bool) {
		x := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name+"{"+labels+"}") + ` (\S+)$`).FindStringSubmatch(m)
		if x == nil {
			return 0, false
		}
		v, _ := strconv.ParseFloat(x[1], 64)
		return v, true
	}
	if v, ok := metric("tpsprof_cluster_tokens_per_second", `job="views"`); !ok {
		t.Errorf("no TPS gauge")
	} else {
		near("/metrics TPS", v, last10)
	}
	shares := map[string]float64{}
	for _, p := range tps.ShareParts() {
		v, ok := metric("tpsprof_step_time_share_ratio", `job="views",part="`+p.Key+`"`)
		if !ok {
			t.Errorf("/metrics lacks the %s share", p.Key)
		}
		shares[p.Key] = v
	}
	checkShares(t, "/metrics shares", shares)
	if _, ok := metric("tpsprof_cluster_tokens_per_second", `job="notok"`); ok {
		t.Errorf("a TPS gauge for a job that counted no token")
	}
	// the counters' ratio is tokens over step time over all 40 steps: the
	// first's time is its own 0.5 s (no step before it), the others' the
	// whole-run figure's 156,000 tokens over their periods
	tok, _ := metric("tpsprof_tokens_total", `job="views"`)
	secs, _ := metric("tpsprof_step_seconds_total", `job="views"`)
	if secs <= 0 {
		t.Errorf("tpsprof_step_seconds_total %v", secs)
	} else {
		near("rate(tokens) / rate(step seconds)", tok/secs, 160000/(0.5+156000/whole))
	}

	// the live page's DOM in a real browser
	srv := httptest.NewServer(c.Handler())
	dom := dumpDOM(t, srv.URL+"/")
	srv.Close()
	clean("the live page", dom)
	if !strings.Contains(dom, `<b class="v-TPS">`+tps.SI(last10)+`</b>`) {
		t.Errorf("the live page does not lead with %s tokens/s:\n%.4000s", tps.SI(last10), dom)
	}
	var bar float64
	for _, p := range tps.ShareParts() {
		x := regexp.MustCompile(`class="part-`+p.Key+`" data-share="([^"]+)"`).FindAllStringSubmatch(dom, -1)
		if len(x) == 0 {
			t.Errorf("the live page's bar lacks %s", p.Key)
			continue
		}
		v, _ := strconv.ParseFloat(x[0][1], 64)
		bar += v
	}
	if math.Abs(bar-1) > 1e-3 {
		t.Errorf("the live page's bar adds up to %v", bar)
	}
	if !strings.Contains(dom, "to fix first: waiting for slower peers (rank 2)") {
		t.Errorf("the live page does not lead its findings with the waiting")
	}
	if !strings.Contains(dom, "throughput n/a: no tokens counted") {
		t.Errorf("the live page does not say the second job counted no token")
	}
	if i := strings.Index(dom, `id="job-done"`); i < 0 {
		t.Errorf("the finished job is not on the page")
	} else {
		box := dom[i:]
		if k := strings.Index(box[1:], `id="job-`); k > 0 {
			box = box[:k+1]
		}
		if !strings.Contains(box, "finished: final figures") || !strings.Contains(box, `<b class="v-TPS">`+tps.SI(doneTPS)+`</b>`) ||
			!strings.Contains(box, `class="part-waiting_for_peers"`) {
			t.Errorf("the finished job lost its final figures (want %s tokens/s, its breakdown, marked finished):\n%.2000s", tps.SI(doneTPS), box)
		}
	}

	// the report, over what the collector wrote
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := report.Analyze(filepath.Join(out, "views"), report.Options{Warmup: 1})
	if err != nil {
		t.Fatal(err)
	}
	if v := report.Invariants(rep); len(v) > 0 {
		t.Errorf("report invariants: %v", v)
	}
	near("report headline", rep.Summary.AggregateTPS, whole)
	if len(rep.Findings) == 0 || rep.Findings[0].Bucket != "waiting_for_peers" || !strings.Contains(rep.Findings[0].Cause, "rank 2") {
		t.Errorf("the report's findings %+v: want the waiting for rank 2 first, as the live page's", rep.Findings)
	}
	var txt, md, html, cmpText, js bytes.Buffer
	report.WriteText(&txt, rep)
	report.WriteMarkdown(&md, rep)
	report.WriteHTML(&html, rep, nil)
	report.WriteCompare(&cmpText, rep, rep)
	json.NewEncoder(&js).Encode(rep)
	head := tps.SI(whole) + " tokens/s"
	for view, b := range map[string]string{"text": txt.String(), "Markdown": md.String(), "HTML": html.String(), "compare": cmpText.String(), "JSON": js.String()} {
		clean("the report's "+view, b)
		if view != "JSON" && !strings.Contains(b, head) && !strings.Contains(b, tps.SI(whole)+" ") {
			t.Errorf("the report's %s does not lead with %s", view, head)
		}
		if view != "JSON" && !strings.Contains(b, "waiting for slower peers") {
			t.Errorf("the report's %s lacks waiting for slower peers", view)
		}
	}
	var back struct {
		Summary struct {
			AggregateTPS float64 `json:"aggregate_tps"`
		} `json:"summary"`
	}
	json.Unmarshal(js.Bytes(), &back)
	near("report JSON", back.Summary.AggregateTPS, whole)

	none, err := report.Analyze(filepath.Join(out, "notok"), report.Options{Warmup: 1})
	if err != nil {
		t.Fatal(err)
	}
	if v := report.Invariants(none); len(v) > 0 {
		t.Errorf("report invariants without tokens: %v", v)
	}
	txt.Reset()
	report.WriteText(&txt, none)
	clean("the no-token report", txt.String())
	if !strings.Contains(txt.String(), "n/a: no tokens counted") || strings.Contains(txt.String(), "0.0 tokens/s") {
		t.Errorf("the report of a job without tokens:\n%s", txt.String())
	}
}

// loopJob publishes a nanoGPT-style loop as the Python package sends it
// (steps: loop, data_source: before_forward): each rank's step begins
// where its previous one ended, its first 30 ms the batch's making (the
// data wait), then 50-90 ms of compute; tokensPerRank a rank a step. It
// returns the job's own truth from step 1 on: tokens over the loop's
// wall time, over the last 10 steps', and the data wait's share.
func loopJob(t *testing.T, nc *nats.Conn, job string, ranks, steps, tokensPerRank int64) (whole, last10, data float64) {
	t.Helper()
	const ms = int64(1e6)
	meta, _ := json.Marshal(tps.RunMeta{Job: job, Steps: tps.StepsLoop, DataSource: "before_forward"})
	if err := nc.Publish(wire.MetaSubject(job), meta); err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(-time.Hour).UnixNano()
	var recs []tps.StepRecord
	var tok, sec, tok10, sec10, wait float64
	for s := range steps {
		// each rank's own work; the step ends at the slowest's (the
		// gradients' all-reduce), the others waiting in it
		own := make([]int64, ranks)
		var d int64
		for r := range own {
			own[r] = 30*ms + (50+(s*7+int64(r)*13)%41)*ms
			d = max(d, own[r])
		}
		for r := range ranks {
			recs = append(recs, tps.StepRecord{Job: job, Step: s, Rank: r, WorldSize: ranks, Node: "vm", Tokens: tokensPerRank,
				StartUnixNs: at, EndUnixNs: at + d, DurationNs: d, DataWaitNs: 30 * ms, FwdNs: own[r] / 3, BwdNs: own[r] / 2,
				CommNs: d - own[r] + 5*ms, ExposedCommNs: d - own[r]})
		}
		if s >= 1 {
			wait += float64(30*ms) / float64(d)
			tok += float64(ranks * tokensPerRank)
			sec += float64(d) / 1e9
			if s >= steps-10 {
				tok10 += float64(ranks * tokensPerRank)
				sec10 += float64(d) / 1e9
			}
		}
		at += d // the next step begins where this one ended
	}
	if err := nc.Publish(wire.StepsSubject(job, "vm"), wire.AppendSteps(nil, recs)); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	return tok / sec, tok10 / sec10, wait / float64(steps-1)
}

// everyViewLoops: a 2-rank loop and a one-process loop, whose steps are
// the loop's period (issue: a loop with no DataLoader read +35-46% TPS
// and no data stall when its batch's making fell out of its steps).
func everyViewLoops(t *testing.T) {
	out := t.TempDir()
	c, nc := startCollectorWith(t, Config{OutDir: out, Grace: time.Minute})
	type truth struct{ whole, last10, data float64 }
	jobs := map[string]truth{}
	for _, j := range []struct {
		name  string
		ranks int64
	}{{"loop2", 2}, {"loop1", 1}} {
		w, l, d := loopJob(t, nc, j.name, j.ranks, 40, 4096)
		jobs[j.name] = truth{w, l, d}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	within := func(what string, got, want, tol float64) {
		t.Helper()
		if math.Abs(got-want) > tol*want {
			t.Errorf("%s: %v, the job's own %v (tolerance %.1f%%)", what, got, want, 100*tol)
		}
	}
	var sum LiveSummary
	if err := json.Unmarshal([]byte(get(t, c, "/api/summary")), &sum); err != nil {
		t.Fatal(err)
	}
	m := get(t, c, "/metrics")
	seen := 0
	for _, lj := range sum.Jobs {
		tr, ok := jobs[lj.Job]
		if !ok {
			continue
		}
		seen++
		if lj.TPS == nil {
			t.Errorf("%s: no live TPS (%s)", lj.Job, lj.TPSUnknown)
			continue
		}
		within(lj.Job+" live TPS", *lj.TPS, tr.last10, 0.005)
		checkShares(t, lj.Job+" live breakdown", lj.Breakdown)
		if d := lj.Breakdown["data_stall"]; math.Abs(d-tr.data) > 0.02 {
			t.Errorf("%s live data stall %.3f, the job's own %.3f", lj.Job, d, tr.data)
		}
		x := regexp.MustCompile(`(?m)^tpsprof_cluster_tokens_per_second\{job="` + lj.Job + `"\} (\S+)$`).FindStringSubmatch(m)
		if x == nil {
			t.Errorf("%s: no TPS gauge", lj.Job)
		} else {
			v, _ := strconv.ParseFloat(x[1], 64)
			within(lj.Job+" /metrics TPS", v, tr.last10, 0.005)
		}
	}
	if seen != len(jobs) {
		t.Errorf("the live summary holds %d of the %d loops", seen, len(jobs))
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for name, tr := range jobs {
		rep, err := report.Analyze(filepath.Join(out, name), report.Options{Warmup: 1})
		if err != nil {
			t.Fatal(err)
		}
		if v := report.Invariants(rep); len(v) > 0 {
			t.Errorf("%s report invariants: %v", name, v)
		}
		s := rep.Summary
		within(name+" report headline", s.AggregateTPS, tr.whole, 0.005)
		within(name+" wall TPS (no gap named: the step TPS)", s.WallTPS, s.AggregateTPS, 0.02)
		if d := rep.Breakdown.DataStall; math.Abs(d-tr.data) > 0.02 {
			t.Errorf("%s report data stall %.3f, the job's own %.3f", name, d, tr.data)
		}
		var txt, html, js bytes.Buffer
		report.WriteText(&txt, rep)
		report.WriteHTML(&html, rep, nil)
		json.NewEncoder(&js).Encode(rep)
		for view, b := range map[string]string{"text": txt.String(), "HTML": html.String()} {
			if !strings.Contains(b, tps.SI(tr.whole)+" ") {
				t.Errorf("%s: the report's %s does not lead with %s tokens/s", name, view, tps.SI(tr.whole))
			}
			if !strings.Contains(b, "data stall") {
				t.Errorf("%s: the report's %s lacks the data stall", name, view)
			}
		}
		if !strings.Contains(txt.String(), "to its first forward") {
			t.Errorf("%s: the text does not say the data wait is the time before the forward:\n%s", name, txt.String())
		}
		var back struct {
			Summary struct {
				AggregateTPS float64 `json:"aggregate_tps"`
			} `json:"summary"`
		}
		json.Unmarshal(js.Bytes(), &back)
		within(name+" report JSON", back.Summary.AggregateTPS, tr.whole, 0.005)
	}
}

// checkShares: every part present, each in [0, 1], adding up to 1.
func checkShares(t *testing.T, what string, m map[string]float64) {
	t.Helper()
	var sum float64
	for _, p := range tps.ShareParts() {
		v, ok := m[p.Key]
		if !ok || v < 0 || v > 1 {
			t.Errorf("%s: %s = %v (present %v)", what, p.Key, v, ok)
		}
		sum += v
	}
	if math.Abs(sum-1) > 1e-3 {
		t.Errorf("%s adds up to %v: %v", what, sum, m)
	}
}

// One rank's clock an hour back (its records' times an hour early) is held
// out of the steps' start: the run is as long as it was, not an hour
// longer (it read "wall TPS 88.7 tokens/s, goodput 0.1%").
func TestAbsurdClockHeldOut(t *testing.T) {
	out := t.TempDir()
	c, nc := startCollectorWith(t, Config{OutDir: out, Grace: time.Minute})
	at := time.Now().Add(-2 * time.Hour).UnixNano()
	var recs []tps.StepRecord
	for s := range int64(30) {
		for r := range int64(2) {
			off := int64(0)
			if r == 1 {
				off = -int64(time.Hour)
			}
			recs = append(recs, tps.StepRecord{Job: "clock", Step: s, Rank: r, WorldSize: 2, Node: "vm", Tokens: 1000,
				StartUnixNs: at + s*1e9 + off, EndUnixNs: at + (s+1)*1e9 + off, DurationNs: 1e9})
		}
	}
	nc.Publish(wire.StepsSubject("clock", "vm"), wire.AppendSteps(nil, recs))
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := report.Analyze(filepath.Join(out, "clock"), report.Options{Warmup: 1})
	if err != nil {
		t.Fatal(err)
	}
	s, g := rep.Summary, rep.Goodput
	if s.WallTPS < 0.9*s.AggregateTPS || g.Goodput < 0.5 || g.ElapsedS > 120 {
		t.Errorf("wall TPS %.1f against %.1f of step time, goodput %.3f of %.0f s: the hour-early clock is in the figures", s.WallTPS, s.AggregateTPS, g.Goodput, g.ElapsedS)
	}
}
