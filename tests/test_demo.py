"""The demo at small size: speculative decoding through the ops equals greedy decoding exactly,
for every layout and both draft shapes -- and the check fails when the commit is wrong."""

import io

import pytest
import torch

from sgl_convwin import cli, demo
from support import DEVICES

SMALL = dict(new_tokens=10, batch=3, prompt_len=5, draft=4, tree_nodes=7, topk=3, layers=2, show_progress=False)


@pytest.mark.parametrize("mixer", demo.MIXERS)
@pytest.mark.parametrize("seed", (0, 1))
@pytest.mark.parametrize("device", DEVICES)
def test_every_layout_and_draft_shape_matches_greedy(device, seed, mixer):
    out = io.StringIO()
    assert demo.run_demo(device=device, out=out, seed=seed, mixer=mixer, **SMALL)
    table = [line for line in out.getvalue().splitlines() if line.startswith("| ") and "layout" not in line]
    assert len(table) == 6 and all("| yes |" in line for line in table), out.getvalue()
    assert "all streams identical" in out.getvalue()


@pytest.mark.parametrize("mixer, cache", [("gdn", demo.ReplayCache), ("mamba2", demo.ReplayCache),
                                          ("linear", demo.SpecCache)])
def test_the_check_fails_when_the_commit_is_wrong(monkeypatch, mixer, cache):
    """Committing the parent of the accepted node (one input short) must change the streams."""
    commit = cache.commit

    def off_by_one(self, state_slots, buffer_slots, accepted, parents):
        wrong = parents.gather(1, accepted.clamp(min=0)[:, None]).squeeze(1).clamp(min=0)
        commit(self, state_slots, buffer_slots, wrong.where(accepted >= 0, accepted), parents)

    monkeypatch.setattr(cache, "commit", off_by_one)
    out = io.StringIO()
    assert not demo.run_demo(out=out, mixer=mixer, **SMALL)
    assert "| NO |" in out.getvalue() and "STREAMS DIFFER" in out.getvalue()


@pytest.mark.parametrize("mixer", ["gdn", "mamba2"])
def test_the_check_fails_when_the_gates_are_not_captured(monkeypatch, mixer):
    """The replay reads each node's gates (g, beta; dt) from the gates buffer: without them the
    streams must differ."""
    monkeypatch.setattr(torch.ops.convwin, "capture_gates", lambda *args: None)
    assert not demo.run_demo(out=io.StringIO(), mixer=mixer, **SMALL)


def test_replay_keeps_no_state_snapshots():
    """The GDN cache keeps the conv-input buffer and the gates only; the linear one snapshots."""
    config = demo.GDNConfig(layers=2)
    model = demo.TinyGDNLM(config, seed=0, device=torch.device("cpu"))
    cache = demo.ReplayCache(model, slots=3, num_nodes=4, layout="token_major", tree=False, device="cpu")
    assert not hasattr(cache, "snapshots")
    per_slot = 2 * (4 + 2) * config.conv_dim * 4 + 2 * 4 * 2 * config.num_v_heads * 4
    assert cache.speculative_nbytes_per_slot() == per_slot
    state = config.num_v_heads * config.head_k_dim * config.head_v_dim * 4
    assert cache.snapshot_nbytes_per_slot() == 2 * 4 * (config.conv_dim * 3 * 4 + state)


def test_the_check_fails_when_the_capture_is_wrong(monkeypatch):
    """A verify pass that computes the outputs but captures nothing leaves stale windows in the
    buffer: the streams must differ."""
    real = torch.ops.convwin.causal_conv1d_verify

    def verify_without_capture(out, buffer, *args, **kwargs):
        real(out, buffer.clone(), *args, **kwargs)

    monkeypatch.setattr(torch.ops.convwin, "causal_conv1d_verify", verify_without_capture)
    assert not demo.run_demo(out=io.StringIO(), **SMALL)


def test_cli_exit_status(monkeypatch):
    args = ["demo", "--tokens", "6", "--requests", "2", "--layers", "2", "--no-progress"]
    assert cli.main(args) == 0
    monkeypatch.setattr(demo, "greedy_reference", lambda *a: [[0] * 6, [0] * 6])
    assert cli.main(args) == 1


def test_tree_shapes():
    assert demo.tree_parents(4, 1) == [-1, 0, 1, 2]  # topk 1 is a chain
    assert demo.tree_parents(8, 3) == [-1, 0, 0, 0, 1, 1, 1, 2]
    assert demo.tree_levels([-1, 0, 0, 0, 1, 1, 1, 2]) == 2


def test_other_draft_shapes():
    """A deeper, narrower tree (topk 2, 11 nodes) and a long chain (6) match greedy too."""
    out = io.StringIO()
    assert demo.run_demo(out=out, **dict(SMALL, draft=6, tree_nodes=11, topk=2, seed=3))


# --- the ring (--ring): no commit, folds inside the verify ------------------------------------


def ring_table(text):
    return [line for line in text.splitlines() if line.startswith("| ring R=")]


