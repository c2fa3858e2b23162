"""The Gated DeltaNet verify recurrence: every draft token's (or tree node's) output from ONE read
of the committed state, in the chunked (WY / UT) form of the delta rule.

Per row b and value head h (key head h // (Hv / Hk)), with S0 = ssm[state_slots[b], h] [dk, dv]
and anc(n) the ancestors of node n and n itself (a chain: 0..n), in float32:

    G_n     = sum_{i in anc(n)} g_i                       cumulative log decay along n's root path
                                                          (each g_i floored at _common.LOG_DECAY_FLOOR)
    D[n, i] = exp(G_n - G_i) for i in anc(n), else 0
    A[n, i] = beta_n D[n, i] (k_n . k_i) for i in anc(n), i != n   (strictly lower triangular)
    U       = (I + A)^-1 diag(beta) (V - diag(exp G) K S0)           the corrected updates u_n
    O       = diag(exp G) Q S0 + (D * Q K^T) U                       Q already scaled by ``scale``

This is the token-by-token recurrence ``S = S exp(g); u = beta (v - S^T k); S = S + k u^T;
o = S^T q`` unrolled along each node's root path (S_n = exp(G_n) S0 + sum_{i in anc(n)}
exp(G_n - G_i) k_i u_i^T): the state is read once and never written.

The kernel stacks k and q into one [NODES, dk] matrix (rows 0..HALF-1: k of node r, rows
HALF..: q of node r - HALF; NODES = max(16, 2N) rounded up to a power of two, tl.dot's minimum
being 16, zero rows beyond N), so that ONE tensor-core product per state tile gives K S0 and
Q S0 together, and every node matrix is a block of one [NODES, NODES] matrix. The stack holds the
rows raw (rounded to tf32); their l2 norms, taken of the rounded rows, and the scale are factors on
the products' rows and columns, so that a query and a key of the same values stay one vector:

    gram = [k; q] [k; q]^T         (k.k in the key block, q.k below it)
    mix  = (D * Q K^T) (I + A)^-1   (query rows; zero on key rows)
    O    = diag(exp G) (Q S0) + mix diag(beta) (V - diag(exp G) K S0)   (query rows)

(I + A)^-1 by blocks (_unit_lower_inverse): A is strictly lower triangular, a node's ancestors before it.

With Q_EFF (a float32 state, by default) the two state terms are folded into the queries first:

    O = Q_eff S0 + mix diag(beta) V,   Q_eff = diag(exp G) Q - mix diag(beta exp G) K

(W = [diag(exp G), -mix diag(beta exp G)] times the stack, in 3xTF32, each column times its row's
l2-norm and scale factor: the stack's raw values are tf32 already). Where a query retrieves a key
its own path just wrote (beta near 1), exp(G) Q S0 and the correction's K S0 cancel; here they
cancel in float32 before the one tf32 product with the state, so the error follows |o| instead of
|Q S0|, which a large state makes far larger.
"""

from __future__ import annotations


import torch
import triton
import triton.language as tl

from ._common import (MAX_GRID_Y, KernelCall, cdiv, floored_log_decay, next_power_of_2, nvidia_at_least, pdl_device,
                      planned_launch)
from .replay import SMEM_TRITON_VERSIONS

