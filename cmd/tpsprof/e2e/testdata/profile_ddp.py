# A gloo DDP job profiled with torch.profiler: each rank writes its trace
# (ProfilerStep#2-4) into the folder given. kineto tests read them back.
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler


def main(out):
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Embedding(256, 64), nn.Linear(64, 256)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handler = tensorboard_trace_handler(out, worker_name="rank%d" % dist.get_rank())
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3),
                 on_trace_ready=handler) as p:
        for _ in range(6):
            x = torch.randint(0, 256, (8, 32))
            loss = nn.functional.cross_entropy(model(x).reshape(-1, 256), x.reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad()
            p.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
