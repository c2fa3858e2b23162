"""The docs state the present and stay short: size limits on the README, the benchmarks and their
logs; api.md names every public name and every command-line option; the README's usage runs."""

import argparse
import os
import re

import pytest
import torch

import sgl_convwin
from sgl_convwin import cli, reference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(*path: str) -> str:
    with open(os.path.join(ROOT, *path), encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("path, limit", [("README.md", 150), ("docs/benchmarks.md", 400)])
def test_page_length(path, limit):
    lines = read(path).count("\n")
    assert lines <= limit, f"{path} has {lines} lines (at most {limit}): move detail out, or drop what is superseded"


def test_benchmark_logs_are_few_and_cited():
    """docs/runs holds only the logs docs/benchmarks.md cites, at most 250 KB in all: in bytes, and
    on disk as `du -sk` counts it (each file in whole 4 KiB blocks)."""
    folder = os.path.join(ROOT, "docs", "runs")
    names = sorted(os.listdir(folder))
    sizes = [os.path.getsize(os.path.join(folder, name)) for name in names]
    assert sum(sizes) <= 250 * 1024, f"docs/runs holds {sum(sizes)} bytes (at most 250 KB)"
    on_disk = 4 * (1 + sum(-(-size // 4096) for size in sizes))  # (KiB, the folder's own block too)
    assert on_disk <= 250, f"docs/runs takes {on_disk} KiB in 4 KiB blocks (at most 250)"
    cited = set(re.findall(r"runs/([\w.-]+)", read("docs", "benchmarks.md")))
    assert set(names) - cited == set(), "logs no table cites (git keeps history)"
    assert cited - set(names) == set(), "cited logs that are missing"


def test_api_names_every_public_name():
    api = read("docs", "api.md")
    missing = [name for name in sgl_convwin.__all__ if not re.search(rf"\b{re.escape(name)}\b", api)]
    assert not missing, f"docs/api.md does not mention {missing}"


def command_line_options() -> dict[str, list[str]]:
    """Every option of every command, from the parsers themselves."""
    options = {}
    for name, parser in cli.build_parser().commands.items():
        options[name] = [option for action in parser._actions if not isinstance(action, argparse._HelpAction)
                         for option in action.option_strings if option.startswith("--")]
    return options


def test_api_names_every_command_line_option():
    api = read("docs", "api.md")
    section = api[api.index("## Command line"):]
    options = command_line_options()
    assert set(options) == {"demo", "plan", "selfcheck"}
    for command, names in options.items():
        assert f"python -m sgl_convwin {command}" in section, command
        missing = [option for option in names if not re.search(rf"{re.escape(option)}\b", section)]
        assert not missing, f"docs/api.md's command line section lacks {command} {missing}"


def test_plan_presets_are_documented():
    from sgl_convwin import plan

    api = read("docs", "api.md")
    missing = [name for name in plan.PRESETS if f"`{name}`" not in api]
    assert not missing, f"docs/api.md does not list plan's models {missing}"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_usage_runs():
    """Every python block of the README runs as written, on the CPU (its device line says cuda
    when there is one), and the usage block leaves what the float64 oracles say: the last layer's
    verify outputs (from the zero states it starts from) and both committed states (from the
    buffer and gates the verify captured)."""
    blocks = python_blocks(read("README.md"))
    assert blocks, "the README has no python usage block"
    for block in blocks:
        namespace = {}
        exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 - the README's own code
        tensors = [value for value in namespace.values() if isinstance(value, torch.Tensor)]
        assert tensors, "the usage block defines no tensor"
    n = namespace  # the usage block's (the last)
    heads = dict(num_k_heads=n["Hk"], head_k_dim=n["dk"], num_v_heads=n["Hv"], head_v_dim=n["dv"])
    q, k, v = (t.unflatten(-1, shape) for t, shape in ((n["q"], (n["Hk"], n["dk"])), (n["k"], (n["Hk"], n["dk"])),
                                                      (n["v"], (n["Hv"], n["dv"]))))
    zeros = torch.zeros_like(n["ssm_state"][0])
    want, written = reference.gdn_verify_reference(q, k, v, n["g"], n["beta"], zeros, n["state_slots"])
    assert list(written) == [0, 1]  # (row 2, padded, untouched)
    torch.testing.assert_close(n["o"][:2].double().cpu(), want[:2], rtol=0, atol=2e-3 * want.abs().max())
    ssm, conv, _ = reference.gdn_commit_reference(
        torch.zeros_like(n["ssm_state"]), torch.zeros_like(n["conv_state"]), n["buffer"], n["gates"], n["conv_weight"],
        n["state_slots"], n["buffer_slots"], n["accepted"], layout="token_major", **heads)
    torch.testing.assert_close(n["ssm_state"].double().cpu(), ssm, rtol=0, atol=1e-4 * ssm.abs().max())
    assert torch.equal(n["conv_state"].cpu(), conv)


def test_one_pitch():
    """The README's tagline, pyproject's description and the package docstring say one thing: the
    whole speculative state (dedup conv-input buffer + replay commit), not conv-window dedup alone."""
    readme_tagline = read("README.md").split("\n```\n", 1)[1].strip().split("\n\n")[0]
    description = re.search(r'^description = "(.*)"$', read("pyproject.toml"), flags=re.M).group(1)
    docstring = sgl_convwin.__doc__.split("\n\n")[0]
    for text in (readme_tagline, description, docstring):
        flat = " ".join(text.split())
        assert "replay" in flat and "Gated DeltaNet" in flat and "Mamba2" in flat, flat
    assert description in " ".join(readme_tagline.split()) and description in " ".join(docstring.split())
