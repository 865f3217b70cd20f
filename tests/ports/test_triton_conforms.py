"""The Triton path (gdncheck.gpu_impl) verified exactly like an outside port: run + verify in every
profile. Under the Triton interpreter (no GPU) on a chosen subset of cases; on a GPU on all of them."""

from __future__ import annotations

import pytest

from gdncheck.conformance.judge.verify import verify
from gdncheck.conformance.ports.run import run_impl

#: Cheap under the interpreter, yet every program feature: prefill, decode steps and the decode op,
#: snapshot/save/load/restore, both resets, batches at different positions, per_head norm, gate
#: extremes, GVA ratios 1-4, and every expected error.
INTERPRETER_CASES = ["prefill_T1_", "decode_T12", "prefill-decode_T65", "snapshot-replay", "restore-mismatch",
                     "mismatch-midstream", "batch-positions", "per-head-norm", "softplus-edges", "sigmoid-edges",
                     "qk-eps", "gated-eps", "rmsnorm-eps", "error-"]


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["f32", "bf16", "f16"])
def test_triton_path_conforms(profile, fixtures_dir, tmp_path):
    cases = None if _cuda() else INTERPRETER_CASES
    report = run_impl("triton", fixtures_dir, tmp_path, profile, cases=cases)
    assert not report.skipped
    summary = verify(fixtures_dir, tmp_path, profile, cases=cases)
    problems = [f"{c.id}: {c.message or c.problem}\n  repro: {c.repro}" for c in summary.cases if c.status != "pass"]
    assert summary.exit_code == 0, "\n".join(problems)
