"""Adapters from the engines' own index conventions to the package's arguments, and what one
request slot costs for an engine's pool sizing.

The package's commit ops (``scatter``, ``scatter_tree``, ``gdn_commit``) take per row b a
destination state slot ``dst_slots[b]``, a buffer slot ``src_slots[b]``, the accepted draft token
(or tree node) ``steps[b]`` and, for trees, ``parents[b, n]`` in [-1, n-1] with -1 for a node that
hangs off the committed history. The engines say the same things differently, and some of the
differences fail quietly:

SGLang (python/sglang/srt/layers/attention/hybrid_linear_attn_backend.py, the EAGLE workers in
python/sglang/srt/speculative/, sgl-kernel's build_tree_efficient):
    * the speculative buffers are indexed by batch row: the source slot is implicit (arange(B));
    * the step is ``last_correct_step_indices`` (chains: ``accept_lens - 1`` where accept_lens
      counts the verified root/bonus token too; trees: the accepted node's index in the request);
    * padded rows carry ``mamba_cache_indices = -1``;
    * trees come as ``retrieve_next_token`` / ``retrieve_next_sibling`` links (first child, next
      sibling, -1 for none) and the conv kernel derives ``retrieve_parent_token`` with the root's
      entry left at 0. Passed to the package as ``parents``, that 0 is a bad link: every node within
      K-2 hops of the root is skipped and the state silently goes stale. ``sglang_parents`` fixes it.
vLLM (vllm/v1/attention/backends/gdn_attn.py, vllm/model_executor/models/qwen3_next.py,
vllm/v1/worker/gpu_model_runner.py):
    * ``num_accepted_tokens`` counts the emitted tokens, bonus included: step = n - 1;
    * ``PAD_SLOT_ID = -1``; a request's state slot is ``spec_state_indices_tensor[:, 0]``
      (``block_table[:, 0]``);
    * inputs are ragged ``[total_tokens, dim]`` with ``query_start_loc``; every spec-decode request
      has num_spec + 1 tokens (padded rows: zero tokens).

Every adapter is a pure function of device tensors built from torch ops (no host sync, no
allocation beyond index tensors of B or B*N elements), so each runs inside a CUDA graph and under
``torch.compile(fullgraph=True)``; each docstring says so. Argument errors raise TypeError /
ValueError naming the argument (checked from shapes and dtypes only, never from values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from .layout import check_layout, physical_nbytes
from .plan import _DTYPES, GatedDeltaNet, Mamba2, ModelShape, make_plan

__all__ = [
    "GatedDeltaNet",
    "Mamba2",
    "PAD_SLOT_ID",
    "SlotBytes",
    "bytes_per_slot",
    "sglang_accepted_steps",
    "sglang_commit_args",
    "sglang_parents",
    "vllm_commit_args",
    "vllm_uniform_view",
]

# SGLang (sglang/kernels/ops/mamba/causal_conv1d_triton.py) and vLLM (vllm/v1/attention/backends/
# utils.py) both pad with -1, which every op of the package skips.
PAD_SLOT_ID = -1

_INDEX_DTYPES = (torch.int32, torch.int64)


def _index_tensor(name: str, value, *, ndim: tuple[int, ...] = (1,)) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {value.dtype}")
    if value.dim() not in ndim:
        shapes = " or ".join(f"{n}-D" for n in ndim)
        raise ValueError(f"{name} must be {shapes}, got shape {tuple(value.shape)}")
    return value


def _same_device(first: str, a: torch.Tensor, second: str, b: torch.Tensor) -> None:
    if a.device != b.device:
        raise ValueError(f"{first} is on {a.device} but {second} is on {b.device}")


def _rows(name: str, value: torch.Tensor, rows: int, rows_name: str) -> torch.Tensor:
    """value's first ``rows`` rows (an engine's cuda-graph buffers may be longer); never fewer."""
    if value.shape[0] < rows:
        raise ValueError(f"{name} has {value.shape[0]} rows, fewer than the {rows} of {rows_name}")
    return value[:rows]


# ---------------------------------------------------------------------------------------------
# SGLang
# ---------------------------------------------------------------------------------------------


def _parents_from_links(next_token: torch.Tensor, next_sibling: torch.Tensor) -> torch.Tensor:
    batch, num_nodes = next_token.shape
    nodes = torch.arange(num_nodes, device=next_token.device, dtype=next_token.dtype).expand(batch, num_nodes)
    spare = torch.full_like(next_token, num_nodes)  # links to nothing land in a spare column

    def valid(link):  # a node is linked to a child or a sibling in [1, N); the root never is
        return (link >= 1) & (link < num_nodes)

    # the parent of every first child: node i for the node next_token[i] names
    pad = torch.zeros(batch, 1, device=next_token.device, dtype=next_token.dtype)
    first_parent = torch.cat([torch.zeros_like(next_token), pad], dim=1)  # unlinked nodes: the root, as SGLang
    first_parent = first_parent.scatter(1, torch.where(valid(next_token), next_token, spare), nodes)[:, :num_nodes]
    # each node's previous sibling (itself for a first child), then pointer doubling to the first one
    head = torch.cat([nodes, pad], dim=1).scatter(1, torch.where(valid(next_sibling), next_sibling, spare), nodes)
    head = head[:, :num_nodes]
    hops = 1
    while hops < num_nodes:  # a fixed count from the shape: log2(N) gathers, no data-dependent loop
        head = head.gather(1, head)
        hops *= 2
    parents = first_parent.gather(1, head)
    return torch.where(nodes == 0, torch.full_like(parents, -1), parents)


def sglang_parents(
    retrieve_parent_token: Optional[torch.Tensor] = None,
    *,
    retrieve_next_token: Optional[torch.Tensor] = None,
    retrieve_next_sibling: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The package's ``parents [B, N]`` from SGLang's EAGLE tree (topk > 1), -1 at the root.

    Give either ``retrieve_parent_token [B, N]`` (what SGLang's verify conv kernel derives; its
    root entry is 0, which is replaced by -1) or the links ``retrieve_next_token`` /
    ``retrieve_next_sibling`` ``[B, N]`` (``spec_info.retrieve_next_token`` / ``retrive_next_token``
    as sgl-kernel's ``build_tree_kernel_efficient`` fills them: the first child and the next sibling
    of node i in the request, -1 for none; node 0 is the verified root). From links, node c named
    as a child of i gets parent i and a sibling gets its left sibling's parent, as SGLang's kernel
    derives them; a node no link reaches gets parent 0 (the root), as there; a link outside
    [1, N-1] is ignored (SGLang's cuda-graph buffers are zeros in padded rows). Links that two
    nodes both claim give an unspecified one of them (they do not occur in SGLang's trees).

    Returns a new int tensor of the input's dtype on its device. Graph-safe: torch ops only
    (scatter, log2(N) gathers), no host sync; CUDA-graph capturable, traceable by
    torch.compile(fullgraph=True).
    """
    if retrieve_parent_token is not None:
        if retrieve_next_token is not None or retrieve_next_sibling is not None:
            raise ValueError("give retrieve_parent_token or retrieve_next_token / retrieve_next_sibling, not both")
        _index_tensor("retrieve_parent_token", retrieve_parent_token, ndim=(2,))
        nodes = torch.arange(retrieve_parent_token.shape[1], device=retrieve_parent_token.device)
        return torch.where(nodes == 0, torch.full_like(retrieve_parent_token, -1), retrieve_parent_token)
    if retrieve_next_token is None or retrieve_next_sibling is None:
        raise ValueError("sglang_parents needs retrieve_parent_token, or both retrieve_next_token and "
                         "retrieve_next_sibling")
    _index_tensor("retrieve_next_token", retrieve_next_token, ndim=(2,))
    _index_tensor("retrieve_next_sibling", retrieve_next_sibling, ndim=(2,))
    if retrieve_next_token.shape != retrieve_next_sibling.shape:
        raise ValueError(f"retrieve_next_token {tuple(retrieve_next_token.shape)} and retrieve_next_sibling "
                         f"{tuple(retrieve_next_sibling.shape)} must have the same shape [B, N]")
    _same_device("retrieve_next_token", retrieve_next_token, "retrieve_next_sibling", retrieve_next_sibling)
    return _parents_from_links(retrieve_next_token, retrieve_next_sibling.to(retrieve_next_token.dtype))


