"""Bad input to convwin.capture and convwin.causal_conv1d_verify: a clear error naming the
argument and what was expected, raised before anything is written; checked mode for index values."""

import pytest
import torch

import sgl_convwin
from sgl_convwin._kernels import triton_kernels
from support import HAS_TRITON, impl_params, whole_storage

L, M, NS, N, DIM, K, B = 2, 3, 4, 4, 8, 4, 2


def good_args(layout="token_major"):
    generator = torch.Generator().manual_seed(0)
    return dict(
        out=torch.zeros(B, N, DIM),
        buffer=torch.zeros(sgl_convwin.physical_shape(layout, L, M, DIM, N, K)),
        conv_state=torch.randn(L, NS, DIM, K - 1, generator=generator),
        x=torch.randn(B, N, DIM, generator=generator),
        weight=torch.randn(DIM, K, generator=generator),
        bias=torch.randn(DIM, generator=generator),
        buffer_slots=torch.tensor([0, 2]),
        state_slots=torch.tensor([3, 1]),
        layer=1,
        parents=None,
        layout=layout,
        activation="silu",
        state_layout="dim_major",
    )


def replaced(**changes):
    layout = changes.get("layout", "token_major")
    return {**good_args(layout if layout in sgl_convwin.LAYOUTS else "token_major"), **changes}


CAPTURE_KEYS = ("buffer", "conv_state", "x", "buffer_slots", "state_slots", "layer", "parents", "layout", "state_layout")

# name: (arguments, error, message); each applies to both ops unless it names a verify argument
BAD_CALLS = {
    "state rank": (replaced(conv_state=torch.randn(L, NS, DIM)), ValueError, r"conv_state must be 4-D \[L, R, dim, K-1\]"),
    "x rank": (replaced(x=torch.randn(B, DIM)), ValueError, r"x must be 3-D \[B, N, dim\]"),
    "x dim": (replaced(x=torch.randn(B, N, DIM + 1)), ValueError, r"x has dim 9 \(axis 2\) but conv_state has 8"),
    "no tokens": (replaced(x=torch.randn(B, 0, DIM)), ValueError, r"x must hold at least one draft token"),
    "buffer draft length": (replaced(x=torch.randn(B, N + 1, DIM)), ValueError,
                            r"token_major buffer for L=2, N=5 draft tokens .* must be \[L, M, N\+K-2, dim\] = \[2, M, 7, 8\], got shape \(2, 3, 6, 8\)"),
    "buffer layers": (replaced(conv_state=torch.randn(L + 1, NS, DIM, K - 1)), ValueError, r"must be \[L, M, N\+K-2, dim\] = \[3, M, 6, 8\]"),
    "buffer K": (replaced(conv_state=torch.randn(L, NS, DIM, K)), ValueError, r"K=5 \(conv_state\)"),
    "dense buffer as token_major": (replaced(buffer=torch.zeros(L, M, N, DIM, K - 1)), ValueError, r"token_major buffer .* got shape \(2, 3, 4, 8, 3\)"),
    "channel_major shape": (replaced(layout="channel_major", buffer=torch.zeros(L, M, N + K - 2, DIM)), ValueError,
                            r"channel_major buffer .* \[L, M, dim, N\+K-2\] = \[2, M, 8, 6\]"),
    "layout": (replaced(layout="tokens"), ValueError, r"layout must be one of \('dense', 'channel_major', 'token_major'\), got 'tokens'"),
    "state layout": (replaced(state_layout="channels_last"), ValueError, r"state_layout must be one of"),
    "window-major shape": (replaced(state_layout="window_major"), ValueError, r"x has dim 8 \(axis 2\) but conv_state has 3"),
    "layer range": (replaced(layer=2), ValueError, r"layer 2 is out of range for 2 layers \(expected 0..1\)"),
    "negative layer": (replaced(layer=-1), ValueError, r"layer -1 is out of range"),
    "buffer dtype": (replaced(buffer=torch.zeros(L, M, N + K - 2, DIM, dtype=torch.float64)), TypeError, r"buffer must be float32, float16 or bfloat16, got torch.float64"),
    "x dtype": (replaced(x=torch.zeros(B, N, DIM, dtype=torch.int32)), TypeError, r"x must be float32, float16 or bfloat16"),
    "slot dtype": (replaced(buffer_slots=torch.tensor([0.0, 1.0])), TypeError, r"buffer_slots must be int32 or int64, got torch.float32"),
    "slot rank": (replaced(state_slots=torch.tensor([[0, 1]])), ValueError, r"state_slots must be 1-D \[B\]"),
    "slot lengths": (replaced(state_slots=torch.tensor([0, 1, 2])), ValueError, r"state_slots has 3 rows but buffer_slots has 2"),
    "batch": (replaced(buffer_slots=torch.tensor([0, 1, 2]), state_slots=torch.tensor([0, 1, 2])), ValueError,
              r"buffer_slots and state_slots have 3 rows but x has 2 \(axis 0\)"),
    "parents shape": (replaced(parents=torch.tensor([[-1, 0, 1]] * B)), ValueError, r"parents must be \[B, N\] = \[2, 4\]"),
    "parents dtype": (replaced(parents=torch.zeros(B, N, dtype=torch.int16)), TypeError, r"parents must be int32 or int64"),
    "expanded buffer": (replaced(buffer=torch.zeros(L, 1, N + K - 2, DIM).expand(L, M, N + K - 2, DIM)), ValueError, r"buffer has overlapping elements"),
    "out shape": (replaced(out=torch.zeros(B, N, DIM + 1)), ValueError, r"out must be \[B, N, dim\] = \[2, 4, 8\] like x"),
    "weight shape": (replaced(weight=torch.zeros(DIM, K - 1)), ValueError, r"weight must be \[dim, K\] = \[8, 4\]"),
    "weight transposed": (replaced(weight=torch.zeros(K, DIM)), ValueError, r"weight must be \[dim, K\] = \[8, 4\]"),
    "bias shape": (replaced(bias=torch.zeros(DIM, 1)), ValueError, r"bias must be \[dim\] = \[8\] or None"),
    "weight dtype": (replaced(weight=torch.zeros(DIM, K, dtype=torch.float64)), TypeError, r"weight must be float32, float16 or bfloat16"),
    "activation": (replaced(activation="relu"), ValueError, r"activation must be None, 'silu' or 'swish', got 'relu'"),
    "expanded out": (replaced(out=torch.zeros(B, N, 1).expand(B, N, DIM)), ValueError, r"out has overlapping elements"),
}
VERIFY_ONLY = {"out shape", "weight shape", "weight transposed", "bias shape", "weight dtype", "activation", "expanded out"}


