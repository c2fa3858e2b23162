"""Bad input: a clear error naming the argument, raised before anything is written."""

import pytest
import torch

import sgl_convwin
from support import impl_params, whole_storage

L, N, M, D, DIM, K = 2, 3, 2, 4, 8, 4


def good_args(device="cpu"):
    conv_state = torch.randn(L, N, DIM, K - 1, device=device)
    buffer = torch.randn(L, M, D + K - 2, DIM, device=device)
    windows = sgl_convwin.window_view(buffer, "token_major", D, K)
    index = torch.tensor([0, 1], device=device)
    return dict(conv_state=conv_state, windows=windows, dst_slots=index, src_slots=index.flip(0), steps=index + 1)


def replaced(**changes):
    args = good_args()
    args.update(changes)
    return args


BAD_CALLS = {
    "state rank": (replaced(conv_state=torch.randn(L, N, DIM)), ValueError, r"conv_state must be 4-D"),
    "windows rank": (replaced(windows=torch.randn(L, M, DIM, K - 1)), ValueError, r"windows must be 5-D"),
    "layers": (replaced(conv_state=torch.randn(L + 1, N, DIM, K - 1)), ValueError, r"windows layers \(axis 0\) is 2 but conv_state has 3"),
    "dim": (replaced(conv_state=torch.randn(L, N, DIM + 1, K - 1)), ValueError, r"dim \(axis 3\) is 8 but conv_state has 9"),
    "width": (replaced(conv_state=torch.randn(L, N, DIM, K)), ValueError, r"K-1 \(axis 4\) is 3 but conv_state has 4"),
    "state dtype": (replaced(conv_state=torch.zeros(L, N, DIM, K - 1, dtype=torch.float64)), TypeError, r"conv_state must be float32, float16 or bfloat16, got torch.float64"),
    "windows dtype": (replaced(windows=torch.zeros(L, M, D, DIM, K - 1, dtype=torch.int32)), TypeError, r"windows must be float32, float16 or bfloat16"),
    "index dtype": (replaced(steps=torch.tensor([0.0, 1.0])), TypeError, r"steps must be int32 or int64, got torch.float32"),
    "index int16": (replaced(dst_slots=torch.tensor([0, 1], dtype=torch.int16)), TypeError, r"dst_slots must be int32 or int64"),
    "index rank": (replaced(src_slots=torch.tensor([[0, 1]])), ValueError, r"src_slots must be 1-D \[B\]"),
    "index length": (replaced(steps=torch.tensor([0, 1, 2])), ValueError, r"steps has 3 rows but dst_slots has 2"),
    # the dispatcher itself rejects a non-tensor (RuntimeError naming 'windows'); the Triton
    # launcher path checks it too (TypeError)
    "not a tensor": (replaced(windows=[1, 2]), (TypeError, RuntimeError), r"(windows must be a torch.Tensor, got list|for argument 'windows')"),
    "state layout": (dict(good_args(), state_layout="channels_last"), ValueError, r"state_layout must be one of"),
    "expanded state": (replaced(conv_state=torch.randn(L, 1, DIM, K - 1).expand(L, N, DIM, K - 1)), ValueError, r"conv_state has overlapping elements"),
    # slots sharing elements (unfold: each slot's window a column further along), where PyTorch's own check gives up
    "unfolded state": (replaced(conv_state=torch.randn(L, DIM, N + K - 2).unfold(2, K - 1, 1).permute(0, 2, 1, 3)), ValueError, r"conv_state has overlapping elements"),
    "window-major shape": (dict(good_args(), state_layout="window_major"), ValueError, r"dim \(axis 3\) is 8 but conv_state has 3"),
}


@pytest.mark.parametrize("name", BAD_CALLS)
@pytest.mark.parametrize("impl", impl_params("cpu", "triton_interpret"))
def test_bad_call_raises_and_writes_nothing(impl, name):
    args, error, message = BAD_CALLS[name]
    state = args["conv_state"]
    before = whole_storage(state).clone() if isinstance(state, torch.Tensor) else None
    with pytest.raises(error, match=message):
        impl.scatter(**args)
    if before is not None:
        assert torch.equal(whole_storage(state), before)


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_on_meta(name):
    """The fake implementation validates too: errors surface at trace time."""
    args, error, message = BAD_CALLS[name]
    meta = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    if name == "expanded state":  # .to() would materialise the expanded tensor (and the unfolded one)
        meta["conv_state"] = torch.empty(L, 1, DIM, K - 1, device="meta").expand(L, N, DIM, K - 1)
    if name == "unfolded state":
        meta["conv_state"] = torch.empty(L, DIM, N + K - 2, device="meta").unfold(2, K - 1, 1).permute(0, 2, 1, 3)
    with pytest.raises(error, match=message):
        sgl_convwin.scatter(**meta)