def sglang_accepted_steps(accept_index: torch.Tensor, accept_length: torch.Tensor) -> torch.Tensor:
    """The accepted node of each request from SGLang's tree verify, on the device.

    accept_index: ``[B, num_steps + 1]`` as ``verify_tree_greedy`` (sgl-kernel) fills it: the flat
    index ``b * N + node`` of the root and of each accepted node, -1 after them; accept_length:
    ``[B]`` accepted drafts, the root/bonus NOT counted (``EagleVerifyOutput.accept_length``).
    Returns ``accept_index[b, accept_length[b]] - b * N``, the node index SGLang's EAGLE worker
    passes as ``accepted_steps`` / ``last_correct_step_indices`` (there computed from the
    flattened accepted indices); N is the row stride of the flat index, taken as
    ``accept_index[:, 0]`` (the root of row b is b * N) -- no draft-token count is needed.
    Rows with ``accept_length < 0`` give -1 (skipped). Graph-safe: a gather, no host sync.
    """
    _index_tensor("accept_index", accept_index, ndim=(2,))
    _index_tensor("accept_length", accept_length)
    _same_device("accept_index", accept_index, "accept_length", accept_length)
    if accept_length.shape[0] != accept_index.shape[0]:
        raise ValueError(f"accept_length has {accept_length.shape[0]} rows, accept_index {accept_index.shape[0]}")
    column = accept_length.to(torch.int64).clamp(0, accept_index.shape[1] - 1).unsqueeze(1)
    last = accept_index.to(torch.int64).gather(1, column).squeeze(1)
    steps = last - accept_index[:, 0].to(torch.int64)
    return torch.where(accept_length >= 0, steps, torch.full_like(steps, -1))


