#!/usr/bin/python3
"""PyTorch baseline for train_mlp: the same MLP (784-1024-1024-10 by default, ReLU, softmax
cross-entropy, Adam lr 1e-3) on random Fashion-MNIST-shaped data, global batch 256, one thread
per process. One process, or DistributedDataParallel (gloo) with --world N via torch.multiprocessing.
Prints one line: 'torch processes=N samples_per_second=X'."""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def model_for(layers):
    mods = []
    for i in range(len(layers) - 1):
        mods.append(torch.nn.Linear(layers[i], layers[i + 1]))
        if i + 2 < len(layers):
            mods.append(torch.nn.ReLU())
    return torch.nn.Sequential(*mods)


def worker(rank, args, result):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if args.world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=args.world)
    layers = [int(v) for v in args.layers.split(",")]
    net = model_for(layers)
    if args.world > 1:
        net = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    local = args.batch // args.world
    x = torch.randn(local * 8, layers[0])
    y = torch.randint(0, layers[-1], (local * 8,))
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(i):
        j = (i % 8) * local
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x[j:j + local]), y[j:j + local])
        loss.backward()
        opt.step()

    for i in range(args.warmup):
        step(i)
    if args.world > 1:
        dist.barrier()
    t0 = time.perf_counter()
    for i in range(args.steps):
        step(i)
    if args.world > 1:
        dist.barrier()
    dt = time.perf_counter() - t0
    if rank == 0:
        result.put(args.steps * args.batch / dt)
    if args.world > 1:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--layers", default="784,1024,1024,10")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    args = p.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))  # one port for all workers
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    if args.world == 1:
        worker(0, args, q)
    else:
        mp.spawn(worker, args=(args, q), nprocs=args.world, join=True)
    print(f"torch processes={args.world} samples_per_second={q.get():.1f}", flush=True)


if __name__ == "__main__":
    main()
