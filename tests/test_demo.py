"""The demo at small size: speculative decoding through the ops equals greedy decoding exactly,
for every layout and both draft shapes -- and the check fails when the commit is wrong."""

import io

import pytest
import torch

from sgl_convwin import cli, demo
from support import DEVICES

SMALL = dict(new_tokens=10, batch=3, prompt_len=5, draft=4, tree_nodes=7, topk=3, layers=2, show_progress=False)


@pytest.mark.parametrize("seed", (0, 1))
@pytest.mark.parametrize("device", DEVICES)
def test_every_layout_and_draft_shape_matches_greedy(device, seed):
    out = io.StringIO()
    assert demo.run_demo(device=device, out=out, seed=seed, **SMALL)
    table = [line for line in out.getvalue().splitlines() if line.startswith("| ") and "layout" not in line]
    assert len(table) == 6 and all("| yes |" in line for line in table), out.getvalue()
    assert "all streams identical" in out.getvalue()


def test_the_check_fails_when_the_commit_is_wrong(monkeypatch):
    """Committing the parent of the accepted node (one input short) must change the streams."""
    commit = demo.SpecCache.commit

    def off_by_one(self, state_slots, buffer_slots, accepted, parents):
        wrong = parents.gather(1, accepted.clamp(min=0)[:, None]).squeeze(1).clamp(min=0)
        commit(self, state_slots, buffer_slots, wrong.where(accepted >= 0, accepted), parents)

    monkeypatch.setattr(demo.SpecCache, "commit", off_by_one)
    out = io.StringIO()
    assert not demo.run_demo(out=out, **SMALL)
    assert "| NO |" in out.getvalue() and "STREAMS DIFFER" in out.getvalue()


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
    assert demo.tree_depth([-1, 0, 0, 0, 1, 1, 1, 2]) == 2


def test_other_draft_shapes():
    """A deeper, narrower tree (topk 2, 11 nodes) and a long chain (6) match greedy too."""
    out = io.StringIO()
    assert demo.run_demo(out=out, **dict(SMALL, draft=6, tree_nodes=11, topk=2, seed=3))
