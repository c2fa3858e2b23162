"""Adapters from the engines' own tensors to the package's arguments, and what one request slot
costs for an engine's pool sizing.

The package's commit ops (``scatter``, ``scatter_tree``, ``gdn_commit``) take per row b a
destination state slot ``dst_slots[b]``, a buffer slot ``src_slots[b]``, the index of the last
accepted draft token (or tree node) ``steps[b]`` -- an index, not a count -- and, for trees,
``parents[b, n]`` in [-1, n-1] with -1 for a node that hangs off the committed history. The
engines hold the same facts differently, and some of the differences fail quietly:

SGLang (python/sglang/srt/speculative/spec_utils.py, the GDN backend
python/sglang/srt/layers/attention/linear/, sgl-kernel's build_tree_efficient / verify_tree_greedy):
    * the speculative buffers are indexed by batch row: the source slot is implicit (arange(B));
    * the commit site holds ``accept_lens`` (tokens accepted, the bonus token counted) and
      ``accept_index`` (flat ``b * N + node`` of each accepted token); the step is
      ``accept_index[b, accept_lens[b] - 1] - b * N`` (``_verify_commit_step_indices``), which for a
      chain is ``accept_lens - 1``; ``num_correct_drafts`` (= accept_lens - 1) is the count without
      the bonus token;
    * padded rows carry ``mamba_cache_indices = -1`` (``PAD_SLOT_ID``);
    * the GDN recurrent state is ``[.., Hv, dv, dk]`` (``Mamba2StateShape.create`` with head_dim = dv,
      state_size = dk): pass ``temporal.transpose(-1, -2)`` to the ops, which take ``[.., Hv, dk, dv]``;
    * trees come as ``retrieve_next_token`` / ``retrieve_next_sibling`` links (first child, next
      sibling, -1 for none) and the conv kernel derives ``retrieve_parent_token`` with the root's
      entry left at 0. Passed to the package as ``parents``, that 0 is a bad link: every node within
      K-2 hops of the root is skipped and the state silently goes stale. ``sglang_parents`` fixes it.
vLLM (vllm/v1/attention/backends/gdn_attn.py, vllm/model_executor/layers/mamba/gdn/
qwen_gdn_linear_attn.py, vllm/model_executor/layers/mamba/mamba_utils.py):
    * ``num_accepted_tokens`` counts the emitted tokens, bonus included: step = n - 1 (0 for a
      stale row: skipped);
    * the spec batch is ragged: request b's tokens are rows ``[qsl[b], qsl[b+1])`` of
      ``spec_query_start_loc``, at most num_spec + 1 of them (fewer when the scheduler dropped
      drafts); padded rows have zero tokens;
    * padded rows of ``spec_state_indices_tensor`` hold ``NULL_BLOCK_ID = 0``, a valid slot number:
      padding is recognised from the token counts (or the number of real requests), never from
      the slot value;
    * the recurrent state is ``[blocks, Hv, dv, dk]`` (pass ``.transpose(-1, -2)``), the conv state
      ``[blocks, K-1, dim]`` by default (pass ``.transpose(-1, -2)``) or ``[blocks, dim, K-1]``;
    * only ``mamba_cache_mode="none"`` keeps a request in one state block across steps; with
      prefix caching on, vLLM picks "align" for these models: the adapters take the mode and
      refuse the others.
transformers (5.x, src/transformers/cache_utils.py ``LinearAttentionLayer``; the Qwen3-Next, Qwen3.5
and Nemotron-H mixers):
    * the conv state is ``[B, dim, K]``, one dead column more than the package's K-1
      (``transformers_layer_states`` takes the newest K-1 as a view);
    * the recurrent states are already ``[B, Hv, dk, dv]`` / ``[B, H, P, Ns]``: no transpose.

Every adapter is a pure function of device tensors built from torch ops (no host sync, no
allocation beyond index tensors of B or B*N elements, and the padded copy of a ragged batch), so
each runs inside a CUDA graph and under ``torch.compile(fullgraph=True)``. Argument errors raise
TypeError / ValueError naming the argument (checked from shapes and dtypes only, never from values).
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
    "NULL_BLOCK_ID",
    "PAD_SLOT_ID",
    "SlotBytes",
    "bytes_per_slot",
    "sglang_accepted_steps",
    "sglang_commit_args",
    "sglang_parents",
    "transformers_layer_states",
    "vllm_commit_args",
    "vllm_pad_batch",
    "vllm_token_counts",
    "vllm_unpad_batch",
    "vllm_verify_slots",
]

# SGLang pads mamba_cache_indices with -1 (null_block_id=-1 at its commit sites), which every op skips.
PAD_SLOT_ID = -1
# vLLM pads state indices with its null block (vllm/v1/attention/backends/utils.py), a real slot number.
NULL_BLOCK_ID = 0

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


def _one_count(names_values: dict) -> tuple[str, torch.Tensor]:
    given = {name: value for name, value in names_values.items() if value is not None}
    if len(given) != 1:
        raise ValueError(f"give exactly one of {', '.join(names_values)}; got {len(given) or 'none'}")
    name, value = next(iter(given.items()))
    return name, _index_tensor(name, value)


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


def sglang_accepted_steps(
    accept_index: torch.Tensor,
    *,
    accept_lens: Optional[torch.Tensor] = None,
    num_correct_drafts: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The package's ``steps [B]`` (index of the last accepted token or node) from SGLang's verify.

    accept_index: ``[B, W]`` as ``verify_tree_greedy`` fills it: the flat index ``b * N + node`` of
        the verified root and of each accepted node, -1 after them (chains and trees alike).
    The count, one of (keywords, so a count is never taken for the other):
        accept_lens: ``[B]`` tokens accepted, the bonus token counted (what SGLang's commit site,
            ``commit_mamba_states_after_verify``, holds);
        num_correct_drafts: ``[B]`` accepted drafts, the bonus not counted (``accept_lens - 1``).
    Returns int64 ``accept_index[b, accept_lens[b] - 1] - b * N`` as SGLang's
    ``_verify_commit_step_indices`` computes it (its own test: accept_lens [3, 1, 5] -> [2, 0, 4]);
    N is the row stride of the flat index, taken as ``accept_index[:, 0]`` (the root of row b is
    b * N). Rows whose count is out of range (accept_lens < 1 or > W) or that name no node give -1
    (skipped). Graph-safe: a gather, no host sync.
    """
    _index_tensor("accept_index", accept_index, ndim=(2,))
    name, count = _one_count({"accept_lens": accept_lens, "num_correct_drafts": num_correct_drafts})
    _same_device("accept_index", accept_index, name, count)
    if count.shape[0] != accept_index.shape[0]:
        raise ValueError(f"{name} has {count.shape[0]} rows, accept_index {accept_index.shape[0]}")
    column = count.to(torch.int64) - (1 if name == "accept_lens" else 0)
    in_range = (column >= 0) & (column < accept_index.shape[1])
    last = accept_index.to(torch.int64).gather(1, column.clamp(0, accept_index.shape[1] - 1).unsqueeze(1)).squeeze(1)
    steps = last - accept_index[:, 0].to(torch.int64)
    return torch.where(in_range & (last >= 0), steps, torch.full_like(steps, -1))


