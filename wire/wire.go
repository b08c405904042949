// Package wire is tpsprof's transport encoding: the NATS subjects and the
// versioned payloads agents publish and collectors read. docs/wire.md is the
// reference.
//
// Step records, node partials and GPU samples, one per rank or GPU every
// step or second, travel as compact binary messages (varints: a fraction
// of their JSON size and many times faster to decode); events and run
// metadata, which are few, travel as JSON.
//
// It owns the encodings and their bounds (a message too large or corrupt
// is an error, never a partial result). It never sends: natsconn
// connects, the agent publishes, the collector subscribes.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/tpsprof/tpsprof/tps"
)

// Version is the wire version, part of every subject.
const Version = "v1"

// Subject prefixes and builders. Job and node are single subject tokens.
const Prefix = "tpsprof." + Version

// StepsSubject is where an agent publishes the step records of job from node.
func StepsSubject(job, node string) string { return Prefix + "." + job + ".steps." + node }

// GPUSubject is where an agent publishes the GPU samples of node.
func GPUSubject(job, node string) string { return Prefix + "." + job + ".gpu." + node }

// PartialSubject is where an agent publishes its node's step partials
// (tps.Partial, binary: AppendPartials), for aggregators (docs/scale.md).
func PartialSubject(job, node string) string { return Prefix + "." + job + ".partial." + node }

// EventsSubject carries run events.
func EventsSubject(job string) string { return Prefix + "." + job + ".events" }

// MetaSubject carries run metadata.
func MetaSubject(job string) string { return Prefix + "." + job + ".meta" }

// AttemptSubject is where `tpsprof launch` asks the collector which attempt
// a new launch of the job is (request-reply; see AttemptReply).
func AttemptSubject(job string) string { return Prefix + "." + job + ".attempt" }

// CaptureSubject is where `tpsprof trace` asks the agents serving job's
// ranks for an on-demand capture (package capture). Outside Prefix: a
// durable stream, which holds everything under Prefix, must not keep
// requests.
func CaptureSubject(job string) string { return "tpsprof.ctl." + Version + "." + job + ".capture" }

// StragglerSubject is where `tpsprof trace --straggler` asks the collector
// which ranks of job to capture (request-reply).
func StragglerSubject(job string) string { return "tpsprof.ctl." + Version + "." + job + ".straggler" }

// AllStraggler matches every job's straggler questions.
const AllStraggler = "tpsprof.ctl." + Version + ".*.straggler"

// ParseCtlSubject splits a control subject (tpsprof.ctl.v1.JOB.KIND) into
// job and kind.
func ParseCtlSubject(subj string) (job, kind string, err error) {
	p := strings.Split(subj, ".")
	if len(p) != 5 || p[0] != "tpsprof" || p[1] != "ctl" || p[2] != Version || !tps.ValidJobID(p[3]) {
		return "", "", fmt.Errorf("wire: not a control subject: %q", subj)
	}
	return p[3], p[4], nil
}

// AttemptReply answers a request on AttemptSubject: what the collector
// knows of the job's attempts, from memory and from its Parquet folder.
type AttemptReply struct {
	// HasData is true when the job has step rows or attempt events.
	HasData bool `json:"has_data"`
	// MaxAttempt is the highest attempt seen (records or events).
	MaxAttempt int64 `json:"max_attempt"`
	// Running is an attempt some node started and has not ended (-1 for
	// none), started RunningSinceUnixNs.
	Running            int64 `json:"running"`
	RunningSinceUnixNs int64 `json:"running_since_unix_ns,omitempty"`
}

