"""The page of ``gdncheck engines --markdown`` (reports/engines.py): the committed docs/engines.md holds
what the command writes for its stable part, and its hand-written header is kept. The command and its
matrix: tests/engines/test_engines.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gdncheck.conformance.engines import probe, registry

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_committed_page_holds_what_the_command_writes(tmp_path):
    from gdncheck.reports.engines import STABLE_BEGIN, stable_part

    missing = [n for n, e in registry.ENGINES.items() if not probe.probe(e).installed]
    # llama-cpp-python builds for ~20 min: CI goes without; doppler needs Node, npm packages and lavapipe;
    # vllm, vllm-triton and vllm-tp their own environment (.venv-vllm, the vllm job)
    if [n for n in missing if n not in ("llamacpp", "ggml", "doppler", "vllm", "vllm-triton", "vllm-tp")]:
        pytest.skip(f"docs/engines.md is the matrix of every registered engine; not installed here: {missing}")
    # SGLang's row is ~7 minutes of Triton's interpreter on 2 cores, vLLM's Triton row ~5, vLLM's whole engine
    # (vllm-tp: three engine starts) ~4: the engines and vllm jobs of the conformance workflow compare them
    # (GDN_ENGINES_PAGE_ALL=1); .ci/run judges SGLang's adapter in tests/engines/sglang/test_sglang.py, the vllm
    # job vLLM's in tests/engines/vllm_triton/test_vllm_triton.py and tests/engines/vllm_tp/test_vllm_tp.py
    heavy = [] if os.environ.get("GDN_ENGINES_PAGE_ALL") == "1" else ["sglang", "vllm-triton", "vllm-tp"]
    selection = [a for n in registry.ENGINES if n not in missing and n not in heavy for a in ("--engine", n)]
    page = tmp_path / "docs" / "engines.md"
    page.parent.mkdir()
    shutil.copy(ROOT / "docs" / "engines.md", page)
    committed = stable_part(page.read_text())
    # the command's default diagnosis, as the page was written with (its likely causes are in the findings);
    # in a process of its own, as a user runs it: fla's and SGLang's Triton kernels choose the interpreter
    # before triton is imported, which a test process may have done already
    out = tmp_path / "full"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-m", "gdncheck", "engines", "--out", str(out), "--diagnose", "8", "-q",
                           *selection, "--markdown", str(page)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=3600)
    rc, m = done.returncode, json.loads((out / "matrix.json").read_text())
    unexplained = [f for r in m["engines"] for p in r["results"].values() for f in p.get("findings", [])
                   if f["unexplained"]]
    assert rc == 0 and m["totals"]["unexplained"] == 0, done.stdout[-3000:] + str(unexplained)
    written = page.read_text()
    assert committed is not None
    # doppler's verdicts hang on the WebGPU device (its race on the subgroup width, its softplus on the
    # device's exp/log accuracy), not on gdncheck: its rows are the page's, as measured, and not compared
    unstable = [*missing, *heavy, "doppler"]
    assert _links(_without(stable_part(written), unstable)) == _links(_without(committed, unstable)), \
        "docs/engines.md is stale: rerun gdncheck engines --markdown docs/engines.md"
    head = (ROOT / "docs" / "engines.md").read_text().split(STABLE_BEGIN)[0]
    assert written.split(STABLE_BEGIN)[0] == head  # the hand-written header is kept


def _without(text: str, engines: list[str]) -> str:
    """The page's rows of the engines that are installed here (an engine not installed is a row of its own)."""
    return "\n".join(line for line in text.splitlines()
                     if not any(line.startswith(f"| {e} |") for e in engines))


def _links(text: str) -> str:
    """The repro links as from the repository root (the copy's page lies elsewhere than docs/)."""
    return re.sub(r"\]\([^)]*?(conformance/engines/)", r"](\1", text)
