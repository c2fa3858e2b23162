"""Replay-commit benchmark: this package's gdn_commit against a snapshot-copy commit and an
input-replay commit, the engine-side verify with and without state snapshots, and a traffic model.

    python benchmarks/bench_commit.py                 # H200 tables (needs CUDA; ~2-3 min at the defaults)
    python benchmarks/bench_commit.py --mixer mamba2  # the same commit tables for Mamba2 layers (below)
    python benchmarks/bench_commit.py --check         # every kernel, both mixers, tiny shapes (CPU: interpreted)

Shapes: Qwen3-Next TP1 layers (L=36 GDN layers, Hk=16, Hv=32, dk=dv=128, conv dim 8192, K=4), fp32
recurrent state, bf16 conv inputs; chain drafts of D=4 with accepted lengths uniform in 1..D, and an
8-node topk-3 tree, TREE_PARENTS below, with the accepted node at a depth uniform in 1..4: the depth
is the chain's accepted length drawn with the same seed, so chain and tree replay equally long paths.

Commit candidates (one step's commit of every layer; dst_slots = src_slots = arange(B)):
  convwin gdn_commit  sgl_convwin.gdn_commit: recomputes conv -> SiLU -> split -> l2norm(k) from the
                      conv-input buffer (token_major) and replays the accepted path onto the state;
                      writes the new conv window too.
  snapshot copy       what engines without replay do: _snapshot_copy_kernel gathers the accepted
                      step's state snapshot snap[l, src, step] -> ssm_state[l, dst] (one launch, all
                      layers), then sgl_convwin.scatter (chain, window_view of the buffer) or
                      scatter_tree (tree) commits the conv window.
  input replay        the ReplaySSM way (vLLM): _kv_replay_kernel replays the accepted path from a
                      cache of post-conv k [.., Hk*dk] and v [.., Hv*dv] (bf16, k NOT normalised:
                      the kernel l2-normalises it, as vLLM's kernels do in-kernel) and g, beta
                      (fp32). Its conv state is widened to K-1+D columns and read at an offset by
                      the next step, so its commit moves no conv bytes (counted as zero).
Each is timed with triton.testing.do_bench (median) and with CUDA-graph replay (captured after a
warm-up, replayed many times, timed with CUDA events), beside the bytes it must move and that as a
fraction of a device-to-device copy ceiling measured in the same run.

Verify (chain only): a Triton stand-in of the engine's verify recurrence over the D draft tokens (reads
the state once, writes o_t = S_t^T (q_t * dk**-0.5) per token) with a snapshot written per token (the
snapshot design) and with no state written (the replay designs), one launch per layer, and FLA's
fused_recurrent_gated_delta_rule on the same inputs when `fla` imports. Then the recurrent-state
traffic per step of each design beside its memory per slot: a model, not a measurement.

--mixer mamba2: Nemotron-H-8B TP1 Mamba2 layers (L=24, H=128 heads, P=64, G=8 groups, Ns=128, conv dim
H*P + 2*G*Ns = 10240 with a bias, K=4), fp32 state [H, P, Ns] (4 MiB per layer per slot), bf16 conv
inputs, fp32 dt, A = -uniform(1, 16) per head; the same drafts, B and timers; commit candidates:
  convwin mamba2_commit  sgl_convwin.mamba2_commit: conv + bias -> SiLU -> x, B from the buffer, then
                      h = exp(dt*A) h + (dt x) B^T along the accepted path; writes the conv window too.
  snapshot copy       the same _snapshot_copy_kernel (it copies a flat per-slot state of any shape) of
                      the accepted step's [H, P, Ns] snapshot, then scatter / scatter_tree.
  input replay        _xb_replay_kernel: from a cache of post-conv x [H*P] and B [G*Ns] (bf16) and dt
                      (fp32) per token, one program per (head x block of --block-p rows of P, row,
                      layer), the [block, Ns] state tile in registers; conv state widened, no conv bytes.
Bytes (per layer; A rows committed, T path tokens): every candidate 2*A*H*P*Ns*4 (state read + write);
convwin + T*dim*2 + A*(K-1)*dim*2 (committed inputs) + A*(K-1)*dim*2 (window) + T*H*4 (dt) + dim*K*2
+ dim*2 (weight, bias) + H*4 (A); snapshot + 2*A*(K-1)*dim*2; input replay + T*(H*P + G*Ns)*2 + T*H*4
+ H*4. The engine-side verify is timed for GDN only (said so in the output); the traffic model is
printed for both.

Memory: at B=256 the fp32 state is 18 GiB and a D=4 snapshot buffer 72 GiB (an 8-node tree's would
be 144 GiB; Mamba2: 24 GiB, 96 GiB): every candidate's own tensors are allocated just before it is timed and freed after, and
a snapshot buffer that does not fit the budget (--mem-limit-gib) holds fewer node snapshots (said so).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from types import SimpleNamespace

import torch

import common  # noqa: F401 -- before any kernel: without CUDA it sets TRITON_INTERPRET=1
import triton
import triton.language as tl

import sgl_convwin
from common import (copy_ceiling_gbps, do_bench_us, environment_line, graph_time_us, markdown_header, markdown_row,
                    needs_cuda)


# Tree draft (topk 3, 8 nodes): node 0 is the root (its parent is the committed history), nodes
# 1, 2, 3 its children, nodes 4, 5, 6 node 1's children, node 7 node 4's child. Depths 1..4, so
# accepted paths are 1..4 tokens long, like the D=4 chain's.
TREE_PARENTS = [-1, 0, 0, 0, 1, 1, 1, 4]


@dataclass(frozen=True)
class Shapes:
    layers: int = 36
    k_heads: int = 16
    v_heads: int = 32
    head_k: int = 128
    head_v: int = 128
    kernel_size: int = 4
    num_draft: int = 4

    @property
    def key_width(self) -> int:  # Hk * dk: the width of q, and of k
        return self.k_heads * self.head_k

    @property
    def dim(self) -> int:  # conv channels: q, k, v
        return 2 * self.key_width + self.v_heads * self.head_v

    @property
    def kv_width(self) -> int:  # what input replay caches per token: k, v
        return self.key_width + self.v_heads * self.head_v

    @property
    def state_numel(self) -> int:  # one layer's recurrent state per slot
        return self.v_heads * self.head_k * self.head_v


    mixer = "gdn"  # class attributes, not fields: asdict(shapes) (printed, in the JSON) lists the fields only
    num_gates = 2  # g, beta

    @property
    def gate_heads(self) -> int:
        return self.v_heads

    @property
    def replay_width(self) -> int:  # bf16 elements input replay caches per token
        return self.kv_width

    @property
    def state_shape(self) -> tuple[int, int, int]:
        return (self.v_heads, self.head_k, self.head_v)


@dataclass(frozen=True)
class Mamba2Shapes:
    """Mamba2 layers: H heads of P channels, G groups of B and C, state [H, P, Ns] per slot; conv input
    x, B, C of width H*P + 2*G*Ns, conv with bias. Defaults: Nemotron-H-8B at TP1 (24 of its 52 layers,
    H 128, P 64, G 8, Ns 128, dim 10240, K 4)."""
    layers: int = 24
    heads: int = 128
    head_dim: int = 64
    groups: int = 8
    d_state: int = 128
    kernel_size: int = 4
    num_draft: int = 4
    mixer = "mamba2"
    num_gates = 1  # dt

    @property
    def dim(self) -> int:  # conv channels: x, B, C
        return self.heads * self.head_dim + 2 * self.groups * self.d_state

    @property
    def x_width(self) -> int:  # H * P
        return self.heads * self.head_dim

    @property
    def replay_width(self) -> int:  # what input replay caches per token: x [H, P], B [G, Ns]
        return self.x_width + self.groups * self.d_state

    @property
    def gate_heads(self) -> int:
        return self.heads

    @property
    def state_numel(self) -> int:  # one layer's recurrent state per slot
        return self.heads * self.head_dim * self.d_state

    @property
    def state_shape(self) -> tuple[int, int, int]:
        return (self.heads, self.head_dim, self.d_state)


QWEN3_NEXT_TP1 = Shapes()
NEMOTRON_H_8B_TP1 = Mamba2Shapes()
CHECK_SHAPES = Shapes(layers=2, k_heads=2, v_heads=4, head_k=16, head_v=16, kernel_size=4, num_draft=3)
MAMBA2_CHECK_SHAPES = Mamba2Shapes(layers=2, heads=4, head_dim=8, groups=2, d_state=16, kernel_size=4, num_draft=3)

# ------------------------------------------------------------------------------------------------
# Kernels written here (baselines and the verify stand-in)
# ------------------------------------------------------------------------------------------------


@triton.jit
def _snapshot_copy_kernel(
    state_ptr, snap_ptr, dst_ptr, src_ptr, steps_ptr,
    state_stride_layer, state_stride_slot,
    snap_stride_layer, snap_stride_slot, snap_stride_step,
    num_state_slots, num_snap_slots, num_steps, numel,
    BLOCK: tl.constexpr,
):
    """ssm_state[layer, dst[row]] = snap[layer, src[row], steps[row]]: one BLOCK of one state per
    program; each per-slot state is contiguous. A negative or out-of-range index skips the row."""
    block = tl.program_id(0)
    row = tl.program_id(1)
    layer = tl.program_id(2).to(tl.int64)
    step = tl.load(steps_ptr + row).to(tl.int64)
    dst = tl.load(dst_ptr + row).to(tl.int64)
    src = tl.load(src_ptr + row).to(tl.int64)
    valid = (step >= 0) & (step < num_steps) & (dst >= 0) & (dst < num_state_slots)
    valid = valid & (src >= 0) & (src < num_snap_slots)
    if valid:
        offsets = block * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < numel
        source = snap_ptr + layer * snap_stride_layer + src * snap_stride_slot + step * snap_stride_step
        values = tl.load(source + offsets, mask=mask)
        dest = state_ptr + layer * state_stride_layer + dst * state_stride_slot
        tl.store(dest + offsets, values.to(state_ptr.dtype.element_ty), mask=mask)


def snapshot_copy(ssm_state, snapshots, dst_slots, src_slots, steps, *, block=4096, num_warps=8):
    """ssm_state [L, N, Hv, dk, dv]; snapshots [L, M, S, Hv, dk, dv]; each slot's state contiguous."""
    num_layers, num_state_slots = ssm_state.shape[:2]
    numel = ssm_state[0, 0].numel()
    assert ssm_state[0, 0].is_contiguous() and snapshots[0, 0, 0].is_contiguous()
    grid = (triton.cdiv(numel, block), steps.shape[0], num_layers)
    _snapshot_copy_kernel[grid](
        ssm_state, snapshots, dst_slots, src_slots, steps,
        ssm_state.stride(0), ssm_state.stride(1),
        snapshots.stride(0), snapshots.stride(1), snapshots.stride(2),
        num_state_slots, snapshots.shape[1], snapshots.shape[2], numel,
        BLOCK=block, num_warps=num_warps,
    )


