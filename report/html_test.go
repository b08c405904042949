package report

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/internal/browser"
	"github.com/tpsprof/tpsprof/tps"
)

func chromium(t *testing.T) string {
	t.Helper()
	b, err := browser.Find()
	if err != nil {
		t.Fatalf("the HTML report test: %v", err)
	}
	return b
}

// openInBrowser loads a page in headless chromium and returns its DOM
// after rendering, the console messages, and a screenshot's path.
func openInBrowser(t *testing.T, page string) (dom, console, shot string) {
	t.Helper()
	bin := chromium(t)
	dir := t.TempDir()
	shot = filepath.Join(dir, "page.png")
	run := func(args ...string) (string, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		base := append(browser.Args(filepath.Join(dir, "profile")), "--enable-logging=stderr", "--v=0", "--virtual-time-budget=3000")
		cmd := exec.CommandContext(ctx, bin, append(base, args...)...)
		cmd.Env = append(os.Environ(), "HOME="+dir)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s: %v\n%s", bin, err, errb.String())
		}
		return out.String(), errb.String()
	}
	dom, console = run("--dump-dom", "file://"+page)
	_, c2 := run("--hide-scrollbars", "--window-size=1400,900", "--screenshot="+shot, "file://"+page)
	var msgs []string
	for _, l := range strings.Split(console+c2, "\n") {
		if strings.Contains(l, "CONSOLE") || strings.Contains(l, "Uncaught") || strings.Contains(l, "Refused to") {
			msgs = append(msgs, l)
		}
	}
	return dom, strings.Join(msgs, "\n"), shot
}

// The HTML report renders in a real browser: its cards, tables and every
// figure are there, nothing is fetched from elsewhere, and the console is
// clean. The screenshot is kept in the test's temporary folder.
func TestHTMLReportInBrowser(t *testing.T) {
	g := generate(t, t.TempDir(), 60, 50)
	rep, pd, err := analyzeWithPlotsChecked(g.dir, Options{Warmup: tps.AutoWarmup})
	if err != nil {
		t.Fatal(err)
	}
	figs, err := pd.Figures(rep)
	if err != nil {
		t.Fatal(err)
	}
	page := filepath.Join(t.TempDir(), "report.html")
	f, _ := os.Create(page)
	if err := WriteHTML(f, rep, figs); err != nil {
		t.Fatal(err)
	}
	f.Close()
	raw, _ := os.ReadFile(page)
	if m := regexp.MustCompile(`(?i)(src|href)="(https?:)?//`).Find(raw); m != nil {
		t.Errorf("the page fetches from elsewhere: %s", m)
	}
	if bytes.Contains(raw, []byte("<script")) {
		t.Error("the page has a script")
	}
	dom, console, shot := openInBrowser(t, page)
	if console != "" {
		t.Errorf("console messages:\n%s", console)
	}
	for _, want := range []string{`class="card`, "Where step time goes", "Goodput", "Slowest ranks", "Reading this report"} {
		if !strings.Contains(dom, want) {
			t.Errorf("the rendered page lacks %q", want)
		}
	}
	if n := strings.Count(dom, "<figure"); n != len(figs) || n < 5 {
		t.Errorf("%d figures rendered, %d drawn", n, len(figs))
	}
	if n := strings.Count(dom, "<svg"); n < len(figs)-1 {
		t.Errorf("%d inline SVGs for %d figures (the heatmap is a PNG)", n, len(figs))
	}
	if fi, err := os.Stat(shot); err != nil || fi.Size() < 20_000 {
		t.Errorf("screenshot %v (%v bytes): blank?", err, fi)
	}
	t.Logf("screenshot: %s", shot)
}

// The comparison page renders too.
func TestCompareHTMLInBrowser(t *testing.T) {
	a := generate(t, t.TempDir(), 60, 50)
	b := generate(t, t.TempDir(), 40, 30)
	ra, err := analyzeChecked(a.dir, Options{Warmup: tps.AutoWarmup})
	if err != nil {
		t.Fatal(err)
	}
	rb, err := analyzeChecked(b.dir, Options{Warmup: tps.AutoWarmup})
	if err != nil {
		t.Fatal(err)
	}
	page := filepath.Join(t.TempDir(), "compare.html")
	f, _ := os.Create(page)
	if err := WriteCompareHTML(f, ra, rb); err != nil {
		t.Fatal(err)
	}
	f.Close()
	dom, console, _ := openInBrowser(t, page)
	if console != "" {
		t.Errorf("console messages:\n%s", console)
	}
	if !strings.Contains(dom, "B against A") || strings.Count(dom, "<tr>") < 10 {
		t.Errorf("the comparison page lacks its table:\n%.2000s", dom)
	}
}
