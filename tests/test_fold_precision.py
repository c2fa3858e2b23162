"""scripts/fold_precision.py, the emulation behind the fold's 3xTF32: its chunk form is the delta rule
(exact products agree with the token-by-token float64 rule to float32's rounding), and the
precisions it reports hold: every product in tf32, or K^T W or U alone, misses the ring tests' 1e-4
x max |S|; 3xTF32 and the bf16 keys' two products stay far under it."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import fold_precision  # noqa: E402


def scheme_errors(modes, bf16_keys=False):
    return fold_precision.errors(modes, bf16_keys, folds=3, pending=8, head_dim=64, decay=0.05, checkpoints={1, 3})


def test_chunk_form_is_the_delta_rule():
    assert max(scheme_errors(dict(gram=0, ks=0, u=0, update=0))) < 1e-6
    assert max(scheme_errors(dict(gram=0, ks=0, u=0, update=0), bf16_keys=True)) < 1e-6


def test_reported_precisions():
    for tf32_somewhere in ("every product tf32", "K^T W tf32", "U tf32"):
        assert min(scheme_errors(fold_precision.SCHEMES[tf32_somewhere][0])) > 1e-4, tf32_somewhere
    assert max(scheme_errors(fold_precision.SCHEMES["every product 3xTF32 (the fold)"][0])) < 1e-6
    modes, bf16_keys = fold_precision.SCHEMES["bf16 keys: gram 1, K S0 and K^T W 2 products"]
    assert max(scheme_errors(modes, bf16_keys)) < 1e-6
