#!/usr/bin/env bash
# The GPU check: what tpsprof measures on one NVIDIA GPU, each figure beside
# the job's own truth, PASS or FAIL. About 4-5 minutes on one H100/H200.
#
#   CGO_CFLAGS=-Wno-deprecated-declarations go build -trimpath -ldflags "-s -w" -o .dev/gpu/tpsprof ./cmd/tpsprof
#   BIN=.dev/gpu/tpsprof bash examples/gpu/check.sh                          # there
#   BIN=... bash examples/gpu/check.sh --tiny --cpu                          # a dry run on CPU
#   BIN=... bash examples/gpu/check.sh --parts 1,6                           # some parts only
#
# 1. a ~0.95 B Llama (transformers, random init, bf16) under DDP over NCCL
#    with one instrument() call: step time against CUDA-event periods, the
#    FLOPs PyTorch counted against the job's own FlopCounterMode count and
#    the analytic model of its config.json, the allocator's peak, the
#    capture's own cost, MFU from both FLOP counts;
# 2. two ranks sharing the GPU (gloo with CUDA tensors), rank 1 late in its
#    forward: `tpsprof trace` names it;
# 3. the Hugging Face Trainer callback (hf_train.py): every step measured;
# 4. zero-code (launch --auto) compiled DDP: every step measured;
# 5. the cost benchmark on CUDA (bench_torch.py --device cuda);
# 6. the cost by TraceML's protocol (cost_protocol.py --device cuda: fresh
#    processes, bare against instrument() and --auto, a DDP job of 13
#    buckets over NCCL), each against issue 58's goal: met or MISSED;
# 7. the same protocol's CPU job (2-rank DDP over gloo, 13 buckets) on this
#    machine's cores: issue 58's CPU goal, which a 2-core machine cannot
#    resolve (bare alone spreads by 1.8-2.1 ms a step there; the goal is
#    56 us), met or MISSED.
# Parts 6 and 7 are 15 fresh torchruns each (~10 s a run on a 2-core CPU
# machine, so ~2.5 minutes; not yet timed on a GPU machine); where one
# command may run 10 minutes, run --parts 1,2,3,4,5 and then --parts 6,7.
# Everything it writes goes under $OUT (default: a new temporary folder);
# the last line says how many checks failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-.dev/gpu/tpsprof}
PY=${PY:-python3}
OUT=${OUT:-$(mktemp -d)}
TINY="" CPU="" DEV=cuda PARTS=1,2,3,4,5,6,7
while [ $# -gt 0 ]; do
	case $1 in
	--tiny) TINY=--tiny ;;
	--cpu) CPU=--cpu DEV=cpu ;;
	--parts) PARTS=${2:?--parts needs a list, e.g. 1,5}; shift ;;
	*) echo "usage: $0 [--tiny] [--cpu] [--parts 1,2,3,4,5,6,7]" >&2; exit 2 ;;
	esac
	shift
done
part() { case ",$PARTS," in *",$1,"*) return 0 ;; esac; return 1; }
[ -x "$BIN" ] || { echo "no tpsprof binary at $BIN (BIN=...)" >&2; exit 2; }
mkdir -p "$OUT/home"
export HOME=$OUT/home # the collector writes its NATS token under HOME for launch to read
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
NATS=nats://127.0.0.1:4222
failed=0
echo "== tpsprof GPU check, $(date -u +%FT%TZ), output in $OUT"
$PY - <<'PY' || true
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "(no GPU)")
PY
"$BIN" collector --out "$OUT/data" --http 127.0.0.1:0 >"$OUT/collector.log" 2>&1 &
COL=$!
trap 'kill -INT $COL 2>/dev/null; wait $COL 2>/dev/null' EXIT
for _ in $(seq 50); do [ -s "$HOME/.config/tpsprof/nats-token" ] && break; sleep 0.2; done
launch() { "$BIN" launch --nats $NATS "$@"; }
TORCHRUN=($PY -m torch.distributed.run)
# torchrun's rendezvous: --standalone (a TCP store on a free port), or with
# RDZV_FILE_DIR set a file store there (where TCP stores cannot connect,
# e.g. a chroot without its own network namespace)
rdzv() {
	if [ -n "${RDZV_FILE_DIR:-}" ]; then
		echo "--rdzv_backend c10d --rdzv_endpoint $(mktemp -u -p "$RDZV_FILE_DIR") --rdzv_conf store_type=file"
	else
		echo --standalone
	fi
}

if part 1; then
echo "== 1. Llama, DDP, instrument()"
SEQ=2048
[ -n "$TINY" ] && SEQ=64
$PY examples/gpu/check.py config --truth "$OUT/llama" $TINY
TPSPROF_FLOPS_EVERY=5 launch --job gpu-llama --hf-config "$OUT/llama/config.json" --seq $SEQ -- \
	"${TORCHRUN[@]}" $(rdzv) --nproc_per_node 1 examples/gpu/check.py llama --truth "$OUT/llama" $TINY $CPU >"$OUT/llama.log" 2>&1 ||
	{ echo "FAIL: the Llama job (see $OUT/llama.log)"; failed=$((failed + 1)); }