def sglang_commit_args(
    mamba_cache_indices: torch.Tensor,
    last_correct_step_indices: Optional[torch.Tensor] = None,
    *,
    accept_lens: Optional[torch.Tensor] = None,
    retrieve_parent_token: Optional[torch.Tensor] = None,
    retrieve_next_token: Optional[torch.Tensor] = None,
    retrieve_next_sibling: Optional[torch.Tensor] = None,
) -> dict:
    """The commit's index arguments from SGLang's tensors at ``update_mamba_state_after_mtp_verify``.

    mamba_cache_indices: ``[B']`` int, the request's mamba pool slot per batch row
        (``forward_metadata.mamba_cache_indices`` / ``state_indices_tensor``), -1 in padded rows;
        B' >= B: only the first B rows are used, as SGLang slices ``[:request_number]``.
    The step, one of:
        last_correct_step_indices: ``[B]`` (SGLang's ``accepted_steps``): the index of the last
            accepted token in the request's verify batch -- chains: accepted drafts, trees: the
            accepted node. Passed as it is.
        accept_lens: ``[B]`` tokens accepted counting the verified root/bonus token (spec v2's
            ``accept_lens``, the EAGLE worker's ``accepted_length``, DFLASH's ``commit_lens``):
            step = accept_lens - 1 (chains only: a tree's step is a node, see
            ``sglang_accepted_steps``).
    Trees (topk > 1): ``retrieve_parent_token`` or ``retrieve_next_token`` + ``retrieve_next_sibling``
        (``[B', N]``), converted by ``sglang_parents`` (the root's 0 becomes -1).

    Returns ``{"dst_slots", "src_slots", "steps"}`` (+ ``"parents"`` for a tree): ``dst_slots`` the
    pool slots, ``src_slots = arange(B)`` (SGLang indexes its speculative buffers by batch row, so
    verify must capture into buffer slot b = the batch row too), ``steps`` int64 with -1 wherever
    the destination is padding. The keys are ``gdn_commit``'s (and ``scatter``'s) argument names:
    ``gdn_commit(ssm, conv, buffer, gates, w, **args, ...)``; ``scatter_tree`` takes them
    positionally (dst, src, steps, parents). Graph-safe: torch ops on the device only, no host
    sync; CUDA-graph capturable, traceable by torch.compile(fullgraph=True).
    """
    _index_tensor("mamba_cache_indices", mamba_cache_indices)
    if (last_correct_step_indices is None) == (accept_lens is None):
        raise ValueError("sglang_commit_args needs exactly one of last_correct_step_indices and accept_lens")
    if last_correct_step_indices is not None:
        steps = _index_tensor("last_correct_step_indices", last_correct_step_indices).to(torch.int64)
        step_name = "last_correct_step_indices"
    else:
        steps = _index_tensor("accept_lens", accept_lens).to(torch.int64) - 1
        step_name = "accept_lens"
    _same_device("mamba_cache_indices", mamba_cache_indices, step_name, steps)
    batch = steps.shape[0]
    dst_slots = _rows("mamba_cache_indices", mamba_cache_indices, batch, step_name)
    steps = torch.where(dst_slots >= 0, steps, torch.full_like(steps, -1))
    args = {
        "dst_slots": dst_slots,
        "src_slots": torch.arange(batch, device=dst_slots.device, dtype=dst_slots.dtype),
        "steps": steps,
    }
    if retrieve_parent_token is not None or retrieve_next_token is not None or retrieve_next_sibling is not None:
        if accept_lens is not None:
            raise ValueError("accept_lens gives a chain's step; for a tree pass last_correct_step_indices (the "
                             "accepted node: sglang_accepted_steps)")
        parents = sglang_parents(retrieve_parent_token, retrieve_next_token=retrieve_next_token,
                                 retrieve_next_sibling=retrieve_next_sibling)
        _same_device("mamba_cache_indices", mamba_cache_indices, "the tree links", parents)
        args["parents"] = _rows("the tree links", parents, batch, step_name)
    return args


