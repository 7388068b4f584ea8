#!/usr/bin/python3
"""PyTorch reference of apps/train_gpt: the same byte-level GPT (pre-LayerNorm blocks, tied
embeddings, GELU tanh), the same fortune data and train / validation split, the same batches
(splitmix64 offsets), AdamW with a warmup + cosine learning rate, global-norm clipping.

One process (--threads N), or DistributedDataParallel (gloo) on --nproc processes with
--ddp, spawned here with torch.multiprocessing (no torchrun): process r takes rows
[r*B/P, (r+1)*B/P) of each step's global batch, so the losses are those of one process.
With --json, prints one JSON object per line on stdout (train rows, validation rows, a summary).
With --init-npy DIR, loads every parameter from DIR/<name>.npy (as train_gpt writes them)."""
import argparse
import gc
import json
import math
import os
import socket
import sys
import time

import numpy as np

# Debian's torch runs its own loops on OpenMP threads and its matrix products on OpenBLAS's
# pthreads: OpenMP's default spin-waiting between parallel regions starves OpenBLAS's threads
# (2 threads ran at under half the speed of 2 passive ones here). Set before torch loads
# libgomp; an OMP_WAIT_POLICY in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

VOCAB = 256
MASK64 = (1 << 64) - 1


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------

def fortunes_of(data):
    """Splits a file's bytes into fortunes at lines that are exactly '%' ('%\\n', or a final
    '%' without newline). A fortune keeps its lines' '\\n'; empty fortunes are skipped."""
    out = []
    cur = []
    pos = 0
    n = len(data)
    while pos < n:
        nl = data.find(b"\n", pos)
        end = n if nl < 0 else nl + 1
        line = data[pos:end]
        if line == b"%\n" or (nl < 0 and line == b"%"):
            if cur:
                f = b"".join(cur)
                if f:
                    out.append(f)
            cur = []
        else:
            cur.append(line)
        pos = end
    if cur:
        f = b"".join(cur)
        if f:
            out.append(f)
    return out


