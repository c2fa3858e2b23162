"""ConvWindowCache: a module whose buffer is registered, whose calls equal the functional ops, and
which compiles (fullgraph, dynamic batch) without copying the cache."""

import re

import pytest
import torch
from torch._inductor.utils import run_and_get_code

import sgl_convwin
from sgl_convwin import ConvWindowCache
from support import DEVICES, CountingBackend

L, M, DIM, K = 2, 5, 24, 4


def test_registered_buffer_and_sizes():
    for layout in sgl_convwin.LAYOUTS:
        cache = ConvWindowCache(L, M, DIM, 4, K, layout=layout)
        assert dict(cache.named_buffers())["buffer"] is cache.buffer
        assert "buffer" not in cache.state_dict()  # a runtime cache, not a weight
        assert cache.buffer.shape == sgl_convwin.physical_shape(layout, L, M, DIM, 4, K)
        per_input = L * M * DIM * 2  # bf16
        assert cache.nbytes == per_input * (4 * (K - 1) if layout == "dense" else 4 + K - 2)
        assert cache.windows.shape == (L, M, 4, DIM, K - 1)
        assert f"layout={layout!r}" in repr(cache)
        bf16_bytes = cache.nbytes
        cache.to(torch.float32)  # the buffer follows the module
        assert cache.buffer.dtype == torch.float32 and cache.nbytes == 2 * bf16_bytes
    with pytest.raises(ValueError, match="dense ConvWindowCache stores windows"):
        ConvWindowCache(L, M, DIM, 4, K, layout="dense").rows
    with pytest.raises(ValueError, match="layout must be one of"):
        ConvWindowCache(L, M, DIM, 4, K, layout="rows")