def call(impl, op, args):
    if op == "capture":
        impl.capture(*(args[k] for k in CAPTURE_KEYS[:7]), layout=args["layout"], state_layout=args["state_layout"])
    else:
        impl.causal_conv1d_verify(
            args["out"], args["buffer"], args["conv_state"], args["x"], args["weight"], args["bias"],
            args["buffer_slots"], args["state_slots"], args["layer"], args["parents"],
            layout=args["layout"], activation=args["activation"], state_layout=args["state_layout"],
        )


def cases():
    return [  # a list: pytest deprecates generators here
        pytest.param(name, op, id=f"{op}-{name}")
        for name in BAD_CALLS
        for op in ("capture", "verify")
        if op == "verify" or name not in VERIFY_ONLY
    ]


@pytest.mark.parametrize("name, op", cases())
@pytest.mark.parametrize("impl", impl_params("cpu", "cpu_op", "triton_interpret"))
def test_bad_call_raises_and_writes_nothing(impl, name, op):
    args, error, message = BAD_CALLS[name]
    writable = [args["buffer"], args["out"]]
    before = [whole_storage(t).clone() for t in writable]
    with pytest.raises(error, match=message):
        call(impl, op, args)
    assert all(torch.equal(whole_storage(t), b) for t, b in zip(writable, before))


@pytest.mark.parametrize("name, op", cases())
def test_bad_call_raises_on_meta(name, op):
    """The fakes validate too: errors surface at trace time."""
    args, error, message = BAD_CALLS[name]
    meta = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    for key in ("buffer", "out"):  # .to() would materialise an expanded tensor
        if args[key].stride()[1] == 0 or args[key].stride()[-1] == 0:
            meta[key] = torch.empty_strided(args[key].shape, args[key].stride(), device="meta")
    with pytest.raises(error, match=message):
        call(type("Dispatched", (), {
            "capture": staticmethod(torch.ops.convwin.capture),
            "causal_conv1d_verify": staticmethod(torch.ops.convwin.causal_conv1d_verify),
        }), op, meta)


