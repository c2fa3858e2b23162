"""``ConvWindowCache``: the engine-facing object -- the window buffer as a registered module buffer
(so CUDA-graph trees and torch.compile see one static address) plus the verify and commit calls.

    cache = ConvWindowCache(num_layers, num_slots, dim, num_draft, kernel_size, device="cuda")
    for layer ...:                                   # verify pass, layer by layer
        cache.causal_conv1d_verify(out, conv_state, x, weight, bias, slots, layer)
    cache.commit(conv_state, slots, accepted)         # after acceptance, all layers, one launch

Replay commit: construct with ``gate_heads=Hv`` (Mamba2: ``gate_heads=H, num_gates=1``) for a gates
buffer, store each layer's g, beta (dt) with ``capture_gates`` during verify, and commit the
recurrent state and the conv window together with ``gdn_commit`` (``mamba2_commit``) -- no state
snapshots.

``slots`` index the buffer; the engine's conv_state is read (verify) and written (commit) at
``state_slots``, which default to ``slots`` (engines usually use one cache index for both).
The commits take what was accepted either as the ops do, ``accepted`` = the index of the last
accepted token or node, or as engines count it, ``num_accepted=`` = tokens accepted counting the
verified one (SGLang's ``accept_lens``, vLLM's ``num_accepted_tokens``; chains only).
Trees: pass ``parents`` [B, N] to every call; token_major / channel_major buffers then hold one
row per node and commit with ``scatter_tree``, dense buffers hold every node's window.

``RingCache``: the ring (Gated DeltaNet; Mamba2 with ``num_gates=1``; no commit pass) as a module --
the ring's rows, gates and cursor as registered buffers, and the ring ops on them (docs/design.md,
"The ring").
"""

from __future__ import annotations

import torch

from .cpu import walk_up
from .layout import DEFAULT_LAYOUT, DENSE, DIM_MAJOR, TOKEN_MAJOR, check_layout, physical_nbytes, window_view
from .ops import alloc_windows, capture, causal_conv1d_verify, scatter, scatter_tree
from .ops_replay import alloc_gates, capture_gates, gdn_commit, mamba2_commit
from .ops_ring import DEFAULT_CAPACITY, alloc_ring, gdn_ring_flush, gdn_ring_verify, ring_accept, ring_conv1d_verify
from .ops_ring_mamba2 import alloc_mamba2_ring, mamba2_ring_flush, mamba2_ring_verify
from .validation import _check_parents, check_index_tensors, check_tree_depth