fi

if part 2; then
echo "== 2. two ranks on one GPU, rank 1 slow: tpsprof trace"
mkdir -p "$OUT/capture"
launch --job gpu-capture -- "${TORCHRUN[@]}" $(rdzv) --nproc_per_node 2 examples/pytorch/phase_straggler.py --device $DEV --slow-rank 1 \
	--delay-ms 50 --phases forward --per-phase 100000 --stop "$OUT/capture/stop" --truth "$OUT/capture" \
	>"$OUT/capture.log" 2>&1 &
JOB=$!
sleep 25
"$BIN" trace gpu-capture --nats $NATS --steps 2 --quiet >"$OUT/trace.txt" 2>&1
touch "$OUT/capture/stop"
wait $JOB || { echo "FAIL: the capture job (see $OUT/capture.log)"; failed=$((failed + 1)); }
$PY examples/gpu/check.py verify-capture --trace "$OUT/trace.txt" --slow-rank 1 || failed=$((failed + 1))

fi

if part 3; then
echo "== 3. Hugging Face Trainer callback"
launch --job gpu-hf -- $PY examples/pytorch/hf_train.py --out "$OUT/hf" --truth "$OUT/hf-truth" --steps 20 \
	>"$OUT/hf.log" 2>&1 || { echo "FAIL: the Trainer job (see $OUT/hf.log)"; failed=$((failed + 1)); }

fi

if part 4; then
echo "== 4. zero-code compiled DDP"
launch --auto --job gpu-compile -- "${TORCHRUN[@]}" $(rdzv) --nproc_per_node 1 examples/gpu/check.py llama --truth "$OUT/compile" --tiny \
	--compile --steps 12 $CPU >"$OUT/compile.log" 2>&1 ||
	{ echo "FAIL: the compiled job (see $OUT/compile.log)"; failed=$((failed + 1)); }

fi

if part 5; then
echo "== 5. the cost benchmark"
launch --job gpu-bench -- $PY examples/pytorch/bench_torch.py --device $DEV >"$OUT/bench.json" 2>"$OUT/bench.log" ||
	{ echo "FAIL: the benchmark (see $OUT/bench.log)"; failed=$((failed + 1)); }

fi

kill -INT $COL 2>/dev/null
wait $COL 2>/dev/null
trap - EXIT

# cost DEVICE NPROC NAME WHAT: the cost protocol (its own collector; exit
# status 3: a goal missed, the figures printed) into $OUT/NAME.json and .log
cost() {
	local reps=5 steps=150 rc
	[ -n "$TINY" ] && reps=1 steps=20
	$PY examples/pytorch/cost_protocol.py --tpsprof "$BIN" --device "$1" --nproc "$2" --repeats $reps --steps $steps \
		>"$OUT/$3.json" 2>"$OUT/$3.log"
	rc=$?
	grep -E "^(met|MISSED)" "$OUT/$3.log"
	case $rc in
	0) ;;
	3) echo "MISSED: $4 (issue 58; $OUT/$3.json)" ;;
	*) echo "FAIL: $4 protocol (see $OUT/$3.log)"; failed=$((failed + 1)) ;;
	esac
}
if part 6; then
	echo "== 6. the cost by TraceML's protocol (fresh processes, against the bare job)"
	cost $DEV 1 cost "the cost goal"
fi
if part 7; then
	echo "== 7. the cost on CPU by the same protocol (2 ranks over gloo, this machine's cores)"
	cost cpu 2 cost-cpu "the CPU cost goal"
fi
echo "== verdicts"
if part 1; then
	"$BIN" report --json --no-plots "$OUT/data/gpu-llama" >"$OUT/llama-report.json" 2>"$OUT/llama-report.log"
	$PY examples/gpu/check.py verify-llama --truth "$OUT/llama" --report "$OUT/llama-report.json" || failed=$((failed + 1))
fi
for job in 3:gpu-hf:20 4:gpu-compile:12; do
	IFS=: read -r n name steps <<<"$job"
	part "$n" || continue
	"$BIN" report --json --no-plots --warmup 0 "$OUT/data/$name" >"$OUT/$name.json" 2>/dev/null
	$PY examples/gpu/check.py verify-steps --report "$OUT/$name.json" --steps "$steps" --name "$name" ||
		failed=$((failed + 1))
done
if part 5; then
	$PY examples/gpu/check.py verify-bench --bench "$OUT/bench.json" || failed=$((failed + 1))
fi
if part 1; then
	"$BIN" report --no-plots "$OUT/data/gpu-llama" | head -40
fi
echo "== $failed check(s) failed; everything is under $OUT"
[ $failed -eq 0 ]
