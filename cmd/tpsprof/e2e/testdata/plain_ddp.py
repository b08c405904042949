# An ordinary DDP training script that knows nothing of tpsprof: the
# zero-code test runs it under `tpsprof launch --auto`.
import sys
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn


class Batches(torch.utils.data.Dataset):
    def __len__(self):
        return int(os.environ.get("STEPS", "6")) * 4

    def __getitem__(self, i):
        time.sleep(0.01)
        ids = torch.randint(0, 128, (32,))
        mask = torch.ones(32, dtype=torch.long)
        mask[24:] = 0  # a quarter of every sequence is padding
        return {"input_ids": ids, "attention_mask": mask}


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Embedding(128, 64), nn.Linear(64, 128)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for batch in torch.utils.data.DataLoader(Batches(), batch_size=4):
        logits = model(batch["input_ids"])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 128), batch["input_ids"].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
    # one write: the two ranks' lines interleave on the shared terminal, and
    # print() writes its pieces separately ("... on rank" from one rank, then
    # the other's, made the test miss "rank 1")
    sys.stdout.write(f"plain script done on rank {dist.get_rank()}\n")
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