def sglang_commit_args(
    mamba_cache_indices: torch.Tensor,
    last_correct_step_indices: Optional[torch.Tensor] = None,
    *,
    accept_lens: Optional[torch.Tensor] = None,
    num_correct_drafts: Optional[torch.Tensor] = None,
    accept_index: Optional[torch.Tensor] = None,
    retrieve_parent_token: Optional[torch.Tensor] = None,
    retrieve_next_token: Optional[torch.Tensor] = None,
    retrieve_next_sibling: Optional[torch.Tensor] = None,
) -> dict:
    """The commit's index arguments from SGLang's tensors at ``update_mamba_state_after_mtp_verify``.

    mamba_cache_indices: ``[B']`` int, the request's mamba pool slot per batch row
        (``forward_metadata.mamba_cache_indices``), -1 in padded rows; B' >= B: only the first B
        rows are used, as SGLang slices ``[:request_number]``.
    The step, one of:
        last_correct_step_indices: ``[B]``, SGLang's own step (``_verify_commit_step_indices``):
            the index of the last accepted token or node. Passed as it is.
        accept_lens: ``[B]`` tokens accepted, the bonus token counted (the commit site's
            ``accept_lens``); num_correct_drafts: ``[B]`` the same without the bonus token. With
            ``accept_index`` (``[B, W]``, as ``verify_tree_greedy`` fills it) the step is
            ``sglang_accepted_steps`` -- chains and trees; without it (chains only) the step is
            ``accept_lens - 1`` / ``num_correct_drafts``.
    Trees (topk > 1): ``retrieve_parent_token`` or ``retrieve_next_token`` + ``retrieve_next_sibling``
        (``[B', N]``), converted by ``sglang_parents`` (the root's 0 becomes -1).

    Returns ``{"dst_slots", "src_slots", "steps"}`` (+ ``"parents"`` for a tree): ``dst_slots`` the
    pool slots, ``src_slots = arange(B)`` (SGLang indexes its speculative buffers by batch row, so
    verify must capture into buffer slot b = the batch row too), ``steps`` int64 with -1 wherever
    the destination is padding. The keys are ``gdn_commit``'s (and ``scatter``'s) argument names:
    ``gdn_commit(temporal.transpose(-1, -2), conv, buffer, gates, w, **args, ...)``;
    ``scatter_tree`` takes them positionally (dst, src, steps, parents). Graph-safe: torch ops on
    the device only, no host sync; CUDA-graph capturable, traceable by torch.compile(fullgraph=True).
    """
    _index_tensor("mamba_cache_indices", mamba_cache_indices)
    step_name, step_value = _one_count({"last_correct_step_indices": last_correct_step_indices,
                                        "accept_lens": accept_lens, "num_correct_drafts": num_correct_drafts})
    is_tree = retrieve_parent_token is not None or retrieve_next_token is not None or retrieve_next_sibling is not None
    if step_name == "last_correct_step_indices":
        if accept_index is not None:
            raise ValueError("accept_index turns a count into a step; last_correct_step_indices already is one")
        steps = step_value.to(torch.int64)
    elif accept_index is not None:
        steps = sglang_accepted_steps(accept_index, **{step_name: step_value})
    elif is_tree:
        raise ValueError(f"{step_name} counts a tree's accepted tokens but not which node: pass accept_index "
                         "too (or last_correct_step_indices)")
    else:
        steps = step_value.to(torch.int64) - (1 if step_name == "accept_lens" else 0)
    _same_device("mamba_cache_indices", mamba_cache_indices, step_name, steps)
    batch = steps.shape[0]
    dst_slots = _rows("mamba_cache_indices", mamba_cache_indices, batch, step_name)
    steps = torch.where(dst_slots >= 0, steps, torch.full_like(steps, -1))
    args = {
        "dst_slots": dst_slots,
        "src_slots": torch.arange(batch, device=dst_slots.device, dtype=dst_slots.dtype),
        "steps": steps,
    }
    if is_tree:
        parents = sglang_parents(retrieve_parent_token, retrieve_next_token=retrieve_next_token,
                                 retrieve_next_sibling=retrieve_next_sibling)
        _same_device("mamba_cache_indices", mamba_cache_indices, "the tree links", parents)
        args["parents"] = _rows("the tree links", parents, batch, step_name)
    return args


