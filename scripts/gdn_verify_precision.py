"""gdn_verify's CUDA kernels where a state much larger than the outputs cancels against the drafts'
own updates: each node's query its own key, betas of 0.99, the state at 1, 10 and 100 times the
tests' scale (dk = dv = 128, chains of 4 and topk-3 trees of 8). Prints max error / max |o| against
the float64 oracle for the mma kernel's stacked products (q_eff off), its effective queries with
the chunks in registers and staged (the default for float32 states), and the Triton kernel's
stacked products and effective queries (its default for float32 states). Needs a CUDA GPU.

    python scripts/gdn_verify_precision.py
"""

from __future__ import annotations

import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
from test_gdn_verify import kernel_runner, make_problem  # noqa: E402

from sgl_convwin import reference  # noqa: E402

TUNINGS = {"mma stacked": dict(mma=True, q_eff=False), "mma q_eff": dict(mma=True, q_eff=True, state_stages=0),
           "mma q_eff staged": dict(mma=True, q_eff=True, state_stages=2),
           "triton stacked": dict(mma=False, q_eff=False), "triton q_eff": dict(mma=False, q_eff=True)}


def main() -> None:
    for tree in (False, True):
        for scale in (1, 10, 100):
            q, k, v, g, beta, ssm, slots, parents = make_problem(
                num_rows=8, num_nodes=8 if tree else 4, head_k_dim=128, head_v_dim=128, num_slots=8,
                parents=[-1, 0, 0, 0, 1, 1, 1, 4] if tree else None, device="cuda")
            problem = [k.clone(), k, v, g, torch.full_like(beta, 0.99), ssm * scale, slots, parents]
            want, _ = reference.gdn_verify_reference(*problem[:6], slots.cpu(), parents)
            errors = []
            for name, tuning in TUNINGS.items():
                out = torch.zeros(v.shape, device="cuda")
                kernel_runner(**tuning)(out, *problem)
                errors.append(f"{name} {((out.cpu().double() - want).abs().max() / want.abs().max()).item():.2e}")
            print(f"{'tree' if tree else 'chain'} state x{scale}: error / max |o|: " + ", ".join(errors))


if __name__ == "__main__":
    main()
