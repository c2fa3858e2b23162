"""CUDA graphs: capture a commit once, rewrite the static indices, replay, compare with the oracle."""

import pytest
import torch

import sgl_convwin
from sgl_convwin import reference
from support import whole_storage

pytestmark = pytest.mark.gpu

L, M, N, D, K, DIM, B = 3, 8, 16, 4, 4, 512, 8


def random_rows(generator, batch=B):
    """A padded batch: distinct destinations, some rows skipped, steps anywhere in the chain."""
    dst = torch.randperm(N, generator=generator)[:batch]
    dst[torch.rand(batch, generator=generator) < 0.25] = -1
    src = torch.randint(0, M, (batch,), generator=generator)
    steps = torch.randint(-1, D, (batch,), generator=generator)
    return dst, src, steps


def capture(commit) -> torch.cuda.CUDAGraph:
    """Warm up on a side stream (compiles the kernel outside the capture), then capture commit."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        commit()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        commit()
    return graph


@pytest.mark.parametrize("state_layout", sgl_convwin.STATE_LAYOUTS)
@pytest.mark.parametrize("layout", sgl_convwin.LAYOUTS)
def test_capture_and_replay_with_new_indices(layout, state_layout):
    generator = torch.Generator().manual_seed(0)
    buffer = sgl_convwin.alloc_windows(L, M, DIM, D, K, layout=layout, device="cuda")
    windows = sgl_convwin.window_view(buffer, layout, D, K)
    shape = (L, N, DIM, K - 1) if state_layout == "dim_major" else (L, N, K - 1, DIM)
    conv_state = torch.zeros(shape, dtype=torch.bfloat16, device="cuda")
    static = [t.cuda() for t in random_rows(generator)]
    static[1] = static[1].to(torch.int32)

    graph = capture(lambda: sgl_convwin.scatter(conv_state, windows, *static, state_layout=state_layout))

    for _ in range(20):
        buffer.copy_(torch.randn(buffer.shape, generator=generator))
        conv_state.copy_(torch.randn(shape, generator=generator))
        for static_tensor, fresh in zip(static, random_rows(generator)):
            static_tensor.copy_(fresh)
        expected = reference.scatter_reference(conv_state, windows, *static, state_layout)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(conv_state.cpu(), expected)


def test_replay_leaves_the_rest_of_the_pool_untouched():
    """conv_state is a slice of a larger pool: replays never write outside it."""
    generator = torch.Generator().manual_seed(1)
    pool = torch.randn(L + 2, N + 3, DIM, K - 1, generator=generator).cuda()
    conv_state = pool[1 : L + 1, 2 : N + 2]
    buffer = torch.randn(sgl_convwin.physical_shape("token_major", L, M, DIM, D, K), generator=generator).cuda()
    windows = sgl_convwin.window_view(buffer, "token_major", D, K)
    dst, src, steps = (t.cuda() for t in random_rows(generator))
    sgl_convwin.scatter(conv_state, windows, dst, src, steps)  # warm up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sgl_convwin.scatter(conv_state, windows, dst, src, steps)
    for _ in range(10):
        for static_tensor, fresh in zip((dst, src, steps), random_rows(generator)):
            static_tensor.copy_(fresh)
        expected = reference.scatter_reference(conv_state, windows, dst, src, steps)
        want = whole_storage(pool).clone()
        want.as_strided(conv_state.shape, conv_state.stride(), conv_state.storage_offset()).copy_(expected)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(whole_storage(pool), want)


def test_checked_mode_is_skipped_during_capture():
    """The checked mode reads indices on the host, which capture forbids: it steps aside."""
    buffer = torch.randn(sgl_convwin.physical_shape("token_major", L, M, DIM, D, K), device="cuda")
    windows = sgl_convwin.window_view(buffer, "token_major", D, K)
    conv_state = torch.zeros(L, N, DIM, K - 1, device="cuda")
    index = torch.zeros(1, dtype=torch.int64, device="cuda")
    sgl_convwin.scatter(conv_state, windows, index, index, index)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with sgl_convwin.index_checks(), torch.cuda.graph(graph):
        sgl_convwin.scatter(conv_state, windows, index, index, index)
    conv_state.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(conv_state[:, 0], windows[:, 0, 0])
    assert not conv_state[:, 1:].any()


def random_tree_rows(generator, num_nodes, batch=B):
    dst, src, _ = random_rows(generator, batch)
    nodes = torch.randint(-1, num_nodes, (batch,), generator=generator)
    parents = torch.stack([
        torch.tensor([int(torch.randint(-1, n, (), generator=generator)) for n in range(num_nodes)])
        for _ in range(batch)
    ])
    return dst, src, nodes, parents


@pytest.mark.parametrize("state_layout", sgl_convwin.STATE_LAYOUTS)
@pytest.mark.parametrize("layout", ("token_major", "channel_major"))
def test_tree_capture_and_replay_with_new_trees(layout, state_layout):
    num_nodes = 8
    generator = torch.Generator().manual_seed(2)
    buffer = sgl_convwin.alloc_windows(L, M, DIM, num_nodes, K, layout=layout, device="cuda")
    rows = buffer if layout == "token_major" else buffer.transpose(-1, -2)
    shape = (L, N, DIM, K - 1) if state_layout == "dim_major" else (L, N, K - 1, DIM)
    conv_state = torch.zeros(shape, dtype=torch.bfloat16, device="cuda")
    static = [t.cuda() for t in random_tree_rows(generator, num_nodes)]

    graph = capture(lambda: sgl_convwin.scatter_tree(conv_state, rows, *static, state_layout=state_layout))
    for _ in range(20):
        buffer.copy_(torch.randn(buffer.shape, generator=generator))
        conv_state.copy_(torch.randn(shape, generator=generator))
        for static_tensor, fresh in zip(static, random_tree_rows(generator, num_nodes)):
            static_tensor.copy_(fresh)
        expected = reference.scatter_tree_reference(conv_state, rows, *static, state_layout)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(conv_state.cpu(), expected)


def verify_step(outs, buffer, conv_state, x, weight, bias, buffer_slots, state_slots, nodes, parents, layout):
    """Per layer the fused conv + capture, then one commit for all layers (chain: parents None)."""
    for layer in range(x.shape[0]):
        sgl_convwin.causal_conv1d_verify(
            outs[layer], buffer, conv_state, x[layer], weight[layer], bias[layer], buffer_slots,
            state_slots, layer, parents, layout=layout, activation="silu",
        )
    if layout == "dense":
        sgl_convwin.scatter(conv_state, buffer, state_slots, buffer_slots, nodes)
    elif parents is None:
        sgl_convwin.scatter(conv_state, sgl_convwin.window_view(buffer, layout, x.shape[2], K),
                            state_slots, buffer_slots, nodes)
    else:
        rows = buffer if layout == "token_major" else buffer.transpose(-1, -2)
        sgl_convwin.scatter_tree(conv_state, rows, state_slots, buffer_slots, nodes, parents)


def fresh_step_values(generator, num_nodes, tree):
    buffer_slots = torch.randperm(M, generator=generator)[:B]
    buffer_slots[torch.rand(B, generator=generator) < 0.25] = -1  # padding
    state_slots = torch.randperm(N, generator=generator)[:B]
    nodes = torch.randint(-1, num_nodes, (B,), generator=generator)
    values = dict(
        x=torch.randn(L, B, num_nodes, DIM, generator=generator).to(torch.bfloat16),
        buffer_slots=buffer_slots, state_slots=state_slots, nodes=nodes,
    )
    if tree:
        values["parents"] = torch.stack([
            torch.tensor([int(torch.randint(-1, n, (), generator=generator)) for n in range(num_nodes)])
            for _ in range(B)
        ])
    return values


def static_step_tensors(generator, layout, num_nodes, tree):
    """The static inputs and outputs of a captured verify_step, on the GPU."""
    static = dict(
        outs=torch.zeros(L, B, num_nodes, DIM, dtype=torch.bfloat16),
        buffer=torch.zeros(sgl_convwin.physical_shape(layout, L, M, DIM, num_nodes, K), dtype=torch.bfloat16),
        conv_state=torch.randn(L, N, DIM, K - 1, generator=generator).to(torch.bfloat16),
        weight=torch.randn(L, DIM, K, generator=generator).to(torch.bfloat16),
        bias=torch.randn(L, DIM, generator=generator).to(torch.bfloat16),
        parents=None,
    )
    static.update(fresh_step_values(generator, num_nodes, tree))
    return {k: None if v is None else v.cuda() for k, v in static.items()}


@pytest.mark.parametrize("tree", (False, True), ids=("chain", "tree"))
@pytest.mark.parametrize("layout", sgl_convwin.LAYOUTS)
def test_verify_step_capture_and_replay(layout, tree):
    """The whole verify/capture/commit step in one CUDA graph, replayed with new tokens, slots,
    accepted nodes and trees; compared with the CPU implementation every replay (buffer and state
    exactly, outputs to bf16 rounding)."""
    num_nodes = 8 if tree else D
    generator = torch.Generator().manual_seed(3)
    static = static_step_tensors(generator, layout, num_nodes, tree)
    graph = capture(lambda: verify_step(**static, layout=layout))
    for _ in range(20):
        for name, value in fresh_step_values(generator, num_nodes, tree).items():
            static[name].copy_(value)
        static["conv_state"].copy_(torch.randn(static["conv_state"].shape, generator=generator))
        expected = {k: None if v is None else v.cpu().clone() for k, v in static.items()}
        verify_step(**expected, layout=layout)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static["buffer"].cpu(), expected["buffer"])
        assert torch.equal(static["conv_state"].cpu(), expected["conv_state"])
        torch.testing.assert_close(static["outs"].cpu().float(), expected["outs"].float(), rtol=1.6e-2, atol=1.6e-2)


def oracle_step(values, layout, tree):
    """The loop oracles for one verify_step: (outs as float64, buffer, conv_state), on the CPU."""
    v = {k: None if t is None else t.cpu() for k, t in values.items()}
    num_nodes = v["x"].shape[2]
    buffer, outs = v["buffer"].clone(), v["outs"].double().clone()
    parents = v["parents"] if tree else None
    for layer in range(L):
        outs[layer], _ = reference.causal_conv1d_verify_reference(
            v["outs"][layer], v["conv_state"], v["x"][layer], v["weight"][layer], v["bias"][layer],
            v["buffer_slots"], v["state_slots"], M, layer, parents, "silu")
        buffer = reference.capture_reference(buffer, v["conv_state"], v["x"][layer], v["buffer_slots"],
                                             v["state_slots"], layer, layout, parents)
    if tree and layout != "dense":
        rows = buffer if layout == "token_major" else buffer.transpose(-1, -2)
        state = reference.scatter_tree_reference(v["conv_state"], rows, v["state_slots"], v["buffer_slots"],
                                                 v["nodes"], v["parents"])
    else:
        windows = buffer if layout == "dense" else sgl_convwin.window_view(buffer, layout, num_nodes, K)
        state = reference.scatter_reference(v["conv_state"], windows, v["state_slots"], v["buffer_slots"], v["nodes"])
    return outs, buffer, state


@pytest.mark.parametrize("layout, tree", [("token_major", True), ("channel_major", False), ("dense", True)])
def test_ten_thousand_replays(layout, tree):
    """One captured verify/capture/commit step, replayed 10,000 times with new tokens, slots,
    accepted nodes and trees written into its static inputs; every 100th replay is checked against
    the loop oracles (buffer and state bit for bit, outputs to bf16 rounding of the float64 conv)."""
    num_nodes = 8 if tree else D
    generator = torch.Generator().manual_seed(4)
    static = static_step_tensors(generator, layout, num_nodes, tree)
    graph = capture(lambda: verify_step(**static, layout=layout))
    fresh_on_gpu = [{k: v.cuda() for k, v in fresh_step_values(generator, num_nodes, tree).items()} for _ in range(50)]
    checked = 0
    for replay in range(10_000):
        for name, value in fresh_on_gpu[replay % len(fresh_on_gpu)].items():
            static[name].copy_(value)
        if replay % 100 == 0:
            torch.cuda.synchronize()
            want_outs, want_buffer, want_state = oracle_step(static, layout, tree)
        graph.replay()
        if replay % 100 == 0:
            torch.cuda.synchronize()
            assert torch.equal(static["buffer"].cpu(), want_buffer), replay
            assert torch.equal(static["conv_state"].cpu(), want_state), replay
            torch.testing.assert_close(static["outs"].cpu().double(), want_outs, rtol=1.6e-2, atol=1.6e-2)
            checked += 1
    assert checked == 100


@pytest.mark.parametrize("mixer", ["gdn", "mamba2"])
@pytest.mark.parametrize("layout", sgl_convwin.LAYOUTS)
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_replay_commit_capture_and_replay(mixer, layout, tree):
    """A replay commit captured once; new slots, steps and parents written into the static inputs
    before each replay; every replay equals the oracle (states whole, as the oracle leaves them)."""
    from support import make_replay

    replay = make_replay(mixer=mixer, layout=layout, tree=tree, num_rows=4, num_draft=4, num_slots=6,
                         buffer_slots=6, head_k_dim=16, head_v_dim=32, device="cuda", seed=0)
    ssm_state, conv_state = replay.ssm_state.clone(), replay.conv_state.clone()
    graph = capture(lambda: replay.commit(*replay.args(ssm_state, conv_state), **replay.kwargs))
    generator = torch.Generator().manual_seed(1)
    for _ in range(4):
        ssm_state.copy_(replay.ssm_state)
        conv_state.copy_(replay.conv_state)
        dst = torch.randperm(6, generator=generator)[:4]
        dst[torch.rand(4, generator=generator) < 0.25] = -1
        replay.dst_slots.copy_(dst)
        replay.src_slots.copy_(torch.randperm(6, generator=generator)[:4])
        replay.steps.copy_(torch.randint(-1, 4, (4,), generator=generator))
        if tree:
            replay.parents.copy_(torch.tensor([[-1] + [int(torch.randint(0, n, (), generator=generator))
                                                       for n in range(1, 4)] for _ in range(4)]))
        graph.replay()
        expected_ssm, expected_conv, _ = replay.reference()
        assert torch.equal(conv_state.cpu(), expected_conv)
        torch.testing.assert_close(ssm_state.cpu().double(), expected_ssm, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("layout", sgl_convwin.LAYOUTS)
def test_capture_ops_capture_and_replay(layout):
    """capture, capture_gates (given gates, one-gate dt, raw a / b) captured once; each replay with
    new inputs and slots leaves what the CPU path leaves on copies (the whole buffers compared)."""
    generator = torch.Generator().manual_seed(7)
    heads = 4
    buffer = sgl_convwin.alloc_windows(L, M, DIM, D, K, layout=layout, device="cuda")
    conv_state = torch.zeros(L, N, DIM, K - 1, dtype=torch.bfloat16, device="cuda")
    gates = sgl_convwin.alloc_gates(L, M, D, heads, device="cuda")
    dts = sgl_convwin.alloc_gates(L, M, D, heads, num_gates=1, device="cuda")
    raw = sgl_convwin.alloc_gates(L, M, D, heads, device="cuda")
    x = torch.zeros(B, D, DIM, device="cuda")
    g, beta, a, b = (torch.zeros(B, D, heads, device="cuda") for _ in range(4))
    A_log, dt_bias = torch.randn(heads, generator=generator).cuda(), torch.randn(heads, generator=generator).cuda()
    buffer_slots = torch.zeros(B, dtype=torch.int64, device="cuda")
    state_slots = torch.zeros(B, dtype=torch.int32, device="cuda")

    def step():
        sgl_convwin.capture(buffer, conv_state, x, buffer_slots, state_slots, 1, layout=layout)
        sgl_convwin.capture_gates(gates, g, beta, buffer_slots, 2)
        sgl_convwin.capture_gates(dts, g, None, buffer_slots, 0)
        sgl_convwin.capture_gates(raw, None, None, buffer_slots, 1, a=a, b=b, A_log=A_log, dt_bias=dt_bias)

    graph = capture(step)
    for _ in range(10):
        for tensor in (buffer, gates, dts, raw, conv_state, x, g, beta, a, b):
            tensor.copy_(torch.randn(tensor.shape, generator=generator))
        dst, _, _ = random_rows(generator)  # (distinct buffer slots: two rows never write one)
        buffer_slots.copy_(torch.where(dst >= 0, torch.randperm(M, generator=generator)[:B], -1))
        state_slots.copy_(torch.randint(-1, N + 1, (B,), generator=generator))
        expected = [t.cpu() for t in (buffer, gates, dts, raw)]
        cpu_args = [t.cpu() for t in (conv_state, x, buffer_slots, state_slots, g, beta, a, b, A_log, dt_bias)]
        conv_cpu, x_cpu, buffer_slots_cpu, state_slots_cpu, g_cpu, beta_cpu, a_cpu, b_cpu, A_log_cpu, bias_cpu = cpu_args
        sgl_convwin.capture(expected[0], conv_cpu, x_cpu, buffer_slots_cpu, state_slots_cpu, 1, layout=layout)
        sgl_convwin.capture_gates(expected[1], g_cpu, beta_cpu, buffer_slots_cpu, 2)
        sgl_convwin.capture_gates(expected[2], g_cpu, None, buffer_slots_cpu, 0)
        sgl_convwin.capture_gates(expected[3], None, None, buffer_slots_cpu, 1, a=a_cpu, b=b_cpu, A_log=A_log_cpu,
                                  dt_bias=bias_cpu)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(buffer.cpu(), expected[0]) and torch.equal(gates.cpu(), expected[1])
        assert torch.equal(dts.cpu(), expected[2])
        torch.testing.assert_close(raw.cpu(), expected[3], rtol=1e-6, atol=1e-6)  # (exp, softplus: two libms)
