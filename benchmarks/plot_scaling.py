"""Scaling plots from bench_scatter.py's JSON: commit time vs batch size and vs draft length, per
layout, against the baselines. Writes PNGs (matplotlib).

    python benchmarks/bench_scatter.py --batches 1 8 64 256 512 --drafts 2 4 8 16 --json scaling.json
    python benchmarks/plot_scaling.py scaling.json --out docs/   # commit-vs-batch.png, commit-vs-draft.png
    python benchmarks/plot_scaling.py bench.log --out docs/      # the same from the printed log
"""

from __future__ import annotations

import argparse
import os
import sys

import matplotlib

from common import read_results

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {  # variant: (line style, colour)
    "torch indexing (dense)": (":", "#999999"),
    "baseline dense flat copy": ("--", "#555555"),
    "baseline channel_major strided": ("--", "#e6550d"),
    "convwin dense": ("-", "#3182bd"),
    "convwin channel_major": ("-", "#fd8d3c"),
    "convwin token_major": ("-", "#31a354"),
}


def _series(rows, key, fixed):
    out = {}
    for row in rows:
        if all(row[k] == v for k, v in fixed.items()):
            out.setdefault(row["variant"], []).append((row[key], row["graph_us"]))
    return {variant: sorted(points) for variant, points in out.items()}


def plot(rows, key, fixed, title, path, log_x):
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for variant, points in _series(rows, key, fixed).items():
        style, color = STYLE.get(variant, ("-", None))
        ax.plot([p[0] for p in points], [p[1] for p in points], style, color=color, marker="o", markersize=3,
                label=variant)
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel({"B": "batch size B", "D": "draft length D"}[key])
    ax.set_ylabel("CUDA-graph replay, us per launch")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="bench_scatter's --json file, or its log (*.log)")
    parser.add_argument("--out", default="docs")
    parser.add_argument("--shape", default="qwen3next-tp1")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--batch", type=int, default=256, help="B of the time-vs-D plot")
    parser.add_argument("--draft", type=int, default=4, help="D of the time-vs-B plot")
    args = parser.parse_args(argv)
    data = read_results(args.results)
    rows = data["rows"]
    where = f"{args.shape}, {args.dtype}\n{data.get('device', '?')}, torch {data.get('torch', '?')}, triton {data.get('triton', '?')}"
    written = [
        plot(rows, "B", dict(shape=args.shape, dtype=args.dtype, D=args.draft),
             f"commit time vs batch, D={args.draft} ({where})", os.path.join(args.out, "commit-vs-batch.png"), True),
        plot(rows, "D", dict(shape=args.shape, dtype=args.dtype, B=args.batch),
             f"commit time vs draft length, B={args.batch} ({where})", os.path.join(args.out, "commit-vs-draft.png"),
             False),
    ]
    print("wrote", *written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
