"""The GPU check's training job and its verdicts (examples/gpu/check.sh).

    check.py llama --truth DIR [--tiny] [--cpu]
        A Llama (transformers, random initialisation, bf16 on CUDA; about
        1 B parameters, or --tiny) trained with one tpsprof.torch.instrument
        call under DDP (NCCL on CUDA, gloo on CPU; one process or torchrun).
        The job keeps its own truth, one JSON line a step: the period
        between CUDA events recorded where each iteration starts (the
        GPU's own clock), the tokens, the allocator's peak since the last
        reset (read right after the optimizer step, before tpsprof resets
        it at the next fetch), its own FlopCounterMode count of one step
        (step 9; tpsprof counts steps 2, 7, 12, ... with
        TPSPROF_FLOPS_EVERY=5), and the NVML energy counter around the run.

    check.py verify-llama --truth DIR --report REPORT.json
        Compares `tpsprof report --json` with that truth and prints each
        figure beside it, PASS or FAIL; exits 1 on a FAIL.

    check.py verify-capture --trace TRACE.txt --slow-rank N
        `tpsprof trace`'s output names the slow rank.

    check.py verify-bench --bench BENCH.json
        The cost benchmark (bench_torch.py --device cuda): the training
        thread's cost a step, paired and self-measured.
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def shape_of(tiny):
    """The model's config.json keys, its sequence length and batch."""
    if tiny:
        shape = dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=512)
        seq, batch = 64, 2
    else:  # ~0.95 B parameters
        shape = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=16,
                     num_key_value_heads=8, vocab_size=32000)
        seq, batch = 2048, 4
    return dict(shape, model_type="llama", max_position_embeddings=seq, tie_word_embeddings=False), seq, batch


def config(a):
    os.makedirs(a.truth, exist_ok=True)
    with open(os.path.join(a.truth, "config.json"), "w") as f:
        json.dump(shape_of(a.tiny)[0], f)


def llama(a):
    import torch
    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM
    auto = os.environ.get("TPSPROF_AUTO") == "1"  # launch --auto: no call of ours
    if not auto:
        try:
            import tpsprof.torch as tt
        except ImportError:
            sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
            import tpsprof.torch as tt

    cuda = torch.cuda.is_available() and not a.cpu
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank() if distributed else 0
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    torch.manual_seed(0)
    shape, seq, batch = shape_of(a.tiny)
    cfg = LlamaConfig(**{k: v for k, v in shape.items() if k != "model_type"})
    os.makedirs(a.truth, exist_ok=True)
    model = LlamaForCausalLM(cfg).to(dev, dtype=torch.bfloat16 if cuda else torch.float32)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if cuda else None)
    if a.compile:
        model = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, cfg.vocab_size, (a.steps * batch, seq), generator=g)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=batch)
    prof = None if auto else tt.instrument(model, opt, loader)
    energy0 = nvml_energy_mj(dev) if cuda else None
    out = open(os.path.join(a.truth, "truth.%d.jsonl" % rank), "w")
    marks, losses = [], []
    for step, (x,) in enumerate(loader):
        if cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            marks.append(ev)
        x = x.to(dev, non_blocking=True)
        counting = step == 9 and not a.compile
        if counting:
            from torch.utils.flop_counter import FlopCounterMode
            # PyTorch's formulas, with grouped-query attention's heads broadcast as
            # the kernels do (torch before 2.12 raises on those shapes; on CPU it has
            # no flash-attention formula): what tpsprof gives its counter
            from tpsprof import _flops
            extra = _flops.attention_formulas()
            fc = FlopCounterMode(display=False, custom_mapping=extra)
            fc.__enter__()
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())  # read at the end: an item() a step would change the job's timing
        row = {"step": step, "rank": rank, "tokens": x.numel()}
        if counting:
            fc.__exit__(None, None, None)
            row["flops"] = fc.get_total_flops()
        if cuda:
            row["peak_allocated"] = torch.cuda.max_memory_allocated(dev)
        out.write(json.dumps(row) + "\n")
    if cuda:
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        marks.append(end)
        torch.cuda.synchronize()
        periods = [marks[i].elapsed_time(marks[i + 1]) * 1e6 for i in range(len(marks) - 1)]
        out.write(json.dumps({"periods_ns": periods, "energy_mj": nvml_energy_mj(dev) - energy0,
                              "losses": [float(v) for v in losses]}) + "\n")
    out.close()
    if prof is not None:
        prof.close()
    if distributed:
        dist.destroy_process_group()