def test_index_on_another_device():
    args = replaced(dst_slots=torch.tensor([0, 1], device="meta"))
    with pytest.raises(ValueError, match=r"dst_slots is on meta but conv_state is on cpu"):
        sgl_convwin.ops._run_scatter(lambda *a: None, *args.values(), "dim_major")


def test_windows_on_another_device():
    args = replaced(windows=torch.randn(L, M, D, DIM, K - 1, device="meta"))
    with pytest.raises(ValueError, match=r"windows is on meta but conv_state is on cpu"):
        sgl_convwin.ops._run_scatter(lambda *a: None, *args.values(), "dim_major")


@pytest.mark.gpu
def test_cpu_indices_with_cuda_cache():
    args = good_args("cuda")
    before = args["conv_state"].clone()
    with pytest.raises(ValueError, match=r"steps is on cpu but conv_state is on cuda"):
        sgl_convwin.scatter(**dict(args, steps=torch.tensor([0, 1])))
    assert torch.equal(args["conv_state"], before)


def test_shared_storage():
    buffer = torch.randn(L, M, D + K - 2, DIM)
    windows = sgl_convwin.window_view(buffer, "token_major", D, K)
    conv_state = buffer[:, :, :3].transpose(-1, -2)  # [L, M, DIM, 3], same storage
    before = buffer.clone()
    index = torch.tensor([0])
    with pytest.raises(ValueError, match=r"conv_state and windows share storage"):
        sgl_convwin.scatter(conv_state, windows, index, index, index)
    assert torch.equal(buffer, before)


def test_separate_storages_names_the_first_shared_pair():
    """The aliasing check every op runs: a written tensor sharing storage with any later argument is
    named with it; read tensors may share (q, k, v are views of one conv output); empty storages
    and absent tensors are never a conflict."""
    from sgl_convwin.validation import check_separate_storages

    conv_out, a, b = torch.zeros(2, 12), torch.zeros(3), torch.zeros(3)
    q, k, v = conv_out[:, :4], conv_out[:, 4:8], conv_out[:, 8:]
    check_separate_storages("op", {"a": a, "b": b}, {"q": q, "k": k, "v": v, "bias": None})
    check_separate_storages("op", {"a": torch.zeros(0), "b": torch.zeros(0)}, {"q": torch.zeros(0)})
    with pytest.raises(ValueError, match=r"^op: b and v share storage"):
        check_separate_storages("op", {"a": a, "b": conv_out[0]}, {"q": None, "v": v})
    with pytest.raises(ValueError, match=r"^op: a and b share storage"):
        check_separate_storages("op", {"a": a, "b": a[1:]}, {"q": q})
    with pytest.raises(ValueError, match=r"^op: a and k share storage"):
        check_separate_storages("op", {"a": k[0], "b": b}, {"k": k})


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(layout="ring"), ValueError, r"layout must be one of"),
        (dict(kernel_size=1), ValueError, r"kernel_size must be >= 2, got 1"),
        (dict(num_draft=0), ValueError, r"num_draft must be >= 1, got 0"),
        (dict(dim=0), ValueError, r"dim must be >= 1, got 0"),
        (dict(num_layers=2.0), TypeError, r"num_layers must be an int, got float"),
        (dict(dtype=torch.float64), TypeError, r"dtype must be float32, float16 or bfloat16"),
        (dict(dtype=torch.int8), TypeError, r"dtype must be float32, float16 or bfloat16"),
    ],
)
def test_bad_alloc(kwargs, error, message):
    args = dict(num_layers=2, num_slots=3, dim=4, num_draft=4, kernel_size=4)
    options = {k: kwargs.pop(k) for k in ("layout", "dtype") if k in kwargs}
    args.update(kwargs)
    with pytest.raises(error, match=message):
        sgl_convwin.alloc_windows(*args.values(), device="cpu", **options)


@pytest.mark.parametrize(
    "layout, shape, message",
    [
        ("token_major", (2, 3, 5, 8), r"token_major buffer for num_draft=4, kernel_size=4 must be \[L, M, N\+K-2, dim\] with N\+K-2 = 6"),
        ("channel_major", (2, 3, 8, 5), r"N\+K-2 = 6, got shape \(2, 3, 8, 5\)"),
        ("dense", (2, 3, 4, 8, 4), r"must be \[L, M, 4, dim, 3\]"),
        ("dense", (2, 3, 6, 8), r"a dense buffer must be 5-D"),
        ("token_major", (3, 6, 8), r"a token_major buffer must be 4-D"),
    ],
)
def test_bad_window_view(layout, shape, message):
    with pytest.raises(ValueError, match=message):
        sgl_convwin.window_view(torch.zeros(shape), layout, 4, 4)


# ---------------------------------------------------------------------------------------------
# Index values: never trusted; the checked mode names the bad row.
# ---------------------------------------------------------------------------------------------

