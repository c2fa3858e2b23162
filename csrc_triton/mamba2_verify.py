"""The Mamba2 verify recurrence: every draft token's (or tree node's) output from ONE read of the
committed state, in the chunked (SSD) form of the selective state update.

Per row b and head h (group h // (H / G)), with S0 = ssm[state_slots[b], h] [P, Ns] and anc(n)
the ancestors of node n and n itself (a chain: 0..n), in float32:

    d_i     = dt_i (+ dt_bias), softplus(d_i) if dt_softplus     the step size of token i
    L_n     = sum_{i in anc(n)} d_i A                             cumulative log decay along n's root path
                                                                  (each d_i A floored at _common.LOG_DECAY_FLOOR)
    M[n, i] = exp(L_n - L_i) d_i (C_n . B_i) for i in anc(n), else 0
    Y       = diag(exp L) C S0^T + M X  (+ D X), times silu(Z)    [nodes, P]

This is the token-by-token recurrence ``h = exp(d A) h + d x B^T; y = h C`` unrolled along each
node's root path (h_n = exp(L_n) S0 + sum_{i in anc(n)} exp(L_n - L_i) d_i x_i B_i^T): the state
is read once and never written. No triangular solve: unlike the delta rule the update does not
read the state.

One program holds one [BLOCK_P, Ns] state tile of one head of one row (HEADS_PER_PROGRAM: of
several heads of a group, one after another) and the node stack [NODES, Ns] of C (and of B),
NODES = max(16, N) rounded up to a power of two (tl.dot's minimum being 16, zero rows beyond N):
C S0^T is tensor-core products over chunks of the tile's state rows, their loads pipelined
through shared memory (cp.async), the intra-chunk term one [NODES, NODES] x [NODES, BLOCK_P]
product. The node matrices use gdn_verify's helpers (the ancestry walk, tf32 operands rounded to
nearest).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import (MAX_GRID_Y, KernelCall, cdiv, floored_log_decay, gdc_launch_dependents, gdc_wait, interpreted,
                      next_power_of_2, pdl_device, planned_launch, prefetch_device, prefetch_lines, prefetch_rows_l2,
                      softplus)
from .gdn_verify import MIN_DOT, _ancestry, _dot, _operand, default_precision, spread_block

# Head-dim rows per state tile [BLOCK_P, Ns], fewer for small batches (gdn_verify.spread_block).
BLOCK_P = 64
VERIFY_WARPS = 4
# C S0^T over chunks of CHUNK_N state rows, CHUNK_STAGES of them in flight (0: the whole tile at
# once): the H200 sweep's fastest (docs/benchmarks.md, "Verify recurrence (mamba2_verify)")
CHUNK_N = 32
CHUNK_STAGES = 3
# The nodes' x, z, dt, B and C lines prefetched into L2 at a program's start, evict_last, so that its
# epilogue's loads of them, after the state's, find them there (a hint: no registers held, the
# values read where they are used; not yet timed on a GPU)
PREFETCH_INPUTS = False
# Heads a program (a divisor of a group's), one after another, and with FLATTEN_HEADS their loop and
# their chunks' loop one pipelined loop: the next head's first chunks in flight under this one's
# outputs (the Mamba2 ring verify's FLATTEN; not yet timed on a GPU)
HEADS_PER_PROGRAM = 1
FLATTEN_HEADS = False


@triton.jit
def _step_sizes(dt_base, node, mask, dt_stride_node, dt_bias_at, HAS_DT_BIAS: tl.constexpr,
                DT_SOFTPLUS: tl.constexpr):
    """d of the nodes ``node`` (where ``mask``) of one row and head: dt (+ dt_bias), softplus'd if
    DT_SOFTPLUS, in float32."""
    step = tl.load(dt_base + node * dt_stride_node, mask=mask, other=0.0).to(tl.float32)
    if HAS_DT_BIAS:
        step += tl.load(dt_bias_at).to(tl.float32)
    if DT_SOFTPLUS:
        step = softplus(step)
    return step


@triton.jit
def _head_tile(
    head, row, pp0, out_ptr, x_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, ssm_ptr, slots_ptr, parents_ptr, d_ptr, z_ptr,
    dt_bias_ptr, num_state_slots,
    out_stride_row, out_stride_node, out_stride_head, out_stride_p,
    x_stride_row, x_stride_node, x_stride_head, x_stride_p,
    dt_stride_row, dt_stride_node, dt_stride_head,
    a_stride,
    b_stride_row, b_stride_node, b_stride_group, b_stride_n,
    c_stride_row, c_stride_node, c_stride_group, c_stride_n,
    ssm_stride_slot, ssm_stride_head, ssm_stride_p, ssm_stride_n,
    slots_stride, parents_stride_row, parents_stride_node,
    d_stride,
    z_stride_row, z_stride_node, z_stride_head, z_stride_p,
    dt_bias_stride,
    NUM_NODES: tl.constexpr, NODES: tl.constexpr, NUM_HEADS: tl.constexpr, NUM_GROUPS: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_STATE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    TREE: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
    DT_SOFTPLUS: tl.constexpr, PRECISION: tl.constexpr, CHUNK_N: tl.constexpr, CHUNK_STAGES: tl.constexpr,
    PREFETCH: tl.constexpr, LINES: tl.constexpr,
):
    """_mamba2_verify_kernel's work for one [BLOCK_P, Ns] state tile: head ``head`` of row ``row``,
    its head-dim rows from pp0."""
    pp = pp0 + tl.arange(0, BLOCK_P)
    group = head // (NUM_HEADS // NUM_GROUPS)

    node = tl.arange(0, NODES)
    real = node < NUM_NODES
    nn = tl.arange(0, BLOCK_N)
    columns = (nn < D_STATE)[None, :]
    p_ok = (pp < HEAD_DIM)[None, :]

    slot = tl.load(slots_ptr + row * slots_stride).to(tl.int64)
    slot_ok = (slot >= 0) & (slot < num_state_slots)
    state_base = ssm_ptr + slot * ssm_stride_slot + head * ssm_stride_head
    c_base = c_ptr + row * c_stride_row + group * c_stride_group
    if PREFETCH:  # what the epilogue reads after the state, into L2 under the state's read
        p_bytes = tl.minimum(BLOCK_P, HEAD_DIM - pp0) * (x_ptr.dtype.element_ty.primitive_bitwidth // 8)
        prefetch_rows_l2(x_ptr + row * x_stride_row + head * x_stride_head + pp0 * x_stride_p, x_stride_node,
                         NUM_NODES, p_bytes, NODES, LINES)
        if HAS_Z:
            prefetch_rows_l2(z_ptr + row * z_stride_row + head * z_stride_head + pp0 * z_stride_p, z_stride_node,
                             NUM_NODES, p_bytes, NODES, LINES)
        prefetch_rows_l2(dt_ptr + row * dt_stride_row + head * dt_stride_head, dt_stride_node, NUM_NODES,
                         dt_ptr.dtype.element_ty.primitive_bitwidth // 8, NODES, LINES)
        if (head % (NUM_HEADS // NUM_GROUPS) == 0) & (pp0 == 0):  # a group's B and C: its first program's
            prefetch_rows_l2(b_ptr + row * b_stride_row + group * b_stride_group, b_stride_node, NUM_NODES,
                             D_STATE * (b_ptr.dtype.element_ty.primitive_bitwidth // 8), NODES, LINES)
            prefetch_rows_l2(c_base, c_stride_node, NUM_NODES,
                             D_STATE * (c_ptr.dtype.element_ty.primitive_bitwidth // 8), NODES, LINES)
    # The state tile first: the program's long read, which nothing else waits on. Loaded as
    # [Ns, BLOCK_P] (S0^T), the right operand of C S0^T (the state's truncation is the one left:
    # unbiased over Ns): whole, or CHUNK_N state rows at a time, their loads pipelined through
    # shared memory (cp.async) rather than held in registers.
    if CHUNK_N == 0:
        state_t = tl.load(state_base + (nn * ssm_stride_n)[:, None] + (pp * ssm_stride_p)[None, :],
                          mask=tl.where(slot_ok, (nn < D_STATE)[:, None] & p_ok, False), other=0.0).to(tl.float32)
    else:
        read = tl.zeros([NODES, BLOCK_P], tl.float32)
        for n0 in tl.range(0, BLOCK_N, CHUNK_N, num_stages=CHUNK_STAGES):
            nc = n0 + tl.arange(0, CHUNK_N)
            chunk = tl.load(state_base + (nc * ssm_stride_n)[:, None] + (pp * ssm_stride_p)[None, :],
                            mask=tl.where(slot_ok, (nc < D_STATE)[:, None] & p_ok, False), other=0.0)
            c_chunk = tl.load(c_base + (node * c_stride_node)[:, None] + (nc * c_stride_n)[None, :],
                              mask=real[:, None] & (nc < D_STATE)[None, :], other=0.0).to(tl.float32)
            read += tl.dot(_operand(c_chunk, PRECISION), chunk.to(tl.float32), input_precision=PRECISION)

    nodes_mask = real[:, None] & columns
    b = tl.load(b_ptr + row * b_stride_row + group * b_stride_group + (node * b_stride_node)[:, None]
                + (nn * b_stride_n)[None, :], mask=nodes_mask, other=0.0).to(tl.float32)
    c = tl.load(c_base + (node * c_stride_node)[:, None] + (nn * c_stride_n)[None, :], mask=nodes_mask,
                other=0.0).to(tl.float32)
    c = _operand(c, PRECISION)
    step = _step_sizes(dt_ptr + row * dt_stride_row + head * dt_stride_head, node, real, dt_stride_node,
                       dt_bias_ptr + head * dt_bias_stride, HAS_DT_BIAS, DT_SOFTPLUS)
    step = tl.where(real, step, 0.0)  # padding nodes: no decay, no update
    rate = tl.load(a_ptr + head * a_stride).to(tl.float32)

    ancestry, links_ok = _ancestry(row, node, real, parents_ptr, parents_stride_row, parents_stride_node, NUM_NODES,
                                   TREE)
    ancestry &= real[None, :]
    cumulative = tl.sum(tl.where(ancestry, floored_log_decay(step * rate)[None, :], 0.0), axis=1)  # L of each node
    decay = tl.exp(tl.where(ancestry, cumulative[:, None] - cumulative[None, :], 0.0))
    gram = _dot(c, tl.trans(b), PRECISION)  # C_n . B_i  (c: an operand already)
    mix = tl.where(ancestry, decay * step[None, :] * gram, 0.0)  # M

    x = tl.load(x_ptr + row * x_stride_row + head * x_stride_head + (node * x_stride_node)[:, None]
                + (pp * x_stride_p)[None, :], mask=real[:, None] & p_ok, other=0.0).to(tl.float32)
    if CHUNK_N == 0:
        read = tl.dot(c, state_t, input_precision=PRECISION)  # C S0^T
    y = tl.exp(cumulative)[:, None] * read + _dot(mix, x, PRECISION)
    if HAS_D:
        y += tl.load(d_ptr + head * d_stride).to(tl.float32) * x
    if HAS_Z:
        gate = tl.load(z_ptr + row * z_stride_row + head * z_stride_head + (node * z_stride_node)[:, None]
                       + (pp * z_stride_p)[None, :], mask=real[:, None] & p_ok, other=0.0).to(tl.float32)
        y *= gate / (1.0 + tl.exp(-gate))
    dst = (out_ptr + row * out_stride_row + head * out_stride_head + (node * out_stride_node)[:, None]
           + (pp * out_stride_p)[None, :])
    tl.store(dst, y.to(out_ptr.dtype.element_ty), mask=tl.where(slot_ok & links_ok, real[:, None] & p_ok, False))


@triton.jit
def _mamba2_verify_kernel(
    out_ptr, x_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, ssm_ptr, slots_ptr, parents_ptr, d_ptr, z_ptr, dt_bias_ptr,
    num_state_slots,
    out_stride_row, out_stride_node, out_stride_head, out_stride_p,
    x_stride_row, x_stride_node, x_stride_head, x_stride_p,
    dt_stride_row, dt_stride_node, dt_stride_head,
    a_stride,
    b_stride_row, b_stride_node, b_stride_group, b_stride_n,
    c_stride_row, c_stride_node, c_stride_group, c_stride_n,
    ssm_stride_slot, ssm_stride_head, ssm_stride_p, ssm_stride_n,
    slots_stride, parents_stride_row, parents_stride_node,
    d_stride,
    z_stride_row, z_stride_node, z_stride_head, z_stride_p,
    dt_bias_stride,
    NUM_NODES: tl.constexpr, NODES: tl.constexpr, NUM_HEADS: tl.constexpr, NUM_GROUPS: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_STATE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    TREE: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
    DT_SOFTPLUS: tl.constexpr, PRECISION: tl.constexpr, CHUNK_N: tl.constexpr, CHUNK_STAGES: tl.constexpr,
    PDL: tl.constexpr, PREFETCH: tl.constexpr, LINES: tl.constexpr, HEADS: tl.constexpr, FLATTEN: tl.constexpr,
):
    """One program: one [BLOCK_P, Ns] state tile of each of HEADS adjacent heads of one row (HEADS
    divides a group's heads). Outputs are stored only if the row's slot is in [0, num_state_slots)
    and (trees) every parent link lies in [-1, n-1]; nothing is written otherwise, and no load leaves
    its tensor. With PDL (sm_90, launched as a programmatic dependent) every read waits for the
    kernel before to finish, and the next kernel may start once every program has waited (so when a
    kernel starts, every one before the kernel just before it has finished). PREFETCH: the nodes'
    small inputs into L2 first (prefetch_rows_l2, LINES lines a row; x, z, B and C rows contiguous).
    FLATTEN: the heads' loop and their chunks' loop one pipelined loop (tl.range's flatten), so that
    the next head's first chunks are in flight while this one's outputs are computed."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    P_BLOCKS: tl.constexpr = (HEAD_DIM + BLOCK_P - 1) // BLOCK_P
    first_head = (tl.program_id(0) // P_BLOCKS) * HEADS
    pp0 = (tl.program_id(0) % P_BLOCKS) * BLOCK_P
    row = tl.program_id(1).to(tl.int64)
    if FLATTEN:
        for head in tl.range(first_head, first_head + HEADS, flatten=True):
            _head_tile(head, row, pp0, out_ptr, x_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, ssm_ptr, slots_ptr, parents_ptr,
                       d_ptr, z_ptr, dt_bias_ptr, num_state_slots, out_stride_row, out_stride_node, out_stride_head,
                       out_stride_p, x_stride_row, x_stride_node, x_stride_head, x_stride_p, dt_stride_row,
                       dt_stride_node, dt_stride_head, a_stride, b_stride_row, b_stride_node, b_stride_group,
                       b_stride_n, c_stride_row, c_stride_node, c_stride_group, c_stride_n, ssm_stride_slot,
                       ssm_stride_head, ssm_stride_p, ssm_stride_n, slots_stride, parents_stride_row,
                       parents_stride_node, d_stride, z_stride_row, z_stride_node, z_stride_head, z_stride_p,
                       dt_bias_stride, NUM_NODES, NODES, NUM_HEADS, NUM_GROUPS, HEAD_DIM, D_STATE, BLOCK_P, BLOCK_N,
                       TREE, HAS_D, HAS_Z, HAS_DT_BIAS, DT_SOFTPLUS, PRECISION, CHUNK_N, CHUNK_STAGES, PREFETCH,
                       LINES)
    else:
        for h in tl.static_range(HEADS):
            _head_tile(first_head + h, row, pp0, out_ptr, x_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, ssm_ptr, slots_ptr,
                       parents_ptr, d_ptr, z_ptr, dt_bias_ptr, num_state_slots, out_stride_row, out_stride_node,
                       out_stride_head, out_stride_p, x_stride_row, x_stride_node, x_stride_head, x_stride_p,
                       dt_stride_row, dt_stride_node, dt_stride_head, a_stride, b_stride_row, b_stride_node,
                       b_stride_group, b_stride_n, c_stride_row, c_stride_node, c_stride_group, c_stride_n,
                       ssm_stride_slot, ssm_stride_head, ssm_stride_p, ssm_stride_n, slots_stride,
                       parents_stride_row, parents_stride_node, d_stride, z_stride_row, z_stride_node, z_stride_head,
                       z_stride_p, dt_bias_stride, NUM_NODES, NODES, NUM_HEADS, NUM_GROUPS, HEAD_DIM, D_STATE,
                       BLOCK_P, BLOCK_N, TREE, HAS_D, HAS_Z, HAS_DT_BIAS, DT_SOFTPLUS, PRECISION, CHUNK_N,
                       CHUNK_STAGES, PREFETCH, LINES)


def state_chunk(chunk_n: int, block_n: int, op: str) -> int:
    """C S0^T's chunk of state rows: chunk_n, at most the tile's block_n (0: the whole tile at once);
    tl.dot takes powers of two from MIN_DOT."""
    chunk_n = min(chunk_n, block_n)
    if chunk_n and (chunk_n < MIN_DOT or chunk_n & (chunk_n - 1)):
        raise ValueError(f"{op}: chunk_n must be 0 or a power of two >= {MIN_DOT}, got {chunk_n}")
    return chunk_n


def _verify_call(out, x, dt, A, B, C, ssm, state_slots, parents, D, z, dt_bias, *, dt_softplus, block_p=None,
                 num_warps=VERIFY_WARPS, precision=None, chunk_n=CHUNK_N, chunk_stages=CHUNK_STAGES, pdl=False,
                 prefetch_inputs=None, heads_per_program=None, flatten=None, maxnreg=None):
    """The kernel's launch for launch_mamba2_verify and planned_mamba2_verify, or None with no rows.
    block_p (a power of two >= 16), num_warps, precision, chunk_n (C S0^T over chunks of that many
    state rows, a power of two >= 16; 0: the whole tile at once), chunk_stages (their pipeline's
    depth), pdl (a programmatic dependent launch, sm_90+), prefetch_inputs (None:
    PREFETCH_INPUTS; where x, z, B and C rows are contiguous, on sm_80+, not interpreted),
    heads_per_program (None: HEADS_PER_PROGRAM; a divisor of H / G), flatten (None: FLATTEN_HEADS)
    and maxnreg (a register cap; None: the compiler's choice): tuning only."""
    num_rows, num_nodes, num_heads, head_dim = x.shape
    num_groups, d_state = B.shape[2], B.shape[3]
    if num_rows == 0:
        return None
    if num_rows > MAX_GRID_Y:
        raise ValueError(f"convwin.mamba2_verify verifies at most {MAX_GRID_Y} rows per call, got {num_rows}; "
                         "split the batch")
    if block_p is None:
        block_p = spread_block(BLOCK_P, num_rows, num_heads, head_dim)
    block_n = max(MIN_DOT, next_power_of_2(d_state))
    chunk_n = state_chunk(chunk_n, block_n, "mamba2_verify")
    heads = HEADS_PER_PROGRAM if heads_per_program is None else heads_per_program
    per_group = num_heads // num_groups
    if not (isinstance(heads, int) and 0 < heads <= per_group and per_group % heads == 0):
        raise ValueError(f"convwin.mamba2_verify: heads_per_program must divide a group's {per_group} heads, got "
                         f"{heads!r}")
    grid = (num_heads // heads * cdiv(head_dim, block_p), num_rows)
    parents_strides = (0, 0) if parents is None else parents.stride()
    scalars = (ssm.shape[0], *out.stride(), *x.stride(), *dt.stride(), A.stride(0), *B.stride(), *C.stride(),
               *ssm.stride(), state_slots.stride(0), *parents_strides, 0 if D is None else D.stride(0),
               *((0,) * 4 if z is None else z.stride()), 0 if dt_bias is None else dt_bias.stride(0))
    constexprs = dict(
        NUM_NODES=num_nodes, NODES=max(MIN_DOT, next_power_of_2(num_nodes)), NUM_HEADS=num_heads,
        NUM_GROUPS=num_groups, HEAD_DIM=head_dim, D_STATE=d_state, BLOCK_P=block_p,
        BLOCK_N=block_n, TREE=parents is not None, HAS_D=D is not None,
        HAS_Z=z is not None, HAS_DT_BIAS=dt_bias is not None, DT_SOFTPLUS=bool(dt_softplus),
        PRECISION=precision or default_precision(ssm), CHUNK_N=chunk_n, CHUNK_STAGES=chunk_stages, HEADS=heads,
        FLATTEN=bool(FLATTEN_HEADS if flatten is None else flatten), num_warps=num_warps,
        **({"maxnreg": maxnreg} if maxnreg else {}),
    )
    pdl = bool(pdl) and gdc_wait is not None and not interpreted() and pdl_device(ssm)
    constexprs.update(PDL=pdl, **({"launch_pdl": True} if pdl else {}))
    prefetch = PREFETCH_INPUTS if prefetch_inputs is None else prefetch_inputs
    rows = (x, B, C) if z is None else (x, z, B, C)
    prefetch = (bool(prefetch) and not interpreted() and prefetch_device(ssm)
                and all(t.stride(-1) == 1 for t in rows))
    constexprs.update(PREFETCH=prefetch, LINES=prefetch_lines(max(t.shape[-1] * t.element_size() for t in rows)))
    return KernelCall(_mamba2_verify_kernel, grid, _tensors(out, x, dt, A, B, C, ssm, state_slots, parents, D, z,
                                                            dt_bias), scalars, constexprs)


def _tensors(out, x, dt, A, B, C, ssm, state_slots, parents, D, z, dt_bias):
    """The kernel's tensor arguments: an absent optional one stands in as a tensor it never reads."""
    return (out, x, dt, A, B, C, ssm, state_slots, state_slots if parents is None else parents,
            A if D is None else D, x if z is None else z, A if dt_bias is None else dt_bias)


def launch_mamba2_verify(out, x, dt, A, B, C, ssm, state_slots, parents, D, z, dt_bias, *, dt_softplus, **tuning):
    """out, x, z [B, N, H, P]; dt [B, N, H]; A, D, dt_bias [H]; B, C [B, N, G, Ns]; ssm [S, H, P, Ns];
    state_slots [B]; parents [B, N] or None; any strides. One launch."""
    call = _verify_call(out, x, dt, A, B, C, ssm, state_slots, parents, D, z, dt_bias, dt_softplus=dt_softplus,
                        **tuning)
    if call is not None:
        call.launch()


def planned_mamba2_verify(out, x, dt, A, B, C, ssm, state_slots, parents, D, z, dt_bias, *, dt_softplus):
    """launch_mamba2_verify fixed for these shapes, strides, dtypes and arguments (_common.planned_launch)."""
    launch = planned_launch(_verify_call(out, x, dt, A, B, C, ssm, state_slots, parents, D, z, dt_bias,
                                         dt_softplus=dt_softplus))

    def run(out, x, dt, A, B, C, ssm, state_slots, parents, D, z, dt_bias, *, dt_softplus):
        launch(*_tensors(out, x, dt, A, B, C, ssm, state_slots, parents, D, z, dt_bias))

    return run