def nvml_energy_mj(dev):
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(dev.index or 0)
        return pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
    except Exception:
        return 0


def lines(path):
    with open(path) as f:
        return [json.loads(x) for x in f if x.strip()]


class Verdicts:
    def __init__(self):
        self.failed = 0

    def check(self, name, got, want, ok, note=""):
        print("%-36s %-22s truth %-26s %s%s" % (name, got, want, "PASS" if ok else "FAIL", "  " + note if note else ""))
        if not ok:
            self.failed += 1

    def goal(self, name, got, goal, met):
        """A target, not a truth: said, never a failure."""
        print("%-36s %-22s goal  %-26s %s" % (name, got, goal, "met" if met else "MISSED"))


def verify_llama(a):
    rep = json.load(open(a.report))
    rows = lines(os.path.join(a.truth, "truth.0.jsonl"))
    steps = [r for r in rows if "step" in r]
    tail = [r for r in rows if "periods_ns" in r]
    v = Verdicts()
    s = rep["summary"]
    # steady steps: the report's warm-up and counted steps out; the truth's
    # mean period over steps 3.. less the counted ones (2, 7, 12, ...; 9 the job's)
    if tail:
        periods = tail[0]["periods_ns"]
        keep = [p for i, p in enumerate(periods) if i >= 3 and (i - 2) % 5 != 0 and i != 9]
        mean = sum(keep) / len(keep)
        got = s["step_time_s"]["p50"] * 1e9
        v.check("step time p50 (ms)", "%.2f" % (got / 1e6), "%.2f (CUDA events, mean)" % (mean / 1e6),
                abs(got - mean) <= 0.05 * mean)
    if tail and tail[0].get("losses") and rep.get("loss"):
        want = tail[0]["losses"][-1]
        got = rep["loss"]["last"]
        v.check("loss, last steady step", "%.6g" % got, "%.6g (the job's own)" % want, abs(got - want) <= 1e-4 * abs(want))
    tok = steps[0]["tokens"]
    c = rep.get("counted_flops") or {}
    own = [r for r in steps if "flops" in r]
    if own and c.get("samples"):
        mine = own[0]["flops"] / tok
        v.check("counted FLOPs a token", "%.4g" % c["per_token"], "%.4g (own count)" % mine,
                abs(c["per_token"] - mine) <= 0.01 * mine)
        if c.get("analytic_per_token"):
            v.check("analytic FLOPs a token", "%.4g" % c["analytic_per_token"], "%.4g" % mine,
                    abs(c["analytic_per_token"] - mine) <= 0.05 * mine, "(within 5%: the analytic model counts matrix products)")
    else:
        v.check("counted FLOPs", json.dumps(c)[:40], "a count", False)
    mem = rep.get("memory")
    if any("peak_allocated" in r for r in steps):
        want = max(r.get("peak_allocated", 0) for r in steps)
        got = mem["fullest"][0]["peak_allocated_bytes"] if mem else 0
        v.check("peak allocated (GiB)", "%.2f" % (got / 2**30), "%.2f" % (want / 2**30), abs(got - want) <= 0.02 * want)
    cost = rep.get("capture_cost")
    v.check("capture cost measured", "%.0f µs a step" % (cost["per_step_ns"] / 1e3) if cost else "none", "in every row",
            cost is not None and cost["rows"] > 0)
    if cost:
        v.goal("capture cost, training thread", "%.0f µs a step" % (cost["per_step_ns"] / 1e3), "≤ 50 µs",
               cost["per_step_ns"] <= 50e3)
    mfu = s.get("mfu")
    if tail:  # a GPU: its peak is known
        v.check("MFU (analytic)", "%.1f%%" % (100 * mfu) if mfu is not None else "n/a",
                "from counted FLOPs %s" % ("%.1f%%" % (100 * c["mfu"]) if c.get("mfu") is not None else "n/a"),
                mfu is not None and c.get("mfu") is not None and abs(mfu - c["mfu"]) <= 0.05 * c["mfu"])
    if tail:  # the MFU ledger with the GPUs' own account of the same steps (GPM, Hopper and later)
        lg = rep.get("mfu_ledger") or {}
        ta, sa = lg.get("tensor_activity"), lg.get("sm_activity")
        print("MFU ledger: %s" % json.dumps((lg.get("ledger") or {}).get("buckets", lg.get("ledger")))[:300])
        v.check("tensor pipes active beside MFU", "%.1f%% (SMs %s, %d samples)" % (100 * ta, "%.1f%%" % (100 * sa) if sa is not None else "n/a",
                                                                             lg.get("gpm_samples", 0)) if ta is not None else "unavailable: %s" % lg.get("gpm_unavailable"),
                "MFU %s; GPM measured" % ("%.1f%%" % (100 * mfu) if mfu is not None else "n/a"), ta is not None and 0 < ta <= 1)
    if tail and tail[0].get("energy_mj"):
        e = rep.get("energy") or {}
        print("energy: NVML %.1f J over the run; report %s" % (tail[0]["energy_mj"] / 1e3, json.dumps(e)[:200]))
    return v.failed