@triton.jit
def _path_length(node, parents_row, parents_stride_node, MAX_DEPTH: tl.constexpr, TREE: tl.constexpr):
    """Tokens on the accepted path: node + 1 (chain), the accepted node's depth (tree)."""
    if TREE:
        length = node * 0
        current = node
        for _ in range(MAX_DEPTH):
            live = current >= 0
            length += live.to(tl.int32)
            parent = tl.load(parents_row + current * parents_stride_node, mask=live, other=-1)
            current = tl.where(live, parent.to(tl.int32), -1)
    else:
        length = node + 1
    return length


@triton.jit
def _path_token(node, j, length, parents_row, parents_stride_node, TREE: tl.constexpr):
    """Path token j, root first: j (chain); the accepted node's ancestor (length - 1 - j) links up (tree)."""
    token = node * 0 + j
    if TREE:
        token = node
        for _ in range(length - 1 - j):
            token = tl.load(parents_row + token * parents_stride_node).to(tl.int32)
    return token


@triton.jit
def _kv_token(kv_base, gates_base, node, j, length, parents_row, parents_stride_node, kv_stride_token,
              gates_stride_token, gates_stride_kind, head, rk, rv,
              GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, KEY_WIDTH: tl.constexpr, TREE: tl.constexpr):
    """Path token j's cached k, v and its g, beta in float32 (zeros past the path's end)."""
    live = j < length
    token = _path_token(node, tl.minimum(j, length - 1), length, parents_row, parents_stride_node, TREE)
    token_base = kv_base + token * kv_stride_token
    k = tl.load(token_base + (head // GROUP) * DK + rk, mask=tl.where(live, rk >= 0, False), other=0.0)
    v = tl.load(token_base + KEY_WIDTH + head * DV + rv, mask=tl.where(live, rv >= 0, False), other=0.0)
    gate = gates_base + token * gates_stride_token
    g = tl.load(gate, mask=live, other=0.0)
    beta = tl.load(gate + gates_stride_kind, mask=live, other=0.0)
    return k.to(tl.float32), v.to(tl.float32), g.to(tl.float32), beta.to(tl.float32)


@triton.jit
def _xb_token(xb_base, gates_base, node, j, length, parents_row, parents_stride_node, xb_stride_token,
              gates_stride_token, head, rp, rn,
              HEADS_PER_GROUP: tl.constexpr, P: tl.constexpr, NS: tl.constexpr, X_WIDTH: tl.constexpr,
              TREE: tl.constexpr):
    """Path token j's cached x, B and its dt in float32 (zeros past the path's end)."""
    live = j < length
    token = _path_token(node, tl.minimum(j, length - 1), length, parents_row, parents_stride_node, TREE)
    token_base = xb_base + token * xb_stride_token
    x = tl.load(token_base + head * P + rp, mask=tl.where(live, rp >= 0, False), other=0.0)
    b = tl.load(token_base + X_WIDTH + (head // HEADS_PER_GROUP) * NS + rn, mask=tl.where(live, rn >= 0, False),
                other=0.0)
    dt = tl.load(gates_base + token * gates_stride_token, mask=live, other=0.0)
    return x.to(tl.float32), b.to(tl.float32), dt.to(tl.float32)


@triton.jit
def _kv_replay_kernel(
    state_ptr, kv_ptr, gates_ptr, dst_ptr, src_ptr, steps_ptr, parents_ptr,
    state_stride_layer, state_stride_slot, state_stride_head, state_stride_k, state_stride_v,
    kv_stride_layer, kv_stride_slot, kv_stride_token,
    gates_stride_layer, gates_stride_slot, gates_stride_token, gates_stride_kind,
    parents_stride_row, parents_stride_node,
    num_state_slots, num_src_slots, num_nodes,
    GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, V_BLOCKS: tl.constexpr,
    KEY_WIDTH: tl.constexpr, MAX_DEPTH: tl.constexpr, TREE: tl.constexpr, L2NORM: tl.constexpr,
):
    """One program per (value head x dv block, row, layer): the [DK, BV] fp32 state tile stays in
    registers while the accepted path's tokens are replayed onto it, root first:
    k /= sqrt(|k|^2 + 1e-6) (L2NORM); S *= exp(g); u = beta * (v - S^T k); S += k u^T."""
    pid = tl.program_id(0)
    head = pid // V_BLOCKS
    v_block = pid % V_BLOCKS
    row = tl.program_id(1)
    layer = tl.program_id(2).to(tl.int64)
    node = tl.load(steps_ptr + row).to(tl.int32)  # the accepted step (chain) or node (tree)
    dst = tl.load(dst_ptr + row).to(tl.int64)
    src = tl.load(src_ptr + row).to(tl.int64)
    valid = (node >= 0) & (node < num_nodes) & (dst >= 0) & (dst < num_state_slots)
    valid = valid & (src >= 0) & (src < num_src_slots)
    if valid:
        parents_row = parents_ptr + row.to(tl.int64) * parents_stride_row
        length = _path_length(node, parents_row, parents_stride_node, MAX_DEPTH, TREE)
        rk = tl.arange(0, DK)
        rv = v_block * BV + tl.arange(0, BV)
        state_tile = (state_ptr + layer * state_stride_layer + dst * state_stride_slot + head * state_stride_head
                      + rk[:, None] * state_stride_k + rv[None, :] * state_stride_v)
        state = tl.load(state_tile).to(tl.float32)
        kv_base = kv_ptr + layer * kv_stride_layer + src * kv_stride_slot
        gates_base = gates_ptr + layer * gates_stride_layer + src * gates_stride_slot + head
        # each token's inputs are loaded two tokens ahead of their use (as the convwin kernels do)
        k, v, g, beta = _kv_token(kv_base, gates_base, node, 0, length, parents_row, parents_stride_node,
                                  kv_stride_token, gates_stride_token, gates_stride_kind, head, rk, rv,
                                  GROUP, DK, DV, KEY_WIDTH, TREE)
        k_next, v_next, g_next, beta_next = _kv_token(
            kv_base, gates_base, node, 1, length, parents_row, parents_stride_node, kv_stride_token,
            gates_stride_token, gates_stride_kind, head, rk, rv, GROUP, DK, DV, KEY_WIDTH, TREE)
        for j in range(length):
            k_after, v_after, g_after, beta_after = _kv_token(
                kv_base, gates_base, node, j + 2, length, parents_row, parents_stride_node, kv_stride_token,
                gates_stride_token, gates_stride_kind, head, rk, rv, GROUP, DK, DV, KEY_WIDTH, TREE)
            if L2NORM:
                k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
            state = state * tl.exp(g)
            u = beta * (v - tl.sum(state * k[:, None], axis=0))
            state = state + k[:, None] * u[None, :]
            k, v, g, beta = k_next, v_next, g_next, beta_next
            k_next, v_next, g_next, beta_next = k_after, v_after, g_after, beta_after
        tl.store(state_tile, state.to(state_ptr.dtype.element_ty))


def kv_replay_commit(ssm_state, kv_cache, gates, dst_slots, src_slots, steps, parents, shapes, *,
                     block_v=32, num_warps=4, l2norm=True):
    """ssm_state [L, N, Hv, dk, dv] any strides; kv_cache [L, M, D, Hk*dk + Hv*dv] (k then v, last dim
    contiguous); gates [L, M, D, 2, Hv]; parents [B, D] or None (chain: tokens 0..steps[b])."""
    num_layers, num_state_slots = ssm_state.shape[:2]
    block_v = min(block_v, shapes.head_v)
    v_blocks = shapes.head_v // block_v
    assert kv_cache.stride(-1) == 1 and gates.stride(-1) == 1 and v_blocks * block_v == shapes.head_v
    tree = parents is not None
    parents_arg = parents if tree else steps
    parents_strides = parents.stride() if tree else (0, 0)
    grid = (shapes.v_heads * v_blocks, steps.shape[0], num_layers)
    _kv_replay_kernel[grid](
        ssm_state, kv_cache, gates, dst_slots, src_slots, steps, parents_arg,
        *ssm_state.stride(),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2),
        gates.stride(0), gates.stride(1), gates.stride(2), gates.stride(3),
        *parents_strides,
        num_state_slots, kv_cache.shape[1], kv_cache.shape[2],
        GROUP=shapes.v_heads // shapes.k_heads, DK=shapes.head_k, DV=shapes.head_v, BV=block_v,
        V_BLOCKS=v_blocks, KEY_WIDTH=shapes.key_width, MAX_DEPTH=kv_cache.shape[2], TREE=tree,
        L2NORM=l2norm, num_warps=num_warps,
    )


@triton.jit
def _xb_replay_kernel(
    state_ptr, xb_ptr, gates_ptr, a_ptr, dst_ptr, src_ptr, steps_ptr, parents_ptr,
    state_stride_layer, state_stride_slot, state_stride_head, state_stride_p, state_stride_n,
    xb_stride_layer, xb_stride_slot, xb_stride_token,
    gates_stride_layer, gates_stride_slot, gates_stride_token,
    a_stride_layer,
    parents_stride_row, parents_stride_node,
    num_state_slots, num_src_slots, num_nodes,
    HEADS_PER_GROUP: tl.constexpr, P: tl.constexpr, NS: tl.constexpr, BP: tl.constexpr, P_BLOCKS: tl.constexpr,
    X_WIDTH: tl.constexpr, MAX_DEPTH: tl.constexpr, TREE: tl.constexpr,
):
    """Mamba2 input replay. One program per (head x block of BP rows of P, row, layer): the [BP, Ns]
    fp32 state tile stays in registers while the accepted path's tokens are replayed onto it, root
    first: h = exp(dt * A[head]) * h + (dt * x[head]) B[group]^T."""
    pid = tl.program_id(0)
    head = pid // P_BLOCKS
    p_block = pid % P_BLOCKS
    row = tl.program_id(1)
    layer = tl.program_id(2).to(tl.int64)
    node = tl.load(steps_ptr + row).to(tl.int32)
    dst = tl.load(dst_ptr + row).to(tl.int64)
    src = tl.load(src_ptr + row).to(tl.int64)
    valid = (node >= 0) & (node < num_nodes) & (dst >= 0) & (dst < num_state_slots)
    valid = valid & (src >= 0) & (src < num_src_slots)
    if valid:
        parents_row = parents_ptr + row.to(tl.int64) * parents_stride_row
        length = _path_length(node, parents_row, parents_stride_node, MAX_DEPTH, TREE)
        rp = p_block * BP + tl.arange(0, BP)
        rn = tl.arange(0, NS)
        state_tile = (state_ptr + layer * state_stride_layer + dst * state_stride_slot + head * state_stride_head
                      + rp[:, None] * state_stride_p + rn[None, :] * state_stride_n)
        state = tl.load(state_tile).to(tl.float32)
        rate = tl.load(a_ptr + layer * a_stride_layer + head).to(tl.float32)
        xb_base = xb_ptr + layer * xb_stride_layer + src * xb_stride_slot
        gates_base = gates_ptr + layer * gates_stride_layer + src * gates_stride_slot + head
        # each token's inputs are loaded two tokens ahead of their use (as the convwin kernels do)
        x, b, dt = _xb_token(xb_base, gates_base, node, 0, length, parents_row, parents_stride_node,
                             xb_stride_token, gates_stride_token, head, rp, rn, HEADS_PER_GROUP, P, NS, X_WIDTH, TREE)
        x_next, b_next, dt_next = _xb_token(xb_base, gates_base, node, 1, length, parents_row, parents_stride_node,
                                            xb_stride_token, gates_stride_token, head, rp, rn, HEADS_PER_GROUP, P, NS,
                                            X_WIDTH, TREE)
        for j in range(length):
            x_after, b_after, dt_after = _xb_token(xb_base, gates_base, node, j + 2, length, parents_row,
                                                   parents_stride_node, xb_stride_token, gates_stride_token, head, rp,
                                                   rn, HEADS_PER_GROUP, P, NS, X_WIDTH, TREE)
            state = state * tl.exp(dt * rate) + (dt * x)[:, None] * b[None, :]
            x, b, dt = x_next, b_next, dt_next
            x_next, b_next, dt_next = x_after, b_after, dt_after
        tl.store(state_tile, state.to(state_ptr.dtype.element_ty))


def xb_replay_commit(ssm_state, xb_cache, gates, A, dst_slots, src_slots, steps, parents, shapes, *,
                     block_p=32, num_warps=4):
    """Mamba2: ssm_state [L, N, H, P, Ns] any strides; xb_cache [L, M, D, H*P + G*Ns] (x then B, last
    dim contiguous); gates [L, M, D, 1, H] (dt); A [L, H]; parents [B, D] or None (chain)."""
    num_layers, num_state_slots = ssm_state.shape[:2]
    block_p = min(block_p, shapes.head_dim)
    p_blocks = shapes.head_dim // block_p
    assert xb_cache.stride(-1) == 1 and gates.stride(-1) == 1 and A.stride(-1) == 1
    assert p_blocks * block_p == shapes.head_dim
    tree = parents is not None
    parents_arg = parents if tree else steps
    parents_strides = parents.stride() if tree else (0, 0)
    grid = (shapes.heads * p_blocks, steps.shape[0], num_layers)
    _xb_replay_kernel[grid](
        ssm_state, xb_cache, gates, A, dst_slots, src_slots, steps, parents_arg,
        *ssm_state.stride(),
        xb_cache.stride(0), xb_cache.stride(1), xb_cache.stride(2),
        gates.stride(0), gates.stride(1), gates.stride(2),
        A.stride(0),
        *parents_strides,
        num_state_slots, xb_cache.shape[1], xb_cache.shape[2],
        HEADS_PER_GROUP=shapes.heads // shapes.groups, P=shapes.head_dim, NS=shapes.d_state, BP=block_p,
        P_BLOCKS=p_blocks, X_WIDTH=shapes.x_width, MAX_DEPTH=xb_cache.shape[2], TREE=tree, num_warps=num_warps,
    )


@triton.jit
def _verify_kernel(
    state_ptr, qkv_ptr, gates_ptr, out_ptr, snap_ptr, slots_ptr,
    state_stride_slot, state_stride_head, state_stride_k, state_stride_v,
    qkv_stride_row, qkv_stride_token,
    gates_stride_row, gates_stride_token, gates_stride_kind,
    out_stride_row, out_stride_token, out_stride_head,
    snap_stride_slot, snap_stride_step, snap_stride_head, snap_stride_k, snap_stride_v,
    scale,
    GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, V_BLOCKS: tl.constexpr,
    KEY_WIDTH: tl.constexpr, NUM_DRAFT: tl.constexpr, SNAPSHOT: tl.constexpr,
):
    """One layer's verify over the D draft tokens of each row, per (value head x dv block, row):
    reads the state once, writes every token's output o_t = S_t^T (l2norm(q_t) * scale), and with
    SNAPSHOT every token's state S_t; never writes the state itself."""
    pid = tl.program_id(0)
    head = pid // V_BLOCKS
    v_block = pid % V_BLOCKS
    row = tl.program_id(1).to(tl.int64)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    if slot >= 0:
        rk = tl.arange(0, DK)
        rv = v_block * BV + tl.arange(0, BV)
        tile = rk[:, None] * state_stride_k + rv[None, :] * state_stride_v
        state = tl.load(state_ptr + slot * state_stride_slot + head * state_stride_head + tile).to(tl.float32)
        key = (head // GROUP) * DK + rk
        for t in tl.static_range(NUM_DRAFT):
            token = qkv_ptr + row * qkv_stride_row + t * qkv_stride_token
            q = tl.load(token + key).to(tl.float32)
            k = tl.load(token + KEY_WIDTH + key).to(tl.float32)
            v = tl.load(token + 2 * KEY_WIDTH + head * DV + rv).to(tl.float32)
            q = q / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6) * scale
            k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
            gate = gates_ptr + row * gates_stride_row + t * gates_stride_token + head
            g = tl.load(gate).to(tl.float32)
            beta = tl.load(gate + gates_stride_kind).to(tl.float32)
            state = state * tl.exp(g)
            u = beta * (v - tl.sum(state * k[:, None], axis=0))
            state = state + k[:, None] * u[None, :]
            o = tl.sum(state * q[:, None], axis=0)
            tl.store(out_ptr + row * out_stride_row + t * out_stride_token + head * out_stride_head + rv,
                     o.to(out_ptr.dtype.element_ty))
            if SNAPSHOT:
                snap = snap_ptr + slot * snap_stride_slot + t * snap_stride_step + head * snap_stride_head
                snap_tile = rk[:, None] * snap_stride_k + rv[None, :] * snap_stride_v
                tl.store(snap + snap_tile, state.to(snap_ptr.dtype.element_ty))


def verify_layer(ssm_state, qkv, gates, out, snapshots, slots, shapes, *, block_v=32, num_warps=4):
    """One layer: ssm_state [N, Hv, dk, dv]; qkv [B, D, dim] (post-conv q, k, v, last dim contiguous);
    gates [B, D, 2, Hv]; out [B, D, Hv, dv]; snapshots [N, D, Hv, dk, dv] or None (no state write)."""
    block_v = min(block_v, shapes.head_v)
    v_blocks = shapes.head_v // block_v
    snap = snapshots if snapshots is not None else ssm_state
    snap_strides = snapshots.stride() if snapshots is not None else (0,) * 5
    grid = (shapes.v_heads * v_blocks, slots.shape[0])
    _verify_kernel[grid](
        ssm_state, qkv, gates, out, snap, slots,
        *ssm_state.stride(),
        qkv.stride(0), qkv.stride(1),
        gates.stride(0), gates.stride(1), gates.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        *snap_strides,
        shapes.head_k ** -0.5,
        GROUP=shapes.v_heads // shapes.k_heads, DK=shapes.head_k, DV=shapes.head_v, BV=block_v,
        V_BLOCKS=v_blocks, KEY_WIDTH=shapes.key_width, NUM_DRAFT=qkv.shape[1],
        SNAPSHOT=snapshots is not None, num_warps=num_warps,
    )


# ------------------------------------------------------------------------------------------------
# Oracles: plain float64 loops, written for reading (the --check references)
# ------------------------------------------------------------------------------------------------


def accepted_path(step: int, parents_row: list[int] | None) -> list[int]:
    """Root-first draft tokens (tree nodes) of the accepted path ending at ``step``."""
    if parents_row is None:
        return list(range(step + 1))
    path = [step]
    while parents_row[path[-1]] >= 0:
        path.append(parents_row[path[-1]])
    return path[::-1]


def delta_rule_step(state, k, v, g, beta):
    """One token of the gated delta rule on one value head: state [dk, dv], k [dk], v [dv]."""
    state = state * math.exp(g)
    u = beta * (v - state.t() @ k)
    return state + torch.outer(k, u)


def l2normalize(x):
    return x / torch.sqrt((x * x).sum() + 1e-6)


def _live_rows(steps, dst_slots):
    return [b for b in range(steps.shape[0]) if int(steps[b]) >= 0 and int(dst_slots[b]) >= 0]


def snapshot_copy_oracle(ssm_state, snapshots, dst_slots, src_slots, steps):
    expected = ssm_state.cpu().clone()
    for b in _live_rows(steps, dst_slots):
        expected[:, int(dst_slots[b])] = snapshots.cpu()[:, int(src_slots[b]), int(steps[b])]
    return expected


def kv_replay_oracle(ssm_state, kv_cache, gates, dst_slots, src_slots, steps, parents, shapes):
    expected = ssm_state.cpu().double().clone()
    kv_cache, gates = kv_cache.cpu().double(), gates.cpu().double()
    group, kw = shapes.v_heads // shapes.k_heads, shapes.key_width
    for b in _live_rows(steps, dst_slots):
        dst, src = int(dst_slots[b]), int(src_slots[b])
        path = accepted_path(int(steps[b]), None if parents is None else parents[b].tolist())
        for layer in range(shapes.layers):
            for node in path:
                token = kv_cache[layer, src, node]
                for head in range(shapes.v_heads):
                    kh = head // group
                    k = l2normalize(token[kh * shapes.head_k:(kh + 1) * shapes.head_k])
                    v = token[kw + head * shapes.head_v: kw + (head + 1) * shapes.head_v]
                    g, beta = float(gates[layer, src, node, 0, head]), float(gates[layer, src, node, 1, head])
                    expected[layer, dst, head] = delta_rule_step(expected[layer, dst, head], k, v, g, beta)
    return expected


def xb_replay_oracle(ssm_state, xb_cache, gates, A, dst_slots, src_slots, steps, parents, shapes):
    """Mamba2 input replay, float64: per path token and head h (group h // (H / G)),
    h_state = exp(dt * A[h]) * h_state + (dt * x[h]) B[group]^T."""
    expected = ssm_state.cpu().double().clone()
    xb_cache, gates, A = xb_cache.cpu().double(), gates.cpu().double(), A.cpu().double()
    P, Ns, per_group = shapes.head_dim, shapes.d_state, shapes.heads // shapes.groups
    for b in _live_rows(steps, dst_slots):
        dst, src = int(dst_slots[b]), int(src_slots[b])
        path = accepted_path(int(steps[b]), None if parents is None else parents[b].tolist())
        for layer in range(shapes.layers):
            for node in path:
                token = xb_cache[layer, src, node]
                for head in range(shapes.heads):
                    x = token[head * P:(head + 1) * P]
                    group = head // per_group
                    B = token[shapes.x_width + group * Ns: shapes.x_width + (group + 1) * Ns]
                    dt = float(gates[layer, src, node, 0, head])
                    state = expected[layer, dst, head]
                    expected[layer, dst, head] = math.exp(dt * float(A[layer, head])) * state + torch.outer(dt * x, B)
    return expected


def gdn_commit_oracle(ssm_state, conv_state, buffer, gates, conv_weight, dst_slots, src_slots, steps, parents,
                      shapes):
    """(ssm_state in float64, conv_state in its dtype) after the commit: token by token along each
    accepted path, the conv over the K inputs ending at the token (the K-1 committed ones from
    conv_state, then the path's buffer rows), SiLU, split, l2norm(k), the gated delta rule."""
    expected = ssm_state.cpu().double().clone()
    expected_conv = conv_state.cpu().clone()
    buffer, gates, weight = buffer.cpu(), gates.cpu().double(), conv_weight.cpu().double()
    K, kw, group = shapes.kernel_size, shapes.key_width, shapes.v_heads // shapes.k_heads
    for b in _live_rows(steps, dst_slots):
        dst, src = int(dst_slots[b]), int(src_slots[b])
        path = accepted_path(int(steps[b]), None if parents is None else parents[b].tolist())
        for layer in range(shapes.layers):
            committed = [conv_state.cpu()[layer, dst, :, col] for col in range(K - 1)]
            inputs = committed + [buffer[layer, src, K - 2 + node] for node in path]  # token_major rows
            for j, node in enumerate(path):
                window = inputs[j: j + K]
                y = sum(weight[layer, :, tap] * window[tap].double() for tap in range(K))
                c = y / (1 + torch.exp(-y))
                for head in range(shapes.v_heads):
                    kh = head // group
                    k = l2normalize(c[kw + kh * shapes.head_k: kw + (kh + 1) * shapes.head_k])
                    v = c[2 * kw + head * shapes.head_v: 2 * kw + (head + 1) * shapes.head_v]
                    g, beta = float(gates[layer, src, node, 0, head]), float(gates[layer, src, node, 1, head])
                    expected[layer, dst, head] = delta_rule_step(expected[layer, dst, head], k, v, g, beta)
            for col, value in enumerate(inputs[-(K - 1):]):
                expected_conv[layer, dst, :, col] = value.to(expected_conv.dtype)
    return expected, expected_conv


def verify_oracle(ssm_state, qkv, gates, slots, shapes):
    """(outputs [L, B, D, Hv, dv], states after each token [L, B, D, Hv, dk, dv]), float64."""
    ssm_state, qkv, gates = ssm_state.cpu().double(), qkv.cpu().double(), gates.cpu().double()
    L, B, D = qkv.shape[:3]
    kw, group, scale = shapes.key_width, shapes.v_heads // shapes.k_heads, shapes.head_k ** -0.5
    outs = torch.zeros(L, B, D, shapes.v_heads, shapes.head_v, dtype=torch.float64)
    states = torch.zeros(L, B, D, shapes.v_heads, shapes.head_k, shapes.head_v, dtype=torch.float64)
    for layer in range(L):
        for b in range(B):
            if int(slots[b]) < 0:
                continue
            for head in range(shapes.v_heads):
                state = ssm_state[layer, int(slots[b]), head]
                kh = head // group
                for t in range(D):
                    q = l2normalize(qkv[layer, b, t, kh * shapes.head_k:(kh + 1) * shapes.head_k]) * scale
                    k = l2normalize(qkv[layer, b, t, kw + kh * shapes.head_k: kw + (kh + 1) * shapes.head_k])
                    v = qkv[layer, b, t, 2 * kw + head * shapes.head_v: 2 * kw + (head + 1) * shapes.head_v]
                    g, beta = float(gates[layer, b, t, 0, head]), float(gates[layer, b, t, 1, head])
                    state = delta_rule_step(state, k, v, g, beta)
                    outs[layer, b, t, head] = state.t() @ q
                    states[layer, b, t, head] = state
    return outs, states


# ------------------------------------------------------------------------------------------------
# Problems
# ------------------------------------------------------------------------------------------------


def tree_depths(parents: list[int]) -> list[int]:
    return [len(accepted_path(n, parents)) for n in range(len(parents))]


def draw_steps(num_rows: int, tree: bool, num_draft: int, generator: torch.Generator) -> torch.Tensor:
    """Accepted lengths uniform in 1..D (chain: step = length - 1). A tree row accepts a node at the
    depth its chain row's length gives (capped at the tree's depth), chosen uniformly among that
    depth's nodes: with the same seed, chain and tree replay paths of the same lengths."""
    lengths = 1 + torch.randint(0, num_draft, (num_rows,), generator=generator)
    if not tree:
        return lengths - 1
    depths = tree_depths(TREE_PARENTS)
    nodes = []
    for length in lengths.tolist():
        choices = [n for n, depth in enumerate(depths) if depth == min(length, max(depths))]
        nodes.append(choices[int(torch.randint(0, len(choices), (1,), generator=generator))])
    return torch.tensor(nodes)


def path_lengths(steps: torch.Tensor, parents: torch.Tensor | None, dst_slots: torch.Tensor) -> list[int]:
    return [len(accepted_path(int(steps[b]), None if parents is None else parents[b].tolist()))
            for b in _live_rows(steps.cpu(), dst_slots.cpu())]


def _make_base_problem(shapes, batch, tree, device, state_tail, *, seed, dst_slots, src_slots, steps,
                       num_state_slots, num_src_slots):
    """What both mixers' problems share: indices, steps, tree parents, the fp32 ssm_state
    [L, N_state, *state_tail], the bf16 conv_state and conv_weight, and the token_major buffer
    filled by sgl_convwin.capture (the verify pass). ``p.normal`` draws more from the same generator."""
    L, K, dim = shapes.layers, shapes.kernel_size, shapes.dim
    num_nodes = len(TREE_PARENTS) if tree else shapes.num_draft
    host = torch.Generator().manual_seed(seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    num_state_slots = batch if num_state_slots is None else num_state_slots
    num_src_slots = batch if num_src_slots is None else num_src_slots
    dst_slots = torch.arange(batch) if dst_slots is None else torch.as_tensor(dst_slots)
    src_slots = torch.arange(batch) if src_slots is None else torch.as_tensor(src_slots)
    steps = draw_steps(batch, tree, shapes.num_draft, host) if steps is None else torch.as_tensor(steps)
    parents = torch.tensor([TREE_PARENTS] * batch, device=device) if tree else None

    def normal(*shape, dtype=torch.float32, std=1.0):
        return torch.empty(shape, dtype=dtype, device=device).normal_(0.0, std, generator=gen)

    p = SimpleNamespace(
        shapes=shapes, tree=tree, num_nodes=num_nodes, num_src_slots=num_src_slots, parents=parents,
        dst_slots=dst_slots.to(device), src_slots=src_slots.to(device), steps=steps.to(device),
        ssm_state=normal(L, num_state_slots, *state_tail, std=0.1),
        conv_state=normal(L, num_state_slots, dim, K - 1, dtype=torch.bfloat16),
        conv_weight=normal(L, dim, K, dtype=torch.bfloat16, std=0.5),
        buffer=sgl_convwin.alloc_windows(L, num_src_slots, dim, num_nodes, K, layout="token_major",
                                         dtype=torch.bfloat16, device=device),
        normal=normal, generator=gen,
    )
    for layer in range(L):  # the verify pass's capture: history rows from conv_state, then x
        x = normal(batch, num_nodes, dim, dtype=torch.bfloat16)
        sgl_convwin.capture(p.buffer, p.conv_state, x, p.src_slots, p.dst_slots, layer)
    return p


def make_problem(shapes: Shapes, batch: int, tree: bool, device, *, seed=0, dst_slots=None, src_slots=None,
                 steps=None, num_state_slots=None, num_src_slots=None):
    """One commit problem for Gated DeltaNet layers: ssm_state [L, N_state, Hv, dk, dv] fp32, conv_state
    [L, N_state, dim, K-1] bf16, the token_major conv-input buffer [L, M, N+K-2, dim] bf16 filled by
    sgl_convwin.capture, gates [L, M, N, 2, Hv] fp32, conv_weight [L, dim, K] bf16; N = D (chain) or
    len(TREE_PARENTS) (tree)."""
    p = _make_base_problem(shapes, batch, tree, device, (shapes.v_heads, shapes.head_k, shapes.head_v), seed=seed,
                           dst_slots=dst_slots, src_slots=src_slots, steps=steps, num_state_slots=num_state_slots,
                           num_src_slots=num_src_slots)
    gate_shape = (shapes.layers, p.num_src_slots, p.num_nodes, shapes.v_heads)
    p.gates = sgl_convwin.alloc_gates(*gate_shape, device=device)
    p.gates[:, :, :, 0] = -torch.nn.functional.softplus(p.normal(*gate_shape)) * 0.5
    p.gates[:, :, :, 1] = torch.sigmoid(p.normal(*gate_shape))
    return p


def make_mamba2_problem(shapes: Mamba2Shapes, batch: int, tree: bool, device, *, seed=0, dst_slots=None,
                        src_slots=None, steps=None, num_state_slots=None, num_src_slots=None):
    """make_problem for Mamba2 layers: ssm_state [L, N_state, H, P, Ns] fp32, conv_state
    [L, N_state, dim, K-1] bf16, the token_major buffer filled by sgl_convwin.capture, gates
    [L, M, N, 1, H] fp32 holding dt (softplus, ~0.05), A [L, H] = -uniform(1, 16) fp32, conv_weight
    [L, dim, K] and conv_bias [L, dim] bf16."""
    p = _make_base_problem(shapes, batch, tree, device, (shapes.heads, shapes.head_dim, shapes.d_state), seed=seed,
                           dst_slots=dst_slots, src_slots=src_slots, steps=steps, num_state_slots=num_state_slots,
                           num_src_slots=num_src_slots)
    L, H = shapes.layers, shapes.heads
    p.conv_bias = p.normal(L, shapes.dim, dtype=torch.bfloat16, std=0.1)
    p.A = -torch.empty(L, H, device=device).uniform_(1.0, 16.0, generator=p.generator)
    p.gates = sgl_convwin.alloc_gates(L, p.num_src_slots, p.num_nodes, H, num_gates=1, device=device)
    p.gates[:, :, :, 0] = torch.nn.functional.softplus(p.normal(L, p.num_src_slots, p.num_nodes, H) - 3.0)
    return p


def problem_for(shapes, batch, tree, device, **kwargs):
    maker = make_mamba2_problem if shapes.mixer == "mamba2" else make_problem
    return maker(shapes, batch, tree, device, **kwargs)


def convwin_commit_fn(p):
    s = p.shapes
    if s.mixer == "mamba2":
        return lambda: sgl_convwin.mamba2_commit(
            p.ssm_state, p.conv_state, p.buffer, p.gates, p.conv_weight, p.A, p.dst_slots, p.src_slots, p.steps,
            p.parents, layout="token_major", num_heads=s.heads, head_dim=s.head_dim, n_groups=s.groups,
            d_state=s.d_state, conv_bias=p.conv_bias)
    return lambda: sgl_convwin.gdn_commit(
        p.ssm_state, p.conv_state, p.buffer, p.gates, p.conv_weight, p.dst_slots, p.src_slots, p.steps,
        p.parents, layout="token_major", num_k_heads=s.k_heads, head_k_dim=s.head_k, num_v_heads=s.v_heads,
        head_v_dim=s.head_v, conv_bias=None, use_qk_l2norm=True)


def snapshot_commit_fn(p, snapshots, snapshot_steps):
    """The state copy (one launch) then the conv window's scatter (one launch)."""
    s = p.shapes
    if p.tree:
        def conv_commit():
            sgl_convwin.scatter_tree(p.conv_state, p.buffer, p.dst_slots, p.src_slots, p.steps, p.parents)
    else:
        windows = sgl_convwin.window_view(p.buffer, "token_major", s.num_draft, s.kernel_size)

        def conv_commit():
            sgl_convwin.scatter(p.conv_state, windows, p.dst_slots, p.src_slots, p.steps)

    def commit():
        snapshot_copy(p.ssm_state, snapshots, p.dst_slots, p.src_slots, snapshot_steps)
        conv_commit()
    return commit


def kv_replay_commit_fn(p, kv_cache, block_v):
    """Input replay: the k, v cache (GDN) or the x, B cache (Mamba2; block_v = rows of P per program)."""
    if p.shapes.mixer == "mamba2":
        return lambda: xb_replay_commit(p.ssm_state, kv_cache, p.gates, p.A, p.dst_slots, p.src_slots, p.steps,
                                        p.parents, p.shapes, block_p=block_v)
    return lambda: kv_replay_commit(p.ssm_state, kv_cache, p.gates, p.dst_slots, p.src_slots, p.steps,
                                    p.parents, p.shapes, block_v=block_v)


def make_verify_problem(shapes: Shapes, batch: int, device, *, seed=0, slots=None, num_state_slots=None):
    L, D, Hv = shapes.layers, shapes.num_draft, shapes.v_heads
    gen = torch.Generator(device=device).manual_seed(seed)
    num_state_slots = batch if num_state_slots is None else num_state_slots
    slots = torch.arange(batch) if slots is None else torch.as_tensor(slots)

    def normal(*shape, dtype=torch.float32, std=1.0):
        return torch.empty(shape, dtype=dtype, device=device).normal_(0.0, std, generator=gen)

    gates = torch.empty(L, batch, D, 2, Hv, device=device)
    gates[:, :, :, 0] = -torch.nn.functional.softplus(normal(L, batch, D, Hv)) * 0.5
    gates[:, :, :, 1] = torch.sigmoid(normal(L, batch, D, Hv))
    return SimpleNamespace(
        shapes=shapes, slots=slots.to(device), gates=gates, normal=normal,
        ssm_state=normal(L, num_state_slots, Hv, shapes.head_k, shapes.head_v, std=0.1),
        qkv=normal(L, batch, D, shapes.dim, dtype=torch.bfloat16),
        out=torch.zeros(batch, D, Hv, shapes.head_v, dtype=torch.bfloat16, device=device),
    )


def verify_step_fn(v, snapshots, block_v):
    """One step's verify recurrence: one launch per layer (as an engine runs it)."""
    s = v.shapes

    def step():
        for layer in range(s.layers):
            verify_layer(v.ssm_state[layer], v.qkv[layer], v.gates[layer], v.out,
                         None if snapshots is None else snapshots[layer], v.slots, s, block_v=block_v)
    return step


# ------------------------------------------------------------------------------------------------
# --check: every kernel here, and the calls of the package's ops, against the float64 loops
# ------------------------------------------------------------------------------------------------


def _close(name, got, want, tol=2e-3) -> bool:
    err = (got.cpu().double() - want).abs().max().item()
    scale = want.abs().max().item()
    good = err <= tol * max(1.0, scale)
    print(f"  {name:58} {'ok' if good else 'MISMATCH'} (max abs err {err:.2e}, max |ref| {scale:.2f})", flush=True)
    return good


def _equal(name, got, want) -> bool:
    good = torch.equal(got.cpu(), want)
    print(f"  {name:58} {'ok' if good else 'MISMATCH'} (bit-exact over the whole tensor)", flush=True)
    return good


def check(device, block_v=32, block_p=32) -> bool:
    start = time.perf_counter()
    s = CHECK_SHAPES
    ok = True
    print(f"check on {device} (TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '0')}): L={s.layers} "
          f"Hk={s.k_heads} Hv={s.v_heads} dk=dv={s.head_k} dim={s.dim} K={s.kernel_size} D={s.num_draft}; "
          f"3 rows, row 1 padded (step -1), permuted slots", flush=True)
    # rows: full acceptance, a padded row, partial acceptance (tree: depth 4, padded, depth 2)
    for tree, steps in ((False, [2, -1, 1]), (True, [7, -1, 2])):
        print(f"{'tree ' + str(TREE_PARENTS) if tree else 'chain'}: steps {steps}", flush=True)
        kwargs = dict(dst_slots=[2, 0, 3], src_slots=[1, 2, 0], steps=steps, num_state_slots=4, num_src_slots=3)
        p = make_problem(s, 3, tree, device, seed=1, **kwargs)
        before = SimpleNamespace(ssm=p.ssm_state.clone(), conv=p.conv_state.clone())
        args = (p.dst_slots, p.src_slots, p.steps)

        # (b) snapshot copy + conv scatter
        snapshots = p.normal(s.layers, 3, p.num_nodes, s.v_heads, s.head_k, s.head_v)
        snapshot_commit_fn(p, snapshots, p.steps)()
        ok &= _equal("snapshot copy kernel: ssm_state", p.ssm_state, snapshot_copy_oracle(before.ssm, snapshots, *args))
        _, want_conv = gdn_commit_oracle(before.ssm, before.conv, p.buffer, p.gates, p.conv_weight, *args,
                                         p.parents, s)
        ok &= _equal(f"snapshot commit: conv window ({'scatter_tree' if tree else 'scatter'})", p.conv_state, want_conv)

        # (c) input replay from a k, v cache
        p.ssm_state.copy_(before.ssm)
        kv_cache = p.normal(s.layers, 3, p.num_nodes, s.kv_width, dtype=torch.bfloat16)
        kv_replay_commit_fn(p, kv_cache, block_v)()
        want = kv_replay_oracle(before.ssm, kv_cache, p.gates, *args, p.parents, s)
        ok &= _close("input-replay kernel: ssm_state (vs float64 loop)", p.ssm_state, want)

        # (a) this package's gdn_commit
        p.ssm_state.copy_(before.ssm)
        p.conv_state.copy_(before.conv)
        convwin_commit_fn(p)()
        want, want_conv = gdn_commit_oracle(before.ssm, before.conv, p.buffer, p.gates, p.conv_weight, *args,
                                            p.parents, s)
        ok &= _close("sgl_convwin.gdn_commit: ssm_state (vs float64 loop)", p.ssm_state, want)
        ok &= _equal("sgl_convwin.gdn_commit: conv_state", p.conv_state, want_conv)

    print("verify stand-in (chain): slots [2, -1, 0]", flush=True)
    v = make_verify_problem(s, 3, device, seed=2, slots=[2, -1, 0], num_state_slots=4)
    want_out, want_states = verify_oracle(v.ssm_state, v.qkv, v.gates, v.slots, s)
    live = (v.slots >= 0).cpu()  # the oracle's tensors are on the CPU
    state_before = v.ssm_state.clone()
    for snapshot in (False, True):
        snapshots = torch.zeros(s.layers, 4, s.num_draft, s.v_heads, s.head_k, s.head_v, device=device)
        outs = []
        for layer in range(s.layers):
            v.out.zero_()
            verify_layer(v.ssm_state[layer], v.qkv[layer], v.gates[layer], v.out,
                         snapshots[layer] if snapshot else None, v.slots, s, block_v=block_v)
            outs.append(v.out.clone())
        label = "with snapshots" if snapshot else "no state write"
        ok &= _close(f"verify stand-in ({label}): outputs", torch.stack(outs).cpu()[:, live], want_out[:, live], tol=2e-2)
        ok &= _equal(f"verify stand-in ({label}): ssm_state untouched", v.ssm_state, state_before.cpu())
        if snapshot:
            ok &= _close("verify stand-in: snapshots", snapshots.cpu()[:, v.slots.cpu()[live]], want_states[:, live])
    try:
        from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
    except Exception as error:  # optional: fla-core
        print(f"  fla naive recurrence: not importable ({type(error).__name__}): skipped", flush=True)
    else:  # the float64 loop itself against FLA's naive recurrence (float32), layer 0, live rows
        kw, group = s.key_width, s.v_heads // s.k_heads
        qkv = v.qkv[0, live].float()
        q = qkv[..., :kw].unflatten(-1, (s.k_heads, s.head_k))
        k = qkv[..., kw:2 * kw].unflatten(-1, (s.k_heads, s.head_k))
        q, k = (x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
        q, k = (x.repeat_interleave(group, dim=2) for x in (q, k))
        val = qkv[..., 2 * kw:].unflatten(-1, (s.v_heads, s.head_v))
        gates = v.gates[0, live].float()
        o, final = naive_recurrent_gated_delta_rule(q, k, val, gates[:, :, 1], gates[:, :, 0], scale=s.head_k ** -0.5,
                                                    initial_state=v.ssm_state[0, v.slots[live]].float(),
                                                    output_final_state=True)
        ok &= _close("float64 verify loop vs fla naive recurrence: outputs", o, want_out[0, live])
        ok &= _close("float64 verify loop vs fla naive recurrence: final state", final, want_states[0, live, -1])
    ok &= check_mamba2(device, block_p=block_p)
    print(f"check: {'all match' if ok else 'FAILED'} ({time.perf_counter() - start:.1f} s)", flush=True)
    return ok


def check_mamba2(device, block_p=32) -> bool:
    """The Mamba2 candidates on tiny shapes: the snapshot copy and the conv scatter, the x, B input
    replay (vs its float64 loop), sgl_convwin.mamba2_commit (vs reference.mamba2_commit_reference)."""
    from sgl_convwin.reference import mamba2_commit_reference

    s = MAMBA2_CHECK_SHAPES
    ok = True
    print(f"mamba2: L={s.layers} H={s.heads} P={s.head_dim} G={s.groups} Ns={s.d_state} dim={s.dim} "
          f"K={s.kernel_size} D={s.num_draft}, conv bias; rows as above", flush=True)
    for tree, steps in ((False, [2, -1, 1]), (True, [7, -1, 2])):
        print(f"mamba2 {'tree ' + str(TREE_PARENTS) if tree else 'chain'}: steps {steps}", flush=True)
        kwargs = dict(dst_slots=[2, 0, 3], src_slots=[1, 2, 0], steps=steps, num_state_slots=4, num_src_slots=3)
        p = make_mamba2_problem(s, 3, tree, device, seed=1, **kwargs)
        before = SimpleNamespace(ssm=p.ssm_state.clone(), conv=p.conv_state.clone())
        args = (p.dst_slots, p.src_slots, p.steps)
        want_ssm, want_conv, _ = mamba2_commit_reference(
            before.ssm, before.conv, p.buffer, p.gates, p.conv_weight, p.A, *args, p.parents, layout="token_major",
            num_heads=s.heads, head_dim=s.head_dim, n_groups=s.groups, d_state=s.d_state, conv_bias=p.conv_bias)
        # the float64 x, B loop fed with x, B of the conv (computed here) must give the oracle's state
        K, weight, bias = s.kernel_size, p.conv_weight.cpu().double(), p.conv_bias.cpu().double()
        conv_xb = torch.zeros(s.layers, 3, p.num_nodes, s.replay_width, dtype=torch.float64)
        for b in _live_rows(p.steps.cpu(), p.dst_slots.cpu()):
            dst, src = int(p.dst_slots[b]), int(p.src_slots[b])
            path = accepted_path(int(p.steps[b]), None if p.parents is None else p.parents[b].tolist())
            for layer in range(s.layers):
                inputs = ([before.conv.cpu()[layer, dst, :, col] for col in range(K - 1)]
                          + [p.buffer.cpu()[layer, src, K - 2 + node] for node in path])  # token_major rows
                for j, node in enumerate(path):
                    y = bias[layer] + sum(weight[layer, :, tap] * inputs[j + tap].double() for tap in range(K))
                    conv_xb[layer, src, node] = (y / (1 + torch.exp(-y)))[:s.replay_width]
        ok &= _close("float64 x,B loop (conv x, B) vs mamba2_commit_reference",
                     xb_replay_oracle(before.ssm, conv_xb, p.gates, p.A, *args, p.parents, s), want_ssm, tol=1e-9)

        snapshots = p.normal(s.layers, 3, p.num_nodes, *s.state_shape)
        snapshot_commit_fn(p, snapshots, p.steps)()
        ok &= _equal("mamba2 snapshot copy kernel: ssm_state", p.ssm_state,
                     snapshot_copy_oracle(before.ssm, snapshots, *args))
        ok &= _equal(f"mamba2 snapshot commit: conv window ({'scatter_tree' if tree else 'scatter'})", p.conv_state,
                     want_conv)

        p.ssm_state.copy_(before.ssm)
        xb_cache = p.normal(s.layers, 3, p.num_nodes, s.replay_width, dtype=torch.bfloat16)
        kv_replay_commit_fn(p, xb_cache, block_p)()
        want = xb_replay_oracle(before.ssm, xb_cache, p.gates, p.A, *args, p.parents, s)
        ok &= _close("mamba2 input-replay kernel: ssm_state (vs float64 loop)", p.ssm_state, want)

        p.ssm_state.copy_(before.ssm)
        p.conv_state.copy_(before.conv)
        convwin_commit_fn(p)()
        ok &= _close("sgl_convwin.mamba2_commit: ssm_state (vs float64 oracle)", p.ssm_state, want_ssm)
        ok &= _equal("sgl_convwin.mamba2_commit: conv_state", p.conv_state, want_conv)
    return ok


# ------------------------------------------------------------------------------------------------
# Timing
# ------------------------------------------------------------------------------------------------

GiB = 1 << 30
DEVICE = "cuda"  # where the timed problems live (a CPU dry run of the tables sets "cpu")


def time_fn(fn):
    """(do_bench median us, graph replay us); graph NaN if capture fails (printed)."""
    fn()
    torch.cuda.synchronize()
    us = do_bench_us(fn, warmup=10, rep=100)
    try:  # a graph of >= ~0.5 ms, rounds of ~120 ms, the median of 3
        graph_us = graph_time_us(fn, rounds=3, warmup=2, estimate_us=us)
    except Exception as error:  # noqa: BLE001 -- report and go on
        print(f"    (graph capture failed: {type(error).__name__}: {str(error)[:200]})", flush=True)
        torch.cuda.synchronize()
        graph_us = float("nan")
    return us, graph_us


def commit_bytes(candidate: str, shapes: Shapes, rows: int, tokens: int, state_bytes=4, conv_bytes=2) -> int:
    """Bytes one commit must move, each distinct input read once and each output written once.
    rows: rows committed (A); tokens: accepted path tokens over those rows (P)."""
    s, W = shapes, shapes.kernel_size - 1
    state = 2 * rows * s.state_numel * state_bytes  # read + write the accepted rows' states
    gates = tokens * s.num_gates * s.gate_heads * 4  # g, beta (GDN) or dt (Mamba2) fp32 per path token
    rates = s.heads * 4 if s.mixer == "mamba2" else 0  # Mamba2's A [H] fp32
    if candidate == "convwin":
        inputs = tokens * s.dim * conv_bytes + rows * W * s.dim * conv_bytes  # path rows + committed inputs
        window = rows * W * s.dim * conv_bytes  # the new conv window written
        weights = s.dim * s.kernel_size * conv_bytes
        bias = s.dim * conv_bytes if s.mixer == "mamba2" else 0  # Mamba2 convs have a bias
        return s.layers * (state + inputs + gates + window + weights + bias + rates)
    if candidate == "snapshot":
        return s.layers * (state + 2 * rows * W * s.dim * conv_bytes)  # snapshot read + state write; window r+w
    if candidate == "replay":  # no conv bytes: widened conv state; k, v (GDN) or x, B (Mamba2) bf16
        return s.layers * (state + tokens * s.replay_width * 2 + gates + rates)
    raise ValueError(candidate)


def verify_bytes(shapes: Shapes, rows: int, snapshot: bool, state_bytes=4) -> int:
    s, D = shapes, shapes.num_draft
    per_layer = rows * s.state_numel * state_bytes  # state read once
    per_layer += rows * D * s.state_numel * state_bytes if snapshot else 0
    per_layer += rows * D * (s.dim * 2 + 2 * s.v_heads * 4)  # q, k, v bf16 and g, beta
    per_layer += rows * D * s.v_heads * s.head_v * 2  # outputs bf16
    return s.layers * per_layer


class Memory:
    """The allocation budget: what the candidate's own tensors may take on top of what is held."""

    def __init__(self, limit_gib):
        free, _ = torch.cuda.mem_get_info()
        self.limit = int(limit_gib * GiB) if limit_gib else free - 3 * GiB

    def room(self) -> int:
        return self.limit - torch.cuda.memory_allocated()


def release():
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


CANDIDATES = ("convwin", "snapshot", "replay")
LABELS = {"convwin": "convwin gdn_commit", "snapshot": "snapshot copy + conv scatter",
          "replay": "input replay (k,v cache)"}
MAMBA2_LABELS = {"convwin": "convwin mamba2_commit", "snapshot": "snapshot copy + conv scatter",
                 "replay": "input replay (x,B cache)"}


def labels_for(shapes):
    return MAMBA2_LABELS if shapes.mixer == "mamba2" else LABELS


def bench_commit(shapes, batches, modes, ceiling, memory, block_v, results, json_path):
    """block_v: dv columns (GDN) or rows of P (Mamba2) per program of the input-replay kernel."""
    labels = labels_for(shapes)
    for mode in modes:
        tree = mode == "tree"
        rows_out = []
        draft = (f"N={len(TREE_PARENTS)} nodes, topk 3, parents {TREE_PARENTS}, accepted depth = the chain's length"
                 if tree else f"D={shapes.num_draft}, accepted length uniform 1..D")
        print(f"\n== commit, {mode} ({draft})", flush=True)
        for B in batches:
            p = problem_for(shapes, B, tree, DEVICE, seed=B)
            lengths = path_lengths(p.steps, p.parents, p.dst_slots)
            A, P = len(lengths), sum(lengths)
            print(f"B={B}: {A} rows, {P} path tokens; common tensors {torch.cuda.memory_allocated() / GiB:.1f} GiB",
                  flush=True)
            for cand in CANDIDATES:
                note = ""
                if cand == "convwin":
                    fn, extra = convwin_commit_fn(p), []
                elif cand == "snapshot":
                    per_node = shapes.layers * B * shapes.state_numel * 4
                    held = min(p.num_nodes, memory.room() // per_node)
                    if held < 1:
                        print(f"  snapshot copy: a snapshot buffer does not fit ({per_node / GiB:.1f} GiB per "
                              f"node), skipped", flush=True)
                        continue
                    snapshots = p.normal(shapes.layers, B, held, *shapes.state_shape)
                    snap_steps = p.steps if held == p.num_nodes else p.steps % held
                    if held < p.num_nodes:
                        note = f"snapshots of {held}/{p.num_nodes} nodes held (memory): node % {held} read"
                        print(f"  note: {note}; the copy moves the same bytes", flush=True)
                    fn, extra = snapshot_commit_fn(p, snapshots, snap_steps), [snapshots]
                else:
                    kv_cache = p.normal(shapes.layers, B, p.num_nodes, shapes.replay_width, dtype=torch.bfloat16)
                    fn, extra = kv_replay_commit_fn(p, kv_cache, block_v), [kv_cache]
                us, graph_us = time_fn(fn)
                nbytes = commit_bytes(cand, shapes, A, P)
                row = dict(mode=mode, B=B, candidate=cand, label=labels[cand], us=us, graph_us=graph_us,
                           bytes=nbytes, rows=A, tokens=P, gbps_graph=nbytes / (graph_us * 1e-6) / 1e9,
                           gbps=nbytes / (us * 1e-6) / 1e9, peak_gib=torch.cuda.max_memory_allocated() / GiB,
                           note=note)
                row["frac"], row["frac_graph"] = row["gbps"] / ceiling, row["gbps_graph"] / ceiling
                rows_out.append(row)
                print(f"  {labels[cand]:30} do_bench {us:9.1f} us  graph {graph_us:9.1f} us  "
                      f"{nbytes / 1e6:9.1f} MB  {row['frac_graph']:6.1%} of ceiling (graph)  "
                      f"peak {row['peak_gib']:.1f} GiB", flush=True)
                del fn, extra
                if cand != "convwin":
                    snapshots = kv_cache = None  # noqa: F841 -- free this baseline's tensors now
                release()
                torch.cuda.reset_peak_memory_stats()
            del p
            release()
        results["commit"] += rows_out
        write_json(json_path, results)
        print_commit_table(mode, rows_out, ceiling)
    if "chain" in modes and "tree" in modes:
        chain = {r["B"]: r for r in results["commit"] if r["mode"] == "chain" and r["candidate"] == "convwin"}
        tree = {r["B"]: r for r in results["commit"] if r["mode"] == "tree" and r["candidate"] == "convwin"}
        print(f"\n{labels['convwin'].split()[-1]}, tree (8 nodes, topk 3) over chain (D=4), graph replay: " + ", ".join(
            f"B={B}: {tree[B]['graph_us'] / chain[B]['graph_us']:.2f}x" for B in batches if B in chain and B in tree))


def bench_transposed(shapes, batches, modes):
    """gdn_commit on pools stored [.., dv, dk] (the engines' layout, passed transposed) against the
    same commit on contiguous pools, graph replay: a table per mode. The two results agree first."""
    print("\n" + markdown_header("mode", "B", "contiguous pool (us)", "transposed pool (us)", "transposed / contiguous"))
    for mode in modes:
        for B in batches:
            p = problem_for(shapes, B, mode == "tree", DEVICE, seed=B)
            stored = p.ssm_state.transpose(-1, -2).contiguous()  # [L, N, Hv, dv, dk]
            conv_before = p.conv_state.clone()
            contiguous_fn = convwin_commit_fn(p)
            contiguous_fn()
            want = p.ssm_state.clone()
            p.conv_state.copy_(conv_before)  # (the commit moves the windows its next replay reads)
            contiguous_us = time_fn(contiguous_fn)[1]
            del contiguous_fn  # (its graph holds the contiguous pool: B = 256's pools are 18 GiB each)
            p.ssm_state = stored.transpose(-1, -2)
            release()
            p.conv_state.copy_(conv_before)
            transposed_fn = convwin_commit_fn(p)
            transposed_fn()
            # (a layer at a time: a whole pool's comparison would take another 18 GiB at B = 256)
            if not all(torch.allclose(got, ref, rtol=1e-5, atol=1e-5) for got, ref in zip(p.ssm_state, want)):
                print(f"  {mode} B={B}: the transposed pool's commit differs from the contiguous one's", flush=True)
                return False
            p.conv_state.copy_(conv_before)
            transposed_us = time_fn(transposed_fn)[1]
            print(markdown_row(mode, B, f"{contiguous_us:.1f}", f"{transposed_us:.1f}",
                               f"{transposed_us / contiguous_us:.2f}x"), flush=True)
            del p, stored, want, transposed_fn
            release()
    return True


def print_commit_table(mode, rows, ceiling):
    base = {r["B"]: r for r in rows if r["candidate"] == "convwin"}
    print("\n" + markdown_header(mode, "B", "candidate", "do_bench median (us)", "graph replay (us)", "bytes moved (MB)",
                                 "GB/s (graph)", f"of ceiling {ceiling:.0f} GB/s (do_bench / graph)",
                                 "time vs convwin (graph)"))
    for r in rows:
        ratio = r["graph_us"] / base[r["B"]]["graph_us"] if r["B"] in base else float("nan")
        print(markdown_row(mode, r["B"], r["label"], f"{r['us']:.1f}", f"{r['graph_us']:.1f}", f"{r['bytes'] / 1e6:.1f}",
                           f"{r['gbps_graph']:.0f}", f"{r['frac']:.1%} / {r['frac_graph']:.1%}", f"{ratio:.2f}x")
              + (f" {r['note']}" if r["note"] else ""), flush=True)


def bench_verify(shapes, batches, ceiling, memory, block_v, results, json_path):
    print(f"\n== verify (engine side, chain D={shapes.num_draft}): one launch per layer, {shapes.layers} layers "
          "per step", flush=True)
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except Exception as error:  # optional: fla-core
        fused_recurrent_gated_delta_rule = None
        print(f"fla not importable ({type(error).__name__}: {str(error)[:120]}): its row is skipped", flush=True)
    rows_out = []
    for B in batches:
        v = make_verify_problem(shapes, B, DEVICE, seed=B)
        variants = [("stand-in, D snapshots written", True), ("stand-in, no state written", False)]
        if fused_recurrent_gated_delta_rule is not None:
            variants.append(("fla fused_recurrent (no state written)", None))
        for label, snapshot in variants:
            extra = None
            if snapshot:
                need = shapes.layers * B * shapes.num_draft * shapes.state_numel * 4
                if need > memory.room():
                    print(f"  B={B} {label}: snapshots need {need / GiB:.1f} GiB, over the budget: skipped", flush=True)
                    continue
                extra = torch.empty(shapes.layers, B, shapes.num_draft, shapes.v_heads, shapes.head_k,
                                    shapes.head_v, device=DEVICE)
                fn = verify_step_fn(v, extra, block_v)
            elif snapshot is False:
                fn = verify_step_fn(v, None, block_v)
            else:
                kw = shapes.key_width
                qkv = v.qkv
                q = qkv[..., :kw].unflatten(-1, (shapes.k_heads, shapes.head_k)).contiguous()
                k = qkv[..., kw:2 * kw].unflatten(-1, (shapes.k_heads, shapes.head_k)).contiguous()
                val = qkv[..., 2 * kw:].unflatten(-1, (shapes.v_heads, shapes.head_v)).contiguous()
                g, beta = v.gates[:, :, :, 0].contiguous(), v.gates[:, :, :, 1].contiguous()
                extra = (q, k, val, g, beta)

                def fn(q=q, k=k, val=val, g=g, beta=beta, ssm_state=v.ssm_state):
                    for layer in range(shapes.layers):
                        fused_recurrent_gated_delta_rule(
                            q[layer], k[layer], val[layer], g=g[layer], beta=beta[layer], scale=shapes.head_k ** -0.5,
                            initial_state=ssm_state[layer], output_final_state=False, use_qk_l2norm_in_kernel=True)
            try:
                us, graph_us = time_fn(fn)
            except Exception as error:  # noqa: BLE001 -- the optional FLA row must not end the run
                print(f"  B={B} {label}: failed ({type(error).__name__}: {str(error)[:200]})", flush=True)
                continue
            nbytes = verify_bytes(shapes, B, bool(snapshot))
            row = dict(B=B, variant=label, us=us, graph_us=graph_us, bytes=nbytes,
                       gbps_graph=nbytes / (graph_us * 1e-6) / 1e9)
            row["frac_graph"] = row["gbps_graph"] / ceiling
            rows_out.append(row)
            print(f"  B={B:<4} {label:40} do_bench {us:9.1f} us  graph {graph_us:9.1f} us  {nbytes / 1e6:9.1f} MB  "
                  f"{row['frac_graph']:6.1%} of ceiling (graph)", flush=True)
            del fn, extra
            release()
        del v
        release()
    results["verify"] = rows_out
    write_json(json_path, results)
    print("\n" + markdown_header("B", f"verify variant (all {shapes.layers} layers)", "do_bench median (us)",
                                 "graph replay (us)", "bytes moved (MB)", "of ceiling (graph)"))
    for r in rows_out:
        print(markdown_row(r["B"], r["variant"], f"{r['us']:.1f}", f"{r['graph_us']:.1f}", f"{r['bytes'] / 1e6:.1f}",
                           f"{r['frac_graph']:.1%}"))
    step_table(batches, results)


def step_table(batches, results):
    """Measured verify + commit per design (chain), graph replay times added."""
    commit = {(r["B"], r["candidate"]): r["graph_us"] for r in results["commit"] if r["mode"] == "chain"}
    verify = {(r["B"], r["variant"]): r["graph_us"] for r in results["verify"]}
    designs = [("snapshots", "stand-in, D snapshots written", "snapshot"),
               ("input replay (k,v cache)", "stand-in, no state written", "replay"),
               ("convwin replay", "stand-in, no state written", "convwin")]
    print("\nwhole step, chain, measured (graph replay): verify recurrence + commit, us")
    print(markdown_header("B", *(name for name, _, _ in designs), "convwin saves vs snapshots"))
    rows = []
    for B in batches:
        totals = [verify.get((B, ver), float("nan")) + commit.get((B, cand), float("nan")) for _, ver, cand in designs]
        rows.append(dict(B=B, **{name: t for (name, _, _), t in zip(designs, totals)}))
        print(markdown_row(B, *(f"{t:.1f}" for t in totals), f"{1 - totals[2] / totals[0]:.0%}"))
    results["step"] = rows


def traffic_model(shapes: Shapes, batches, ring_every: int, ceiling, results):
    """Recurrent-state traffic per step and speculative memory per slot of four designs: a MODEL,
    computed from the shapes, not measured."""
    s, D, K, R = shapes, shapes.num_draft, shapes.kernel_size, ring_every
    state = s.state_numel * 4 * s.layers  # one fp32 state, all layers, one slot
    gates = D * s.num_gates * s.gate_heads * 4
    kv_token = s.replay_width * 2 + s.num_gates * s.gate_heads * 4  # k, v bf16 + g, beta fp32 (Mamba2: x, B + dt)
    cached, gate_names = ("x,B,dt", "dt") if s.mixer == "mamba2" else ("k,v,g,beta", "g,beta")
    designs = [  # name, states read per step, states written per step, speculative bytes per slot
        ("snapshots (dense conv windows + D state snapshots)", 2, D + 1,
         s.layers * (D * (K - 1) * s.dim * 2) + D * state),
        (f"eager replay, input cache (vLLM ReplaySSM: {cached} + conv widened by D)", 2, 1,
         s.layers * (D * kv_token + D * s.dim * 2)),
        (f"eager replay, convwin (dedup conv-input buffer + {gate_names})", 2, 1,
         s.layers * ((D + K - 2) * s.dim * 2 + gates)),
        (f"ring, delayed commit every R={R} steps (ring of R*D={R * D} tokens {cached} + conv widened by D)",
         1, 1 / R, s.layers * (R * D * kv_token + D * s.dim * 2)),
    ]
    print(f"\nrecurrent-state traffic per step vs speculative memory per slot -- a MODEL (computed, not measured):"
          f"\n  snapshots: verify reads 1 state and writes D={D}, commit copies 1 (read 1 + write 1);"
          f"\n  eager replay: verify reads 1, commit reads 1 + writes 1; ring: verify reads 1, writes 1 every R steps"
          f"\n  (one state = {s.state_numel * 4 / 2**20:.0f} MiB per layer, {state / 2**20:.0f} MiB over {s.layers} "
          f"layers;"
          f" memory excludes the committed state and conv state every design keeps; times at the measured ceiling)")
    print(markdown_header("design", "states read + written per step", "state MiB per slot per step",
                          "speculative MiB per slot", *(f"us at B={B}" for B in batches)))
    rows = []
    for name, reads, writes, memory in designs:
        traffic = (reads + writes) * state
        at = [B * traffic / (ceiling * 1e9) * 1e6 for B in batches]
        rows.append(dict(design=name, states_read=reads, states_written=writes, state_bytes_per_step=traffic,
                         speculative_bytes_per_slot=memory, us_at_ceiling={str(B): t for B, t in zip(batches, at)}))
        print(markdown_row(name, f"{reads} + {writes:g}", f"{traffic / 2**20:.0f}", f"{memory / 2**20:.2f}",
                           *(f"{t:.0f}" for t in at)))
    results["model"] = rows


def write_json(path, results):
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", "--verify-only", dest="check", action="store_true",
                        help="only check every kernel on tiny shapes (CPU: TRITON_INTERPRET=1)")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64, 256])
    parser.add_argument("--modes", nargs="+", default=["chain", "tree"], choices=["chain", "tree"])
    parser.add_argument("--mixer", default="gdn", choices=["gdn", "mamba2"],
                        help="gdn: Qwen3-Next TP1 GDN layers, gdn_commit (default); mamba2: Nemotron-H-8B TP1 Mamba2 "
                             "layers, mamba2_commit")
    parser.add_argument("--layers", type=int, default=None,
                        help="recurrent layers (default: 36 GDN layers of Qwen3-Next TP1, 24 Mamba2 layers of "
                             "Nemotron-H-8B TP1)")
    parser.add_argument("--num-draft", type=int, default=QWEN3_NEXT_TP1.num_draft, help="chain draft tokens D")
    parser.add_argument("--ring-every", type=int, default=4, help="R: the ring's checkpoint period (model only)")
    parser.add_argument("--block-v", type=int, default=32, help="dv columns per program of the kernels written here")
    parser.add_argument("--block-p", type=int, default=32, help="rows of P per program of the Mamba2 input replay")
    parser.add_argument("--mem-limit-gib", type=float, default=None,
                        help="GPU memory the benchmark may hold (default: free memory at start - 3 GiB)")
    parser.add_argument("--no-verify", action="store_true", help="skip the engine-side verify timing")
    parser.add_argument("--json", default=None, help="write every measured number here")
    parser.add_argument("--transposed", action="store_true",
                        help="only gdn_commit on pools stored [.., dv, dk] (the engines' layout) against contiguous ones")
    args = parser.parse_args(argv)
    if args.transposed and args.mixer != "gdn":
        parser.error("--transposed times gdn_commit")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if not check(device, block_v=args.block_v, block_p=args.block_p):
        return 1
    if args.check:
        return 0
    if not needs_cuda():
        return 1
    start = time.perf_counter()
    mamba2 = args.mixer == "mamba2"
    if mamba2:
        shapes = Mamba2Shapes(layers=args.layers or NEMOTRON_H_8B_TP1.layers, num_draft=args.num_draft)
    else:
        shapes = Shapes(layers=args.layers or QWEN3_NEXT_TP1.layers, num_draft=args.num_draft)
    block = args.block_p if mamba2 else args.block_v
    if args.transposed:
        print("\n" + environment_line())
        return 0 if bench_transposed(shapes, args.batches, args.modes) else 1
    ceiling = copy_ceiling_gbps()
    release()
    memory = Memory(args.mem_limit_gib)
    print("\n" + environment_line())
    print(f"copy ceiling (device-to-device 1 GiB bf16, read+write / do_bench median): {ceiling:.0f} GB/s")
    print(f"shapes: {asdict(shapes)} (dim {shapes.dim}), fp32 state, bf16 conv inputs; memory budget "
          f"{memory.limit / GiB:.0f} GiB: each baseline's tensors are allocated just before it runs and freed after "
          f"(B=256: state {shapes.layers * 256 * shapes.state_numel * 4 / GiB:.0f} GiB, D={shapes.num_draft} "
          f"snapshots {shapes.layers * 256 * shapes.num_draft * shapes.state_numel * 4 / GiB:.0f} GiB)", flush=True)
    results = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                   ceiling_gbps=ceiling, shapes=asdict(shapes), tree_parents=TREE_PARENTS, block_v=args.block_v,
                   commit=[], verify=[])
    if mamba2:
        results.update(mixer="mamba2", block_p=args.block_p)
    bench_commit(shapes, args.batches, args.modes, ceiling, memory, block, results, args.json)
    if mamba2:
        print("\nengine-side verify timing: GDN only (run --mixer gdn); not timed for mamba2, so no whole-step "
              "table here", flush=True)
    elif not args.no_verify:
        bench_verify(shapes, args.batches, ceiling, memory, args.block_v, results, args.json)
    traffic_model(shapes, args.batches, args.ring_every, ceiling, results)
    write_json(args.json, results)
    print(f"\ndone in {time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
