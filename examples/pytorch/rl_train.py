"""An RL-style post-training loop measured by tpsprof: each step generates
rollouts with the policy (greedy decoding, one token at a time, no KV
cache), scores them, and makes one policy-gradient update on them (a
REINFORCE-style loss weighted by a toy reward: the share of even tokens).

    tpsprof launch --job rl --nats nats://127.0.0.1:4222 -- torchrun --nproc_per_node 2 examples/pytorch/rl_train.py

The generation is timed with ``prof.rollout()``: each request's prompt and
generated tokens, its time to first token and the gaps between its tokens
go to the collector, which reports generation TPS and latencies beside the
update's TPS and MFU. ``prof.add_bytes`` gives the UTF-8 length of the
text trained on (here: the tokens as bytes of a byte-level vocabulary), so
runs with different tokenizers compare by bytes/s.
"""

import argparse
import os
import sys
import time

try:
    import tpsprof
except ImportError:  # a checkout, not under tpsprof launch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import tpsprof

import torch
import torch.distributed as dist
import torch.nn as nn
import tpsprof.torch


class Policy(nn.Module):
    """A tiny causal transformer over a byte vocabulary."""

    def __init__(self, vocab, dim, seq):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        layer = nn.TransformerEncoderLayer(dim, 4, dim * 2, batch_first=True, dropout=0.0)
        self.body = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        n = ids.shape[1]
        mask = torch.triu(torch.full((n, n), float("-inf"), device=ids.device), 1)
        h = self.emb(ids) + self.pos(torch.arange(n, device=ids.device))
        return self.head(self.body(h, mask=mask))


@torch.no_grad()
def generate(model, prompt, new_tokens):
    """Greedy decoding, one token at a time; returns the sequence and the
    time.perf_counter() at which each new token was ready."""
    ids, times = prompt, []
    for _ in range(new_tokens):
        logits = model(ids)[:, -1]
        nxt = logits.argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], 1)
        int(nxt[0, 0])  # the token is on the host: what a generation server returns
        times.append(time.perf_counter())
    return ids, times


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--requests", type=int, default=4, help="rollouts per step and rank")
    p.add_argument("--prompt", type=int, default=8, help="prompt tokens")
    p.add_argument("--new", type=int, default=16, help="generated tokens per request")
    p.add_argument("--dim", type=int, default=64)
    args = p.parse_args()
    if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    torch.manual_seed(1234 + rank)
    vocab, seq = 256, args.prompt + args.new
    model = Policy(vocab, args.dim, seq)
    if dist.is_initialized():
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    prof = tpsprof.torch.instrument(model, opt)
    for step in range(args.steps):
        # 1. rollouts: generate with the current policy, timed as the step's generation phase
        seqs = []
        with prof.rollout() as r:
            for _ in range(args.requests):
                prompt = torch.randint(0, vocab, (1, args.prompt))
                t0 = time.perf_counter()
                out, times = generate(model.module if hasattr(model, "module") else model, prompt, args.new)
                r.request(args.prompt, args.new, token_times=times, start=t0)
                seqs.append(out)
        batch = torch.cat(seqs)
        reward = (batch[:, args.prompt:] % 2 == 0).float().mean(1)  # toy reward
        # 2. the update on the rollouts (REINFORCE with a mean baseline)
        logits = model(batch[:, :-1])
        logp = torch.log_softmax(logits, -1).gather(-1, batch[:, 1:, None]).squeeze(-1)[:, args.prompt - 1:]
        loss = -((reward - reward.mean())[:, None] * logp).mean()
        opt.zero_grad()
        loss.backward()
        prof.add_tokens(batch[:, 1:].numel())  # the update's training tokens
        prof.add_bytes(batch[:, 1:].numel())  # byte-level vocabulary: one byte a token
        opt.step()
    prof.close()
    print("rank %d: %d steps, %d lines sent, %d dropped" % (rank, prof.steps, prof.client.sent, prof.client.dropped), flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