@pytest.mark.parametrize("capacity", (7, 16))  # 7 = the tree's N: a fold at every step with something pending
@pytest.mark.parametrize("mixer, seed", [("gdn", 0), ("gdn", 1), ("mamba2", 0)])
def test_ring_matches_greedy(mixer, seed, capacity):
    out = io.StringIO()
    assert demo.run_demo(out=out, mixer=mixer, seed=seed, ring=True, capacity=capacity, **SMALL), out.getvalue()
    text = out.getvalue()
    assert len(ring_table(text)) == 2 and all("| yes |" in line for line in ring_table(text)), text
    checks = [line for line in text.splitlines() if line.startswith("ring, ")]
    assert len(checks) == 2 and all("conv windows identical" in line and "BEYOND" not in line for line in checks), text
    folds = [int(line.split(": ")[1].split(" folds")[0]) for line in checks]
    assert capacity == 16 or all(count > 0 for count in folds), text  # R = N: the folds ran, not only the flush


def test_ring_cache_is_alloc_ring():
    model = demo.TinyGDNLM(demo.GDNConfig(layers=2), seed=0, device=torch.device("cpu"))
    cache = demo.RingSpecCache(model, slots=3, num_nodes=4, parents=None, capacity=6, device="cpu")
    assert not hasattr(cache, "buffer") and not hasattr(cache, "gates")  # no eager buffer, no commit
    assert cache.speculative_nbytes_per_slot() == 2 * 10 * (model.config.conv_dim + 2 * 4) * 4 + 8
    model = demo.TinyMamba2LM(demo.Mamba2Config(layers=2), seed=0, device=torch.device("cpu"))
    cache = demo.RingSpecCache(model, slots=3, num_nodes=4, parents=None, capacity=6, device="cpu")
    assert cache.ring.gates.shape == (2, 3, 10, 1, 4)  # alloc_mamba2_ring's: dt per head
    assert cache.speculative_nbytes_per_slot() == 2 * 10 * (model.config.conv_dim + 4) * 4 + 8


def _drop_writes(monkeypatch, name, argument):
    """Run the ring op ``name`` on a copy of its argument ``argument`` (by position): its writes there are lost."""
    import sgl_convwin.cache as cache_module

    real = getattr(cache_module, name)

    def lossy(*args, **kwargs):
        args = list(args)
        args[argument] = args[argument].clone()
        real(*args, **kwargs)

    monkeypatch.setattr(cache_module, name, lossy)


@pytest.mark.parametrize("mixer, name, argument", [
    ("gdn", "ring_conv1d_verify", 1),  # the drafts' rows never reach the ring
    ("gdn", "gdn_ring_verify", 9),  # nor their gates
    ("gdn", "gdn_ring_verify", 6),  # the fold's checkpoint state is lost
    ("gdn", "gdn_ring_verify", 7),  # the fold's conv window is lost
    ("mamba2", "mamba2_ring_verify", 9),  # the drafts' dt
    ("mamba2", "mamba2_ring_verify", 6),
    ("mamba2", "mamba2_ring_verify", 7),
])
def test_the_ring_check_fails_when_the_ring_loses_a_write(monkeypatch, mixer, name, argument):
    _drop_writes(monkeypatch, name, argument)
    out = io.StringIO()
    assert not demo.run_demo(out=out, mixer=mixer, ring=True, capacity=7, **SMALL)
    assert "STREAMS DIFFER" in out.getvalue()


def test_the_ring_check_fails_when_acceptance_is_wrong(monkeypatch):
    """Accepting the parent of the accepted node (one token short) must change the streams."""
    commit = demo.RingSpecCache.commit

    def off_by_one(self, state_slots, ring_slots, accepted, parents):
        wrong = parents.gather(1, accepted.clamp(min=0)[:, None]).squeeze(1).clamp(min=0)
        commit(self, state_slots, ring_slots, wrong.where(accepted >= 0, accepted), parents)

    monkeypatch.setattr(demo.RingSpecCache, "commit", off_by_one)
    assert not demo.run_demo(out=io.StringIO(), ring=True, **SMALL)


@pytest.mark.parametrize("mixer", demo.RING_MIXERS)
def test_the_ring_check_fails_when_the_ring_outputs_are_off(monkeypatch, mixer):
    """The ring verify's own outputs are checked against the decoder's (the tokens come from the
    decoder's recurrence): outputs 0.1% off fail the run."""
    import sgl_convwin.cache as cache_module

    name = f"{mixer}_ring_verify"
    real = getattr(cache_module, name)

    def skewed(out, *args, **kwargs):
        real(out, *args, **kwargs)
        out.mul_(1.001)

    monkeypatch.setattr(cache_module, name, skewed)
    out = io.StringIO()
    assert not demo.run_demo(out=out, mixer=mixer, ring=True, **SMALL)
    assert "(BEYOND 0.0001)" in out.getvalue() and "all streams identical" not in out.getvalue()


def test_ring_arguments():
    with pytest.raises(ValueError, match="needs mixer 'gdn' or 'mamba2'"):
        demo.run_demo(ring=True, mixer="linear", out=io.StringIO(), **SMALL)
    with pytest.raises(ValueError, match="ring capacity 6 must be >= the tokens verified per step"):
        demo.run_demo(ring=True, capacity=6, out=io.StringIO(), **SMALL)