def load_data(data_dir):
    """Returns (train, val, n_fortunes, files): the two byte streams as uint8 arrays."""
    names = sorted(os.listdir(os.fsencode(data_dir)))  # bytewise order
    train, val = [], []
    k = 0
    files = 0
    for name in names:
        if name.endswith(b".dat"):
            continue
        path = os.path.join(os.fsencode(data_dir), name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        files += 1
        with open(path, "rb") as fh:
            data = fh.read()
        for f in fortunes_of(data):
            (val if k % 10 == 9 else train).append(f + b"\n")
            k += 1
    tr = np.frombuffer(b"".join(train), dtype=np.uint8)
    va = np.frombuffer(b"".join(val), dtype=np.uint8)
    return tr, va, k, files


def splitmix64_scalar(z):
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def splitmix64(z):
    """splitmix64 of a numpy uint64 array, wrapping modulo 2^64."""
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


class Batches:
    """Training batches: row i of step s starts at splitmix64(splitmix64(seed) + s*B + i) % (N - T)."""

    def __init__(self, train, seed, batch, context):
        self.train = train
        self.base = splitmix64_scalar(seed & MASK64)
        self.B, self.T = batch, context
        self.span = np.uint64(len(train) - context)
        self.cols = np.arange(context + 1, dtype=np.int64)

    def get(self, step, lo=0, hi=None):
        hi = self.B if hi is None else hi
        start = (self.base + step * self.B) & MASK64
        with np.errstate(over="ignore"):
            z = np.uint64(start) + np.arange(lo, hi, dtype=np.uint64)  # wraps mod 2^64
        off = (splitmix64(z) % self.span).astype(np.int64)
        rows = self.train[off[:, None] + self.cols[None, :]].astype(np.int64)
        t = torch.from_numpy(rows)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def val_windows(val, context, batch, max_windows):
    w = (min(max_windows, (len(val) - 1) // context) // batch) * batch
    if w == 0:
        return None, None
    idx = np.arange(w, dtype=np.int64)[:, None] * context + np.arange(context + 1, dtype=np.int64)[None, :]
    t = torch.from_numpy(val[idx].astype(np.int64))
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------

def param_specs(L, C, T):
    """(name, shape, init): init is 'w' (normal 0.02), 'wp' (normal 0.02/sqrt(2L)), 'zero', 'one'."""
    specs = [("wte", (VOCAB, C), "w"), ("wpe", (T, C), "w")]
    for l in range(L):
        p = f"h{l}."
        specs += [
            (p + "ln1_g", (C,), "one"), (p + "ln1_b", (C,), "zero"),
            (p + "wq", (C, C), "w"), (p + "bq", (C,), "zero"),
            (p + "wk", (C, C), "w"), (p + "bk", (C,), "zero"),
            (p + "wv", (C, C), "w"), (p + "bv", (C,), "zero"),
            (p + "wo", (C, C), "wp"), (p + "bo", (C,), "zero"),
            (p + "ln2_g", (C,), "one"), (p + "ln2_b", (C,), "zero"),
            (p + "w1", (C, 4 * C), "w"), (p + "b1", (4 * C,), "zero"),
            (p + "w2", (4 * C, C), "wp"), (p + "b2", (C,), "zero"),
        ]
    specs += [("lnf_g", (C,), "one"), ("lnf_b", (C,), "zero")]
    return specs


class GPT(torch.nn.Module):
    def __init__(self, L, C, H, T, init_npy=None):
        super().__init__()
        assert C % H == 0, "--d-model must be a multiple of --heads"
        self.L, self.C, self.H, self.T = L, C, H, T
        self.names = []
        std_proj = 0.02 / math.sqrt(2 * L)
        for name, shape, kind in param_specs(L, C, T):
            if init_npy is not None:
                a = np.load(os.path.join(init_npy, name + ".npy"))
                assert a.dtype == np.float32, f"{name}.npy: dtype {a.dtype}, want float32"
                assert tuple(a.shape) == tuple(shape), f"{name}.npy: shape {a.shape}, want {shape}"
                t = torch.from_numpy(np.ascontiguousarray(a)).clone()
            else:
                t = torch.empty(shape, dtype=torch.float32)
                if kind == "w":
                    t.normal_(0.0, 0.02)
                elif kind == "wp":
                    t.normal_(0.0, std_proj)
                elif kind == "one":
                    t.fill_(1.0)
                else:
                    t.zero_()
            self.register_parameter(name.replace(".", "_"), torch.nn.Parameter(t))
            self.names.append(name)
        # True above the diagonal: masked. A plain attribute, not a buffer, so DDP has none to sync.
        self.mask = torch.ones(T, T, dtype=torch.bool).triu(1)

    def p(self, name):
        return getattr(self, name.replace(".", "_"))

    def named(self):
        return [(n, self.p(n)) for n in self.names]

    def forward(self, x, y):
        B, T = x.shape
        C, H = self.C, self.H
        Dh = C // H
        p = self.p
        h = p("wte")[x] + p("wpe")[:T]
        mask = self.mask[:T, :T]
        scale = 1.0 / math.sqrt(Dh)
        for l in range(self.L):
            q_ = f"h{l}."
            a = F.layer_norm(h, (C,), p(q_ + "ln1_g"), p(q_ + "ln1_b"), 1e-5)
            q = (a @ p(q_ + "wq") + p(q_ + "bq")).view(B, T, H, Dh).transpose(1, 2)
            k = (a @ p(q_ + "wk") + p(q_ + "bk")).view(B, T, H, Dh).transpose(1, 2)
            v = (a @ p(q_ + "wv") + p(q_ + "bv")).view(B, T, H, Dh).transpose(1, 2)
            s = (q @ k.transpose(-2, -1)) * scale
            s = s.masked_fill(mask, float("-inf"))
            att = torch.softmax(s, dim=-1) @ v  # (B, H, T, Dh)
            att = att.transpose(1, 2).reshape(B, T, C)
            h = h + att @ p(q_ + "wo") + p(q_ + "bo")
            a = F.layer_norm(h, (C,), p(q_ + "ln2_g"), p(q_ + "ln2_b"), 1e-5)
            h = h + F.gelu(a @ p(q_ + "w1") + p(q_ + "b1"), approximate="tanh") @ p(q_ + "w2") + p(q_ + "b2")
        h = F.layer_norm(h, (C,), p("lnf_g"), p("lnf_b"), 1e-5)
        logits = h @ p("wte").t()
        return F.cross_entropy(logits.reshape(B * T, VOCAB), y.reshape(B * T))


def lr_at(t, args):
    """optax.warmup_cosine_decay_schedule(0, lr, warmup, steps, min_lr) at count t."""
    if t < args.warmup:
        return args.lr * t / args.warmup
    d = max(args.steps - args.warmup, 1)
    c = 0.5 * (1.0 + math.cos(math.pi * min(t - args.warmup, d) / d))
    return args.min_lr + (args.lr - args.min_lr) * c


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------

def set_blas_threads(n):
    """Debian's torch runs its matrix products in OpenBLAS (pthread build), whose thread pool
    torch.set_num_threads does not size: set it too, or 2 OpenMP + 2 OpenBLAS threads fight
    over the cores. Returns OpenBLAS's core name, or None without OpenBLAS."""
    try:
        import ctypes
        lib = ctypes.CDLL("libopenblas.so.0")  # the copy torch has loaded
        lib.openblas_set_num_threads(n)
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode()
    except (OSError, AttributeError):
        return None


def worker(rank, args):
    P = args.nproc if args.ddp else 1
    ddp = args.ddp
    threads = args.threads if args.threads > 0 else (1 if ddp else (os.cpu_count() or 1))
    torch.set_num_threads(threads)
    blas_core = set_blas_threads(threads)
    if ddp:
        dist.init_process_group("gloo", rank=rank, world_size=P)
    lead = rank == 0

    def out(obj, text):
        if lead:
            print(json.dumps(obj) if args.json else text, flush=True)

    B, T = args.batch, args.context
    assert B % P == 0, "--batch must be a multiple of --nproc"
    train, val, n_fortunes, n_files = load_data(args.data_dir)
    if lead:
        print(f"data {args.data_dir}: {n_files} files, {n_fortunes} fortunes, train {len(train)} bytes, "
              f"validation {len(val)} bytes", file=sys.stderr, flush=True)
    assert len(train) > T + 1, "training stream shorter than the context"
    batches = Batches(train, args.seed, B, T)
    vx, vy = val_windows(val, T, B, args.val_windows)

    torch.manual_seed(args.seed)
    model = GPT(args.layers, args.d_model, args.heads, T, args.init_npy)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named() if p.dim() == 2]
    no_decay = [p for n, p in model.named() if p.dim() != 2]
    net = torch.nn.parallel.DistributedDataParallel(model) if ddp else model
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=0.0, betas=(0.9, args.beta2), eps=1e-8)
    if lead:
        print(f"model: {args.layers} layers, d_model {args.d_model}, {args.heads} heads, context {T}, "
              f"{n_params} parameters; {P} process(es) x {threads} thread(s); torch {torch.__version__}, "
              f"OpenBLAS core {blas_core}", file=sys.stderr, flush=True)

    lo, hi = rank * B // P, (rank + 1) * B // P

    def evaluate():
        """Mean cross-entropy over all validation tokens; batches split round-robin over processes."""
        if vx is None:
            return float("nan")
        total = torch.zeros(1, dtype=torch.float64)
        with torch.no_grad():
            for j, b in enumerate(range(0, vx.shape[0], B)):
                if j % P == rank:
                    total += float(model(vx[b:b + B], vy[b:b + B])) * (B * T)
        if ddp:
            dist.all_reduce(total)
        return float(total) / (vx.shape[0] * T)

    def log_val(s, v):
        out({"step": s, "val_loss": v}, f"step {s:6d}  val_loss {v:.4f}")

    v = evaluate()
    log_val(0, v)
    last_val_step = 0
    train_seconds = 0.0
    steps_done = 0
    wall0 = time.perf_counter()
    stop = torch.zeros(1, dtype=torch.int32)
    last = min(args.steps, args.max_steps) if args.max_steps > 0 else args.steps
    loss_value = float("nan")
    for s in range(last):
        if args.max_seconds > 0:
            stop[0] = int(time.perf_counter() - wall0 >= args.max_seconds)
            if ddp:
                dist.broadcast(stop, 0)
            if stop[0]:
                break
        t0 = time.perf_counter()
        lr = lr_at(s, args)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = batches.get(s, lo, hi)
        opt.zero_grad(set_to_none=True)
        # --autocast: PyTorch's one-line mixed precision (bfloat16 products, float32 weights).
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast):
            loss = net(x, y)
        loss.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        lv = loss.detach().clone()
        if ddp:
            dist.all_reduce(lv)
            lv /= P
        loss_value = float(lv)
        train_seconds += time.perf_counter() - t0
        steps_done = s + 1
        if args.log_every > 0 and (s + 1) % args.log_every == 0:
            tps = steps_done * B * T / train_seconds
            out({"step": s + 1, "loss": loss_value, "lr": lr, "tokens_per_second": tps},
                f"step {s + 1:6d}  loss {loss_value:.4f}  lr {lr:.3e}  {tps:.0f} tokens/s")
        if args.eval_every > 0 and (s + 1) % args.eval_every == 0 and s + 1 < last:
            v = evaluate()
            log_val(s + 1, v)
            last_val_step = s + 1
    if last_val_step != steps_done:
        v = evaluate()
        log_val(steps_done, v)
    tps = steps_done * B * T / train_seconds if train_seconds > 0 else 0.0
    summary = {"summary": True, "framework": "torch", "processes": P, "threads": threads,
               "steps": steps_done, "tokens_per_second": tps, "train_seconds": train_seconds,
               "final_loss": loss_value, "final_val_loss": v, "params": n_params,
               "blas_core": blas_core, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
               "autocast": "bfloat16" if args.autocast else None}
    out(summary, f"torch: {P} process(es) x {threads} thread(s), {steps_done} steps in {train_seconds:.2f} s "
                 f"= {tps:.0f} tokens/s, final val_loss {v:.4f}, {n_params} parameters")
    if ddp:
        # torch 1.13's gloo process group can deadlock when DDP's reducer is destroyed at exit
        # (its worker thread frees a tensor and waits for the GIL held by the joining thread):
        # drop DDP first, then leave the process without running the interpreter's teardown.
        dist.barrier()
        del net, opt
        gc.collect()
        dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=192)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--batch", type=int, default=32, help="global batch (rows per step)")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta2", type=float, default=0.99)
    p.add_argument("--clip", type=float, default=1.0, help="global gradient norm clip (0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default="/usr/share/games/fortunes")
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--val-windows", type=int, default=256)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--json", action="store_true")
    p.add_argument("--max-steps", type=int, default=0,
                   help="stop after this many steps (0: --steps; the schedule still spans --steps)")
    p.add_argument("--max-seconds", type=float, default=0.0, help="stop training after this wall time (0: none)")
    p.add_argument("--threads", type=int, default=0, help="torch threads per process (default: 1 with --ddp, else all cores)")
    p.add_argument("--init-npy", default=None, help="directory of <name>.npy initial parameters")
    p.add_argument("--ddp", action="store_true", help="DistributedDataParallel (gloo) on --nproc processes")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--autocast", action="store_true",
                   help="torch.autocast('cpu', dtype=torch.bfloat16) around the forward (the bfloat16 peer of train_gpt --dtype bfloat16)")
    args = p.parse_args()
    if args.ddp:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(free_port())
        mp.spawn(worker, args=(args,), nprocs=args.nproc, join=True)
    else:
        worker(0, args)


if __name__ == "__main__":
    main()
