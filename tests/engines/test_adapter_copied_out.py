"""An adapter copied out of gdncheck as a plug-in of one's own (docs/engines.md: each adapter is a model for a
port) imports and runs, and an import that fails says what failed (issue 43, item 7). Before, SGLang's
adapter imported gdncheck's modules relatively, so the copy failed on ``attempted relative import with no
known parent package`` and the error said SGLang's kernels "cannot be imported here" with its pip line, as if
SGLang were not installed."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENGINES = ROOT / "conformance" / "engines"


def _run(tmp_path, code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(tmp_path)}
    return subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="SGLang is not installed")
def test_sglangs_adapter_copied_out_imports_its_kernels(tmp_path):
    shutil.copy(ENGINES / "sglang" / "adapter.py", tmp_path / "my_sglang.py")
    done = _run(tmp_path, "import my_sglang; print('kernels', my_sglang.kernels(True).version)")
    assert done.returncode == 0 and "kernels 0.5.23" in done.stdout, done.stdout + done.stderr[-2000:]


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="SGLang is not installed")
def test_an_import_failure_that_is_not_sglang_missing_says_what_failed(tmp_path):
    shutil.copy(ENGINES / "sglang" / "adapter.py", tmp_path / "my_sglang.py")
    code = ("import my_sglang\n"
            "def broken():\n"
            "    raise ImportError('attempted relative import with no known parent package')\n"
            "my_sglang._bare_packages = broken\n"
            "from gdncheck.errors import GDNError\n"
            "try:\n"
            "    my_sglang.kernels(True)\n"
            "except GDNError as exc:\n"
            "    print(exc)\n")
    done = _run(tmp_path, code)
    said = done.stdout
    assert "importing sglang's kernels failed, though sglang is installed" in said, said + done.stderr[-2000:]
    assert "attempted relative import" in said and "pip install" not in said


def test_vllm_tritons_adapter_copied_out_says_vllm_is_missing_not_a_relative_import(tmp_path):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: the copy's kernels would import")
    shutil.copy(ENGINES / "vllm_triton" / "adapter.py", tmp_path / "my_vllm_triton.py")
    code = ("import my_vllm_triton\n"
            "from gdncheck.errors import GDNError\n"
            "try:\n"
            "    my_vllm_triton.kernels(True)\n"
            "except GDNError as exc:\n"
            "    print(exc)\n")
    done = _run(tmp_path, code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "needs vLLM's kernels, which cannot be imported here (No module named 'vllm'" in done.stdout, done.stdout