# ---------------------------------------------------------------------------------------------
# vLLM
# ---------------------------------------------------------------------------------------------


def vllm_commit_args(
    state_indices: torch.Tensor,
    num_accepted_tokens: torch.Tensor,
    *,
    buffer_slots: Optional[torch.Tensor] = None,
) -> dict:
    """The commit's index arguments from vLLM's GDN / Mamba metadata.

    state_indices: ``[B]`` (``state_indices_tensor``, ``block_table[:, 0]``) or ``[B, 1 + num_spec]``
        (``spec_state_indices_tensor``; column 0, the request's own slot, is used -- with the
        package the other columns hold nothing), ``PAD_SLOT_ID = -1`` in padded rows.
    num_accepted_tokens: ``[B]`` tokens emitted by the verify, the bonus token included (>= 1;
        vLLM fills padded rows with 1): step = n - 1, the conv window vLLM reads at offset n - 1 of
        its widened conv state.
    buffer_slots: ``[B]``, where verify captured each row; default: the state slot itself (a
        request keeps its slot across steps, so the commit may run in a later step than the verify).

    Returns ``{"dst_slots", "src_slots", "steps"}`` (``steps`` int64, -1 where the destination is
    padding or n < 1), keyed by ``gdn_commit`` / ``scatter`` argument names. Graph-safe: torch
    ops on the device only, no host sync; CUDA-graph capturable, traceable by
    torch.compile(fullgraph=True).
    """
    _index_tensor("state_indices", state_indices, ndim=(1, 2))
    _index_tensor("num_accepted_tokens", num_accepted_tokens)
    _same_device("state_indices", state_indices, "num_accepted_tokens", num_accepted_tokens)
    dst_slots = state_indices[:, 0] if state_indices.dim() == 2 else state_indices
    if dst_slots.shape[0] != num_accepted_tokens.shape[0]:
        raise ValueError(f"state_indices has {dst_slots.shape[0]} rows but num_accepted_tokens "
                         f"{num_accepted_tokens.shape[0]}: select the spec rows of both alike")
    steps = num_accepted_tokens.to(torch.int64) - 1
    steps = torch.where(dst_slots >= 0, steps, torch.full_like(steps, -1))
    if buffer_slots is None:
        src_slots = dst_slots
    else:
        src_slots = _index_tensor("buffer_slots", buffer_slots)
        _same_device("state_indices", state_indices, "buffer_slots", buffer_slots)
        if src_slots.shape[0] != dst_slots.shape[0]:
            raise ValueError(f"buffer_slots has {src_slots.shape[0]} rows, state_indices {dst_slots.shape[0]}")
    return {"dst_slots": dst_slots, "src_slots": src_slots, "steps": steps}


