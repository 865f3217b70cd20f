"""Mutants of the MLX port's glue (conformance/engines/mlx/adapter.py; the port itself: tests/engines/mlx/test_mlx.py):
the state layout, the norm fold and the head order, each patched into the adapter, run through
``gdncheck run`` and ``gdncheck verify`` like the port, and caught at their stage. Skipped, saying why,
where MLX and mlx-lm are not installed."""

from __future__ import annotations

import numpy as np
import pytest

from tests.engines.mlx.test_mlx import _mlx_module, _needs_mlx, _run_verify  # noqa: F401 (_needs_mlx: autouse, as there)


# --- glue mutants: each must fail verify at its stage ---------------------------------------------------
def _tiled(S: np.ndarray, cfg_heads: tuple[int, int]) -> np.ndarray:
    from gdncheck.conformance.meta.mutants import tiled_order

    return np.ascontiguousarray(S[:, tiled_order(*cfg_heads)])


def _sanitize_without_fold(model, ckpt):
    """A converter that hands mlx-lm its conv weights already in MLX's [C, K, 1] layout: mlx-lm's sanitize
    then takes the checkpoint for a sanitized one and folds no 1 + w into the RMSNorm weights."""
    ckpt = {k: (v.moveaxis(2, 1) if k.endswith("conv1d.weight") else v) for k, v in ckpt.items()}
    return model.sanitize(ckpt)


MUTANTS = {
    # MLX's [Hv, dv, dk] state written as it is (dk != dv: a shape failure; the stage is the same)
    "state_untransposed": ("recurrent_to_format", lambda module: (lambda S: S), "dk-gt-dv_T63", "delta_rule"),
    "state_untransposed_square": ("recurrent_to_format", lambda module: (lambda S: S), "prefill-decode_T65",
                                  "delta_rule"),
    "norm_w_not_one_plus_w": ("sanitize", lambda module: _sanitize_without_fold, "prefill-decode_T65",
                              "input_norm"),
    "state_heads_tiled": ("recurrent_to_format",
                          lambda module: (lambda S, f=module.recurrent_to_format: _tiled(f(S), (2, 6))),
                          "prefill-decode_T65", "delta_rule"),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_glue_mutants_are_caught_at_their_stage(tmp_path, monkeypatch, mutant):
    module = _mlx_module()
    attr, make, case, stage = MUTANTS[mutant]
    monkeypatch.setattr(module, attr, make(module))
    rc, summary = _run_verify(tmp_path, "f32", [case], name=mutant)
    assert rc == 1
    (c,) = summary["cases"]
    assert c["status"] == "fail" and c["first_divergence"]["stage"] == stage, c["first_divergence"]
