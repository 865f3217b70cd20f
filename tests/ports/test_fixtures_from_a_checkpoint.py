"""Goldens from a checkpoint (``gdncheck fixtures build --from-checkpoint``, fixtures/build.py): built
from a synthetic Hugging Face checkpoint's layer, run by the built-in reference port and verified with
the global bounds, rebuilt identically by check. The committed suite's format: tests/fixtures/."""

from __future__ import annotations

import pytest

from gdncheck.config import GDNConfig
from gdncheck.fixtures.build import check_suite
from gdncheck.fixtures.manifest import FixtureError


def test_fixtures_from_a_checkpoint(tmp_path):
    """--from-checkpoint: goldens from a (synthetic) Hugging Face checkpoint's layer, verified with the
    global bounds, rebuilt identically by check."""
    from gdncheck.conformance.judge.verify import verify
    from gdncheck.conformance.ports.run import run_impl
    from gdncheck.fixtures.build import build_checkpoint_suite
    from gdncheck.synthetic import make_weights, write_hf_checkpoint

    cfg = GDNConfig(hidden_size=32, intermediate_size=48, num_k_heads=2, num_v_heads=4, head_k_dim=16,
                    head_v_dim=8)
    ckpt = write_hf_checkpoint(tmp_path / "ckpt", cfg, {1: make_weights(cfg, 7)}, num_layers=2)
    doc = build_checkpoint_suite(ckpt, 1, tmp_path / "fx")
    assert [c["id"].split("_")[0] for c in doc["cases"]] == ["ckpt-l1-prefill-decode", "ckpt-l1-segments",
                                                              "ckpt-l1-decode"]
    assert doc["source"]["layer"] == 1
    run_impl("reference", tmp_path / "fx", tmp_path / "out", "bf16")
    s = verify(tmp_path / "fx", tmp_path / "out", "bf16")
    assert s.exit_code == 0
    assert {r.bound["source"] for c in s.cases for r in c.records if r.bound} == {"global"}
    assert {r["status"] for r in check_suite(tmp_path / "fx", checkpoint=ckpt)} == {"identical"}
    with pytest.raises(FixtureError, match="--checkpoint DIR"):  # never the folder the manifest names
        check_suite(tmp_path / "fx")