# ---------------------------------------------------------------------------------------------
# vLLM
# ---------------------------------------------------------------------------------------------


def _query_start_loc(query_start_loc: torch.Tensor, batch: Optional[int] = None) -> torch.Tensor:
    _index_tensor("query_start_loc", query_start_loc)
    if query_start_loc.shape[0] < 1:
        raise ValueError("query_start_loc must have B + 1 >= 1 entries, got an empty tensor")
    if batch is not None:
        query_start_loc = _rows("query_start_loc", query_start_loc, batch + 1, "the state indices + 1")
    return query_start_loc.to(torch.int64)


def vllm_token_counts(query_start_loc: torch.Tensor) -> torch.Tensor:
    """Tokens of each request, ``[B]`` int64, from ``spec_query_start_loc [B + 1]``: 0 in padded
    rows (vLLM repeats the last offset there), fewer than num_spec + 1 where drafts were dropped."""
    qsl = _query_start_loc(query_start_loc)
    return qsl[1:] - qsl[:-1]


def vllm_pad_batch(x: torch.Tensor, query_start_loc: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """A ragged ``[total_tokens, *rest]`` batch (vLLM's ``mixed_qkv_spec``, ``a``, ``b``, g or beta
    with ``spec_query_start_loc``) as a new ``[B, N, *rest]`` tensor, N = ``num_tokens`` =
    num_spec + 1: row b holds request b's tokens, then its last token repeated (the positions past
    a request's count are never committed; a request with no tokens gets an arbitrary row).

    query_start_loc: ``[B + 1]`` int, request b's tokens at rows [qsl[b], qsl[b + 1]), at most N
    of them. A gather of B*N rows (a copy: the ops take ``[B, N, dim]`` with strides, and ragged
    offsets are not strides). Graph-safe: no host sync.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 1:
        raise ValueError("x must be [total_tokens, ...], got a 0-D tensor")
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
        raise ValueError(f"num_tokens must be an int >= 1, got {num_tokens!r}")
    qsl = _query_start_loc(query_start_loc)
    _same_device("x", x, "query_start_loc", qsl)
    batch = qsl.shape[0] - 1
    if x.shape[0] == 0:
        return x.new_zeros(batch, num_tokens, *x.shape[1:])
    positions = torch.arange(num_tokens, device=x.device, dtype=torch.int64)
    rows = torch.minimum(qsl[:-1, None] + positions, (qsl[1:, None] - 1)).clamp(0, x.shape[0] - 1)
    return x.index_select(0, rows.flatten()).view(batch, num_tokens, *x.shape[1:])


def vllm_unpad_batch(dst: torch.Tensor, padded: torch.Tensor, query_start_loc: torch.Tensor) -> None:
    """Write ``padded [B, N, *rest]`` back into the ragged ``dst [total_tokens, *rest]``:
    ``dst[qsl[b] + t] = padded[b, t]`` for t < request b's count; rows of no request (the padded
    tail) keep their values. In place, no host sync (each row finds its request by a
    ``searchsorted`` on the device)."""
    for name, value in (("dst", dst), ("padded", padded)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    qsl = _query_start_loc(query_start_loc)
    batch = qsl.shape[0] - 1
    if padded.dim() < 2 or padded.shape[0] != batch or padded.shape[2:] != dst.shape[1:]:
        raise ValueError(f"padded must be [B={batch}, N, *{tuple(dst.shape[1:])}] to match dst and "
                         f"query_start_loc, got {tuple(padded.shape)}")
    _same_device("dst", dst, "padded", padded)
    _same_device("dst", dst, "query_start_loc", qsl)
    if batch == 0 or dst.shape[0] == 0:
        return
    num_tokens = padded.shape[1]
    rows = torch.arange(dst.shape[0], device=dst.device, dtype=torch.int64)
    request = torch.searchsorted(qsl[1:].contiguous(), rows, right=True)
    position = rows - qsl[request.clamp(max=batch - 1)]
    owned = (request < batch) & (position >= 0) & (position < num_tokens)
    values = padded[request.clamp(max=batch - 1), position.clamp(0, num_tokens - 1)]
    dst.copy_(torch.where(owned.view(-1, *([1] * (dst.dim() - 1))), values.to(dst.dtype), dst))


def _vllm_cache_mode(mamba_cache_mode) -> None:
    """Refuse every vLLM mamba_cache_mode but "none" (required of the caller: vLLM's own default
    for these models with prefix caching on is "align")."""
    if mamba_cache_mode != "none":
        raise ValueError(f"mamba_cache_mode={mamba_cache_mode!r} is not supported: in 'align' mode "
                         "mamba_get_block_table_tensor moves a request's state block with its length and in "
                         "'all' mode each position has its own block, so the verify's buffer slot is not the "
                         "request's slot at commit time; run vLLM without prefix caching (its mode is then "
                         "'none') and pass vllm_config.cache_config.mamba_cache_mode")


def vllm_verify_slots(state_indices: torch.Tensor, query_start_loc: torch.Tensor, *,
                      mamba_cache_mode: str) -> torch.Tensor:
    """The verify's slots ``[B]`` from vLLM's spec metadata: the request's state block
    (``spec_state_indices_tensor[:, 0]``), -1 where the request has no tokens (vLLM's padded rows,
    whose block is ``NULL_BLOCK_ID`` = 0, a real slot number). ``mamba_cache_mode``: vLLM's
    (``vllm_config.cache_config.mamba_cache_mode``), "none" only (vllm_commit_args). Graph-safe."""
    _vllm_cache_mode(mamba_cache_mode)
    _index_tensor("state_indices", state_indices, ndim=(1, 2))
    slots = state_indices[:, 0] if state_indices.dim() == 2 else state_indices
    qsl = _query_start_loc(query_start_loc, slots.shape[0])
    _same_device("state_indices", state_indices, "query_start_loc", qsl)
    counts = qsl[1:] - qsl[:-1]
    return torch.where(counts > 0, slots, torch.full_like(slots, -1))


def vllm_commit_args(
    state_indices: torch.Tensor,
    num_accepted_tokens: torch.Tensor,
    *,
    query_start_loc: Optional[torch.Tensor] = None,
    num_reqs: Optional[int] = None,
    buffer_slots: Optional[torch.Tensor] = None,
    mamba_cache_mode: str,
) -> dict:
    """The commit's index arguments from vLLM's GDN / Mamba metadata of the step just verified.

    state_indices: ``[B]`` or ``[B, 1 + num_spec]`` (``spec_state_indices_tensor``; column 0, the
        request's own block, is used), ``NULL_BLOCK_ID`` (0) in padded rows.
    num_accepted_tokens: ``[B]`` tokens emitted by the verify, the bonus token included
        (the V1 runner's ``_update_states_after_model_execute``, in batch order): step = n - 1;
        n = 0 (a stale row) skips.
    What marks padding, at least one of (vLLM's padded rows carry slot 0, a real slot number):
        query_start_loc: ``[B + 1]`` (``spec_query_start_loc``): rows with no tokens are padding,
            and n above a row's token count is skipped;
        num_reqs: the number of real (spec) requests, a Python int (``num_spec_decodes``).
    buffer_slots: ``[B]``, where verify captured each row; default: the state block itself (a
        request keeps its block across steps in ``mamba_cache_mode="none"``).
    mamba_cache_mode: vLLM's cache mode (``vllm_config.cache_config.mamba_cache_mode``), required:
        only "none" is supported ("align", vLLM's default for these models with prefix caching,
        moves a request's block with its length, "all" keeps a block per position: the buffer slot
        and the state slot of a request would differ between the verify and the next step).

    Returns ``{"dst_slots", "src_slots", "steps"}`` (``steps`` int64; ``steps`` and ``dst_slots``
    -1 in skipped rows), keyed by ``gdn_commit`` / ``scatter`` argument names. Graph-safe: torch ops
    on the device only, no host sync.
    """
    _vllm_cache_mode(mamba_cache_mode)
    _index_tensor("state_indices", state_indices, ndim=(1, 2))
    _index_tensor("num_accepted_tokens", num_accepted_tokens)
    _same_device("state_indices", state_indices, "num_accepted_tokens", num_accepted_tokens)
    if query_start_loc is None and num_reqs is None:
        raise ValueError("vllm_commit_args needs query_start_loc or num_reqs: vLLM pads state indices with "
                         "NULL_BLOCK_ID = 0, a real slot number, so padding is known only from the token counts "
                         "or the number of real requests")
    dst_slots = state_indices[:, 0] if state_indices.dim() == 2 else state_indices
    batch = dst_slots.shape[0]
    if num_accepted_tokens.shape[0] != batch:
        raise ValueError(f"state_indices has {batch} rows but num_accepted_tokens "
                         f"{num_accepted_tokens.shape[0]}: select the spec rows of both alike")
    counts = num_accepted_tokens.to(torch.int64)
    real = counts >= 1
    if query_start_loc is not None:
        qsl = _query_start_loc(query_start_loc, batch)
        _same_device("state_indices", state_indices, "query_start_loc", qsl)
        real = real & (counts <= qsl[1:] - qsl[:-1])
    if num_reqs is not None:
        if isinstance(num_reqs, bool) or not isinstance(num_reqs, int) or not 0 <= num_reqs <= batch:
            raise ValueError(f"num_reqs must be an int in [0, {batch}], got {num_reqs!r}")
        real = real & (torch.arange(batch, device=dst_slots.device) < num_reqs)
    steps = torch.where(real, counts - 1, torch.full_like(counts, -1))
    if buffer_slots is None:
        src_slots = dst_slots
    else:
        src_slots = _index_tensor("buffer_slots", buffer_slots)
        _same_device("state_indices", state_indices, "buffer_slots", buffer_slots)
        if src_slots.shape[0] != batch:
            raise ValueError(f"buffer_slots has {src_slots.shape[0]} rows, state_indices {batch}")
    dst_slots = torch.where(real, dst_slots, torch.full_like(dst_slots, -1))
    return {"dst_slots": dst_slots, "src_slots": src_slots, "steps": steps}


# ---------------------------------------------------------------------------------------------
# transformers
# ---------------------------------------------------------------------------------------------


def transformers_layer_states(
    conv_states: torch.Tensor, recurrent_states: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The package's ``(ssm_state, conv_state)`` for one linear-attention layer of a transformers
    cache, as views: the ops write the model's own cache in place.

    transformers 5.x (``cache_utils.LinearAttentionLayer``; Qwen3-Next, Qwen3.5, Nemotron-H) keeps
    per layer ``conv_states[0]`` ``[B, dim, K]``: K columns, oldest first, where the package keeps
    K-1. Its ``causal_conv1d_update`` concatenates the state with the new input, convolves, and
    keeps the last K; the conv reads only the newest K-1 of them, so column 0 is dead. The view
    returned is the newest K-1 columns; a commit leaves column 0 as it was (never read).
    ``recurrent_states[0]`` is ``[B, Hv, dk, dv]`` for Gated DeltaNet
    (``torch_recurrent_gated_delta_rule``: ``S[k, v]``, ``o = S^T q``) and ``[B, H, P, Ns]`` for
    Mamba2 (``mamba2_selective_state_update``): the package's orientations already -- unlike
    SGLang's and vLLM's ``[.., Hv, dv, dk]``, no ``.transpose(-1, -2)`` here.

    conv_states: ``[B, dim, K]``; recurrent_states: ``[B, ...]`` (4-D), same B and device.
    Returns ``ssm_state [1, B, ...]`` and ``conv_state [1, B, dim, K-1]`` (a one-layer pool each,
    the form the commit ops take; ``ssm_state[0]`` is the ``[S, ...]`` pool ``gdn_verify`` takes).
    """
    if not isinstance(conv_states, torch.Tensor) or not isinstance(recurrent_states, torch.Tensor):
        raise TypeError("conv_states and recurrent_states must be torch.Tensors (the layer's states[0])")
    if conv_states.dim() != 3 or conv_states.shape[-1] < 2:
        raise ValueError(f"conv_states must be [B, dim, K] with K >= 2, got shape {tuple(conv_states.shape)}")
    if recurrent_states.dim() != 4:
        raise ValueError(f"recurrent_states must be 4-D [B, heads, ., .], got shape {tuple(recurrent_states.shape)}")
    if recurrent_states.shape[0] != conv_states.shape[0]:
        raise ValueError(f"recurrent_states has {recurrent_states.shape[0]} rows, conv_states {conv_states.shape[0]}")
    _same_device("conv_states", conv_states, "recurrent_states", recurrent_states)
    return recurrent_states.unsqueeze(0), conv_states[..., 1:].unsqueeze(0)


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
        x, B and gates per token) -- the last three from ``plan.make_plan``, None without a mixer;
    ring: the ring design's rows, gates and cursor (``alloc_ring`` / ``alloc_mamba2_ring`` /
        ``RingCache``, checkpoint excluded): ``RingCache(..., num_slots=1, capacity=...).nbytes``
        (Mamba2: ``num_gates=1``); None without a mixer.
    """

    conv: int
    gates: int
    total: int
    dense_conv: int
    snapshot: Optional[int]
    dedup_snapshot: Optional[int]
    input_replay: Optional[int]
    ring: Optional[int] = None


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
    capacity: Optional[int] = None,
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
    sized (gates 0). For a Gated DeltaNet mixer ``gates`` sizes ``gdn_commit``'s two-gate buffer,
    for a Mamba2 mixer ``mamba2_commit``'s one-gate (dt) buffer of ``alloc_gates(num_gates=1)``; an
    engine that keeps Mamba2 state snapshots charges ``dedup_snapshot`` instead. tree: size
    ``input_replay`` as engines do for trees (dense windows); the package's sizes do not depend
    on it. capacity: the ring's R (default ``plan.default_capacity(num_draft)``: 16, or N if larger),
    sizing ``ring`` for either mixer (ValueError below num_draft). Pure arithmetic on
    Python ints; raises ValueError / TypeError naming the argument.
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
    plan = make_plan(shape, tp=1, draft_tokens=num_draft, topk=2 if tree else 1, requests=1, dtype=dtype_name,
                     capacity=capacity)
    designs = {design.key: design for design in plan.designs}
    gates = designs["replay"].parts["gates"]
    return SlotBytes(conv, gates, conv + gates, dense_conv, designs["snapshot"].bytes_per_slot,
                     designs["dedup_snapshot"].bytes_per_slot, designs["input_replay"].bytes_per_slot,
                     plan.ring_bytes_per_slot)

