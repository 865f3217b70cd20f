"""transformers as a port holds A_log and the gated norm's weight as transformers' own loader does
(issue 44): in f32 the case file's float32 values bit for bit; in bf16 rounded to bf16, since its Qwen3.5
classes keep nothing in float32 (from_pretrained casts every tensor to the requested dtype). Both conform
on the checkpoint-dtype cases: the bf16 rounding is below what the bf16 profile resolves."""

from __future__ import annotations

import numpy as np
import pytest

from gdncheck.config import GDNConfig
from gdncheck.conformance.judge.verify import verify
from gdncheck.conformance.ports.run import load_case_input, run_impl
from gdncheck.weights import LayerWeights

pytest.importorskip("transformers")
F32_NAMES = ("linear_attn.A_log", "linear_attn.norm.weight")


def _layer(fixtures_dir, manifest, profile):
    from gdncheck.conformance.engines.hf.adapter import hf

    entry = next(c for c in manifest["cases"] if c["id"].startswith("f32-weights"))
    inp, _ = load_case_input(fixtures_dir, entry)
    cfg = GDNConfig.from_hf(dict(inp.config))
    return hf(cfg, LayerWeights(inp.weights, config=cfg), profile=profile), inp.weights


def test_in_f32_the_port_keeps_the_files_float32_values(fixtures_dir, manifest):
    layer, weights = _layer(fixtures_dir, manifest, "f32")
    params = dict(layer.layer.named_parameters())
    for name in F32_NAMES:
        got = params[name].detach().numpy()
        assert got.dtype == np.float32
        want = np.asarray(weights[name], dtype=np.float32)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), name


def test_in_bf16_the_port_rounds_them_as_from_pretrained_does(fixtures_dir, manifest):
    import torch

    layer, weights = _layer(fixtures_dir, manifest, "bf16")
    params = dict(layer.layer.named_parameters())
    for name in F32_NAMES:
        held = params[name].detach()
        stored = torch.from_numpy(np.asarray(weights[name], dtype=np.float32))
        assert held.dtype == torch.bfloat16 and torch.equal(held, stored.to(torch.bfloat16)), name
        assert (held.float() != stored).all(), name  # every value moved: none is bf16-exact


@pytest.mark.parametrize("profile", ["f32", "bf16"])
def test_transformers_conforms_on_the_checkpoint_dtype_cases(fixtures_dir, tmp_path, profile):
    run_impl("hf", fixtures_dir, tmp_path, profile, tags=["checkpoint-dtypes"])
    s = verify(fixtures_dir, tmp_path, profile, tags=["checkpoint-dtypes"])
    assert s.exit_code == 0 and len(s.cases) == 3, [c.message for c in s.cases if c.status != "pass"]
