"""Draws docs/layouts.png: one slot of each physical layout, and a tree's rows (run by hand;
the PNG is committed). python scripts/draw_layouts.py [--out docs/layouts.png]"""

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

D, K, DIM = 4, 4, 3  # draft steps, kernel width, channels drawn
W, S = K - 1, D + K - 2
INPUTS = ["x-2", "x-1", "x0", "x1", "x2", "x3"]  # the slot's sequence: K-2 history, then D drafts
COLORS = ["#bbbbbb", "#999999", "#8dd3c7", "#80b1d3", "#fdb462", "#fb8072"]


def cell(ax, x, y, label, color, w=1.0, h=1.0, fontsize=7):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor="black", linewidth=0.6))
    ax.text(x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=fontsize)


def panel(ax, title, width, height):
    ax.set_xlim(-0.5, width + 0.5)
    ax.set_ylim(-1.2, height + 0.6)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title, fontsize=9)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="docs/layouts.png")
    out = parser.parse_args().out
    fig, axes = plt.subplots(1, 4, figsize=(15, 4.2), gridspec_kw={"width_ratios": [D * W + D, S, S, 10]})

    ax = axes[0]  # dense [D, dim, K-1]: every window in full
    panel(ax, f"dense [D, dim, K-1]: {D * W} columns per channel", D * (W + 1), DIM)
    for t in range(D):
        for c in range(DIM):
            for w in range(W):
                i = t + w
                cell(ax, t * (W + 1) + w, DIM - 1 - c, f"{INPUTS[i]}", COLORS[i])
        ax.text(t * (W + 1) + W / 2, -0.7, f"window {t}", ha="center", fontsize=8)

    ax = axes[1]  # channel_major [dim, S]: a row per channel
    panel(ax, f"channel_major [dim, D+K-2]: {S} columns", S, DIM)
    for c in range(DIM):
        for i in range(S):
            cell(ax, i, DIM - 1 - c, INPUTS[i], COLORS[i])
        ax.text(-0.3, DIM - 1 - c + 0.5, f"ch{c}", ha="right", va="center", fontsize=7)
    ax.text(S / 2, -0.7, "window t = columns t .. t+K-2 of every row", ha="center", fontsize=8)

    ax = axes[2]  # token_major [S, dim]: a row per input
    panel(ax, f"token_major [D+K-2, dim]: {S} rows", DIM, S)
    for i in range(S):
        for c in range(DIM):
            cell(ax, c, S - 1 - i, INPUTS[i], COLORS[i])
        ax.text(-0.3, S - 1 - i + 0.5, f"row {i}", ha="right", va="center", fontsize=7)
    ax.text(DIM / 2, -0.7, "window t = rows t .. t+K-2: one block", ha="center", fontsize=8)

    ax = axes[3]  # tree rows
    panel(ax, "tree rows (topk 3, N=8): history, then a row per node", 10, 8)
    nodes = {"h": (4.5, 7.2), 0: (1.5, 5.2), 1: (4.5, 5.2), 2: (7.5, 5.2), 3: (0.5, 3.2), 4: (1.5, 3.2),
             5: (2.5, 3.2), 6: (4.0, 3.2), 7: (5.0, 3.2)}
    parents = [-1, -1, -1, 0, 0, 0, 1, 1]
    for n, p in enumerate(parents):
        x0, y0 = nodes["h" if p < 0 else p]
        x1, y1 = nodes[n]
        ax.plot([x0 + 0.4, x1 + 0.4], [y0, y1 + 0.8], color="gray", linewidth=0.8)
    cell(ax, nodes["h"][0] - 0.6, nodes["h"][1], "x-2 x-1", "#aaaaaa", w=2.0, h=0.8)
    for n in range(8):
        x, y = nodes[n]
        cell(ax, x, y, f"n{n}", "#fdb462" if n in (1, 6) else "#ffffff", w=0.8, h=0.8)
    ax.text(5, 1.6, "window(n6) = [x-1, n1, n6]: walk the parent links", ha="center", fontsize=8)
    ax.text(5, 0.6, "rows: x-2 x-1 n0 n1 ... n7  =  (N+K-2)/(N(K-1)) = 0.42x of dense", ha="center", fontsize=8)

    fig.suptitle(f"one slot, K={K}, D={D} (one colour per input): dense stores each input up to K-1 times",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print("wrote", out)


if __name__ == "__main__":
    main()
