"""The public path under torch.compile(fullgraph=True): same results, no graph breaks, no clones."""

import re

import pytest
import torch
from torch._inductor.utils import run_and_get_code

import sgl_convwin
from sgl_convwin import reference
from support import DEVICES, CountingBackend

L, M, N, D, K, DIM = 2, 3, 5, 4, 4, 16


def commit_step(conv_state, buffer, dst, src, steps, layout, state_layout):
    windows = sgl_convwin.window_view(buffer, layout, D, K)
    sgl_convwin.scatter(conv_state, windows, dst, src, steps, state_layout=state_layout)


def inputs(device, layout, state_layout, seed=0):
    generator = torch.Generator().manual_seed(seed)
    buffer = torch.randn(sgl_convwin.physical_shape(layout, L, M, DIM, D, K), generator=generator)
    shape = (L, N, DIM, K - 1) if state_layout == "dim_major" else (L, N, K - 1, DIM)
    conv_state = torch.randn(shape, generator=generator)
    dst = torch.tensor([3, -1, 0, 1])
    src = torch.tensor([2, 0, 0, 1], dtype=torch.int32)
    steps = torch.tensor([1, 2, 3, 0])
    return [t.to(device) for t in (conv_state, buffer, dst, src, steps)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_layout", sgl_convwin.STATE_LAYOUTS)
@pytest.mark.parametrize("layout", sgl_convwin.LAYOUTS)
def test_compiled_commit_matches_oracle(device, layout, state_layout):
    torch._dynamo.reset()
    conv_state, buffer, dst, src, steps = inputs(device, layout, state_layout)
    windows = sgl_convwin.window_view(buffer, layout, D, K)
    expected = reference.scatter_reference(conv_state, windows, dst, src, steps, state_layout)
    compiled = torch.compile(commit_step, fullgraph=True)
    compiled(conv_state, buffer, dst, src, steps, layout, state_layout)
    assert torch.equal(conv_state.cpu(), expected)


def allocations(code: str) -> list[str]:
    return re.findall(r"empty_strided_\w+\(\([^)]*\)", code)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_layout", sgl_convwin.STATE_LAYOUTS)
@pytest.mark.parametrize("layout", sgl_convwin.LAYOUTS)
def test_compiled_commit_does_not_copy_the_cache(device, layout, state_layout):
    """Inductor must call the op in place on the caller's buffers: no clone, no copy-back."""
    torch._dynamo.reset()
    args = inputs(device, layout, state_layout, seed=1)
    compiled = torch.compile(commit_step, fullgraph=True)
    _, codes = run_and_get_code(compiled, *args, layout, state_layout)
    code = "\n".join(codes)
    assert "torch.ops.convwin.scatter.default(" in code
    assert allocations(code) == [], allocations(code)
    assert ".copy_(" not in code and "clone" not in code


@pytest.mark.parametrize("device", DEVICES)
def test_window_major_view_is_not_cloned_either(device):
    """Passing a transposed view of a window-major state also runs in place (checked here)."""
    torch._dynamo.reset()
    conv_state, buffer, dst, src, steps = inputs(device, "token_major", "window_major", seed=2)
    windows = sgl_convwin.window_view(buffer, "token_major", D, K)
    expected = reference.scatter_reference(conv_state, windows, dst, src, steps, "window_major")

    def step(conv_state, buffer, dst, src, steps):
        windows = sgl_convwin.window_view(buffer, "token_major", D, K)
        sgl_convwin.scatter(conv_state.transpose(-1, -2), windows, dst, src, steps)

    _, codes = run_and_get_code(torch.compile(step, fullgraph=True), conv_state, buffer, dst, src, steps)
    assert allocations("\n".join(codes)) == []
    assert torch.equal(conv_state.cpu(), expected)


@pytest.mark.parametrize("device", DEVICES)
def test_dynamic_batch_compiles_at_most_twice(device):
    torch._dynamo.reset()
    counting_backend = CountingBackend()

    conv_state, buffer, _, _, _ = inputs(device, "token_major", "dim_major")
    step = torch.compile(commit_step, fullgraph=True, dynamic=True, backend=counting_backend)
    generator = torch.Generator().manual_seed(3)
    for batch in (1, 2, 3, 7, 64, 200, 512):
        active = min(batch, N)  # distinct destinations, the rest padding
        dst = torch.full((batch,), -1, dtype=torch.int64)
        dst[:active] = torch.randperm(N, generator=generator)[:active]
        src = torch.randint(0, M, (batch,), generator=generator)
        steps = torch.randint(-1, D, (batch,), generator=generator)
        dst, src, steps = dst.to(device), src.to(device), steps.to(device)
        windows = sgl_convwin.window_view(buffer, "token_major", D, K)
        expected = reference.scatter_reference(conv_state, windows, dst, src, steps)
        step(conv_state, buffer, dst, src, steps, "token_major", "dim_major")
        assert torch.equal(conv_state.cpu(), expected)
    assert counting_backend.compiles <= 2, f"{counting_backend.compiles} compilations for batch sizes 1..512"


def tree_commit_step(conv_state, buffer, dst, src, nodes, parents, layout, state_layout):
    rows = buffer if layout == "token_major" else buffer.transpose(-1, -2)
    sgl_convwin.scatter_tree(conv_state, rows, dst, src, nodes, parents, state_layout=state_layout)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_layout", sgl_convwin.STATE_LAYOUTS)
@pytest.mark.parametrize("layout", ("token_major", "channel_major"))
def test_compiled_tree_commit(device, layout, state_layout):
    torch._dynamo.reset()
    conv_state, buffer, dst, src, _ = inputs(device, layout, state_layout, seed=4)
    nodes = torch.tensor([3, 0, 2, 1], device=device)
    parents = torch.tensor([[-1, -1, 0, 1], [-1, 0, 1, 2], [-1, -1, -1, 0], [-1, 0, 0, 0]], device=device)
    rows = buffer if layout == "token_major" else buffer.transpose(-1, -2)
    expected = reference.scatter_tree_reference(conv_state, rows, dst, src, nodes, parents, state_layout)
    compiled = torch.compile(tree_commit_step, fullgraph=True)
    _, codes = run_and_get_code(compiled, conv_state, buffer, dst, src, nodes, parents, layout, state_layout)
    code = "\n".join(codes)
    assert "torch.ops.convwin.scatter_tree.default(" in code
    assert allocations(code) == [] and ".copy_(" not in code
    assert torch.equal(conv_state.cpu(), expected)


def verify_step(outs, buffer, conv_state, x, weight, bias, buffer_slots, state_slots, nodes, parents, layout,
                out_slices=False):
    """A whole speculative step as an engine compiles it: per layer the fused conv (writing layer
    ``layer`` of the whole ``outs`` and capturing into the whole buffer), then one commit for all
    layers. ``out_slices``: pass ``outs[layer]`` instead (refused under dynamic shapes)."""
    for layer in range(x.shape[0]):
        sgl_convwin.causal_conv1d_verify(
            outs[layer] if out_slices else outs, buffer, conv_state, x[layer], weight[layer], bias[layer], buffer_slots, state_slots,
            layer, parents, layout=layout, activation="silu",
        )
    if layout == "dense":
        sgl_convwin.scatter(conv_state, buffer, state_slots, buffer_slots, nodes)
    else:
        rows = buffer if layout == "token_major" else buffer.transpose(-1, -2)
        sgl_convwin.scatter_tree(conv_state, rows, state_slots, buffer_slots, nodes, parents)


def verify_inputs(device, layout, seed):
    generator = torch.Generator().manual_seed(seed)
    nodes_per_tree, B = 5, 3
    parents = torch.tensor([[-1, -1, 0, 1, 2], [-1, 0, 1, 2, 3], [-1, 0, 0, 1, 1]])
    tensors = dict(
        outs=torch.zeros(L, B, nodes_per_tree, DIM),
        buffer=torch.zeros(sgl_convwin.physical_shape(layout, L, M, DIM, nodes_per_tree, K)),
        conv_state=torch.randn(L, N, DIM, K - 1, generator=generator),
        x=torch.randn(L, B, nodes_per_tree, DIM, generator=generator),
        weight=torch.randn(L, DIM, K, generator=generator),
        bias=torch.randn(L, DIM, generator=generator),
        buffer_slots=torch.tensor([2, 0, -1]),
        state_slots=torch.tensor([4, 1, 0]),
        nodes=torch.tensor([3, 4, 2]),
        parents=parents,
    )
    return {k: v.to(device) for k, v in tensors.items()}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", sgl_convwin.LAYOUTS)
@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_verify_step(device, layout, dynamic):
    """Compiled (dynamic shapes or not) == eager bit for bit; the ops run in place: no allocation,
    no copy, no clone."""
    torch._dynamo.reset()
    eager = verify_inputs(device, layout, seed=5)
    compiled_args = verify_inputs(device, layout, seed=5)
    verify_step(**eager, layout=layout)
    compiled = torch.compile(verify_step, fullgraph=True, dynamic=dynamic)
    _, codes = run_and_get_code(compiled, **compiled_args, layout=layout)
    code = "\n".join(codes)
    assert code.count("torch.ops.convwin.causal_conv1d_verify.default(") == L
    assert allocations(code) == [], allocations(code)
    assert ".copy_(" not in code and "clone" not in code
    for name in ("outs", "buffer", "conv_state"):
        assert torch.equal(compiled_args[name], eager[name]), name
    assert eager["outs"].any() and not torch.equal(eager["conv_state"], verify_inputs(device, layout, 5)["conv_state"])


def assert_compiled_step_in_place(step, make, commit, dynamic, **kwargs):
    """``step`` compiled (fullgraph) on ``make()``'s tensors == eager bit for bit, with one ``commit``
    in the graph, no allocation, no copy or clone of the states, and the commit writing something."""
    eager, compiled_args, before = make(), make(), make()
    step(**eager, **kwargs)
    compiled = torch.compile(step, fullgraph=True, dynamic=dynamic)
    _, codes = run_and_get_code(compiled, **compiled_args, **kwargs)
    code = "\n".join(codes)
    assert code.count(f"torch.ops.convwin.{commit}.default(") == 1
    assert allocations(code) == [], allocations(code)
    assert ".copy_(" not in code and "clone" not in code
    for name in ("ssm_state", "conv_state", "buffer", "gates"):
        assert torch.equal(compiled_args[name], eager[name]), name
    assert not torch.equal(eager["ssm_state"], before["ssm_state"]), "the commit wrote nothing"


def replay_step(ssm_state, conv_state, buffer, gates, x, g, beta, conv_weight, slots, steps, *, layout, dims):
    """A verify pass that keeps no state (capture inputs and gates), then the replay commit."""
    for layer in range(buffer.shape[0]):
        sgl_convwin.capture(buffer, conv_state, x[layer], slots, slots, layer, layout=layout)
        sgl_convwin.capture_gates(gates, g[layer], beta[layer], slots, layer)
    sgl_convwin.gdn_commit(ssm_state, conv_state, buffer, gates, conv_weight, slots, slots, steps,
                           layout=layout, **dims)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", sgl_convwin.LAYOUTS)
@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_replay_step(device, layout, dynamic):
    """Compiled (fullgraph) == eager bit for bit, and the states are written in place: no copy or
    clone of ssm_state or conv_state in the generated code."""
    torch._dynamo.reset()
    generator = torch.Generator().manual_seed(7)
    layers, slots_n, hk, dk, hv, dv, draft = 2, 4, 1, 4, 2, 4, 3
    dim = 2 * hk * dk + hv * dv
    dims = dict(num_k_heads=hk, head_k_dim=dk, num_v_heads=hv, head_v_dim=dv)

    def make():
        generator.manual_seed(7)
        return dict(
            ssm_state=torch.randn(layers, slots_n, hv, dk, dv, generator=generator).to(device),
            conv_state=torch.randn(layers, slots_n, dim, K - 1, generator=generator).to(device),
            buffer=sgl_convwin.alloc_windows(layers, slots_n, dim, draft, K, layout=layout, dtype=torch.float32,
                                             device=device),
            gates=sgl_convwin.alloc_gates(layers, slots_n, draft, hv, device=device),
            x=torch.randn(layers, 3, draft, dim, generator=generator).to(device),
            g=-torch.rand(layers, 3, draft, hv, generator=generator).to(device),
            beta=torch.rand(layers, 3, draft, hv, generator=generator).to(device),
            conv_weight=torch.randn(layers, dim, K, generator=generator).to(device),
            slots=torch.tensor([2, 0, -1], device=device),
            steps=torch.tensor([1, 2, 0], device=device),
        )

    assert_compiled_step_in_place(replay_step, make, "gdn_commit", dynamic, layout=layout, dims=dims)


def mamba2_replay_step(ssm_state, conv_state, buffer, gates, x, dt, A, conv_weight, slots, steps, *, layout, dims):
    """replay_step for Mamba2: dt the one gate, then mamba2_commit."""
    for layer in range(buffer.shape[0]):
        sgl_convwin.capture(buffer, conv_state, x[layer], slots, slots, layer, layout=layout)
        sgl_convwin.capture_gates(gates, dt[layer], None, slots, layer)
    sgl_convwin.mamba2_commit(ssm_state, conv_state, buffer, gates, conv_weight, A, slots, slots, steps,
                              layout=layout, **dims)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_mamba2_replay_step(device, dynamic):
    """test_compiled_replay_step's checks for mamba2_commit (token_major)."""
    torch._dynamo.reset()
    generator = torch.Generator().manual_seed(8)
    layers, slots_n, heads, head_dim, groups, d_state, draft = 2, 4, 2, 4, 1, 4, 3
    dim = heads * head_dim + 2 * groups * d_state
    dims = dict(num_heads=heads, head_dim=head_dim, n_groups=groups, d_state=d_state)

    def make():
        generator.manual_seed(8)
        return dict(
            ssm_state=torch.randn(layers, slots_n, heads, head_dim, d_state, generator=generator).to(device),
            conv_state=torch.randn(layers, slots_n, dim, K - 1, generator=generator).to(device),
            buffer=sgl_convwin.alloc_windows(layers, slots_n, dim, draft, K, dtype=torch.float32, device=device),
            gates=sgl_convwin.alloc_gates(layers, slots_n, draft, heads, num_gates=1, device=device),
            x=torch.randn(layers, 3, draft, dim, generator=generator).to(device),
            dt=torch.rand(layers, 3, draft, heads, generator=generator).to(device),
            A=-torch.rand(layers, heads, generator=generator).to(device),
            conv_weight=torch.randn(layers, dim, K, generator=generator).to(device),
            slots=torch.tensor([2, 0, -1], device=device),
            steps=torch.tensor([1, 2, 0], device=device),
        )

    assert_compiled_step_in_place(mamba2_replay_step, make, "mamba2_commit", dynamic, layout="token_major", dims=dims)


@pytest.mark.parametrize("device", DEVICES)
def test_output_slices_are_right_or_refused(device):
    """out[layer] slices: right eagerly and with static shapes; with dynamic shapes Inductor would
    write every slice at offset 0 of outs (pytorch/pytorch#198068), so the op refuses them."""
    eager = verify_inputs(device, "token_major", seed=6)
    verify_step(**eager, layout="token_major", out_slices=True)
    whole = verify_inputs(device, "token_major", seed=6)
    verify_step(**whole, layout="token_major")
    assert torch.equal(eager["outs"], whole["outs"]) and eager["outs"][1].any()
    torch._dynamo.reset()
    static = verify_inputs(device, "token_major", seed=6)
    torch.compile(verify_step, fullgraph=True, dynamic=False)(**static, layout="token_major", out_slices=True)
    assert torch.equal(static["outs"], eager["outs"])
    torch._dynamo.reset()
    dynamic = verify_inputs(device, "token_major", seed=6)
    with pytest.raises(Exception, match="symbolic storage offset"):
        torch.compile(verify_step, fullgraph=True, dynamic=True)(**dynamic, layout="token_major", out_slices=True)


def test_state_slices_are_refused_under_dynamic_shapes():
    """The same protection for the replay commit's states: a slot-range view of a larger pool at a
    symbolic offset raises instead of being written at the pool's start."""
    from support import make_replay

    replay = make_replay(num_slots=6, seed=8)
    pool = torch.cat([replay.ssm_state[:, :1], replay.ssm_state], dim=1)  # one extra slot in front

    def commit(pool, conv_state):
        sgl_convwin.gdn_commit(pool[:, 1:], conv_state, *replay.args()[2:], **replay.kwargs)

    torch._dynamo.reset()
    with pytest.raises(Exception, match="symbolic storage offset"):
        torch.compile(commit, fullgraph=True, dynamic=True)(pool.clone(), replay.conv_state.clone())
    torch._dynamo.reset()
    static_pool, conv_state = pool.clone(), replay.conv_state.clone()
    torch.compile(commit, fullgraph=True, dynamic=False)(static_pool, conv_state)
    eager_pool, eager_conv = pool.clone(), replay.conv_state.clone()
    commit(eager_pool, eager_conv)
    assert torch.equal(static_pool, eager_pool) and not torch.equal(eager_pool, pool)


def test_cache_verify_into_a_whole_output_compiles_with_dynamic_shapes():
    """The pattern integration.md recommends, through ConvWindowCache: one [L, B, N, dim] output
    passed whole, dynamic shapes, equal to eager."""
    generator = torch.Generator().manual_seed(9)
    cache = sgl_convwin.ConvWindowCache(L, M, DIM, 4, K, dtype=torch.float32)
    conv_state = torch.randn(L, N, DIM, K - 1, generator=generator)
    x = torch.randn(L, 3, 4, DIM, generator=generator)
    weight = torch.randn(L, DIM, K, generator=generator)
    slots = torch.tensor([0, 2, -1])

    def step(x):
        out = torch.zeros(L, 3, 4, DIM)
        for layer in range(L):
            cache.causal_conv1d_verify(out, conv_state, x[layer], weight[layer], None, slots, layer)
        return out

    expected = step(x)
    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True, dynamic=True)(x)
    assert torch.equal(got, expected) and expected[1, 0].any() and not expected[:, 2].any()