def verify_steps(a):
    rep = json.load(open(a.report))
    s = rep["summary"]
    v = Verdicts()
    v.check(a.name + ": steps measured", str(s.get("steps")), str(a.steps), s.get("steps") == a.steps)
    v.check(a.name + ": throughput", "%.4g tokens/s" % s.get("aggregate_tps", 0), "known", not s.get("tps_unknown"))
    return v.failed


def verify_capture(a):
    text = open(a.trace).read()
    v = Verdicts()
    named = ("rank %d" % a.slow_rank) in text
    v.check("capture names the slow rank", "yes" if named else "no", "rank %d" % a.slow_rank, named)
    return v.failed


def verify_bench(a):
    raw = open(a.bench).read()
    res = json.loads(raw[raw.index("{"):])
    v = Verdicts()
    t = res["tiny_step"]
    v.goal("training thread, paired (µs a step)", "%.1f" % t["overhead_us"], "≤ 50", t["overhead_us"] <= 50)
    v.check("self-measured (µs a step)", "%.1f" % t["self_us"], "≤ paired %.1f" % t["overhead_us"],
            t["self_us"] <= max(t["overhead_us"], 0) * 1.5 + 5)
    m = res["model_step"]
    v.check("model step overhead", "%.2f%%" % m["overhead_pct"], "< 1%% of %.1f ms" % m["bare_ms"], m["overhead_pct"] < 1)
    return v.failed


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["config", "llama", "verify-llama", "verify-steps", "verify-capture", "verify-bench"])
    p.add_argument("--name", default="job")
    p.add_argument("--compile", action="store_true", help="torch.compile the DDP model")
    p.add_argument("--truth")
    p.add_argument("--report")
    p.add_argument("--trace")
    p.add_argument("--bench")
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--tiny", action="store_true", help="a tiny model (a dry run on CPU)")
    p.add_argument("--cpu", action="store_true", help="on CPU even where CUDA is")
    a = p.parse_args()
    if a.what in ("config", "llama"):
        (config if a.what == "config" else llama)(a)
        return 0
    return {"verify-llama": verify_llama, "verify-steps": verify_steps, "verify-capture": verify_capture,
            "verify-bench": verify_bench}[a.what](a)


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
