package cli

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/mfu"
	"github.com/tpsprof/tpsprof/tps"
)

type gpuReport struct {
	Devices []gpuLine `json:"devices"`
}

type gpuLine struct {
	agent.GPUInfo
	PeakKey     string         `json:"peak_key,omitempty"`
	PeakBF16    float64        `json:"peak_bf16_tflops,omitempty"`
	PeakError   string         `json:"peak_error,omitempty"`
	Sample      *tps.GPUSample `json:"sample,omitempty"`
	SampleErr   string         `json:"sample_error,omitempty"`
	Unsupported []string       `json:"unsupported,omitempty"`
}

func runGPUs(args []string, stdout, stderr io.Writer) int {
	const cmd = "gpus"
	fs := newFlagSet(cmd, "gpus [--json]", `  tpsprof gpus           # what this node's GPUs report through NVML, and the peak tpsprof will use
  tpsprof gpus --json
`, stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	r, err := agent.OpenNVML()
	if err != nil && *asJSON {
		// the JSON reader gets JSON: no GPU, and why
		printJSON(stdout, map[string]any{"devices": []any{}, "error": err.Error()})
		return exitError
	}
	if err != nil {
		if errors.Is(err, agent.ErrNoNVML) {
			fmt.Fprintf(stderr, "tpsprof gpus: no GPU telemetry on this node: %v\n", err)
			return exitError
		}
		failErr(stderr, "gpus", err)
		return exitError
	}
	defer r.Close()
	rep := gpuReport{}
	for _, d := range r.Devices() {
		l := gpuLine{GPUInfo: d}
		if g, err := mfu.LookupGPU(d.Name); err == nil {
			l.PeakKey = g.Key
			p, _ := g.Peak(mfu.BF16)
			l.PeakBF16 = p / 1e12
		} else {
			l.PeakError = err.Error()
		}
		s, err := r.Sample(d.Index)
		if err != nil {
			l.SampleErr = err.Error()
		} else {
			s.UnixNs = time.Now().UnixNano()
			l.Sample = &s
			l.Unsupported = absentFields(&s)
		}
		rep.Devices = append(rep.Devices, l)
	}
	if *asJSON {
		printJSON(stdout, rep)
		return exitOK
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "index\tname\tuuid\tpeak (bf16)\tutil\tpower\tSM clock\ttemp\tnot reported")
	for _, l := range rep.Devices {
		peak := "unknown: use --peak-tflops"
		if l.PeakKey != "" {
			peak = fmt.Sprintf("%s %.0f TFLOP/s", l.PeakKey, l.PeakBF16)
		}
		if l.Sample == nil {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\tread failed: %s\n", l.Index, l.Name, l.UUID, peak, l.SampleErr)
			continue
		}
		s := l.Sample
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%v\n", l.Index, l.Name, l.UUID, peak,
			fmtF(s.GPUUtilPct, "%.0f%%"), fmtF(s.PowerW, "%.0f W"), fmtI(s.SMClockMHz, "%d MHz"), fmtI(s.TempC, "%d C"), l.Unsupported)
	}
	tw.Flush()
	return exitOK
}

func fmtF(p *float64, f string) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf(f, *p)
}

func fmtI(p *int64, f string) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf(f, *p)
}

// absentFields names the readings the GPU did not report.
func absentFields(s *tps.GPUSample) []string {
	var out []string
	for name, absent := range map[string]bool{
		"energy": s.EnergyMJ == nil, "clock_event_reasons": s.ClockEventReason == nil, "pcie": s.PCIeTxBps == nil,
		"nvlink": s.NVLinkTxBytes == nil, "ecc": s.ECCCorrected == nil, "remapped_rows": s.RemappedCorr == nil,
		"xid": s.XIDEvents == nil, "gpm": s.GPMSMUtilPct == nil,
	} {
		if absent {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}
