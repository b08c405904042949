"""A runnable training loop instrumented with the tpsprof hook.

With PyTorch installed it trains a small transformer language model on random
tokens (on the GPU when there is one, else on the CPU); without PyTorch it runs
a synthetic loop. Either way each step goes to the node's tpsprof agent.

    tpsprof launch --job demo-train --nats nats://127.0.0.1:4222 -- python3 examples/pytorch/train.py --steps 50
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tpsprof_hook import TPSProf  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--synthetic", action="store_true", help="skip PyTorch even if installed")
    args = p.parse_args()
    prof = TPSProf()
    try:
        import torch  # noqa: F401
        have_torch = not args.synthetic
    except ImportError:
        have_torch = False
    if have_torch:
        train_torch(prof, args)
    else:
        train_synthetic(prof, args)
    prof.close()
    print("tpsprof hook: %d steps sent, %d dropped (socket %s)" % (prof.sent, prof.dropped, prof.path))


def train_synthetic(prof, args):
    tokens = args.batch * args.seq
    for step in range(args.steps):
        prof.start(step)
        with prof.phase("data_wait"):
            time.sleep(0.0005)
        with prof.phase("fwd"):
            sum(i * i for i in range(2000))
        with prof.phase("bwd"):
            sum(i * i for i in range(4000))
        prof.end(tokens=tokens, loss=10.0 / (step + 1))


def train_torch(prof, args):
    import torch
    import torch.nn as nn

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    vocab, d = 8192, 256
    layer = nn.TransformerEncoderLayer(d_model=d, nhead=4, dim_feedforward=4 * d, batch_first=True)
    model = nn.Sequential(nn.Embedding(vocab, d), nn.TransformerEncoder(layer, num_layers=2), nn.Linear(d, vocab)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mask = nn.Transformer.generate_square_subsequent_mask(args.seq, device=dev)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    for step in range(args.steps):
        prof.start(step)
        with prof.phase("data_wait"):
            x = torch.randint(0, vocab, (args.batch, args.seq + 1), device=dev)
        with prof.phase("fwd"):
            h = model[0](x[:, :-1])
            h = model[1](h, mask=mask, is_causal=True)
            logits = model[2](h)
            loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), x[:, 1:].reshape(-1))
            sync()
        with prof.phase("bwd"):
            loss.backward()
            sync()
        with prof.phase("optim"):
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
        prof.end(tokens=args.batch * args.seq, loss=loss.item())


if __name__ == "__main__":
    main()
