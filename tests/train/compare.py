#!/usr/bin/env python3
"""Compares train_mlp outputs for the tests.

  compare.py losses RTOL a.jsonl b.jsonl ...   per-step losses of every run equal the first's within RTOL
  compare.py identical a.jsonl b.jsonl         per-step losses bit-identical
  compare.py npy RTOL dirA dirB [SKIP]         every .npy in checkpoint dir A equals B's within RTOL (numpy),
                                               except those whose names match the regex SKIP
"""
import glob
import json
import os
import sys


def losses(path):
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                obj = json.loads(line)
                if "loss" in obj and "step" in obj:
                    out.append((obj["step"], obj["loss"]))
    if not out:
        sys.exit(f"{path}: no per-step losses")
    return out


def main():
    mode = sys.argv[1]
    if mode in ("losses", "identical"):
        rtol = float(sys.argv[2]) if mode == "losses" else 0.0
        files = sys.argv[3:] if mode == "losses" else sys.argv[2:]
        ref = losses(files[0])
        for other in files[1:]:
            got = losses(other)
            if [s for s, _ in got] != [s for s, _ in ref]:
                sys.exit(f"{other}: steps {[s for s, _ in got][:5]}... differ from {files[0]}")
            for (s, a), (_, b) in zip(ref, got):
                if abs(a - b) > rtol * abs(a):
                    sys.exit(f"step {s}: loss {b!r} in {other} vs {a!r} in {files[0]} (rtol {rtol})")
            print(f"{other}: {len(got)} losses match {files[0]} (rtol {rtol})")
    elif mode == "npy":
        import numpy as np
        import re
        rtol, a, b = float(sys.argv[2]), sys.argv[3], sys.argv[4]
        skip = re.compile(sys.argv[5]) if len(sys.argv) > 5 else None
        names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(a, "*.npy")))
        if not names or names != sorted(os.path.basename(p) for p in glob.glob(os.path.join(b, "*.npy"))):
            sys.exit(f"{a} and {b} hold different arrays")
        for n in names:
            if skip and skip.search(n):
                continue
            x, y = np.load(os.path.join(a, n)), np.load(os.path.join(b, n))
            if x.shape != y.shape or x.dtype != y.dtype:
                sys.exit(f"{n}: {x.shape} {x.dtype} vs {y.shape} {y.dtype}")
            scale = max(float(np.abs(x).max()), 1e-30)
            err = float(np.abs(x - y).max()) / scale
            if not err <= rtol:
                sys.exit(f"{n}: max difference {err:.3e} of the largest entry (rtol {rtol})")
        print(f"{len(names)} arrays of {a} and {b} agree (rtol {rtol})")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