MIN_DOT = 16  # tl.dot's smallest M, N and K
# Value columns per state tile [dk, BLOCK_V], one tile a program (several, computing the node
# matrices once, measured no faster: docs/benchmarks.md, Rejected designs). Below VERIFY_PROGRAMS
# programs (about four per SM of an H100/H200) the tile is halved, so that small batches still
# spread over the GPU.
BLOCK_V = 64
VERIFY_PROGRAMS = 512
VERIFY_WARPS = 4
# gdn_verify_mma's kernel: two warps over 128 value columns, a float32 state's rows loaded 16 at a
# time (25 KB of shared memory a program, not 41 KB: 8 programs an SM, not 5; on the H200 5-9% faster
# from B = 64), 32 where the pool is stored transposed (a column's whole 128-byte line a copy: 16 rows
# 1.26-1.33x slower there), a 2-byte state's 64 (32 or 16 rows 3-7% slower: docs/benchmarks.md). It
# serves batches that give it MMA_MIN_PROGRAMS programs or more and at most MMA_MAX_NODES nodes;
# smaller ones are faster on the kernel below (docs/benchmarks.md, the verify sweep).
MMA_MIN_PROGRAMS = 128
MMA_BLOCK_V = 128
# Where MMA_BLOCK_V columns a program leave fewer than MMA_MIN_PROGRAMS programs, this many instead
# if they reach it (0: never; B = 2-3 at Qwen3-Next TP1: docs/benchmarks.md, "Small batches")
MMA_SPREAD_BLOCK_V = 64
MMA_WARPS = 2
MMA_CHUNK_K = (16, 32)  # (value columns contiguous, rows contiguous)
MMA_CHUNK_K_2BYTE = 64
MMA_MAX_NODES = 16
# The state chunks through shared memory by cp.async, this many in flight from the program's start,
# under the effective queries (below); the stacked products keep them in registers, one chunk ahead
# (staged, 1-2% slower there).
MMA_STATE_STAGES = 2
# The mma kernel launched as a programmatic dependent on sm_90+, every read after the launch
# before it finishes (1): its start overlaps that launch's tail. 2 (reads the slots and first state
# chunks before that wait) is faster but wrong where the launch before writes them: opt-in only.
MMA_PDL = 1
# The mma kernel's outputs from the effective queries (gdn_verify_mma's docstring): the error
# relative to the outputs' own terms, not to a state much larger than them. Where the chunks can be
# staged and the state is float32; in registers they would wait across the node matrices (10-15%
# slower), and a bf16 state's 2e-2 tolerance has the stacked products' error to spare.
MMA_Q_EFF = True
# The mma kernel's small inputs loaded at the program's start, their latency under the stack's and
# the state's: 1, g and beta (not when the node matrices need them); 2, also v under the effective
# queries (its term the products' first addend, not after the state's); 0, neither. Chains, trees:
# on the H200 1 is the faster for chains, 0 for trees, 2 the slower for both (docs/benchmarks.md).
MMA_EARLY_LOADS = (1, 0)
# The mma kernel's stacked products in the state's own 16-bit type (mma.m16n8k16) where q, k and the
# pool share it: exact like tf32's, half the mma instructions, no widening of the state. For pools
# stored contiguous, transposed: faster on a transposed pool's staged chunks only (docs/benchmarks.md).
MMA_NATIVE_PRODUCTS = (False, True)
# The mma kernel's first state rows prefetched into L2 before its programmatic dependent launch's
# wait (0: none), for 4-byte, 2-byte pools: the tile's first bytes come from DRAM under the kernel
# before's end. Faster on bf16 pools, slower on float32 ones (docs/benchmarks.md).
MMA_PREFETCH_ROWS = (0, 32)
# The mma kernel's v loads and out stores in 16-byte runs a thread, through shared memory into and
# out of the accumulator's layout (off: an element a load or store, from the accumulator's layout).
MMA_VALUE_RUNS = True
# The mma kernel's v rows prefetched into L2 at a program's start (evict_last), so that its load of
# them after the state's products finds them there (a hint: no registers held; not yet timed on a GPU)
MMA_PREFETCH_VALUES = False
# Both kernels' effective queries by default for these state dtypes; the Triton kernel's up to
# TRITON_Q_EFF_MAX_NODES nodes (past them its W [k; q] product spills, past 32 it overflows shared
# memory).
Q_EFF_DTYPES = (torch.float32,)
TRITON_Q_EFF_MAX_NODES = 8
# The Triton kernel's trees walked by pointer jumping (log2 N dependent lookups, not N - 1); both
# kernels' (I + A)^-1 as one block of the whole tree where no root path is over 4 nodes (A^4 = 0
# then), its joins skipped; off: the link-by-link walk, the blocked inverse at every depth
TRITON_TREE_DOUBLING = True
SHALLOW_TREES = True


@triton.jit
def _operand(x, PRECISION: tl.constexpr):
    """x as a tensor-core operand: with "tf32", rounded to tf32's 10 mantissa bits to nearest (ties
    away from zero, as cvt.rna.tf32.f32) -- the tensor cores truncate the 13 bits they drop, an
    error biased enough to fail float32's tolerance -- else as it is."""
    if PRECISION == "tf32":
        bits = x.to(tl.int32, bitcast=True)
        x = ((bits + 0x1000) & -8192).to(tl.float32, bitcast=True)
    return x


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr):
    return tl.dot(_operand(a, PRECISION), _operand(b, PRECISION), input_precision=PRECISION)


