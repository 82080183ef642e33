"""Records the small PyTorch-profiler set in this directory: CPU PyTorch with
the gloo backend, 4 ranks started by torchrun on one machine, a small MLP
trained for 40 steps with its gradients all-reduced by hand
(`dist.all_reduce`, two buckets per step, plus the loss); rank SLOW_RANK
sleeps SLOW_MS in every step from SLOW_FROM on (a host-side slowdown: it
reaches each step's collectives late). Steps 8..39 are profiled.

    pip install torch        # CPU is enough
    torchrun --nproc-per-node 4 record.py OUT_DIR
    gzip -9 -n OUT_DIR/*.json

Writes OUT_DIR/rank-N.json (Kineto JSON, with distributedInfo).
"""
import os
import sys
import time

import torch
import torch.distributed as dist

SLOW_RANK = 2
SLOW_MS = 40
SLOW_FROM = 12
STEPS = 40
WAIT, WARMUP, ACTIVE = 6, 2, 32

def main():
    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    params = list(model.parameters())
    buckets = [params[: len(params) // 2], params[len(params) // 2 :]]

    def step(i):
        x = torch.randn(64, 256)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        if rank == SLOW_RANK and i >= SLOW_FROM:
            time.sleep(SLOW_MS / 1e3)
        for b in buckets:
            flat = torch.cat([p.grad.flatten() for p in b])
            dist.all_reduce(flat)
            flat /= world
        l = loss.detach().clone()
        dist.all_reduce(l)
        opt.step()

    sched = torch.profiler.schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1)
    os.makedirs(out, exist_ok=True)

    def save(p):
        p.export_chrome_trace(os.path.join(out, f"rank-{rank}.json"))

    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=sched,
        on_trace_ready=save,
    ) as prof:
        for i in range(STEPS):
            step(i)
            prof.step()
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
