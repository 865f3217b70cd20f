"""What engines shard of the GDN layer, read from their installed code, so that docs/sharding.md stays true."""

from __future__ import annotations

import pytest


def test_transformers_tp_plan_gathers_every_gdn_projection():
    conf = pytest.importorskip("transformers.models.qwen3_5.configuration_qwen3_5")
    plan = {k: v for cls in vars(conf).values() if isinstance(cls, type)
            for k, v in (getattr(cls, "base_model_tp_plan", None) or {}).items() if ".linear_attn." in k}
    assert plan == {f"layers.*.linear_attn.{p}": "colwise_gather_output"
                    for p in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")}
