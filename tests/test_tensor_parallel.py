"""Tensor parallelism: 2 processes (gloo, CPU), each rank holds its share of the conv channels,
runs the verify pass and the commit on its own cache; the gathered caches and states equal one
unsharded run exactly, the conv outputs to float32 rounding (the conv is depthwise, so no op
communicates)."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import sgl_convwin

L, M, DIM, N, K, B = 2, 4, 12, 5, 4, 3
PARENTS = [[-1, 0, 0, 1, 2], [-1, 0, 1, 2, 3], [-1, -1, 0, 0, 1]]


def problem():
    g = torch.Generator().manual_seed(0)
    return dict(
        conv_state=torch.randn(L, M, DIM, K - 1, generator=g),
        x=torch.randn(L, B, N, DIM, generator=g),
        weight=torch.randn(L, DIM, K, generator=g),
        bias=torch.randn(L, DIM, generator=g),
    )


def run_step(p, dim, layout):
    """Verify every layer, then commit; returns (outputs, committed state, logical windows)."""
    cache = sgl_convwin.ConvWindowCache(L, M, dim, N, K, layout=layout, dtype=torch.float32)
    slots, accepted = torch.tensor([2, 0, 3]), torch.tensor([4, 2, 3])
    parents = torch.tensor(PARENTS)
    outs = torch.zeros(L, B, N, dim)
    state = p["conv_state"].clone()
    for layer in range(L):
        cache.causal_conv1d_verify(outs[layer], state, p["x"][layer], p["weight"][layer], p["bias"][layer],
                                   slots, layer, parents=parents, activation="silu")
    cache.commit(state, slots, accepted, parents=parents)
    return outs, state, cache.buffer


def worker(rank, world_size, init_file, layout):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        per_rank = sgl_convwin.dim_per_rank(DIM, world_size)
        shard = slice(rank * per_rank, (rank + 1) * per_rank)
        full = problem()
        mine = dict(conv_state=full["conv_state"][:, :, shard].contiguous(), x=full["x"][..., shard].contiguous(),
                    weight=full["weight"][:, shard].contiguous(), bias=full["bias"][:, shard].contiguous())
        outs, state, buffer = run_step(mine, per_rank, layout)
        channel_axis = {"token_major": 3, "channel_major": 2, "dense": 3}[layout]
        gathered = []
        for tensor, axis in ((outs, 3), (state, 2), (buffer, channel_axis)):
            parts = [torch.empty_like(tensor) for _ in range(world_size)]
            dist.all_gather(parts, tensor.contiguous())
            gathered.append(torch.cat(parts, dim=axis))
        want = run_step(full, DIM, layout)
        # copies exactly; the conv's float32 sums may round differently with the vector width
        if not torch.allclose(gathered[0], want[0], rtol=1e-6, atol=1e-6):
            raise AssertionError(f"rank {rank}: gathered outputs differ from the unsharded run ({layout})")
        for name, got, expected in zip(("conv_state", "buffer"), gathered[1:], want[1:]):
            if not torch.equal(got, expected):
                raise AssertionError(f"rank {rank}: gathered {name} differs from the unsharded run ({layout})")
    except BaseException:
        dist.destroy_process_group()
        raise
    # Success: both ranks meet, then leave without running gloo's C++ teardown, which sometimes
    # aborts ("terminate called without an active exception") when the peer exits first.
    dist.barrier()
    os._exit(0)


@pytest.mark.parametrize("layout", [layout if layout == sgl_convwin.TOKEN_MAJOR else pytest.param(layout, marks=pytest.mark.slow)
                                    for layout in sgl_convwin.LAYOUTS])
def test_two_ranks_equal_one(tmp_path, layout):
    init_file = os.path.join(tmp_path, "rendezvous")
    mp.spawn(worker, args=(2, init_file, layout), nprocs=2, join=True)


def test_dim_per_rank():
    assert sgl_convwin.dim_per_rank(8192, 4) == 2048
    with pytest.raises(ValueError, match="cannot be split evenly across 3"):
        sgl_convwin.dim_per_rank(8192, 3)
