"""Smoke test of the benchmark's code path at tiny sizes (``--quick``): its table and JSON have every field.
Timings are not checked here; performance is measured by ``python -m gdncheck.bench``, never by tests."""

from __future__ import annotations

import importlib
import importlib.util
import json

import numpy as np
import pytest

from gdncheck import bench
from gdncheck.bench import common as bench_common
from gdncheck.bench import reference as bench_reference
from gdncheck.reference import Layer, in_proj, mlp, out_proj
from gdncheck.synthetic import make_inputs, make_weights

FIGURE_KEYS = {"seconds", "min_seconds", "runs", "cpu_seconds", "sys_seconds", "peak_mib"}


def _run(tmp_path, capsys, *extra):
    path = tmp_path / "bench.json"
    assert bench.main(["reference", "--quick", "--json", str(path), *extra]) == 0
    return capsys.readouterr().out, json.loads(path.read_text())


def test_quick_bench_table_and_json(tmp_path, capsys):
    before = bench_common.set_numpy_hugepage(None)
    out, result = _run(tmp_path, capsys, "--no-hf", "--threads", "1")
    assert result["config"] == bench_common.QUICK.summary() and result["threads"] == [1]
    assert result["numpy_madvise_hugepage"] in (False, None)  # --numpy-hugepage off, where numpy has the switch
    assert bench_common.set_numpy_hugepage(None) == before  # and restored afterwards
    assert [r["T"] for r in result["rows"]] == [16, 40]
    for row in result["rows"]:
        assert row["threads"] == 1
        for key in ("recurrent", "chunked", "layer", "layer_matmuls"):
            assert set(row[key]) == FIGURE_KEYS, (key, row[key])
            assert row[key]["seconds"] >= 0 and len(row[key]["runs"]) >= 1
        assert row["chunked_vs_recurrent"] <= 1e-12  # the error the benchmark prints is a real one
        assert "hf_torch_chunk_fp32" not in row
        assert any("threads=1" in b for b in row["env"]["blas"]), row["env"]
    header = next(line for line in out.splitlines() if line.startswith("| T |"))
    for column in ("recurrent", "chunked C=64", "chunked vs rec", "HF torch fp32", "chunked/HF", "layer",
                   "layer matmuls", "layer/mm", "threads", "load"):
        assert column in header
    assert sum(line.startswith("| 16 |") or line.startswith("| 40 |") for line in out.splitlines()) == 2
    assert "BLAS as measured" in out


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
def test_quick_bench_with_transformers(tmp_path, capsys):
    out, result = _run(tmp_path, capsys, "--tokens", "40", "--layer-max", "0")
    row = result["rows"][0]
    assert set(row["hf_torch_chunk_fp32"]) == FIGURE_KEYS
    assert row["hf_vs_chunked"] <= 1e-5  # fp32 against float64
    assert "layer" not in row


def test_layer_matmuls_are_the_layers_products():
    """The projections in the matmul measure are the layer's own products (same weights, same shapes)."""
    layer = Layer(bench_common.QUICK, make_weights(bench_common.QUICK, seed=3))
    x = make_inputs(bench_common.QUICK, 2, 40, seed=4)
    qkv, a, b, attn_out, up, mlp_out = bench_reference.layer_matmuls(layer, x)()
    p = layer.params
    qkv_ref, z_ref, a_ref, b_ref = in_proj(x, p["linear_attn.in_proj_qkv.weight"], p["linear_attn.in_proj_z.weight"],
                                           p["linear_attn.in_proj_a.weight"], p["linear_attn.in_proj_b.weight"])
    for got, want in ((qkv, qkv_ref), (a, a_ref), (b, b_ref)):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(attn_out, out_proj(z_ref, p["linear_attn.out_proj.weight"]))
    assert up.shape == (2, 40, bench_common.QUICK.intermediate_size) and mlp_out.shape == x.shape
    ref = mlp(x, p["mlp.gate_proj.weight"], p["mlp.up_proj.weight"], p["mlp.down_proj.weight"])
    assert mlp_out.shape == ref.shape


@pytest.mark.parametrize(("T", "C"), [(40, 16), (1100, 64), (1100, 48), (600, 700)])
def test_delta_rule_matmuls_follow_the_reference_blocks(T, C, monkeypatch):
    """The benchmark replays the chunked form's products block by block: same blocks as the reference."""
    module = importlib.import_module("gdncheck.reference.delta_rule_chunked")
    seen = []
    real_block = module._block

    def spy(q, *args):
        L = args[-3]
        seen.append((q.shape[1] // L, L))
        return real_block(q, *args)

    monkeypatch.setattr(module, "_block", spy)
    cfg = bench_common.QUICK
    rng = np.random.default_rng(0)
    q = rng.normal(size=(1, T, cfg.num_k_heads, cfg.head_k_dim))
    v = rng.normal(size=(1, T, cfg.num_v_heads, cfg.head_v_dim))
    g = -rng.uniform(size=(1, T, cfg.num_v_heads))
    module.delta_rule_chunked(q, q, v, g, -g, chunk_size=C)
    blocks = bench_reference._delta_rule_operands(cfg, 1, T, C, module.BLOCK_TOKENS)
    assert [(op["QK"].shape[3], op["T_inv"].shape[-1]) for op in blocks] == seen