def step_inputs(device, num_nodes, batch=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return dict(
        conv_state=torch.randn(L, M + 1, DIM, K - 1, generator=g).to(device),
        x=torch.randn(L, batch, num_nodes, DIM, generator=g).to(device),
        weight=torch.randn(L, DIM, K, generator=g).to(device),
        bias=torch.randn(L, DIM, generator=g).to(device),
        slots=torch.tensor([3, 0, -1][:batch], device=device),
        state_slots=torch.tensor([5, 1, 2][:batch], device=device),
        accepted=torch.tensor([num_nodes - 1, 1, 0][:batch], device=device),
    )


def cache_step(cache, outs, conv_state, x, weight, bias, slots, state_slots, accepted, parents):
    for layer in range(x.shape[0]):
        cache.causal_conv1d_verify(outs[layer], conv_state, x[layer], weight[layer], bias[layer], slots, layer,
                                   state_slots=state_slots, parents=parents, activation="silu")
    cache.commit(conv_state, slots, accepted, state_slots=state_slots, parents=parents)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tree", (False, True), ids=("chain", "tree"))
def test_methods_equal_the_ops_and_layouts_agree(device, tree):
    """The module's step equals the functional ops on a plain buffer; and every layout leaves the
    same committed state and outputs (dedup == dense), bit for bit."""
    num_nodes = 6 if tree else 4
    parents = torch.tensor([[-1, -1, 0, 1, 1, 3]] * 3, device=device) if tree else None
    results = []
    for layout in sgl_convwin.LAYOUTS:
        cache = ConvWindowCache(L, M, DIM, num_nodes, K, layout=layout, dtype=torch.float32, device=device)
        inputs = step_inputs(device, num_nodes)
        outs = torch.zeros(L, 3, num_nodes, DIM, device=device)
        cache_step(cache, outs, parents=parents, **inputs)

        functional = step_inputs(device, num_nodes)
        buffer = sgl_convwin.alloc_windows(L, M, DIM, num_nodes, K, layout=layout, dtype=torch.float32, device=device)
        f_outs = torch.zeros_like(outs)
        for layer in range(L):
            sgl_convwin.causal_conv1d_verify(
                f_outs[layer], buffer, functional["conv_state"], functional["x"][layer], functional["weight"][layer],
                functional["bias"][layer], functional["slots"], functional["state_slots"], layer, parents,
                layout=layout, activation="silu")
        if tree and layout != "dense":
            rows = buffer if layout == "token_major" else buffer.transpose(-1, -2)
            sgl_convwin.scatter_tree(functional["conv_state"], rows, functional["state_slots"], functional["slots"],
                                     functional["accepted"], parents)
        else:
            sgl_convwin.scatter(functional["conv_state"], sgl_convwin.window_view(buffer, layout, num_nodes, K),
                                functional["state_slots"], functional["slots"], functional["accepted"])
        assert torch.equal(cache.buffer, buffer) and torch.equal(outs, f_outs)
        assert torch.equal(inputs["conv_state"], functional["conv_state"])
        results.append((outs, inputs["conv_state"]))
    for outs, state in results[1:]:
        assert torch.equal(outs, results[0][0]) and torch.equal(state, results[0][1])


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_step_does_not_copy_the_cache(device):
    torch._dynamo.reset()
    cache = ConvWindowCache(L, M, DIM, 4, K, dtype=torch.float32, device=device)
    inputs = step_inputs(device, 4)
    outs = torch.zeros(L, 3, 4, DIM, device=device)
    compiled = torch.compile(lambda *a: cache_step(cache, *a, parents=None), fullgraph=True)
    _, codes = run_and_get_code(compiled, outs, *inputs.values())
    code = "\n".join(codes)
    assert code.count("torch.ops.convwin.causal_conv1d_verify.default(") == L
    assert "torch.ops.convwin.scatter.default(" in code
    assert re.findall(r"empty_strided_\w+\(\([^)]*\)", code) == [] and ".copy_(" not in code


@pytest.mark.parametrize("device", DEVICES)
def test_dynamic_batch_commit_compiles_at_most_twice(device):
    torch._dynamo.reset()
    counting_backend = CountingBackend()

    cache = ConvWindowCache(L, 8, DIM, 4, K, dtype=torch.float32, device=device)
    cache.buffer.normal_()
    commit = torch.compile(lambda s, slots, acc: cache.commit(s, slots, acc), fullgraph=True, dynamic=True,
                           backend=counting_backend)
    g = torch.Generator().manual_seed(1)
    for batch in (1, 2, 3, 17, 64, 255, 512):
        state = torch.zeros(L, 8, DIM, K - 1, device=device)
        slots = torch.full((batch,), -1, dtype=torch.int64)
        slots[: min(batch, 8)] = torch.randperm(8, generator=g)[: min(batch, 8)]
        accepted = torch.randint(0, 4, (batch,), generator=g)
        slots, accepted = slots.to(device), accepted.to(device)
        commit(state, slots, accepted)
        expected = torch.zeros_like(state)
        sgl_convwin.scatter(expected, cache.windows, slots, slots, accepted)
        assert torch.equal(state, expected)
    assert counting_backend.compiles <= 2, f"{counting_backend.compiles} compilations for batch sizes 1..512"


class EngineStep(torch.nn.Module):
    """What an engine compiles: the cache, its conv state and the outputs are module buffers
    (static addresses for CUDA-graph trees); tokens, weights and indices are inputs."""

    def __init__(self, device):
        super().__init__()
        self.cache = ConvWindowCache(L, M, DIM, 4, K, dtype=torch.float32, device=device)
        self.register_buffer("conv_state", torch.zeros(L, M + 1, DIM, K - 1, device=device))
        self.register_buffer("outs", torch.zeros(L, 3, 4, DIM, device=device))

    def forward(self, x, weight, bias, slots, state_slots, accepted):
        cache_step(self.cache, self.outs, self.conv_state, x, weight, bias, slots, state_slots, accepted, None)


@pytest.mark.gpu
def test_reduce_overhead_has_no_cudagraph_skips():
    """mode="reduce-overhead" over the step module: zero cudagraph skips, results exact."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled, eager = EngineStep("cuda"), EngineStep("cuda")
    step = torch.compile(compiled, mode="reduce-overhead", fullgraph=True)
    for seed in range(5):
        inputs = step_inputs("cuda", 4, seed=seed)
        for module in (compiled, eager):
            module.conv_state.copy_(inputs["conv_state"])
        args = [inputs[k] for k in ("x", "weight", "bias", "slots", "state_slots", "accepted")]
        eager(*args)
        step(*args)
        torch.cuda.synchronize()
        for name in ("conv_state", "outs"):
            assert torch.equal(getattr(compiled, name), getattr(eager, name)), name
        assert torch.equal(compiled.cache.buffer, eager.cache.buffer)
    assert counters["inductor"]["cudagraph_skips"] == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", sgl_convwin.LAYOUTS)
def test_capture_method_equals_the_op(device, layout):
    parents = torch.tensor([[-1, 0, 0, 1, 1, 3]] * 3, device=device)
    cache = ConvWindowCache(L, M, DIM, 6, K, layout=layout, dtype=torch.float32, device=device)
    buffer = sgl_convwin.alloc_windows(L, M, DIM, 6, K, layout=layout, dtype=torch.float32, device=device)
    inputs = step_inputs(device, 6)
    for layer in range(L):
        cache.capture(inputs["conv_state"], inputs["x"][layer], inputs["slots"], layer,
                      state_slots=inputs["state_slots"], parents=parents)
        sgl_convwin.capture(buffer, inputs["conv_state"], inputs["x"][layer], inputs["slots"], inputs["state_slots"],
                            layer, parents, layout=layout)
    assert torch.equal(cache.buffer, buffer) and buffer.any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", sgl_convwin.LAYOUTS)
def test_commit_skips_a_tree_row_with_a_bad_link_on_every_layout(device, layout):
    """A tree whose accepted node's walk meets a bad parent link (here node 1 its own parent) is not
    committed on any layout: the rows layouts' scatter_tree skips the row, and a dense cache, whose
    capture left that node's window unwritten, skips it too instead of committing the window an
    earlier step left there. The other row commits its node's window."""
    n = 3
    cache = ConvWindowCache(L, M, DIM, n, K, layout=layout, dtype=torch.float32, device=device)
    conv_state = torch.randn(L, M, DIM, K - 1, device=device)
    slots, good = torch.tensor([0, 1], device=device), torch.tensor([[-1, 0, 1]] * 2, device=device)
    cache.capture(conv_state, torch.randn(2, n, DIM, device=device), slots, 0, parents=good)
    cache.capture(conv_state, torch.randn(2, n, DIM, device=device), slots, 1, parents=good)
    bad = torch.tensor([[-1, 1, 1], [-1, 0, 0]], device=device)
    x = torch.randn(L, 2, n, DIM, device=device)
    for layer in range(L):
        cache.capture(conv_state, x[layer], slots, layer, parents=bad)
    want = conv_state.clone()
    for layer in range(L):
        inputs = torch.cat([conv_state[layer, 1].T, x[layer, 1]])  # [K-1+N, dim]: history, then the nodes
        want[layer, 1] = inputs[[K - 2, K - 1, K + 1]].T  # node 2's window: history newest, node 0, node 2
    cache.commit(conv_state, slots, torch.tensor([2, 2], device=device), parents=bad)
    assert torch.equal(conv_state, want)


@pytest.mark.parametrize("layout", sgl_convwin.LAYOUTS)
def test_commit_refuses_bad_parents_on_every_layout(layout):
    """A tree commit's parents are checked on every layout (a dense cache walks them itself), before
    anything is written."""
    cache = ConvWindowCache(L, M, DIM, 3, K, layout=layout, dtype=torch.float32)
    conv_state = torch.randn(L, M, DIM, K - 1)
    before, slots, steps = conv_state.clone(), torch.tensor([0, 1]), torch.tensor([2, 2])
    for parents, error, message in ((torch.tensor([[-1, 0]] * 2), ValueError, r"parents must be \[B, N\] = \[2, 3\]"),
                                    (torch.tensor([-1, 0, 1]), ValueError, r"parents must be \[B, N\]"),
                                    (torch.tensor([[-1.0, 0.0, 1.0]] * 2), TypeError, "parents must be int32 or int64")):
        with pytest.raises(error, match=message):
            cache.commit(conv_state, slots, steps, parents=parents)
        assert torch.equal(conv_state, before)


def test_cache_replay_commit_matches_the_functions():
    """ConvWindowCache's gates and gdn_commit are the free functions on its own buffers."""
    from support import make_replay

    replay = make_replay(tree=True, seed=5, buffer_slots=4)
    kw = dict(replay.kwargs)
    layout = kw.pop("layout")
    cache = sgl_convwin.ConvWindowCache(replay.buffer.shape[0], 4, replay.conv_state.shape[2], replay.gates.shape[2],
                                        4, layout=layout, dtype=replay.buffer.dtype, gate_heads=kw["num_v_heads"])
    cache.buffer.copy_(replay.buffer)
    g, beta = replay.gates[0, :, :, 0][None].clone(), replay.gates[0, :, :, 1][None].clone()
    cache.capture_gates(g[0], beta[0], torch.arange(4), 0)
    cache.gates[1:].copy_(replay.gates[1:])
    assert torch.equal(cache.gates, replay.gates)
    assert cache.nbytes == replay.buffer.numel() * replay.buffer.element_size() + replay.gates.numel() * 4
    expected = (replay.ssm_state.clone(), replay.conv_state.clone())
    sgl_convwin.gdn_commit(*replay.args(*expected), **replay.kwargs)
    got = (replay.ssm_state.clone(), replay.conv_state.clone())
    cache.gdn_commit(*got, replay.conv_weight, replay.src_slots, replay.steps, state_slots=replay.dst_slots,
                     parents=replay.parents, **{k: v for k, v in kw.items() if k != "state_layout"},
                     state_layout=kw["state_layout"])
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert not torch.equal(got[0], replay.ssm_state)
    with pytest.raises(ValueError, match="gate_heads"):
        sgl_convwin.ConvWindowCache(1, 2, 8, 2, 4).capture_gates(g[0], beta[0], torch.arange(4), 0)


def test_cache_mamba2_commit_matches_the_function():
    from support import make_replay

    replay = make_replay(mixer="mamba2", tree=True, seed=6, buffer_slots=4)
    kw = dict(replay.kwargs)
    cache = sgl_convwin.ConvWindowCache(replay.buffer.shape[0], 4, replay.conv_state.shape[2], replay.gates.shape[2],
                                        4, layout=kw.pop("layout"), dtype=replay.buffer.dtype,
                                        gate_heads=kw["num_heads"], num_gates=1)
    cache.buffer.copy_(replay.buffer)
    cache.gates.copy_(replay.gates)
    expected = (replay.ssm_state.clone(), replay.conv_state.clone())
    sgl_convwin.mamba2_commit(*replay.args(*expected), **replay.kwargs)
    got = (replay.ssm_state.clone(), replay.conv_state.clone())
    cache.mamba2_commit(*got, replay.conv_weight, replay.A, replay.src_slots, replay.steps,
                        state_slots=replay.dst_slots, parents=replay.parents, **kw)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert not torch.equal(got[0], replay.ssm_state)