// Choose applies the launch rule (docs/capture.md, "Attempts and runs"):
// join the running attempt when it started within join of now (the other
// nodes of one launch), else the attempt after the highest the job has
// (0 for a job without data). It returns the attempt and a sentence for
// the user.
func (r AttemptReply) Choose(now time.Time, join time.Duration) (int64, string) {
	if r.Running >= 0 && r.RunningSinceUnixNs > 0 && now.Sub(time.Unix(0, r.RunningSinceUnixNs)) <= join {
		return r.Running, fmt.Sprintf("attempt %d (joining the attempt other nodes started %s ago)", r.Running,
			now.Sub(time.Unix(0, r.RunningSinceUnixNs)).Round(time.Second))
	}
	if !r.HasData {
		return 0, "attempt 0 (the job has no data yet)"
	}
	if r.MaxAttempt < 0 || r.MaxAttempt >= tps.MaxAttempt {
		// a collector that never bounded attempts: never overflow, never go negative
		return tps.MaxAttempt, fmt.Sprintf("attempt %d (the job's data claims attempt %d, past the limit: pass --attempt)", tps.MaxAttempt, r.MaxAttempt)
	}
	next := r.MaxAttempt + 1
	return next, fmt.Sprintf("attempt %d (the job has data up to attempt %d: this launch is a new attempt, reported apart from the earlier ones)", next, r.MaxAttempt)
}

// Wildcards a collector subscribes to.
const (
	AllSteps    = Prefix + ".*.steps.*"
	AllGPU      = Prefix + ".*.gpu.*"
	AllEvents   = Prefix + ".*.events"
	AllMeta     = Prefix + ".*.meta"
	AllPartials = Prefix + ".*.partial.*"
	AllAttempt  = Prefix + ".*.attempt"
)