@triton.jit
def _unit_lower_inverse(A, I, NUM_NODES: tl.constexpr, PRECISION: tl.constexpr, SHALLOW: tl.constexpr = False,
                        depth=0):
    """(I + A)^-1 for A strictly lower triangular (zero past NUM_NODES): within blocks of 4,
    (I - A)(I + A^2) (A^4 = 0 there); then blocks of 8, 16, ... each joined from its two halves as
    T - T A' T, A' the coupling of the halves. Every intermediate stays the size of an inverse: the
    power series (I - A)(I + A^2)(I + A^4)... over a whole path has powers that grow like binomials and
    cancel when keys are near parallel (a repeated token), which tf32 did not survive (0.55 x max |o|
    off at 16 nodes); the same number of products. With SHALLOW, where every root path has at most 4
    nodes (``depth``, a tree's), A^4 = 0 over the whole matrix: one block, no joins."""
    idx = tl.arange(0, A.shape[0])
    if NUM_NODES <= 2:
        T = I - A
    else:
        within = A  # up to 4 nodes one block
        if NUM_NODES > 4:
            one_block = (idx[:, None] // 4) == (idx[None, :] // 4)
            if SHALLOW:
                one_block = one_block | (depth <= 4)
            within = tl.where(one_block, A, 0.0)
        T = I - within  # exact: only the correction below carries the products' rounding
        T = T + _dot(T, _dot(within, within, PRECISION), PRECISION)
    if NUM_NODES > 4:
        if SHALLOW:
            if depth > 4:
                T = _joined_blocks(T, A, idx, NUM_NODES, PRECISION)
        else:
            T = _joined_blocks(T, A, idx, NUM_NODES, PRECISION)
    return T


@triton.jit
def _joined_blocks(T, A, idx, NUM_NODES: tl.constexpr, PRECISION: tl.constexpr):
    """_unit_lower_inverse's blocks of 4 (T) joined into 8, 16, ...: each pair of halves as T - T A' T."""
    for level in tl.static_range(0, max(0, (NUM_NODES - 1).bit_length() - 2)):
        half = 4 << level
        coupling = tl.where(((idx[:, None] // (2 * half)) == (idx[None, :] // (2 * half)))
                            & ((idx[:, None] // half) != (idx[None, :] // half)), A, 0.0)
        T = T - _dot(_dot(T, coupling, PRECISION), T, PRECISION)
    return T


@triton.jit
def _l2_normalised(x, L2NORM: tl.constexpr):
    """Rows of x divided by sqrt(|row|^2 + 1e-6) (FLA's l2norm), if L2NORM."""
    if L2NORM:
        x = x / tl.sqrt(tl.sum(x * x, axis=1) + 1e-6)[:, None]
    return x


@triton.jit
def stack_rows(keys, queries, key_side, mask):
    """float32 rows of the [k; q] stack: from ``keys`` where ``key_side``, else ``queries`` (pointer
    blocks); one load when q and k share a dtype, else one each (pointers of two types do not mix)."""
    if keys.dtype == queries.dtype:
        return tl.load(tl.where(key_side[:, None], keys, queries), mask=mask, other=0.0).to(tl.float32)
    given_k = tl.load(keys, mask=mask & key_side[:, None], other=0.0).to(tl.float32)
    return tl.where(key_side[:, None], given_k,
                    tl.load(queries, mask=mask & ~key_side[:, None], other=0.0).to(tl.float32))


@triton.jit
def _ancestry(row, node, real, parents_ptr, parents_stride_row, parents_stride_node, NUM_NODES: tl.constexpr,
              TREE: tl.constexpr, DOUBLING: tl.constexpr = False):
    """[NODES, NODES] bool: node(c) is node(r)'s ancestor or itself (both sides of the stack), and
    whether every parent link of the row lies in [-1, n-1] (always, for a chain). A tree's links
    are one load; the walk looks them up in registers (no chain of dependent loads): link by link,
    or with DOUBLING each node's path mask by pointer jumping (log2 N rounds: a node's mask joins
    that of the node 2^k above it, which already holds the 2^k nodes from there up)."""
    if TREE:
        up = tl.load(parents_ptr + row * parents_stride_row + node * parents_stride_node, mask=real, other=-1)
        links_ok = tl.sum(tl.where(real & ((up < -1) | (up >= node)), 1, 0)) == 0
        if DOUBLING:
            # entry x < NODES / 2 is node x's (the key rows hold nodes 0, 1, ...): lookups by node
            bits = tl.full(node.shape, 1, tl.int32) << node
            for _ in tl.static_range((NUM_NODES - 1).bit_length()):
                climbing = tl.where(links_ok, up >= 0, False)
                above = tl.where(climbing, up, 0).to(tl.int32)
                bits |= tl.where(climbing, tl.gather(bits, above, 0), 0)
                up = tl.where(climbing, tl.gather(up, above, 0), -1)
            return ((bits[:, None] >> node[None, :]) & 1) != 0, links_ok
        links = up  # entry x < NODES / 2: node x's parent (the key rows hold nodes 0, 1, ...)
        ancestry = node[:, None] == node[None, :]
        for _ in tl.static_range(NUM_NODES - 1):
            ancestry |= up[:, None] == node[None, :]
            climbing = tl.where(links_ok, up >= 0, False)
            up = tl.where(climbing, tl.gather(links, tl.where(climbing, up, 0).to(tl.int32), 0), -1)
        return ancestry, links_ok
    else:
        return node[None, :] <= node[:, None], row >= 0


@triton.jit
def _gdn_verify_kernel(
    out_ptr, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, ssm_ptr, slots_ptr, parents_ptr,
    num_state_slots, scale,
    out_stride_row, out_stride_node, out_stride_head, out_stride_v,
    q_stride_row, q_stride_node, q_stride_head, q_stride_k,
    k_stride_row, k_stride_node, k_stride_head, k_stride_k,
    v_stride_row, v_stride_node, v_stride_head, v_stride_v,
    g_stride_row, g_stride_node, g_stride_head,
    beta_stride_row, beta_stride_node, beta_stride_head,
    ssm_stride_slot, ssm_stride_head, ssm_stride_k, ssm_stride_v,
    slots_stride, parents_stride_row, parents_stride_node,
    NUM_NODES: tl.constexpr, NODES: tl.constexpr, NUM_K_HEADS: tl.constexpr, NUM_V_HEADS: tl.constexpr,
    HEAD_K_DIM: tl.constexpr, HEAD_V_DIM: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
    TREE: tl.constexpr, L2NORM: tl.constexpr, PRECISION: tl.constexpr, Q_EFF: tl.constexpr,
    DOUBLING: tl.constexpr, SHALLOW: tl.constexpr,
):
    """One program: one [BLOCK_K, BLOCK_V] state tile of one value head of one row. Outputs are
    stored only if the row's slot is in [0, num_state_slots) and (trees) every parent link lies in
    [-1, n-1]; nothing is written otherwise, and no load leaves its tensor. Q_EFF: the outputs from
    the effective queries (module docstring). DOUBLING: a tree walked by pointer jumping (_ancestry);
    SHALLOW: a tree's inverse as one block where its paths allow (_unit_lower_inverse)."""
    HALF: tl.constexpr = NODES // 2
    V_BLOCKS: tl.constexpr = (HEAD_V_DIM + BLOCK_V - 1) // BLOCK_V
    head = tl.program_id(0) // V_BLOCKS
    vv = (tl.program_id(0) % V_BLOCKS) * BLOCK_V + tl.arange(0, BLOCK_V)
    row = tl.program_id(1).to(tl.int64)
    k_head = head // (NUM_V_HEADS // NUM_K_HEADS)

    stack = tl.arange(0, NODES)  # rows of the [k; q] stack
    key_side = stack < HALF
    node = stack % HALF
    real = node < NUM_NODES
    kk = tl.arange(0, BLOCK_K)

    slot = tl.load(slots_ptr + row * slots_stride).to(tl.int64)
    slot_ok = (slot >= 0) & (slot < num_state_slots)
    columns = (vv < HEAD_V_DIM)[None, :]
    # The state tile first: the program's long read, which nothing else waits on.
    tile = (ssm_ptr + slot * ssm_stride_slot + head * ssm_stride_head + (kk * ssm_stride_k)[:, None]
            + (vv * ssm_stride_v)[None, :])
    state = tl.load(tile, mask=tl.where(slot_ok, (kk < HEAD_K_DIM)[:, None] & columns, False),
                    other=0.0).to(tl.float32)
    # v next: the outputs' last term waits on it, after everything else
    v = tl.load(v_ptr + row * v_stride_row + head * v_stride_head + (node * v_stride_node)[:, None]
                + (vv * v_stride_v)[None, :], mask=(real & key_side)[:, None] & columns, other=0.0)

    keys = k_ptr + row * k_stride_row + k_head * k_stride_head + (node * k_stride_node)[:, None] + (kk * k_stride_k)[None, :]
    queries = (q_ptr + row * q_stride_row + k_head * q_stride_head + (node * q_stride_node)[:, None]
               + (kk * q_stride_k)[None, :])
    # the stack raw, as a tensor-core operand; each row's l2 norm (of the rounded row: a query and a
    # key of the same values stay one vector) and scale a factor on the products' rows and columns
    kq = _operand(stack_rows(keys, queries, key_side, real[:, None] & (kk < HEAD_K_DIM)[None, :]), PRECISION)
    row_c = tl.where(key_side, 1.0, scale)
    if L2NORM:
        row_c = row_c / tl.sqrt(tl.sum(kq * kq, axis=1) + 1e-6)
    g = floored_log_decay(tl.load(g_ptr + row * g_stride_row + node * g_stride_node + head * g_stride_head,
                                  mask=real, other=0.0).to(tl.float32))
    beta = tl.load(beta_ptr + row * beta_stride_row + node * beta_stride_node + head * beta_stride_head,
                   mask=real & key_side, other=0.0).to(tl.float32)  # zero on query rows: no update there

    ancestry, links_ok = _ancestry(row, node, real, parents_ptr, parents_stride_row, parents_stride_node, NUM_NODES,
                                   TREE, DOUBLING)
    ancestry &= (key_side & real)[None, :]  # the key columns of each row's root path
    depth = tl.max(tl.sum(ancestry.to(tl.int32), axis=1))  # the longest root path's nodes
    cumulative = tl.sum(tl.where(ancestry, g[None, :], 0.0), axis=1)  # G of node(r)
    decay = tl.exp(tl.where(ancestry, cumulative[:, None] - cumulative[None, :], 0.0))
    decay = tl.where(ancestry, decay, 0.0)  # D, on both sides' rows
    gram = tl.dot(kq, tl.trans(kq), input_precision=PRECISION) * row_c[:, None] * row_c[None, :]
    eye = (stack[:, None] == stack[None, :]).to(tl.float32)
    A = tl.where(key_side[:, None] & (eye < 0.5), beta[:, None] * decay * gram, 0.0)
    # the node matrices in 3xTF32 where the effective queries need them whole
    SPLIT: tl.constexpr = "tf32x3" if PRECISION == "tf32" and Q_EFF else PRECISION
    inverse = _unit_lower_inverse(A, eye, NUM_NODES, SPLIT, SHALLOW, depth)  # (I + A)^-1 on the key block
    queries = tl.where(key_side[:, None], 0.0, decay * gram)
    if PRECISION == "tf32" and (NUM_NODES > 4 or Q_EFF):  # past 4 nodes near-parallel keys sum up to N terms here
        mix = _dot(queries, inverse, "tf32x3")
    else:
        mix = _dot(queries, inverse, PRECISION)
    grown = tl.exp(cumulative)[:, None]
    kept = tl.where(key_side[:, None], 0.0, grown)  # diag(exp G) Q S0 on query rows
    store_ok = slot_ok & links_ok

    v = v.to(tl.float32)
    if Q_EFF:  # the query rows of W [k; q], zero key rows; then one product with the state
        W = (eye * kept - mix * (beta * tl.exp(cumulative))[None, :]) * row_c[None, :]
        q_eff = _operand(_dot(W, kq, SPLIT), PRECISION)
        o = (tl.dot(q_eff, state, input_precision=PRECISION)
             + tl.dot(_operand(mix, PRECISION), _operand(beta[:, None] * v, PRECISION), input_precision=PRECISION))
    else:
        mix = _operand(mix, PRECISION)
        # K S0 on key rows, Q S0 on query rows (the state's truncation is the one left: unbiased over dk)
        products = tl.dot(kq, state, input_precision=PRECISION) * row_c[:, None]
        rhs = beta[:, None] * (v - grown * products)
        o = kept * products + tl.dot(mix, _operand(rhs, PRECISION), input_precision=PRECISION)
    dst = (out_ptr + row * out_stride_row + head * out_stride_head + (node * out_stride_node)[:, None]
           + (vv * out_stride_v)[None, :])
    tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=tl.where(store_ok, (real & ~key_side)[:, None] & columns, False))


def default_precision(ssm) -> str:
    """tl.dot's input precision: tf32, operands rounded to nearest except the state (docs/benchmarks.md
    has its error against float64)."""
    return "tf32"


def spread_block(largest: int, num_rows: int, num_heads: int, dim: int, smallest: int = 2 * MIN_DOT) -> int:
    """A tile's columns: ``largest`` (or dim rounded up to a power of two, >= MIN_DOT), halved down
    to ``smallest`` while rows x heads x tiles would be fewer than VERIFY_PROGRAMS programs."""
    block = max(MIN_DOT, min(largest, next_power_of_2(dim)))
    while block > smallest and num_rows * num_heads * cdiv(dim, block) < VERIFY_PROGRAMS:
        block //= 2
    return block


def check_mma_tiles(op: str, block_v: int, num_warps: int, chunk_k: int) -> None:
    """The mma kernels' tiles: powers of two, block_v >= 8 x warps (a warp's mma columns), chunk_k >= MIN_DOT."""
    powers = all(n > 0 and n & (n - 1) == 0 for n in (block_v, num_warps, chunk_k))
    if not (powers and block_v >= 8 * num_warps and chunk_k >= MIN_DOT):
        raise ValueError(f"{op}: the mma kernel's block_v, warps and chunk_k are powers of two, block_v >= 8 x "
                         f"warps and chunk_k >= {MIN_DOT}; got block_v {block_v}, {num_warps} warps, chunk_k {chunk_k}")


@triton.constexpr_function  # (the Gluon kernels call these too: gdn_verify_mma, gdn_ring_verify_mma)
def rows_contiguous(stride_k: int, stride_v: int) -> bool:
    """Whether a pool's state rows are contiguous ([.., dv, dk] storage passed transposed, the
    engines' layout) rather than its value columns."""
    return stride_k == 1 and stride_v != 1


@triton.constexpr_function
def column_copy_lanes(chunk_k: int, element_bytes: int) -> int:
    """Where the rows are contiguous, the lanes of a warp down a chunk's column, 16 bytes each over
    its chunk_k rows, at most 32 (0: the chunk's column is under 16 bytes)."""
    return min(32, chunk_k * element_bytes // 16)


def state_stages_for(state_stages: int, block_v: int, num_warps: int, chunk_k: int, block_k: int, ssm) -> int:
    """The mma kernels' state_stages, at most the tile's block_k // chunk_k chunks of rows, where
    each thread's cp.async is of 4 bytes or more, or 0 (the chunks through registers). Its copy:
    where the value columns are contiguous, its run of a chunk row, block_v / (8 warps) elements;
    where the rows are (a transposed pool), 16 bytes down a column, the warp's lanes over whole
    128-byte segments of chunk_k rows (gdn_verify_mma._state_copy_layout); one element where the
    pool or its strides are not aligned as Triton sees them."""
    size = ssm.element_size()
    k_contiguous = rows_contiguous(ssm.stride(-2), ssm.stride(-1))
    # (Triton takes a runtime stride as aligned only at a multiple of 16 elements; dk's is a constexpr)
    aligned = (ssm.data_ptr() % 16 == 0 and all(stride % 16 == 0 for stride in ssm.stride()[:-2])
               and ssm.stride(-1 if k_contiguous else -2) * size % 16 == 0)
    if k_contiguous:
        lanes_k = column_copy_lanes(chunk_k, size)
        if lanes_k < 1 or (32 // lanes_k) * num_warps > block_v:
            return 0  # (a lane would copy what another does)
        run = 16 // size if aligned else 1
    else:
        run = block_v // (8 * num_warps) if ssm.stride(-1) == 1 and aligned else 1
    return min(int(state_stages), block_k // chunk_k) if run * size >= 4 else 0


def _mma_kernel_runs_on(ssm) -> bool:
    """Whether gdn_verify_mma's kernel (Gluon, mma.sync: sm_80+, Triton 3.6) serves ssm's device."""
    return (ssm.is_cuda and triton.__version__.startswith(SMEM_TRITON_VERSIONS)
            and nvidia_at_least(ssm.device, (8, 0)))


def _verify_call(out, q, k, v, g, beta, ssm, state_slots, parents, *, scale, use_qk_l2norm,
                 block_v=None, num_warps=None, precision=None, mma=None, chunk_k=None, state_stages=None,
                 persistent=None, maxnreg=None, pdl=None, q_eff=None, tree_masks=False, doubling=None, shallow=None,
                 early_loads=None, native_products=None, prefetch_rows=None, value_runs=None, prefetch_values=None):
    """The kernel's launch for launch_gdn_verify and planned_gdn_verify, or None with no rows.
    mma: gdn_verify_mma's kernel (None: where _mma_kernel_runs_on and the batch is large enough).
    block_v (a power of two >= 16; >= 8 * num_warps with mma), num_warps, precision (the Triton
    kernel's), chunk_k (state rows per load of the mma kernel, a power of two >= 16; None:
    MMA_CHUNK_K's for the pool's layout, MMA_CHUNK_K_2BYTE for a 2-byte state), state_stages (the
    mma kernel's chunks through shared memory, that many in flight; None: MMA_STATE_STAGES under
    q_eff, else 0; 0, or copies under 4 bytes: registers), persistent (the mma kernel on that many
    programs, each taking tiles until none is left -- a few an SM cap how many share one; None: a
    program a tile), maxnreg (the mma kernel's register cap), pdl (the mma kernel launched as a
    programmatic dependent, sm_90+: 1, everything read after the kernel launched before it finishes;
    2, its slots and first state chunks (only the slots with the effective queries in registers)
    before, which that kernel must not write; 0, a plain launch; None: MMA_PDL), q_eff (the outputs
    from the effective queries; None: the mma kernel's where MMA_Q_EFF, the chunks stage and the
    state is of Q_EFF_DTYPES, the Triton kernel's where the state is of Q_EFF_DTYPES and the nodes
    at most TRITON_Q_EFF_MAX_NODES), tree_masks (the mma kernel's ``parents`` each node's path mask
    instead of its link -- bit j of node n's set where node j is n or one of its ancestors --
    checked for a forest's, not walked: tree_path_masks), doubling (the Triton kernel's tree walked
    by pointer jumping; None: TRITON_TREE_DOUBLING), shallow (a tree's inverse as one block where no
    root path is over 4 nodes; None: SHALLOW_TREES), early_loads (the mma kernel's small inputs
    loaded at its start, 0 .. 2; None: MMA_EARLY_LOADS's for a chain or a tree), native_products
    (the mma kernel's stacked products in the pool's 16-bit type, q and k of it too; None:
    MMA_NATIVE_PRODUCTS's for a contiguous or a transposed pool where they are), prefetch_rows (the
    mma kernel's first state rows of a tile prefetched into L2 before its pdl 1 wait, a power of
    two; None: MMA_PREFETCH_ROWS's for the pool's element size), value_runs (the mma kernel's v and
    out in 16-byte runs; None: MMA_VALUE_RUNS), prefetch_values (the mma kernel's v rows prefetched
    into L2 at its start, where they are contiguous, not on the persistent kernel; None:
    MMA_PREFETCH_VALUES): tuning only."""
    num_rows, num_nodes, num_k_heads, head_k_dim = q.shape
    num_v_heads, head_v_dim = v.shape[2], v.shape[3]
    if num_rows == 0:
        return None
    if num_rows > MAX_GRID_Y:
        raise ValueError(f"convwin.gdn_verify verifies at most {MAX_GRID_Y} rows per call, got {num_rows}; "
                         "split the batch")
    columns = [c for c in (MMA_BLOCK_V, MMA_SPREAD_BLOCK_V)
               if c and num_rows * num_v_heads * cdiv(head_v_dim, c) >= MMA_MIN_PROGRAMS]  # the mma kernel's tiles
    if mma is None:
        mma = num_nodes <= MMA_MAX_NODES and bool(columns) and _mma_kernel_runs_on(ssm)
    if num_warps is None:
        num_warps = MMA_WARPS if mma else VERIFY_WARPS
    if mma and block_v is None:
        block_v = max(8 * num_warps, min((columns or [MMA_BLOCK_V])[0], next_power_of_2(head_v_dim)))
    if block_v is None:
        block_v = spread_block(BLOCK_V, num_rows, num_v_heads, head_v_dim)
    grid = (num_v_heads * cdiv(head_v_dim, block_v), num_rows)
    parents_strides = (0, 0) if parents is None else parents.stride()
    scalars = (ssm.shape[0], float(scale), *out.stride(), *q.stride(), *k.stride(), *v.stride(), *g.stride(),
               *beta.stride(), *ssm.stride(), state_slots.stride(0), *parents_strides)
    constexprs = dict(
        NUM_NODES=num_nodes, NODES=max(MIN_DOT, next_power_of_2(2 * num_nodes)), NUM_K_HEADS=num_k_heads,
        NUM_V_HEADS=num_v_heads, HEAD_K_DIM=head_k_dim, HEAD_V_DIM=head_v_dim,
        BLOCK_K=max(MIN_DOT, next_power_of_2(head_k_dim)), BLOCK_V=block_v, TREE=parents is not None,
        L2NORM=bool(use_qk_l2norm), PRECISION=precision or default_precision(ssm), num_warps=num_warps,
    )
    tensors = (out, q, k, v, g, beta, ssm, state_slots, state_slots if parents is None else parents)
    shallow = parents is not None and bool(SHALLOW_TREES if shallow is None else shallow)
    if tree_masks and not (mma and parents is not None):
        raise ValueError("convwin.gdn_verify: tree_masks are the mma kernel's, for a tree's parents")
    if (early_loads is not None or native_products or prefetch_rows or value_runs is not None
            or prefetch_values) and not mma:
        raise ValueError("convwin.gdn_verify: early_loads, native_products, prefetch_rows, value_runs and "
                         "prefetch_values are the mma kernel's")
    if doubling and mma:
        raise ValueError("convwin.gdn_verify: doubling is the Triton kernel's walk (the mma kernel's is across lanes)")
    if mma:
        from . import gdn_verify_mma
        if chunk_k is None:
            chunk_k = (MMA_CHUNK_K_2BYTE if ssm.element_size() == 2
                       else MMA_CHUNK_K[rows_contiguous(ssm.stride(-2), ssm.stride(-1))])
        chunk_k = min(chunk_k, constexprs["BLOCK_K"])
        check_mma_tiles("convwin.gdn_verify", block_v, num_warps, chunk_k)
        stages = state_stages_for(MMA_STATE_STAGES if state_stages is None else state_stages, block_v, num_warps,
                                  chunk_k, constexprs["BLOCK_K"], ssm)
        if q_eff is None:
            q_eff = MMA_Q_EFF and stages > 0 and ssm.dtype in Q_EFF_DTYPES
        if state_stages is None and not q_eff and ssm.stride(-1) == 1:
            stages = 0  # (a transposed pool's chunks stay staged: in registers its loads are of one element)
        half = (torch.bfloat16, torch.float16)  # (exact in tf32; wider q or k rounded to it first)
        native_ok = not q_eff and ssm.dtype in half and q.dtype == k.dtype == ssm.dtype
        if native_products and not native_ok:
            raise ValueError("convwin.gdn_verify: native_products are the stacked products' (q_eff off) with q, k and "
                             f"the pool of one 16-bit type; got q {q.dtype}, k {k.dtype}, pool {ssm.dtype}, "
                             f"q_eff {bool(q_eff)}")
        if native_products is None:
            native_products = MMA_NATIVE_PRODUCTS[rows_contiguous(ssm.stride(2), ssm.stride(3))]
        native = native_ok and bool(native_products)
        constexprs.update(CHUNK_K=chunk_k, ROUND_KQ=not (q.dtype in half and k.dtype in half),
                          WARPS=num_warps, SSM_STRIDE_K=ssm.stride(2), SSM_STRIDE_V=ssm.stride(3),
                          STATE_STAGES=stages, Q_EFF=bool(q_eff), TREE_MASKS=bool(tree_masks), SHALLOW=shallow,
                          EARLY=int(MMA_EARLY_LOADS[parents is not None] if early_loads is None else early_loads),
                          NATIVE=native, RUNS=bool(MMA_VALUE_RUNS if value_runs is None else value_runs))
        if maxnreg is not None:
            constexprs.update(maxnreg=maxnreg)
        pdl = MMA_PDL if pdl is None else int(pdl)
        pdl = pdl if pdl_device(ssm) else 0
        constexprs.update(PDL=pdl, **({"launch_pdl": True} if pdl else {}))
        rows = MMA_PREFETCH_ROWS[ssm.element_size() == 2] if prefetch_rows is None else prefetch_rows  # (checked too)
        if (prefetch_rows and persistent is not None) or rows & (rows - 1):
            raise ValueError("convwin.gdn_verify: prefetch_rows is a power of two, of the non-persistent kernel; got "
                             f"{rows} (persistent {persistent})")
        prefetch_rows = rows
        if prefetch_values and persistent is not None:
            raise ValueError("convwin.gdn_verify: prefetch_values is the non-persistent kernel's")
        if persistent is not None:
            return KernelCall(gdn_verify_mma._gdn_verify_mma_persistent_kernel, (min(grid[0] * grid[1], persistent), 1),
                              tensors, (*scalars[:2], num_rows, *scalars[2:]), constexprs)
        prefetch_values = MMA_PREFETCH_VALUES if prefetch_values is None else prefetch_values
        constexprs.update(PREFETCH=min(prefetch_rows, constexprs["BLOCK_K"]) if pdl == 1 else 0,
                          PREFETCH_V=bool(prefetch_values) and v.stride(3) == 1)
        return KernelCall(gdn_verify_mma._gdn_verify_mma_kernel, grid, tensors, scalars, constexprs)
    if q_eff is None:
        q_eff = ssm.dtype in Q_EFF_DTYPES and num_nodes <= TRITON_Q_EFF_MAX_NODES
    doubling = parents is not None and bool(TRITON_TREE_DOUBLING if doubling is None else doubling)
    constexprs.update(Q_EFF=bool(q_eff), DOUBLING=doubling, SHALLOW=shallow)
    return KernelCall(_gdn_verify_kernel, grid, tensors, scalars, constexprs)


def tree_path_masks(parents: torch.Tensor) -> torch.Tensor:
    """[B, N] links (node n's parent < n, or -1) as _verify_call's tree_masks take them: node n's
    path mask, bit j set where node j is n or one of its ancestors (valid links assumed)."""
    nodes = torch.arange(parents.shape[1], device=parents.device)
    masks = torch.ones_like(parents) << nodes
    for n in range(parents.shape[1]):  # (a parent comes first: its mask is complete)
        parent = parents[:, n]
        masks[:, n] |= torch.where(parent >= 0, masks.gather(1, parent.clamp(min=0)[:, None])[:, 0], 0)
    return masks


def launch_gdn_verify(out, q, k, v, g, beta, ssm, state_slots, parents, *, scale, use_qk_l2norm, **tuning):
    """out [B, N, Hv, dv]; q, k [B, N, Hk, dk]; v [B, N, Hv, dv]; g, beta [B, N, Hv];
    ssm [S, Hv, dk, dv]; state_slots [B]; parents [B, N] or None; any strides. One launch."""
    call = _verify_call(out, q, k, v, g, beta, ssm, state_slots, parents, scale=scale,
                        use_qk_l2norm=use_qk_l2norm, **tuning)
    if call is not None:
        call.launch()


def planned_gdn_verify(out, q, k, v, g, beta, ssm, state_slots, parents, *, scale, use_qk_l2norm):
    """launch_gdn_verify fixed for these shapes, strides, dtypes and arguments (_common.planned_launch)."""
    call = _verify_call(out, q, k, v, g, beta, ssm, state_slots, parents, scale=scale, use_qk_l2norm=use_qk_l2norm)
    launch = planned_launch(call)
    if call is None or not call.constexprs.get("STATE_STAGES") or ssm.element_size() >= 4:
        def run(out, q, k, v, g, beta, ssm, state_slots, parents, *, scale, use_qk_l2norm):
            launch(out, q, k, v, g, beta, ssm, state_slots, state_slots if parents is None else parents)

        return run
    # a later pool of these strides may start off 16 bytes: its copies of one value, under cp.async's 4
    unstaged = planned_launch(_verify_call(out, q, k, v, g, beta, ssm, state_slots, parents, scale=scale,
                                           use_qk_l2norm=use_qk_l2norm, state_stages=0,
                                           q_eff=call.constexprs["Q_EFF"]))

    def run_staged(out, q, k, v, g, beta, ssm, state_slots, parents, *, scale, use_qk_l2norm):
        (unstaged if ssm.data_ptr() & 15 else launch)(out, q, k, v, g, beta, ssm, state_slots,
                                                      state_slots if parents is None else parents)

    return run_staged