def vllm_uniform_view(
    x: torch.Tensor, query_start_loc: torch.Tensor, num_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A ragged ``[total_tokens, *rest]`` batch (vLLM's ``mixed_qkv`` with ``query_start_loc``)
    seen as ``[B, N, *rest]`` when every request has N = ``num_tokens`` tokens, no copy.

    query_start_loc: ``[B + 1]`` int, request b's tokens at rows [qsl[b], qsl[b + 1]).
    Returns ``(view, rows_ok)``: ``view = x[:B*N].view(B, N, *rest)`` (x's first B*N rows must be
    contiguous along the token axis in the ``[B, N]`` sense: ``x.view`` raises otherwise) and
    ``rows_ok [B]`` bool, True where request b's tokens are exactly rows b*N .. b*N+N-1. What is
    ASSUMED: vLLM packs spec-decode requests back to back, each num_spec + 1 tokens (true when
    every spec row verifies the same number of drafts and prefill tokens are split off by
    ``spec_token_indx``); rows_ok is the device-side check of it, so mask the slots with it
    (``torch.where(rows_ok, slots, -1)``) rather than read it on the host -- vLLM's padded rows
    (zero tokens) come out False and are skipped. Only x's length is checked on the host (a shape,
    no sync): ValueError naming x if it has fewer than B*N rows. Graph-safe: a view plus index
    arithmetic on the device; CUDA-graph capturable, traceable by torch.compile(fullgraph=True).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    _index_tensor("query_start_loc", query_start_loc)
    _same_device("x", x, "query_start_loc", query_start_loc)
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
        raise ValueError(f"num_tokens must be an int >= 1, got {num_tokens!r}")
    if x.dim() < 1:
        raise ValueError("x must be [total_tokens, ...], got a 0-D tensor")
    batch = query_start_loc.shape[0] - 1
    if batch < 0:
        raise ValueError("query_start_loc must have B + 1 >= 1 entries, got an empty tensor")
    if x.shape[0] < batch * num_tokens:
        raise ValueError(f"x has {x.shape[0]} token rows, fewer than B * N = {batch} * {num_tokens} "
                         f"(B from query_start_loc)")
    view = x[: batch * num_tokens].view(batch, num_tokens, *x.shape[1:])
    starts = torch.arange(batch, device=x.device, dtype=torch.int64) * num_tokens
    begin, end = query_start_loc[:-1].to(torch.int64), query_start_loc[1:].to(torch.int64)
    rows_ok = (begin == starts) & (end == starts + num_tokens)
    return view, rows_ok


# ---------------------------------------------------------------------------------------------
# Pool sizing
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SlotBytes:
    """Bytes of speculative state one request slot costs, per tensor-parallel rank, all layers.

    conv: the package's conv-input buffer of the chosen layout (``physical_nbytes``);
    gates: the fp32 gates of the replay commit (``alloc_gates``; 0 without a mixer);
    total: conv + gates -- what ``ConvWindowCache(..., num_slots=1, gate_heads=Hv).nbytes`` holds, the
        number to charge per running request in a pool;
    dense_conv: dense conv windows, D * (K-1) columns (SGLang's ``intermediate_conv_window``);
    snapshot: dense conv windows + one fp32 recurrent state per draft token (SGLang's
        ``intermediate_conv_window`` + ``intermediate_ssm``: the snapshot design);
    dedup_snapshot: the deduplicated conv buffer + the same state snapshots (a conv-only integration);
    input_replay: the engines' ReplaySSM (conv state widened by D columns, cached post-conv k, v /
        x, B and gates per token) -- the last three from ``plan.make_plan``, None without a mixer.
    """

    conv: int
    gates: int
    total: int
    dense_conv: int
    snapshot: Optional[int]
    dedup_snapshot: Optional[int]
    input_replay: Optional[int]


def bytes_per_slot(
    num_layers: int,
    dim: int,
    num_draft: int,
    kernel_size: int = 4,
    *,
    dtype: torch.dtype = torch.bfloat16,
    layout: str = "token_major",
    mixer: Union[GatedDeltaNet, Mamba2, None] = None,
    tree: bool = False,
) -> SlotBytes:
    """What one request slot of the package's speculative buffers costs, for an engine's pool sizing.

    num_layers: the mixer layers with a conv (on this pipeline stage); dim: conv_dim PER RANK
    (``dim_per_rank``); num_draft: draft tokens per request in the verify batch (SGLang:
    ``speculative_num_draft_tokens``; vLLM: num_speculative_tokens + 1), tree nodes for a tree;
    dtype: the conv buffer's dtype (the conv state's); layout: the buffer's layout.
    mixer: the layer's dims per rank, ``GatedDeltaNet(Hk, dk, Hv, dv)`` or ``Mamba2(H, P, G, Ns)``
    (from ``sgl_convwin.plan``, re-exported here), with ``mixer.conv_dim == dim``: adds the replay
    commit's gates and the other designs' sizes, computed by ``plan.make_plan`` (recurrent
    states and gates in fp32, as the planner assumes). Without a mixer only the conv buffer is
    sized (gates 0). The package's replay commit is Gated DeltaNet's (``gdn_commit``); for a
    Mamba2 mixer ``gates`` sizes the one-gate (dt) buffer of ``alloc_gates(num_gates=1)``, and an
    engine that keeps Mamba2 state snapshots charges ``dedup_snapshot`` instead. tree: size
    ``input_replay`` as engines do for trees (dense windows); the package's sizes do not depend
    on it. Pure arithmetic on Python ints; raises ValueError / TypeError naming the argument.
    """
    check_layout(layout)
    if dtype not in _DTYPES.values():
        raise TypeError(f"dtype must be float32, float16 or bfloat16, got {dtype}")
    conv = physical_nbytes(layout, num_layers, 1, dim, num_draft, kernel_size, dtype)
    dense_conv = physical_nbytes("dense", num_layers, 1, dim, num_draft, kernel_size, dtype)
    if mixer is None:
        return SlotBytes(conv, 0, conv, dense_conv, None, None, None)
    if not isinstance(mixer, (GatedDeltaNet, Mamba2)):
        raise TypeError(f"mixer must be a GatedDeltaNet or Mamba2 (sgl_convwin.plan), got {type(mixer).__name__}")
    if mixer.conv_dim != dim:
        raise ValueError(f"mixer's conv_dim {mixer.conv_dim} differs from dim {dim} (give both per rank)")
    dtype_name = {value: key for key, value in _DTYPES.items()}[dtype]
    shape = ModelShape("bytes_per_slot", num_layers, dim, kernel_size, mixer.state_elements, num_draft,
                       2 if tree else 1, "sgl_convwin.integrations.bytes_per_slot", mixer)
    plan = make_plan(shape, tp=1, draft_tokens=num_draft, topk=2 if tree else 1, requests=1, dtype=dtype_name)
    designs = {design.key: design for design in plan.designs}
    gates = designs["replay"].parts["gates"]
    return SlotBytes(conv, gates, conv + gates, dense_conv, designs["snapshot"].bytes_per_slot,
                     designs["dedup_snapshot"].bytes_per_slot, designs["input_replay"].bytes_per_slot)

