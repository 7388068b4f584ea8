#!/usr/bin/python3
"""Loss curves of train_gpt (or benchmarks/torch_gpt.py) runs as a PNG.

  plot_loss.py OUT.png RUN.jsonl [LABEL=RUN2.jsonl ...]

Reads the JSON lines of each run (other lines are ignored): rows with "loss" are the training
loss (a thin line, with a running mean over --smooth points drawn over it), rows with
"val_loss" the validation loss (markers), both against "step". A run's label is the LABEL=
prefix if given, else the file's name."""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_run(path):
    train, val = [], []
    with open(path, errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if not isinstance(row, dict) or "step" not in row:
                continue
            if "loss" in row:
                train.append((row["step"], row["loss"]))
            if "val_loss" in row:
                val.append((row["step"], row["val_loss"]))
    return sorted(train), sorted(val)


def running_mean(values, n):
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= n:
            acc -= values[i - n]
        out.append(acc / min(i + 1, n))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="the PNG to write")
    p.add_argument("runs", nargs="+", help="RUN.jsonl or LABEL=RUN.jsonl")
    p.add_argument("--smooth", type=int, default=20, help="running mean over this many train points (<= 1: none)")
    p.add_argument("--title", default="")
    args = p.parse_args()

    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=120)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    plotted = 0
    for i, spec in enumerate(args.runs):
        label, path = spec.split("=", 1) if ("=" in spec and not os.path.exists(spec)) else (None, spec)
        label = label or os.path.basename(path)
        train, val = read_run(path)
        c = colors[i % len(colors)]
        if train:
            steps, losses = zip(*train)
            smooth = args.smooth > 1 and len(losses) > args.smooth
            ax.plot(steps, losses, color=c, lw=0.6, alpha=0.35 if smooth else 0.9,
                    label=None if smooth else f"{label} train")
            if smooth:
                ax.plot(steps, running_mean(list(losses), args.smooth), color=c, lw=1.4,
                        label=f"{label} train (mean of {args.smooth})")
            plotted += 1
        if val:
            steps, losses = zip(*val)
            ax.plot(steps, losses, color=c, ls="--", lw=1.0, marker="o", ms=4, label=f"{label} validation")
            plotted += 1
        if not train and not val:
            print(f"plot_loss.py: no loss rows in {path}")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/char)")
    if args.title:
        ax.set_title(args.title)
    ax.grid(True, alpha=0.3)
    if plotted:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
