"""Smoke test of the MoE benchmark's code path at tiny sizes (``bench moe --quick``). Timings are
not checked; performance is measured by ``python -m gdncheck.bench moe``, never by tests."""

from __future__ import annotations

import json

import numpy as np

from gdncheck import bench
from gdncheck.bench import moe as bench_moe
from gdncheck.reference import mlp_moe

FIGURE_KEYS = {"seconds", "min_seconds", "runs", "cpu_seconds", "sys_seconds", "peak_mib"}


def test_quick_moe_bench_table_and_json(tmp_path, capsys):
    path = tmp_path / "moe.json"
    assert bench.main(["moe", "--quick", "--threads", "1", "--experts-in-memory", "5", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    result = json.loads(path.read_text())
    assert result["config"] == bench_moe.MOE_QUICK.summary() and result["experts_in_memory"] == 5
    assert [r["T"] for r in result["rows"]] == [16, 40]
    for row in result["rows"]:
        assert set(row["block"]) == FIGURE_KEYS and set(row["gemms"]) == FIGURE_KEYS
        assert row["ratio"] == row["block"]["seconds"] / row["gemms"]["seconds"]
        assert 1 <= row["experts_hit"] <= 16 and row["max_tokens_per_expert"] <= row["T"]
    header = next(line for line in out.splitlines() if line.startswith("| T |"))
    assert "block/GEMMs" in header and "GEMMs alone" in header
    assert "5 distinct expert weight sets" in out


def test_pooled_experts_are_aliases_of_their_sets():
    """Expert e of a pool of P sets computes exactly what a stack holding set e mod P computes."""
    dims = bench_moe.MOE_QUICK
    w = bench_moe.moe_weights(dims, pool=3)
    assert w["w_gate"].shape == (16, 16, 32)
    stacked = dict(w)
    for name in ("w_gate", "w_up", "w_down"):
        stacked[name] = np.stack([w[name].pool[e % 3] for e in range(16)])
    h = np.random.default_rng(0).normal(size=(1, 12, 32))
    a = mlp_moe(h, *(w[n] for n in bench_moe.ARGS), 4)
    b = mlp_moe(h, *(stacked[n] for n in bench_moe.ARGS), 4)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
