"""The GPU benchmark and the GPU check script, run here on their CPU dry-run path."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from gdncheck.cli import main as cli_main
from gdncheck.gpu_tools.bench import design_flops_per_token_head, flops_per_token_head, main
from tests.gpu_impl.helpers import needs_interpreter

ROOT = Path(__file__).resolve().parents[2]


def test_flop_counts():
    # the minimal count of docs/math.md §6: F(64) = 181,589 and F(16) = 118,869 at dk = dv = 128
    assert round(flops_per_token_head(64, 128, 128)) == 181589
    assert round(flops_per_token_head(16, 128, 128)) == 118869
    # what the pipeline computes: K Kᵀ, Q Kᵀ, W (2·C²·dk each), U (2·C²·dv), the inverse's
    # log2(C) - 1 levels of two C³ products, W S, Q S, Kᵀ V' (2·C·dk·dv each), (Q Kᵀ) V' (2·C²·dv),
    # per chunk, over C tokens
    C, d = 64, 128
    per_chunk = 3 * 2 * C * C * d + 2 * C * C * d + 5 * 2 * 2 * C ** 3 + 3 * 2 * C * d * d + 2 * C * C * d
    assert design_flops_per_token_head(C, d, d) == per_chunk / C == 262144


@needs_interpreter
def test_bench_dry_run_writes_json_and_markdown(tmp_path, capsys):
    assert main(["--dry-run", "--json", str(tmp_path / "b.json"), "--markdown", str(tmp_path / "b.md")]) == 0
    text = capsys.readouterr().out
    assert "Ceilings measured now: copy" in text and "Decode kernel (fused recurrent" in text
    assert "Prefill (chunked WY pipeline" in text and "Decode step of the whole layer" in text
    result = json.loads((tmp_path / "b.json").read_text())
    assert [(r["Hv"], r["B"]) for r in result["decode"]] == [(4, 1), (4, 2)]
    assert all(r["us"] > 0 for r in result["decode"]) and result["prefill"][0]["T"] == 64
    assert result["layer_decode"][0]["plain_us"] > 0 and "need a GPU" in result["layer_decode"][0]["graph"]
    assert result["fla"] == "not run on the CPU (dry run)"
    row = result["prefill"][0]
    assert row["x_floor_min"] > row["x_floor"] > 0  # F_design > F(C): the design floor is the higher one
    serving = [(r["pattern"], r["what"], r["goal"]) for r in result["serving"]]
    assert serving == [("packed prefill", "delta rule", 1.2), ("packed prefill", "layer (f32)", 1.2),
                       ("decode with slots", "delta rule", 1.1), ("decode with slots", "layer (f32)", 1.1)]
    assert all(r["ratio"] == r["us"] / r["baseline_us"] > 0 for r in result["serving"])
    assert "Serving patterns (gpu_impl/serving.py)" in text and "| decode with slots | delta rule |" in text
    assert (tmp_path / "b.md").read_text().startswith("**gdncheck.gpu_tools.bench**")


@needs_interpreter
def test_cli_gpu_bench_dry_run(capsys):
    assert cli_main(["gpu-bench", "--dry-run"]) == 0
    assert "dry run, tiny sizes" in capsys.readouterr().out


def test_fla_absence_is_reported_in_every_row():
    from gdncheck.gpu_tools import bench as B

    fla, why = B.fla_ops()
    if fla is None:
        assert why.startswith("not importable (")
    result = {"device_name": "gpu", "mode": "test", "torch": "", "triton": "", "fla": "not importable (x)",
              "chunk": 16, "ceilings": {"copy_GBps": 1.0, "tf32_TFLOPs": 1.0, "bf16_TFLOPs": 2.0},
              "prefill_flops": {"design": 1.0, "minimal": 1.0},
              "decode": [{"Hv": 4, "B": 1, "us": 1.0, "GBps": 1.0, "pct_copy": 1.0}], "layer_decode": [],
              "prefill": [{"T": 64, "Hv": 4, "ms": 1.0, "Mtok_s": 1.0, "TFLOPs": 1.0, "floor_ms": 1.0,
                           "x_floor": 1.0, "x_floor_min": 1.0}]}
    text = B.markdown(result)
    assert text.count("not importable (x)") == 3  # the header, the decode row, the prefill row


@needs_interpreter
def test_fla_columns_plumbing():
    """The FLA comparison path (used on a GPU when ``fla`` imports), fed a stand-in with FLA's
    keyword signature and its equal-heads layout: the columns appear, the outputs agree with ours
    exactly, and a failing FLA call is reported, not raised."""
    import torch

    from gdncheck.gpu_impl import delta_rule_recurrent
    from gdncheck.gpu_tools import bench as B

    def recurrent(*, q, k, v, g, beta, initial_state=None, output_final_state=False):
        assert q.shape[2] == v.shape[2], "FLA is given q, k with one head per value head"
        return delta_rule_recurrent(q, k, v, g, beta, initial_state)

    def broken(**kwargs):
        raise RuntimeError("no kernel for this GPU")

    dev, measure = torch.device("cpu"), B.timer(torch.device("cpu"), repeat=1)
    s = B.DRY
    ceil = {"copy_GBps": 1.0, "tf32_TFLOPs": 1.0}
    result = {"decode": B.bench_decode(s, dev, measure, ceil), "prefill": B.bench_prefill(s, dev, measure, ceil)}
    B.bench_fla(s, dev, measure, result, (recurrent, broken))
    assert all(r["fla_rel_diff"] == 0.0 and r["fla_over_ours"] > 0 for r in result["decode"])
    assert all("RuntimeError: no kernel" in r["fla_error"] for r in result["prefill"])
    text = B.markdown({**result, "layer_decode": [], "device_name": "cpu", "mode": "test", "torch": "",
                       "triton": "", "fla": "stand-in", "chunk": s.chunk, "prefill_flops": {"design": 1, "minimal": 1},
                       "ceilings": {"copy_GBps": 1.0, "tf32_TFLOPs": 1.0, "bf16_TFLOPs": 1.0}})
    assert "FLA / ours" in text and "error: RuntimeError" in text


@pytest.mark.slow
@needs_interpreter
def test_gpu_check_script_dry_run_writes_one_json_and_one_markdown(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path)}
    env.pop("GDN_DEVICE", None)
    run = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run"], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    result = json.loads((tmp_path / "gpu-check.json").read_text())
    assert result["status"] == "pass" and result["mode"] == "dry run on the CPU"
    assert result["versions"]["torch"] and result["versions"]["triton"] and result["versions"]["python"]
    # a layer test, a serving test, the large-index family at its small size and its plan's sizes
    assert result["tests"]["passed"] == 4 and result["tests"]["failures"] == 0
    figures = [v for k, v in result["tests"]["properties"].items() if "large_index" in k]
    assert figures and figures[0]["pool_slots"] == "8"  # the dry run's small size, recorded
    assert "figures of `" in (tmp_path / "gpu-check.md").read_text()
    assert result["compile"]["scope"] == "tiny" and result["compile"]["builds"] and not result["compile"]["problems"]
    assert result["bench"]["mode"] == "dry run, tiny sizes"
    md = (tmp_path / "gpu-check.md").read_text()
    assert md.startswith("# gdncheck GPU check: PASS") and "## Compile table" in md and "## Benchmark" in md


def test_gpu_check_says_why_each_test_failed(tmp_path):
    """A failed test's message, else the traceback's last error line, lands in the result and the page."""
    import xml.etree.ElementTree as ET

    from gdncheck.gpu_tools.gpu_check import _why, markdown

    case = ET.fromstring('<testcase classname="t" name="a"><failure message="ValueError: Pointer argument (at 8) '
                         'cannot be accessed from Triton (cpu tensor?)">long traceback</failure></testcase>')
    assert _why(case) == "ValueError: Pointer argument (at 8) cannot be accessed from Triton (cpu tensor?)"
    bare = ET.fromstring('<testcase classname="t" name="b"><error>Traceback\nE   AssertionError: 1 == 16\n'
                         'more</error></testcase>')
    assert _why(bare) == "E AssertionError: 1 == 16"
    result = {"status": "fail", "mode": "GPU", "versions": {},
              "tests": {"rc": 1, "tests": 2, "passed": 0, "failures": 1, "errors": 1, "skipped": 0,
                        "failed": ["t::a", "t::b"], "why": {"t::a": _why(case), "t::b": _why(bare)}},
              "compile": {"rc": 0, "builds": [], "problems": []}, "bench": {"rc": 0}}
    md = markdown(result)
    assert "- failed: `t::a`: ValueError: Pointer argument (at 8)" in md and "`t::b`: E AssertionError" in md


def test_gpu_check_status_fails_on_any_step():
    from gdncheck.gpu_tools.gpu_check import status

    ok = {"tests": {"rc": 0, "tests": 3}, "compile": {"rc": 0, "problems": []}, "bench": {"rc": 0}}
    assert status(ok) == "pass"
    assert status({**ok, "tests": {"rc": 1, "tests": 3}}) == "fail"
    assert status({**ok, "tests": {"rc": 0, "tests": 0}}) == "fail"  # nothing collected is no pass
    assert status({**ok, "compile": {"rc": 1, "problems": ["smem"]}}) == "fail"
    assert status({**ok, "bench": {"rc": 124}}) == "fail"
