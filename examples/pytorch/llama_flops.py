"""A plain training loop over a Hugging Face Llama, or GPT-2 with --gpt2
(random initialisation from a config.json, nothing downloaded) with nothing declared to tpsprof:
run it under ``tpsprof launch --auto`` and the package counts the tokens
from the loader and, on sampled steps, the FLOPs PyTorch's FlopCounterMode
counts (torch >= 2.1). The report compares them with the analytic FLOPs
of the same config (``launch --hf-config``).

    tpsprof launch --auto --job llama --hf-config cfg.json -- \\
        torchrun --nproc-per-node 2 examples/pytorch/llama_flops.py --config cfg.json

--checkpointing recomputes each decoder layer's activations in the
backward (gradient checkpointing): the counted steps are then hardware
FLOPs.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="the model's config.json")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--gpt2", action="store_true", help="the config is GPT-2's (n_embd, n_layer, n_head)")
    a = p.parse_args()
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    with open(a.config) as f:
        keys = json.load(f)
    if a.gpt2:
        cfg = GPT2Config(**keys)
        model = GPT2LMHeadModel(cfg)
    else:
        cfg = LlamaConfig(**keys)
        model = LlamaForCausalLM(cfg)
    if a.checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1 + (dist.get_rank() if distributed else 0))
    ids = torch.randint(0, cfg.vocab_size, (a.steps * a.batch, a.seq), generator=g)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=a.batch)
    for (x,) in loader:
        out = model(input_ids=x, labels=x)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