CHECKED = {
    "dst too large": (dict(dst_slots=[0, N]), r"dst_slots\[1\] = 3 is out of range for conv_state with 3 slots"),
    "src too large": (dict(src_slots=[M + 4, 0]), r"src_slots\[0\] = 6 is out of range for windows with 2 slots"),
    "src negative": (dict(src_slots=[0, -1]), r"src_slots\[1\] = -1 is out of range"),
    "step too large": (dict(steps=[D, 0]), r"steps\[0\] = 4 is out of range for 4 draft steps"),
    "duplicate dst": (dict(dst_slots=[1, 1]), r"rows 0 and 1 both commit into conv_state slot 1"),
}


@pytest.mark.parametrize("name", CHECKED)
@pytest.mark.parametrize("impl", impl_params())
def test_checked_mode_names_the_row(impl, name):
    changes, message = CHECKED[name]
    args = good_args(impl.device)
    for key, values in changes.items():
        args[key] = torch.tensor(values, device=impl.device)
    before = args["conv_state"].clone()
    with sgl_convwin.index_checks():
        assert sgl_convwin.index_checks_enabled()
        with pytest.raises(IndexError, match=message):
            impl.scatter(**args)
    assert not sgl_convwin.index_checks_enabled()
    assert torch.equal(args["conv_state"], before)


@pytest.mark.parametrize("impl", impl_params())
def test_checked_mode_accepts_skipped_rows(impl):
    args = good_args(impl.device)
    args["dst_slots"] = torch.tensor([-1, 2], device=impl.device)
    args["steps"] = torch.tensor([D + 7, -1], device=impl.device)  # both rows skipped
    before = args["conv_state"].clone()
    with sgl_convwin.index_checks():
        impl.scatter(**args)
    assert torch.equal(args["conv_state"], before)


def test_checked_mode_from_environment():
    import subprocess
    import sys

    code = "import sgl_convwin; print(sgl_convwin.index_checks_enabled())"
    for value, expected in (("1", "True"), ("0", "False")):
        env = dict(__import__("os").environ, SGL_CONVWIN_CHECK_INDICES=value)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == expected


# ---------------------------------------------------------------------------------------------
# scatter_tree
# ---------------------------------------------------------------------------------------------

NODES = 4


def good_tree_args(device="cpu"):
    index = torch.tensor([0, 1], device=device)
    return dict(
        conv_state=torch.randn(L, N, DIM, K - 1, device=device),
        rows=torch.randn(L, M, NODES + K - 2, DIM, device=device),
        dst_slots=index,
        src_slots=index.flip(0),
        nodes=index + 2,
        parents=torch.tensor([[-1, 0, 1, 1], [-1, -1, 0, 2]], device=device),
    )


def tree_replaced(**changes):
    args = good_tree_args()
    args.update(changes)
    return args


BAD_TREE_CALLS = {
    "rows rank": (tree_replaced(rows=torch.randn(L, M, DIM)), ValueError, r"rows must be 4-D \[L, M, N\+K-2, dim\]"),
    "rows dim": (tree_replaced(rows=torch.randn(L, M, NODES + 2, DIM + 1)), ValueError, r"rows dim \(axis 3\) is 9 but conv_state has 8"),
    "rows layers": (tree_replaced(rows=torch.randn(L + 1, M, NODES + 2, DIM)), ValueError, r"rows layers \(axis 0\) is 3 but conv_state has 2"),
    "no node rows": (tree_replaced(rows=torch.randn(L, M, 2, DIM), parents=torch.zeros(2, 0, dtype=torch.int64)), ValueError, r"K-2 = 2 history rows and at least one node, got 2"),
    "parents shape": (tree_replaced(parents=torch.zeros(2, NODES + 1, dtype=torch.int64)), ValueError, r"parents must be \[B, N\] = \[2, 4\]"),
    "parents rows": (tree_replaced(parents=torch.zeros(3, NODES, dtype=torch.int64)), ValueError, r"parents must be \[B, N\] = \[2, 4\]"),
    "parents dtype": (tree_replaced(parents=torch.zeros(2, NODES)), TypeError, r"parents must be int32 or int64, got torch.float32"),
    "nodes dtype": (tree_replaced(nodes=torch.tensor([0, 1], dtype=torch.int16)), TypeError, r"nodes must be int32 or int64"),
    "nodes length": (tree_replaced(nodes=torch.tensor([0])), ValueError, r"nodes has 1 rows but dst_slots has 2"),
    "rows dtype": (tree_replaced(rows=torch.zeros(L, M, NODES + 2, DIM, dtype=torch.float64)), TypeError, r"rows must be float32, float16 or bfloat16"),
    "state layout": (dict(good_tree_args(), state_layout="kd"), ValueError, r"state_layout must be one of"),
}


