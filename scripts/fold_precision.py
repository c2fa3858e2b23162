"""How precise the GDN ring's fold products must be: the fold's chunk form (csrc_triton/gdn_ring_verify_mma.py,
_row_head with FOLD) emulated in float64 with each product's operands rounded as the tensor cores take them
(tf32, to nearest), against the delta rule token by token in float64, over many folds of one head's state.

    python scripts/fold_precision.py [--folds 60] [--pending 16]

Prints max |S - S_ref| / max |S_ref| after 1, 5, 20 and the last fold, for each scheme: every product in
tf32; every product in 3xTF32 (each operand a tf32 head and a tf32 rest, three products: the kernel's
fold); one product at a time in tf32; the keys' rests dropped; keys rounded to bf16 before their norm
(as a 16-bit conv output would be), so that tf32 holds them whole and two products (the state's or the
update's parts) make 3xTF32. The ring's tests hold the checkpoint to 1e-4 x max |S|.
"""

from __future__ import annotations

import argparse

import torch

F64 = torch.float64


def tf32(x):
    """x rounded to nearest tf32 (10 stored mantissa bits), as the kernels' _rounded."""
    bits = x.to(torch.float32).contiguous().view(torch.int32)
    return ((bits + 0x1000) & -8192).view(torch.float32).to(F64)


def f32(x):
    return x.to(torch.float32).to(F64)


def product(a, b, mode):
    """a @ b accumulated in float32 from tf32 operands: 1 (one product), 3 (3xTF32), 2 (a whole, b's two parts);
    0: from the operands as they are."""
    if mode == 0:
        return f32(a @ b)
    a_hi, b_hi = tf32(a), tf32(b)
    if mode == 1:
        return f32(a_hi @ b_hi)
    b_lo = tf32(b - b_hi)
    if mode == 2:
        return f32(a_hi @ b_lo + a_hi @ b_hi)
    return f32(tf32(a - a_hi) @ b_hi + a_hi @ b_lo + a_hi @ b_hi)


def fold(state, keys, values, g, beta, modes, bf16_keys):
    """The checkpoint after one fold of the pending tokens, the kernel's chunk form: U = (I + A)^-1 rhs,
    S_P = exp(G_P) S0 + K^T diag(exp(G_P - G_j)) U; the inverse taken exact here."""
    pending = keys.shape[0]
    if bf16_keys:  # keys whole in tf32, each row's norm applied to its products
        raw = keys.to(torch.bfloat16).to(F64)
        norm = f32(1.0 / torch.sqrt((raw * raw).sum(1, keepdim=True) + 1e-6))
        gram = product(raw, raw.T, modes["gram"]) * norm * norm.T
        products = product(raw, state, modes["ks"]) * norm
    else:
        raw = f32(keys / torch.sqrt((keys * keys).sum(1, keepdim=True) + 1e-6))
        norm = torch.ones(pending, 1, dtype=F64)
        gram = product(raw, raw.T, modes["gram"])
        products = product(raw, state, modes["ks"])
    cumulative = f32(torch.cumsum(g, 0))
    r = torch.arange(pending)
    decay = torch.exp(cumulative[:, None] - cumulative[None, :])
    A = torch.where(r[:, None] > r[None, :], beta[:, None] * decay * gram, torch.zeros((), dtype=F64))
    inverse = f32(torch.linalg.inv(torch.eye(pending, dtype=F64) + A))
    rhs = f32(beta[:, None] * (values - torch.exp(cumulative)[:, None] * products))
    weighted = f32(product(inverse, rhs, modes["u"]) * torch.exp(cumulative[-1] - cumulative)[:, None] * norm)
    return f32(torch.exp(cumulative[-1]) * state + product(raw.T, weighted, modes["update"]))


def delta_rule(state, keys, values, g, beta, bf16_keys):
    """The same tokens one at a time in float64."""
    if bf16_keys:
        keys = keys.to(torch.bfloat16).to(F64)
    keys = keys / torch.sqrt((keys * keys).sum(1, keepdim=True) + 1e-6)
    for t in range(keys.shape[0]):
        state = torch.exp(g[t]) * state
        state = state + torch.outer(keys[t], beta[t] * (values[t] - keys[t] @ state))
    return state


SCHEMES = {  # name: (products' modes, keys rounded to bf16 first)
    "every product tf32": (dict(gram=1, ks=1, u=1, update=1), False),
    "every product 3xTF32 (the fold)": (dict(gram=3, ks=3, u=3, update=3), False),
    "K S0 tf32": (dict(gram=3, ks=1, u=3, update=3), False),
    "K^T W tf32": (dict(gram=3, ks=3, u=3, update=1), False),
    "the gram tf32": (dict(gram=1, ks=3, u=3, update=3), False),
    "U tf32": (dict(gram=3, ks=3, u=1, update=3), False),
    "the keys' rests dropped": (dict(gram=3, ks=2, u=3, update=2), False),
    "bf16 keys: gram 1, K S0 and K^T W 2 products": (dict(gram=1, ks=2, u=3, update=2), True),
    "bf16 keys, and U tf32": (dict(gram=1, ks=2, u=1, update=2), True),
}


def errors(modes, bf16_keys, folds, pending, head_dim, decay, checkpoints, seed=1):
    """max |S - S_ref| / max |S_ref| after each fold in checkpoints, over folds random folds."""
    generator = torch.Generator().manual_seed(seed)
    state = torch.zeros(head_dim, head_dim, dtype=F64)
    reference = state.clone()
    found = []
    for index in range(1, folds + 1):
        keys = torch.nn.functional.silu(torch.randn(pending, head_dim, generator=generator, dtype=F64))
        values = torch.randn(pending, head_dim, generator=generator, dtype=F64).to(torch.bfloat16).to(F64)
        g = -torch.rand(pending, generator=generator, dtype=F64) * decay
        beta = torch.rand(pending, generator=generator, dtype=F64)
        state = fold(state, keys, values, g, beta, modes, bf16_keys)
        reference = delta_rule(reference, keys, values, g, beta, bf16_keys)
        if index in checkpoints:
            found.append(((state - reference).abs().max() / reference.abs().max()).item())
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folds", type=int, default=60)
    parser.add_argument("--pending", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args(argv)
    checkpoints = sorted({1, 5, 20, args.folds} & set(range(1, args.folds + 1)))
    for decay in (0.02, 0.2):
        print(f"g ~ -U(0, {decay}), beta ~ U(0, 1), keys silu(N(0, 1)), values bf16 N(0, 1); {args.folds} folds of "
              f"{args.pending}, dk = dv = {args.head_dim}; after fold " + " / ".join(map(str, checkpoints)))
        for name, (modes, bf16_keys) in SCHEMES.items():
            found = errors(modes, bf16_keys, args.folds, args.pending, args.head_dim, decay, checkpoints)
            print(f"  {name:48s} " + " / ".join(f"{error:.2e}" for error in found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
