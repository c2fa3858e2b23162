"""benchmarks/bench_scatter.py's eager table: a CPU dry run of it on tiny shapes (timer stubbed, each
timed call run once) so that a broken row is found before a GPU run, and its raw launches checked
to be the launches the ops make."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import bench_scatter  # noqa: E402
import common  # noqa: E402
import sgl_convwin  # noqa: E402
from support import HAS_TRITON, INTERPRET, whole_storage  # noqa: E402

OPS = ("scatter", "scatter_tree", "capture", "causal_conv1d_verify", "capture_gates", "gdn_commit", "mamba2_commit")
TINY = dict(conv_shape=(4, 16), gdn=dict(layers=2, num_k_heads=1, head_k_dim=4, num_v_heads=2, head_v_dim=4),
            mamba2=dict(layers=2, num_heads=2, head_dim=4, n_groups=1, d_state=4))
interpreted = pytest.mark.skipif(not (INTERPRET and HAS_TRITON), reason="Triton's interpreter runs on the CPU only")


@interpreted
def test_eager_table_dry_run(monkeypatch, capsys):
    """Three rows per op (raw launch, public function, registered op; scatter also its launcher),
    each timed call run once, ratios against the op's own raw launch."""
    ran = []

    def run_once(candidates, calls, rounds, sync):
        times = {}
        for name, fn in candidates.items():
            fn()
            sync()
            ran.append(name)
            times[name] = (4.0, 8.0) if name.startswith("raw") else (2.0, 2.0)
        return times

    monkeypatch.setattr(common, "interleaved_host_times", run_once)
    results = bench_scatter.eager_overhead(device="cpu", **TINY)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "best us" not in line]
    assert len(rows) == len(results) == len(ran) == 3 * len(OPS) + 1
    for name in OPS:
        assert f"| raw Triton launch of {name} (args prepared) | 4.00 | 8.00 | 1.00x | 1.00x |" in rows
        assert f"| sgl_convwin.{name} (public) | 2.00 | 2.00 | 0.50x | 0.25x |" in rows
        assert f"| torch.ops.convwin.{name} | 2.00 | 2.00 | 0.50x | 0.25x |" in rows
    assert "| csrc_triton launch_scatter | 2.00 | 2.00 | 0.50x | 0.25x |" in rows


def _written(name):
    schema = getattr(torch.ops.convwin, name).default._schema
    return [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]


@interpreted
@pytest.mark.parametrize("name", OPS)
def test_raw_launches_are_the_ops_launches(name):
    """The raw launch the table times writes what the op's own (unplanned) launcher writes, on random
    data with every row active (the table's replay commits pad theirs), over the whole storages."""
    args, kwargs = bench_scatter.eager_calls("cpu", **TINY)[name]
    generator = torch.Generator().manual_seed(0)
    for tensor in [*args, *kwargs.values()]:
        if isinstance(tensor, torch.Tensor):
            storage = whole_storage(tensor)
            if tensor.is_floating_point():
                storage.copy_(torch.randn(storage.shape, generator=generator))
            else:  # slot 0, step or node 0, every node a root (parents -1): active rows
                storage.fill_(-1 if tensor.dim() == 2 else 0)
    public = getattr(sgl_convwin, name)
    copies = list(args)
    for i in _written(name):
        copies[i] = torch.empty(0, dtype=args[i].dtype).set_(whole_storage(args[i]).clone().untyped_storage(),
                                                           args[i].storage_offset(), args[i].shape, args[i].stride())
    before = [whole_storage(args[i]).clone() for i in _written(name)]
    public.cuda_impl(*copies, **kwargs)
    bench_scatter.raw_launch(bench_scatter.raw_calls(name, args, kwargs))()
    for i, old in zip(_written(name), before):
        assert torch.equal(whole_storage(args[i]), whole_storage(copies[i])), (name, i)
        assert not torch.equal(whole_storage(args[i]), old), (name, i, "nothing written")


@interpreted
def test_tree_configs_launch_the_tree_kernel():
    """--tree-configs entries parse into launcher arguments that each commit the oracle's windows."""
    import argparse

    from sgl_convwin import reference
    from sgl_convwin._kernels import triton_kernels

    configs = [bench_scatter.tree_config(text) for text in ("256/1", "512/2/preload", "1024/4/links", "64/1/columns")]
    assert configs[1] == dict(channels=512, num_warps=2, preload_parents=True)
    assert bench_scatter.tree_config_name(configs[2]) == "scatter_tree kernel, 1024 channels / 4 warps, link by link"
    assert bench_scatter.tree_config("512/1/links/columns") == dict(channels=512, num_warps=1, preload_parents=False,
                                                                    lane_rows=False)
    assert bench_scatter.tree_config_name(bench_scatter.tree_config("512/1/columns")) == \
        "scatter_tree kernel, 512 channels / 1 warps, own vectors stored"
    for text in ("256/1/fast", "256/1/preload/links", "256/1/columns/columns"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench_scatter.tree_config(text)
    generator = torch.Generator().manual_seed(1)
    rows = torch.randn(2, 3, 10, 24, generator=generator)
    parents = torch.tensor([common.tree_parents(8, 3)] * 2)
    dst, src, nodes = torch.tensor([2, 0]), torch.tensor([1, 2]), torch.tensor([7, 4])
    for config in configs:
        state = torch.zeros(2, 3, 24, 3)
        want = reference.scatter_tree_reference(state, rows, dst, src, nodes, parents, "dim_major")
        triton_kernels().launch_scatter_tree(state, rows, dst, src, nodes, parents, **config)
        assert torch.equal(state, want), config