@pytest.mark.parametrize("name", BAD_TREE_CALLS)
@pytest.mark.parametrize("impl", impl_params("cpu", "cpu_op", "triton_interpret"))
def test_bad_tree_call_raises_and_writes_nothing(impl, name):
    args, error, message = BAD_TREE_CALLS[name]
    before = args["conv_state"].clone()
    with pytest.raises(error, match=message):
        impl.scatter_tree(**args)
    assert torch.equal(args["conv_state"], before)


@pytest.mark.parametrize("name", BAD_TREE_CALLS)
def test_bad_tree_call_raises_on_meta(name):
    args, error, message = BAD_TREE_CALLS[name]
    meta = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    with pytest.raises(error, match=message):
        sgl_convwin.scatter_tree(**meta)


def test_tree_rows_sharing_storage_with_state():
    rows = torch.randn(L, N, NODES + K - 2, DIM)
    conv_state = rows[:, :, :3].transpose(-1, -2)
    args = dict(good_tree_args(), conv_state=conv_state, rows=rows)
    with pytest.raises(ValueError, match=r"conv_state and rows share storage"):
        sgl_convwin.scatter_tree(**args)


CHECKED_TREE = {
    "node too large": (dict(nodes=[0, NODES]), r"nodes\[1\] = 4 is out of range for 4 draft nodes"),
    "bad parent": (dict(parents=[[-1, 0, 2, 1], [-1, -1, 0, 2]]), r"parents\[0, 2\] = 2; a node's parent must be an earlier node \(0..1\) or -1"),
    "parent below -1": (dict(parents=[[-1, 0, 1, 1], [-2, -1, 0, 2]]), r"parents\[1, 0\] = -2"),
    "dst too large": (dict(dst_slots=[N, 0]), r"dst_slots\[0\] = 3 is out of range"),
    "duplicate dst": (dict(dst_slots=[2, 2]), r"rows 0 and 1 both commit into conv_state slot 2"),
}


@pytest.mark.parametrize("name", CHECKED_TREE)
@pytest.mark.parametrize("impl", impl_params())
def test_tree_checked_mode_names_the_row(impl, name):
    changes, message = CHECKED_TREE[name]
    args = good_tree_args(impl.device)
    for key, values in changes.items():
        args[key] = torch.tensor(values, device=impl.device)
    before = args["conv_state"].clone()
    with sgl_convwin.index_checks(), pytest.raises(IndexError, match=message):
        impl.scatter_tree(**args)
    assert torch.equal(args["conv_state"], before)


@pytest.mark.parametrize("impl", impl_params("cpu", "cpu_op", "triton_interpret"))
def test_state_that_cannot_be_written_in_place(impl):
    """A state that requires grad, and an inference tensor outside inference mode, are refused
    before anything is written; inside inference mode the inference tensor is written."""
    args = good_args()
    leaf = torch.zeros(L, N, DIM, K - 1, requires_grad=True)
    with pytest.raises(ValueError, match=r"conv_state requires grad; the ops write it in place"):
        impl.scatter(**dict(args, conv_state=leaf))
    assert not leaf.detach().any()
    impl.scatter(**dict(args, conv_state=leaf.detach()))  # the remedy the message names
    assert leaf.detach().any()

    with torch.inference_mode():
        inference = torch.zeros(L, N, DIM, K - 1)
    with pytest.raises(ValueError, match=r"conv_state is an inference tensor"):
        impl.scatter(**dict(args, conv_state=inference))
    assert not inference.any()
    with torch.inference_mode():
        impl.scatter(**dict(args, conv_state=inference))
    assert inference.any()


@pytest.mark.parametrize("bad", [None, [1, 2], 3.0])
def test_public_functions_raise_type_error_for_any_non_tensor(bad):
    """Not only None: a list or a number in a tensor argument is a TypeError naming it, before
    the dispatcher sees it."""
    buffer = sgl_convwin.alloc_windows(1, 2, 4, 2, 4)
    index = torch.tensor([0])
    with pytest.raises(TypeError, match="convwin.scatter: conv_state must be a torch.Tensor"):
        sgl_convwin.scatter(bad, sgl_convwin.window_view(buffer, "token_major", 2, 4), index, index, index)
    with pytest.raises(TypeError, match="convwin.capture: x must be a torch.Tensor"):
        sgl_convwin.capture(buffer, torch.zeros(1, 2, 4, 3), bad, index, index, 0)
    with pytest.raises(TypeError, match="convwin.gdn_commit: .* must be a torch.Tensor"):
        sgl_convwin.gdn_commit(bad, torch.zeros(1, 2, 4, 3), buffer, torch.zeros(1, 2, 2, 2, 1),
                               torch.zeros(1, 4, 4), index, index, index,
                               num_k_heads=1, head_k_dim=1, num_v_heads=1, head_v_dim=2)