@pytest.mark.parametrize("op", ("capture", "verify"))
def test_tensors_on_another_device(op):
    for key in ("buffer", "x", "buffer_slots", "parents", "out", "weight", "bias"):
        if op == "capture" and key in ("out", "weight", "bias"):
            continue
        args = good_args()
        args["parents"] = torch.tensor([[-1, 0, 1, 2]] * B)
        args[key] = args[key].to("meta")
        with pytest.raises(ValueError, match=rf"{key} is on meta but conv_state is on cpu"):
            if op == "capture":
                sgl_convwin.ops._run_capture(
                    lambda *a, **k: None, *(args[k] for k in ("buffer", "conv_state", "x", "buffer_slots",
                                                              "state_slots", "layer", "layout", "parents",
                                                              "state_layout")))
            else:
                sgl_convwin.ops._run_verify(
                    lambda *a, **k: None, *(args[k] for k in ("out", "buffer", "conv_state", "x", "weight", "bias",
                                                              "buffer_slots", "state_slots", "layer", "layout",
                                                              "parents", "activation", "state_layout")))


@pytest.mark.parametrize(
    "op, dst, src",
    [("capture", "buffer", "conv_state"), ("capture", "buffer", "x"), ("verify", "buffer", "conv_state")]
    + [("verify", "out", src) for src in ("buffer", "conv_state", "x", "weight", "bias")],
)
def test_every_shared_storage_pair_is_refused(op, dst, src):
    """Each destination against each source it reads: two views of one storage are refused."""
    args = good_args()
    first, second = args[dst], args[src]
    storage = torch.zeros(first.numel() + second.numel(), dtype=first.dtype)
    args[dst] = storage[: first.numel()].view(first.shape)
    args[src] = storage[first.numel():].view(second.shape)
    assert args[src].untyped_storage().data_ptr() == storage.untyped_storage().data_ptr()
    with pytest.raises(ValueError, match=rf"{dst} and {src} share storage"):
        call(sgl_convwin, op, args)


@pytest.mark.parametrize("op", ("capture", "verify"))
def test_shared_storage(op):
    args = good_args()
    storage = torch.zeros(L * M * (N + K - 2) * DIM + B * N * DIM)
    args["buffer"] = storage[: L * M * (N + K - 2) * DIM].view(L, M, N + K - 2, DIM)
    args["x"] = storage[L * M * (N + K - 2) * DIM:].view(B, N, DIM)
    with pytest.raises(ValueError, match=r"buffer and x share storage"):
        call(sgl_convwin, op, args)
    if op == "verify":
        args = good_args()
        args["out"] = args["x"]
        with pytest.raises(ValueError, match=r"out and x share storage"):
            call(sgl_convwin, op, args)


CHECKED = {
    "buffer slot": (dict(buffer_slots=torch.tensor([0, 3])), r"buffer_slots\[1\] = 3 is out of range for a buffer with 3 slots \(expected 0..2"),
    "state slot": (dict(state_slots=torch.tensor([4, 1])), r"state_slots\[0\] = 4 is out of range for conv_state with 4 slots"),
    "parent": (dict(parents=torch.tensor([[-1, 0, 1, 2], [-1, 0, 2, 1]])), r"parents\[1, 2\] = 2; a node's parent must be an earlier node \(0..1\)"),
    "duplicate": (dict(buffer_slots=torch.tensor([2, 2])), r"rows 0 and 1 both write buffer slot 2"),
}


@pytest.mark.parametrize("name", CHECKED)
@pytest.mark.parametrize("op", ("capture", "verify"))
@pytest.mark.parametrize("impl", impl_params())
def test_checked_mode_names_the_row(impl, op, name):
    changes, message = CHECKED[name]
    args = {k: v.to(impl.device) if isinstance(v, torch.Tensor) else v for k, v in replaced(**changes).items()}
    before = whole_storage(args["buffer"]).clone()
    with sgl_convwin.index_checks():
        with pytest.raises(IndexError, match=message):
            call(impl, op, args)
    assert torch.equal(whole_storage(args["buffer"]), before)
    call(impl, op, args)  # unchecked, the same call runs (bad rows and nodes are skipped)


@pytest.mark.parametrize("op", ("capture", "verify"))
@pytest.mark.parametrize("impl", impl_params())
def test_checked_mode_accepts_padding(impl, op):
    args = {k: v.to(impl.device) if isinstance(v, torch.Tensor) else v for k, v in
            replaced(buffer_slots=torch.tensor([-1, 2]), state_slots=torch.tensor([7, -1])).items()}
    with sgl_convwin.index_checks():
        call(impl, op, args)
    assert not args["buffer"].any() and not args["out"].any(), "padded rows must write nothing"