class ConvWindowCache(torch.nn.Module):
    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        dim: int,
        num_draft: int,
        kernel_size: int,
        *,
        layout: str = DEFAULT_LAYOUT,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str | None = None,
        gate_heads: int | None = None,
        num_gates: int = 2,
    ):
        super().__init__()
        check_layout(layout)
        self.num_layers, self.num_slots, self.dim = num_layers, num_slots, dim
        self.num_draft, self.kernel_size, self.layout = num_draft, kernel_size, layout
        # Not persistent: a runtime cache, not a weight (state_dict stays free of it).
        self.register_buffer(
            "buffer",
            alloc_windows(num_layers, num_slots, dim, num_draft, kernel_size, layout=layout, dtype=dtype, device=device),
            persistent=False,
        )
        # [L, M, D, num_gates, gate_heads] float32: g, beta (GDN) or dt (Mamba2, num_gates=1) per
        # draft token for the replay commits (None: no replay)
        gates = None if gate_heads is None else alloc_gates(num_layers, num_slots, num_draft, gate_heads,
                                                            num_gates=num_gates, device=self.buffer.device)
        self.register_buffer("gates", gates, persistent=False)

    def _apply(self, fn, recurse=True):
        return _gates_kept_float32(self, super()._apply, fn, recurse)

    @property
    def nbytes(self) -> int:
        """Physical bytes of the buffer and the gates (the logical window view would over-report)."""
        gates = 0 if self.gates is None else self.gates.numel() * self.gates.element_size()
        return gates + physical_nbytes(self.layout, self.num_layers, self.num_slots, self.dim, self.num_draft,
                                       self.kernel_size, self.buffer.dtype)

    @property
    def windows(self) -> torch.Tensor:
        """The logical windows [L, M, N, dim, K-1] (a view; chains: window t of slot m)."""
        return window_view(self.buffer, self.layout, self.num_draft, self.kernel_size)

    @property
    def rows(self) -> torch.Tensor:
        """The rows [L, M, N+K-2, dim] of a token_major or channel_major buffer (a view)."""
        if self.layout == DENSE:
            raise ValueError("a dense ConvWindowCache stores windows, not rows; use .windows")
        return self.buffer if self.layout == TOKEN_MAJOR else self.buffer.transpose(-1, -2)

    def capture(self, conv_state, x, slots, layer, *, state_slots=None, parents=None, state_layout=DIM_MAJOR):
        """Write layer ``layer``'s inputs (x [B, N, dim], history from conv_state) into the buffer."""
        state_slots = slots if state_slots is None else state_slots
        capture(self.buffer, conv_state, x, slots, state_slots, layer, parents, layout=self.layout,
                state_layout=state_layout)

    def causal_conv1d_verify(
        self, out, conv_state, x, weight, bias, slots, layer, *,
        state_slots=None, parents=None, activation=None, state_layout=DIM_MAJOR,
    ):
        """The verify pass's conv of layer ``layer`` into ``out`` [B, N, dim], capturing its inputs."""
        state_slots = slots if state_slots is None else state_slots
        causal_conv1d_verify(out, self.buffer, conv_state, x, weight, bias, slots, state_slots, layer, parents,
                             layout=self.layout, activation=activation, state_layout=state_layout)

    def commit(self, conv_state, slots, accepted=None, *, num_accepted=None, state_slots=None, parents=None,
               state_layout=DIM_MAJOR):
        """conv_state[:, state_slots[b]] = the window of draft step / node accepted[b] (or of
        num_accepted[b] - 1) of buffer slot slots[b], all layers, one launch; a negative step skips the row."""
        accepted = _steps(accepted, num_accepted, parents)
        state_slots = slots if state_slots is None else state_slots
        if parents is not None and self.layout != DENSE:
            scatter_tree(conv_state, self.rows, state_slots, slots, accepted, parents, state_layout=state_layout)
            return
        if parents is not None:
            # a dense tree's node with a bad parent link on its walk was not captured: skip its row, as
            # scatter_tree does, rather than commit the slot's older window (capture's walk, no sync)
            op, device = "ConvWindowCache.commit", self.buffer.device
            num_rows = check_index_tensors(op, device, ("accepted",), accepted, owner="the cache")
            _check_parents(op, parents, device, num_rows, self.num_draft, "B the accepted steps', N the cache's draft "
                           "tokens", owner="the cache")
            width = self.kernel_size - 1
            links_ok = walk_up(accepted[:, None], parents, history=width, steps=width)[1][:, 0]
            accepted = torch.where(links_ok, accepted, -1)
        scatter(conv_state, self.windows, state_slots, slots, accepted, state_layout=state_layout)

    def capture_gates(self, g, beta, slots, layer, *, a=None, b=None, A_log=None, dt_bias=None):
        """Store layer ``layer``'s gates g, beta [B, N, Hv] (Mamba2: dt, beta=None) of the verify
        pass, or compute them from the raw a, b with A_log, dt_bias (g = beta = None; see
        ``sgl_convwin.capture_gates``). Needs gate_heads."""
        capture_gates(self._gates(), g, beta, slots, layer, a=a, b=b, A_log=A_log, dt_bias=dt_bias)

    def gdn_commit(
        self, ssm_state, conv_state, conv_weight, slots, accepted=None, *, num_k_heads, head_k_dim, num_v_heads,
        head_v_dim, num_accepted=None, state_slots=None, parents=None, conv_bias=None, use_qk_l2norm=True,
        state_layout=DIM_MAJOR,
    ):
        """Replay each request's accepted path onto ssm_state and commit its conv window
        (``sgl_convwin.gdn_commit``): both states at ``state_slots`` (default ``slots``), all layers;
        ``accepted`` (an index) or ``num_accepted`` (a count) as in ``commit``."""
        accepted = _steps(accepted, num_accepted, parents)
        state_slots = slots if state_slots is None else state_slots
        gdn_commit(ssm_state, conv_state, self.buffer, self._gates(), conv_weight, state_slots, slots, accepted,
                   parents, layout=self.layout, num_k_heads=num_k_heads, head_k_dim=head_k_dim,
                   num_v_heads=num_v_heads, head_v_dim=head_v_dim, conv_bias=conv_bias,
                   use_qk_l2norm=use_qk_l2norm, state_layout=state_layout)

    def mamba2_commit(
        self, ssm_state, conv_state, conv_weight, A, slots, accepted=None, *, num_heads, head_dim, n_groups,
        d_state, num_accepted=None, state_slots=None, parents=None, conv_bias=None, state_layout=DIM_MAJOR,
    ):
        """``sgl_convwin.mamba2_commit`` on this cache's buffers (construct with num_gates=1);
        ``accepted`` (an index) or ``num_accepted`` (a count) as in ``commit``."""
        accepted = _steps(accepted, num_accepted, parents)
        state_slots = slots if state_slots is None else state_slots
        mamba2_commit(ssm_state, conv_state, self.buffer, self._gates(), conv_weight, A, state_slots, slots, accepted,
                      parents, layout=self.layout, num_heads=num_heads, head_dim=head_dim, n_groups=n_groups,
                      d_state=d_state, conv_bias=conv_bias, state_layout=state_layout)

    def _gates(self) -> torch.Tensor:
        if self.gates is None:
            raise ValueError("this ConvWindowCache has no gates buffer: construct it with gate_heads=num_v_heads")
        return self.gates

    def extra_repr(self) -> str:
        return (f"layers={self.num_layers}, slots={self.num_slots}, dim={self.dim}, num_draft={self.num_draft}, "
                f"kernel_size={self.kernel_size}, layout={self.layout!r}, dtype={self.buffer.dtype}, "
                f"nbytes={self.nbytes}")


