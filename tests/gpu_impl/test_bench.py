"""The GPU benchmark and the GPU check script, run here on their CPU dry-run path."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from gdncheck.cli import main as cli_main
from gdncheck.gpu_impl.bench import flops_per_token_head, main
from tests.gpu_impl.helpers import needs_interpreter

ROOT = Path(__file__).resolve().parents[2]


def test_real_flop_count():
    # perf-anchors §3.2: F(64) = 181,589 and F(16) = 118,869 at dk = dv = 128
    assert round(flops_per_token_head(64, 128, 128)) == 181589
    assert round(flops_per_token_head(16, 128, 128)) == 118869


@needs_interpreter
def test_bench_dry_run_prints_the_table(tmp_path, capsys):
    assert main(["--dry-run", "--json", str(tmp_path / "b.json")]) == 0
    text = capsys.readouterr().out
    assert "ceilings measured now: copy" in text and "decode: fused recurrent kernel" in text
    assert "prefill: chunked WY pipeline" in text
    result = json.loads((tmp_path / "b.json").read_text())
    assert [(r["Hv"], r["B"]) for r in result["decode"]] == [(4, 1), (4, 2)]
    assert all(r["us"] > 0 for r in result["decode"]) and result["prefill"][0]["T"] == 64


@needs_interpreter
def test_cli_gpu_bench_dry_run(capsys):
    assert cli_main(["gpu-bench", "--dry-run"]) == 0
    assert "dry run, tiny sizes" in capsys.readouterr().out


@needs_interpreter
def test_gpu_check_script_dry_run(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path)}
    env.pop("GDN_DEVICE", None)
    run = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run"], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "1 passed" in run.stdout and "gpu_check: OK" in run.stdout
    assert json.loads((tmp_path / "bench.json").read_text())["mode"] == "dry run, tiny sizes"


@needs_interpreter
def test_fla_columns_plumbing():
    """The FLA comparison path (used on a GPU when ``fla`` imports), fed a stand-in with FLA's
    keyword signature: the columns appear, and a failing FLA call is reported, not raised."""
    import torch

    from gdncheck.gpu_impl import bench as B
    from gdncheck.gpu_impl import delta_rule_recurrent

    def recurrent(*, q, k, v, g, beta, initial_state=None, output_final_state=False):
        return delta_rule_recurrent(q, k, v, g, beta, initial_state)

    def broken(**kwargs):
        raise RuntimeError("no kernel for this GPU")

    dev, measure = torch.device("cpu"), B.timer(torch.device("cpu"), repeat=1)
    s = B.DRY
    result = {"decode": B.bench_decode(s, dev, measure, {"copy_GBps": 1.0}),
              "prefill": B.bench_prefill(s, dev, measure, {"gemm_TFLOPs": 1.0})}
    B.bench_fla(s, dev, measure, result, (recurrent, broken))
    assert all(r["fla_rel_diff"] == 0.0 and r["fla_over_ours"] > 0 for r in result["decode"])
    assert all("RuntimeError: no kernel" in r["fla_error"] for r in result["prefill"])
    text = B.report({**result, "device_name": "cpu", "mode": "test", "torch": "", "triton": "", "fla": "stand-in",
                     "chunk": s.chunk, "ceilings": {"copy_GBps": 1.0, "gemm_TFLOPs": 1.0, "gemm_dtype": "f32"}})
    assert "FLA/ours" in text and "error" in text