@pytest.mark.parametrize("op", ("capture", "verify"))
@pytest.mark.parametrize("impl", impl_params("cpu", "cpu_op", "triton_interpret"))
def test_destinations_that_cannot_be_written_in_place(impl, op):
    names = ("buffer",) if op == "capture" else ("buffer", "out")
    for name in names:
        args = good_args()
        args[name] = args[name].clone().requires_grad_(True)
        with pytest.raises(ValueError, match=rf"{name} requires grad; the ops write it in place"):
            call(impl, op, args)
        assert not args["buffer"].any() and not args["out"].any()
        with torch.inference_mode():
            inference = torch.zeros_like(args[name])
        args = dict(good_args(), **{name: inference})
        with pytest.raises(ValueError, match=rf"{name} is an inference tensor"):
            call(impl, op, args)
        assert not inference.any()
        with torch.inference_mode():
            call(impl, op, args)
        assert inference.any()


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_rows_kernel_refuses_slots_beyond_int32_offsets():
    """The rows verify kernel's per-element offsets are int32: a buffer slot of 2**31 elements or
    more is refused before launch; a large buffer made of small slots is not (meta tensors: no
    memory is allocated)."""
    verify = triton_kernels().verify
    meta = dict(device="meta", dtype=torch.bfloat16)
    state, x = torch.empty(1, 2, 8, K - 1, **meta), torch.empty(1, 2, 8, **meta)
    weight, slots = torch.empty(8, K, **meta), torch.zeros(1, dtype=torch.int64, device="meta")
    wide_slot = torch.empty(1, 2, 3, 2**31 // 2, **meta)  # one slot: 3 rows of 2**30 elements
    with pytest.raises(ValueError, match=r"a buffer slot spans 3221225472 elements; at most 2\*\*31"):
        verify.launch_causal_conv1d_verify(
            torch.empty(1, 2, 8, **meta), wide_slot, state, x, weight, None, slots, slots, 0, None,
            dense=False, silu=False,
        )
    many_slots = torch.empty(1, 2**31 // 6 + 1, 3, 2, **meta)  # > 2**31 elements, 6 per slot
    verify._check_rows_spans(many_slots, state, x, None, weight, None, None)  # no error


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
@pytest.mark.parametrize("tree", (False, True), ids=("chain-node-loop", "tree-small-tree-kernel"))
def test_node_loops_take_int64_offsets_beyond_int32_spans(tree):
    """The node loops address elements by int32 offsets only where every span fits: dense windows
    whose slot spans 2**31 elements or more (a node stride of 2**30 times node 2), or x whose
    request does, get int64 offsets, even when int32 is asked for; compact strides get int32 (meta
    tensors: no memory is allocated, nothing is launched)."""
    verify = triton_kernels().verify
    meta = dict(device="meta", dtype=torch.bfloat16)
    B, N, dim = 1, 3, 8
    state, out = torch.empty(1, 2, dim, K - 1, **meta), torch.empty(B, N, dim, **meta)
    weight, slots = torch.empty(dim, K, **meta), torch.zeros(B, dtype=torch.int64, device="meta")
    parents = torch.tensor([[-1, 0, 1]], device="meta") if tree else None
    compact_windows, compact_x = torch.empty(1, 2, N, dim, K - 1, **meta), torch.empty(B, N, dim, **meta)
    wide_windows = torch.empty_strided((1, 2, N, dim, K - 1), (2**33, 2**32, 2**30, K - 1, 1), **meta)
    wide_x = torch.empty_strided((B, N, dim), (2**32, 2**30, 1), **meta)
    cases = [(compact_windows, compact_x, {}, True), (wide_windows, compact_x, {}, False),
             (compact_windows, wide_x, {}, False), (wide_windows, compact_x, dict(offsets32=True), False)]
    for windows, x, asked, narrow in cases:
        call = verify._verify_call(out, windows, state, x, weight, None, slots, slots, 0, parents, dense=True,
                                   silu=False, prefetch=None if tree else 2, **asked)
        assert call.kernel is (verify._verify_small_tree_kernel if tree else verify._verify_node_loop_kernel)
        assert call.constexprs["OFFSETS32"] is narrow, (windows.stride(), x.stride(), asked)