def _steps(accepted, num_accepted, parents):
    """The ops' steps from an index (``accepted``) or an engine's count (``num_accepted``)."""
    if (accepted is None) == (num_accepted is None):
        raise ValueError("give accepted (the index of the last accepted token or node) or num_accepted (tokens "
                         "accepted counting the verified one: SGLang's accept_lens, vLLM's num_accepted_tokens), "
                         "exactly one")
    if num_accepted is None:
        return accepted
    if not isinstance(num_accepted, torch.Tensor) or num_accepted.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"num_accepted must be an int32 or int64 tensor, got {num_accepted!r:.60}")
    if parents is not None:
        raise ValueError("num_accepted counts a chain's tokens but not which tree node was accepted: for a tree "
                         "pass accepted (the node index, e.g. sgl_convwin.integrations.sglang_accepted_steps)")
    return num_accepted.to(torch.int64) - 1


def _gates_kept_float32(module, apply, fn, recurse):
    """nn.Module._apply (``apply``: the parent's) with the gates' dtype kept: ``.to(torch.bfloat16)``
    (or ``model.half()``) moves them with the module but never rounds them (the ops replay exactly
    the float32 gates the verify used)."""
    gates = module.gates
    apply(fn, recurse)
    if gates is not None and module.gates.dtype != gates.dtype:
        module.gates = gates.to(module.gates.device)
    return module