// NodeToken turns a host name into a subject token: characters outside
// [A-Za-z0-9_-] become '_'.
func NodeToken(node string) string {
	if node == "" {
		return "unknown"
	}
	var b strings.Builder
	for i := 0; i < len(node) && i < 64; i++ {
		c := node[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' {
			b.WriteByte(c)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// ParseSubject splits a v1 subject into job, kind (steps, gpu, partial,
// events, meta, attempt) and node (empty for events, meta and attempt).
func ParseSubject(subj string) (job, kind, node string, err error) {
	// Called once per message: parsed with Cut rather than Split, which
	// allocated a slice every time.
	rest, ok := strings.CutPrefix(subj, Prefix+".")
	if !ok {
		return "", "", "", fmt.Errorf("wire: subject %q is not a tpsprof %s subject", subj, Version)
	}
	job, rest, ok = strings.Cut(rest, ".")
	if !ok {
		return "", "", "", fmt.Errorf("wire: subject %q is not a tpsprof %s subject", subj, Version)
	}
	kind, node, hasNode := strings.Cut(rest, ".")
	switch {
	case (kind == "steps" || kind == "gpu" || kind == "partial") && hasNode && node != "" && !strings.Contains(node, "."):
	case (kind == "events" || kind == "meta" || kind == "attempt") && !hasNode:
		node = ""
	default:
		return "", "", "", fmt.Errorf("wire: subject %q has an unknown layout", subj)
	}
	if !tps.ValidJobID(job) {
		return "", "", "", fmt.Errorf("wire: subject %q: invalid job id", subj)
	}
	return job, kind, node, nil
}

// Errors of the step batch decoder.
var (
	ErrBadMagic  = errors.New("wire: not a tpsprof step batch (bad magic or version)")
	ErrTruncated = errors.New("wire: step batch truncated")
	ErrTooLarge  = errors.New("wire: step batch too large")
)

// magic starts a step batch: "TPS" and the binary layout version.
var magic = [4]byte{'T', 'P', 'S', 1}

// MaxBatchRecords bounds a batch so a corrupt count cannot make the decoder
// allocate without limit.
const MaxBatchRecords = 1 << 16

// presence bits of the optional fields.
const (
	hasDP = 1 << iota
	hasTP
	hasPP
	hasCP
	hasEP
	hasLocalRank
	hasLoss
	isSkipped
	// hasTrace: figures from a profiler trace follow the loss (three
	// varints). Decoders before it reject such records as unknown bits.
	hasTrace
	// hasSeqSq: the batch's Σ document length² follows (a varint).
	hasSeqSq
	// hasBytes: the text's UTF-8 bytes follow (a varint).
	hasBytes
	// hasGen: the generation phase follows (four varints: gen_ns,
	// requests, prompt tokens, output tokens).
	hasGen
	// hasCost: the capture's own cost follows (two varints: capture_ns,
	// capture_cpu_ns).
	hasCost
	// hasMem: the step's device memory follows (three varints: peak
	// allocated, peak reserved, capacity).
	hasMem
	// hasHost: the step's host time splits follow (a varint: gc_ns).
	// From hasTrace on, group g of tps.Measures has bit hasTrace << (g -
	// tps.WireTrace): a new group is a constant there and a bit here.
	hasHost
	// hasHostWork: the training thread's CPU time before the step's first
	// forward follows (a varint: host_ns).
	hasHostWork
	// hasCostParts: the capture cost's communication parts follow (two
	// varints: capture_comm_ns, capture_comm_cpu_ns).
	hasCostParts
)

// AppendSteps appends a step batch holding recs to dst.
func AppendSteps(dst []byte, recs []tps.StepRecord) []byte {
	dst = append(dst, magic[:]...)
	dst = binary.AppendUvarint(dst, uint64(len(recs)))
	for i := range recs {
		dst = appendStep(dst, &recs[i])
	}
	return dst
}

func appendStep(b []byte, r *tps.StepRecord) []byte {
	var bits uint64
	opt := [...]*int32{r.DPRank, r.TPRank, r.PPRank, r.CPRank, r.EPRank, r.LocalRank}
	for i, p := range opt {
		if p != nil {
			bits |= 1 << i
		}
	}
	if r.Loss != nil {
		bits |= hasLoss
	}
	if r.Skipped {
		bits |= isSkipped
	}
	for _, g := range optionalGroups {
		for _, m := range g.measures {
			if *m.Of(r) != 0 {
				bits |= g.bit
				break
			}
		}
	}
	b = binary.AppendUvarint(b, bits)
	b = appendString(b, r.Job)
	for _, v := range [...]int64{r.Attempt, r.Step, r.Rank, r.WorldSize} {
		b = binary.AppendVarint(b, v)
	}
	for _, p := range opt {
		if p != nil {
			b = binary.AppendVarint(b, int64(*p))
		}
	}
	b = appendString(b, r.Node)
	b = appendString(b, r.GPUUUID)
	for _, m := range coreMeasures {
		b = binary.AppendVarint(b, *m.Of(r))
	}
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(r.FLOPs))
	if r.Loss != nil {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(*r.Loss))
	}
	for _, g := range optionalGroups {
		if bits&g.bit != 0 {
			for _, m := range g.measures {
				b = binary.AppendVarint(b, *m.Of(r))
			}
		}
	}
	return b
}

// The measures of a record, from tps.Measures: the core varints, then the
// optional groups in this order, each present when its bit is set.
var (
	coreMeasures   = tps.MeasuresIn(tps.WireCore)
	optionalGroups = []struct {
		bit      uint64
		measures []*tps.Measure
	}{}
	lastBit = uint64(hasTrace) << (tps.NumWireGroups - 1 - tps.WireTrace)
)

func init() {
	if lastBit != hasCostParts {
		panic("wire: tps.Measures has a wire group with no presence bit")
	}
	for g := tps.WireTrace; g < tps.NumWireGroups; g++ {
		optionalGroups = append(optionalGroups, struct {
			bit      uint64
			measures []*tps.Measure
		}{hasTrace << (g - tps.WireTrace), tps.MeasuresIn(g)})
	}
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decoder reads a batch, interning repeated strings (job, node, GPU
// UUIDs) so a batch of one node's ranks allocates each only once. The
// first internSmall distinct strings are found by a linear scan (a node's
// batch holds about ten: no map to allocate per message); past them, a map.
type decoder struct {
	b     []byte
	err   error
	small [internSmall]string
	n     int
	more  map[string]string
}

const internSmall = 16

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = ErrTruncated
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = ErrTruncated
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 1 {
		d.err = ErrTruncated
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) float() float64 {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 8 {
		d.err = ErrTruncated
		return 0
	}
	v := math.Float64frombits(binary.LittleEndian.Uint64(d.b))
	d.b = d.b[8:]
	return v
}

func (d *decoder) string(limit int) string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > uint64(limit) {
		d.err = fmt.Errorf("%w: string of %d bytes (limit %d)", ErrTooLarge, n, limit)
		return ""
	}
	if uint64(len(d.b)) < n {
		d.err = ErrTruncated
		return ""
	}
	raw := d.b[:n]
	d.b = d.b[n:]
	for _, s := range d.small[:d.n] {
		if s == string(raw) { // no allocation for the comparison
			return s
		}
	}
	if s, ok := d.more[string(raw)]; ok {
		return s
	}
	s := string(raw)
	switch {
	case d.n < internSmall:
		d.small[d.n] = s
		d.n++
	case len(d.more) < 1024:
		if d.more == nil {
			d.more = make(map[string]string)
		}
		d.more[s] = s
	}
	return s
}

// DecodeSteps appends the records of a step batch to dst, all or none: a
// corrupt batch leaves dst as it was. Records are decoded, not validated: the caller validates each (tps.StepRecord.Validate).
func DecodeSteps(data []byte, dst []tps.StepRecord) ([]tps.StepRecord, error) {
	if len(data) < len(magic) || [4]byte(data[:4]) != magic {
		return dst, ErrBadMagic
	}
	start := len(dst)
	d := decoder{b: data[4:]}
	n := d.uvarint()
	if d.err != nil {
		return dst, d.err
	}
	if n > MaxBatchRecords {
		return dst, fmt.Errorf("%w: %d records (limit %d)", ErrTooLarge, n, MaxBatchRecords)
	}
	// A record takes at least 27 bytes; a count the payload cannot hold is corrupt.
	if n*27 > uint64(len(d.b)) {
		return dst, ErrTruncated
	}
	dst = slices.Grow(dst, int(n))
	// The optional int32 fields of the whole batch share one allocation,
	// the losses another.
	var ints []int32
	var losses []float64
	for i := uint64(0); i < n; i++ {
		// Decode in place: a StepRecord is 264 bytes, copying it was a
		// fifth of the collector's time (BENCHMARKS.md).
		dst = append(dst, tps.StepRecord{})
		r := &dst[len(dst)-1]
		bits := d.uvarint()
		if bits >= lastBit<<1 {
			return dst[:start], fmt.Errorf("wire: record %d: unknown field bits %#x", i, bits)
		}
		r.Job = d.string(64)
		r.Attempt, r.Step, r.Rank, r.WorldSize = d.varint(), d.varint(), d.varint(), d.varint()
		opt := [...]**int32{&r.DPRank, &r.TPRank, &r.PPRank, &r.CPRank, &r.EPRank, &r.LocalRank}
		for j, p := range opt {
			if bits&(1<<j) == 0 {
				continue
			}
			v := d.varint()
			if v < math.MinInt32 || v > math.MaxInt32 {
				return dst[:start], fmt.Errorf("wire: record %d: coordinate %d out of int32 range", i, v)
			}
			if len(ints) == cap(ints) {
				ints = make([]int32, 0, 6*int(min(n-i, 256)))
			}
			ints = append(ints, int32(v))
			*p = &ints[len(ints)-1]
		}
		r.Node = d.string(tps.MaxStringLen)
		r.GPUUUID = d.string(tps.MaxStringLen)
		for _, m := range coreMeasures {
			*m.Of(r) = d.varint()
		}
		r.FLOPs = d.float()
		if bits&hasLoss != 0 {
			if len(losses) == cap(losses) { // one allocation per batch, like ints
				losses = make([]float64, 0, int(min(n-i, 1024)))
			}
			losses = append(losses, d.float())
			r.Loss = &losses[len(losses)-1]
		}
		r.Skipped = bits&isSkipped != 0
		for _, g := range optionalGroups {
			if bits&g.bit != 0 {
				for _, m := range g.measures {
					*m.Of(r) = d.varint()
				}
			}
		}
		if d.err != nil {
			return dst[:start], fmt.Errorf("record %d: %w", i, d.err)
		}
	}
	if len(d.b) != 0 {
		return dst[:start], fmt.Errorf("wire: %d bytes after the last record", len(d.b))
	}
	return dst, nil
}