class RingCache(torch.nn.Module):
    """The ring of ``alloc_ring`` as registered (non-persistent) buffers ``rows``, ``gates`` and
    ``cursor``, and the steps an engine runs on it::

        cache.reset(slots)                                   # new requests (their prefill wrote the states)
        for layer ...:                                       # each decode step
            cache.conv1d_verify(conv_out, conv_state, x, weight, bias, slots, layer, activation="silu")
            cache.gdn_verify(out, q, k, v, g, beta, ssm_state, conv_state, weight, bias, slots, layer)
        cache.accept(slots, accepted)                         # a cursor advance, all layers
        cache.flush(ssm_state, conv_state, conv_weights, slots, ...)   # only when the states are needed now

    ``slots`` index the ring; ``state_slots`` (default ``slots``) index conv_state and ssm_state.
    Mamba2: ``num_gates=1`` with H for ``num_v_heads`` (``alloc_mamba2_ring``: dt per head), and
    ``mamba2_verify`` / ``mamba2_flush`` in place of ``gdn_verify`` / ``flush``. ``tree_depth``: for
    trees, the most nodes on a root path (``gdn_ring_verify``'s; every op here passes it).
    """

    def __init__(self, num_layers: int, num_slots: int, dim: int, num_draft: int, num_v_heads: int, *,
                 capacity: int = DEFAULT_CAPACITY, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str | None = None, num_gates: int = 2, tree_depth: int | None = None):
        super().__init__()
        if isinstance(num_gates, bool) or num_gates not in (1, 2):
            raise ValueError(f"RingCache: num_gates must be 2 (GDN: g, beta) or 1 (Mamba2: dt), got {num_gates!r}")
        alloc = alloc_ring if num_gates == 2 else alloc_mamba2_ring
        ring = alloc(num_layers, num_slots, dim, num_draft, num_v_heads, capacity=capacity, dtype=dtype, device=device)
        check_tree_depth("RingCache", tree_depth, num_draft, None)
        self.num_draft, self.capacity, self.tree_depth = num_draft, capacity, tree_depth
        for name, tensor in ring._asdict().items():
            self.register_buffer(name, tensor, persistent=False)

    @property
    def nbytes(self) -> int:
        """Physical bytes of the rows, the gates and the cursor (the checkpoint states not counted)."""
        return sum(t.numel() * t.element_size() for t in (self.rows, self.gates, self.cursor))

    @property
    def pending(self) -> torch.Tensor:
        """[M]: the accepted tokens each slot holds beyond its checkpoint (a view of the cursor)."""
        return self.cursor[:, 1]

    def _apply(self, fn, recurse=True):
        return _gates_kept_float32(self, super()._apply, fn, recurse)

    def _drafts(self, drafts, method: str) -> None:
        # the verify's fold and accept's cursor must agree on N: another N loses or repeats pending tokens
        # (drafts that are no [B, N, ...] tensor: the op's checks name them)
        if isinstance(drafts, torch.Tensor) and drafts.dim() >= 2 and drafts.shape[1] != self.num_draft:
            raise ValueError(f"RingCache.{method}: this ring verifies {self.num_draft} draft tokens a step (its "
                             f"num_draft), got {drafts.shape[1]}; pad the drafts to {self.num_draft}")

    def _depth(self, parents):
        # a step of chains folds by N: a ring of trees verifying a chain keeps the ops' rule for chains
        return None if parents is None else self.tree_depth

    def reset(self, slots: torch.Tensor) -> None:
        """Empty the ring slots ``slots`` (negative: skipped), for new requests whose conv_state and
        ssm_state the prefill wrote; no sync."""
        check_index_tensors("RingCache.reset", self.cursor.device, ("slots",), slots, owner="the ring's cursor")
        num_slots = self.cursor.shape[0]
        slots = slots.long()
        named = torch.where((slots >= 0) & (slots < num_slots), slots, num_slots)  # num_slots: the spare entry
        hit = torch.zeros(num_slots + 1, dtype=torch.bool, device=slots.device).index_fill_(0, named, True)
        self.cursor.masked_fill_(hit[:num_slots, None], 0)

    def conv1d_verify(self, out, conv_state, x, weight, bias, slots, layer, *, state_slots=None, parents=None,
                      activation=None, state_layout=DIM_MAJOR):
        """``ring_conv1d_verify`` of layer ``layer`` (out [B, N, dim]; x [B, N, dim])."""
        self._drafts(x, "conv1d_verify")
        state_slots = slots if state_slots is None else state_slots
        ring_conv1d_verify(out, self.rows, conv_state, x, weight, bias, slots, state_slots, self.cursor, layer,
                           parents, activation=activation, state_layout=state_layout)

    def gdn_verify(self, out, q, k, v, g, beta, ssm_state, conv_state, conv_weight, conv_bias, slots, layer, *,
                   state_slots=None, parents=None, scale=None, use_qk_l2norm=True, state_layout=DIM_MAJOR,
                   after_due_flush=False):
        """``gdn_ring_verify`` of layer ``layer`` (conv_weight [dim, K], conv_bias [dim]: the layer's;
        ``after_due_flush``: this step began with ``flush(..., due_only=True)``, a hint)."""
        self._drafts(q, "gdn_verify")
        state_slots = slots if state_slots is None else state_slots
        gdn_ring_verify(out, q, k, v, g, beta, ssm_state, conv_state, self.rows, self.gates, self.cursor, conv_weight,
                        conv_bias, slots, state_slots, layer, parents, scale=scale, use_qk_l2norm=use_qk_l2norm,
                        state_layout=state_layout, after_due_flush=after_due_flush,
                        tree_depth=self._depth(parents))

    def accept(self, slots, accepted=None, *, num_accepted=None, parents=None):
        """``ring_accept``: ``accepted`` (the index of the last accepted token or node) or
        ``num_accepted`` (tokens accepted counting the verified one; chains), as ``ConvWindowCache.commit``."""
        ring_accept(self.cursor, self.rows, self.gates, slots, _steps(accepted, num_accepted, parents), parents,
                    num_draft=self.num_draft, tree_depth=self._depth(parents))

    def flush(self, ssm_state, conv_state, conv_weight, slots, *, num_k_heads, head_k_dim, num_v_heads, head_v_dim,
              state_slots=None, conv_bias=None, use_qk_l2norm=True, state_layout=DIM_MAJOR, due_only=False):
        """``gdn_ring_flush``: both states at ``state_slots`` as eager ``gdn_commit`` would have left them
        (conv_weight [L, dim, K], conv_bias [L, dim]); with ``due_only`` only the rows whose next verify
        would fold (``num_draft``: this ring's), every layer's folds of a step in one launch before its
        first layer."""
        state_slots = slots if state_slots is None else state_slots
        gdn_ring_flush(ssm_state, conv_state, self.cursor, self.rows, self.gates, conv_weight, slots, state_slots,
                       num_k_heads=num_k_heads, head_k_dim=head_k_dim, num_v_heads=num_v_heads, head_v_dim=head_v_dim,
                       conv_bias=conv_bias, use_qk_l2norm=use_qk_l2norm, state_layout=state_layout,
                       num_draft=self.num_draft if due_only else None,
                       tree_depth=self.tree_depth if due_only else None)

    def mamba2_verify(self, out, x, dt, A, B, C, ssm_state, conv_state, conv_weight, conv_bias, slots, layer, *,
                      state_slots=None, parents=None, D=None, z=None, dt_bias=None, dt_softplus=False,
                      state_layout=DIM_MAJOR, after_due_flush=False):
        """``mamba2_ring_verify`` of layer ``layer`` (A [H], conv_weight [dim, K], conv_bias [dim]: the
        layer's; ``after_due_flush``: this step began with ``mamba2_flush(..., due_only=True)``, a hint)."""
        self._drafts(x, "mamba2_verify")
        state_slots = slots if state_slots is None else state_slots
        mamba2_ring_verify(out, x, dt, A, B, C, ssm_state, conv_state, self.rows, self.gates, self.cursor, conv_weight,
                           conv_bias, slots, state_slots, layer, parents, D=D, z=z, dt_bias=dt_bias,
                           dt_softplus=dt_softplus, state_layout=state_layout, after_due_flush=after_due_flush,
                           tree_depth=self._depth(parents))

    def mamba2_flush(self, ssm_state, conv_state, conv_weight, A, slots, *, num_heads, head_dim, n_groups, d_state,
                     state_slots=None, conv_bias=None, state_layout=DIM_MAJOR, due_only=False):
        """``mamba2_ring_flush``: both states at ``state_slots`` as eager ``mamba2_commit`` would have left
        them (conv_weight [L, dim, K], A [L, H], conv_bias [L, dim]); ``due_only`` as in ``flush``."""
        state_slots = slots if state_slots is None else state_slots
        mamba2_ring_flush(ssm_state, conv_state, self.cursor, self.rows, self.gates, conv_weight, A, slots,
                          state_slots, num_heads=num_heads, head_dim=head_dim, n_groups=n_groups, d_state=d_state,
                          conv_bias=conv_bias, state_layout=state_layout,
                          num_draft=self.num_draft if due_only else None,
                          tree_depth=self.tree_depth if due_only else None)

    def extra_repr(self) -> str:
        layers, slots, rows, dim = self.rows.shape
        return (f"layers={layers}, slots={slots}, dim={dim}, num_draft={self.num_draft}, capacity={self.capacity}, "
                f"tree_depth={self.tree_depth}, "
                f"num_gates={self.gates.shape[3]}, dtype={self.rows.dtype}, nbytes={self.nbytes}")
