"""The fixture guarantee (fixtures/FORMAT.md §10): goldens are bit-identical on every CPU.

They are built in the reference's golden arithmetic (reference/arith.py), which uses no BLAS and no
SIMD-dispatched transcendental function. Here: every default case rebuilt in subprocesses under other
OpenBLAS kernels (OPENBLAS_CORETYPE) and other NumPy SIMD targets (NPY_DISABLE_CPU_FEATURES) has the
manifest's sha256; the golden path calls none of the CPU-dependent functions and no ``@``; and its
values agree with the fast reference (BLAS, np.exp) to 1e-13.
"""

from __future__ import annotations

import ast
import json
import os
import platform
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal, localcontext
from pathlib import Path

import numpy as np
import pytest

from gdncheck.config import GDNConfig
from gdncheck.fixtures.build import build_case, golden_tensors
from gdncheck.fixtures.cases import suite
from gdncheck.fixtures.manifest import FixtureError
from gdncheck.fixtures.reference_impl import reference_f64 as reference
from gdncheck.harness import CaseInput, execute
from gdncheck.safetensors_io import SafetensorsFile

ROOT = Path(__file__).resolve().parents[2]
CPU_ENV = ("OPENBLAS_CORETYPE", "NPY_DISABLE_CPU_FEATURES", "NPY_ENABLE_CPU_FEATURES")

#: Run in each subprocess: build the named cases; print their sha256, the OpenBLAS kernel in use and
#: the NumPy SIMD targets left on.
CPU_FEATURES = """
try:
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
except ImportError:  # NumPy 1.x
    from numpy.core._multiarray_umath import __cpu_dispatch__, __cpu_features__
"""
WORKER = CPU_FEATURES + """
import json, sys
from gdncheck.fixtures.build import build_case
from gdncheck.fixtures.cases import suite
specs = {s.case_id(0): s for s in suite("default")}
shas = {cid: build_case(specs[cid], 0)[1]["sha256"] for cid in sys.argv[1:]}
try:
    import threadpoolctl
    blas = [i.get("architecture") for i in threadpoolctl.threadpool_info() if i.get("internal_api") == "openblas"]
except ImportError:
    blas = []
simd = [t for t in __cpu_dispatch__ if __cpu_features__.get(t)]
print(json.dumps({"sha256": shas, "blas": blas, "simd": simd}))
"""


def cpu_features() -> tuple[list[str], dict[str, bool]]:
    """(NumPy's dispatch targets this CPU runs, NumPy's CPU feature table)."""
    names: dict = {}
    exec(CPU_FEATURES, names)
    return [t for t in names["__cpu_dispatch__"] if names["__cpu_features__"].get(t)], dict(names["__cpu_features__"])


def cpu_settings() -> list[tuple[str, dict[str, str]]]:
    """Settings other than this process's: OpenBLAS kernels this CPU can run, NumPy SIMD targets off."""
    targets, has = cpu_features()
    off_all = {"NPY_DISABLE_CPU_FEATURES": " ".join(targets)} if targets else {}
    off_top = {"NPY_DISABLE_CPU_FEATURES": targets[-1]} if targets else {}
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        out = [("OpenBLAS Prescott, NumPy baseline only", {"OPENBLAS_CORETYPE": "Prescott", **off_all})]
        if has.get("SSE42"):
            out.append(("OpenBLAS Nehalem", {"OPENBLAS_CORETYPE": "Nehalem"}))
        if has.get("AVX"):
            out.append(("OpenBLAS SandyBridge, top NumPy target off", {"OPENBLAS_CORETYPE": "SandyBridge", **off_top}))
        if has.get("AVX2") and has.get("FMA3"):
            out.append(("OpenBLAS Haswell", {"OPENBLAS_CORETYPE": "Haswell"}))
        return out
    if machine in ("aarch64", "arm64"):
        return [("OpenBLAS ARMV8, NumPy baseline only", {"OPENBLAS_CORETYPE": "ARMV8", **off_all}),
                ("top NumPy target off", off_top)]
    return [("NumPy baseline only", off_all)] if off_all else []


def _cost(case: dict) -> float:
    """A rough build cost: layer calls (a decode step of T tokens is T calls), heavier with big heads."""
    if case["kind"] == "error":
        return 0.05
    c = case["config"]
    heads = c["linear_num_value_heads"] * c["linear_key_head_dim"] * c["linear_value_head_dim"] / 4096
    calls = sum(s["T"] if s["op"] == "decode" else 1 + s["T"] / 20
                for s in case["program"] if s["op"] in ("forward", "decode"))
    return 0.05 + calls * (1 + heads)


def _plan(manifest, n: int) -> list[list[str]]:
    """Every case into one of n groups, the costliest first into the lightest group."""
    groups: list[list[str]] = [[] for _ in range(n)]
    load = [0.0] * n
    for case in sorted(manifest["cases"], key=_cost, reverse=True):
        i = load.index(min(load))
        groups[i].append(case["id"])
        load[i] += _cost(case)
    return groups


def _run(env_changes: dict[str, str], ids: list[str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in CPU_ENV}
    path = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.update(env_changes, OPENBLAS_NUM_THREADS="1", PYTHONPATH=path)
    proc = subprocess.run([sys.executable, "-c", WORKER, *ids], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"a build under {env_changes} failed (exit {proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_case_is_bit_identical_under_other_blas_kernels_and_simd_targets(manifest):
    settings = cpu_settings()
    if not settings:
        pytest.skip(f"no other BLAS kernel or SIMD target to try on {platform.machine()}")
    groups = _plan(manifest, len(settings))
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda sg: _run(sg[0][1], sg[1]), zip(settings, groups)))
    want = {c["id"]: c["sha256"] for c in manifest["cases"]}
    built = {}
    for (name, env_changes), result in zip(settings, results):
        for cid, sha in result["sha256"].items():
            assert sha == want[cid], f"{cid} built under {name} ({env_changes}) has sha256 {sha[:16]}, the manifest " \
                                     f"{want[cid][:16]}: the golden is not bit-identical across CPUs"
            built[cid] = name
        disabled = env_changes.get("NPY_DISABLE_CPU_FEATURES", "").split()
        assert not set(disabled) & set(result["simd"]), f"NumPy ignored NPY_DISABLE_CPU_FEATURES under {name}"
    assert set(built) == set(want), f"cases not built under another setting: {sorted(set(want) - set(built))}"
    if platform.machine().lower() in ("x86_64", "amd64") and any(r["blas"] for r in results):
        kernels = {k for r in results for k in r["blas"]}
        assert len(kernels) >= 2, f"OPENBLAS_CORETYPE changed nothing: every build used {kernels}"


# --- the golden path uses none of the CPU-dependent functions ----------------------------------------
FORBIDDEN = ("exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "logaddexp", "logaddexp2", "tanh", "power",
             "float_power", "matmul", "dot", "vdot", "inner", "einsum", "tensordot", "sum", "mean")
PATH_CASES = ("dk-gt-dv", "decode_T12", "per-head-norm", "snapshot-replay", "mismatch-midstream",
              "softplus-edges", "sigmoid-edges", "real-heads_T3_Hk16_Hv32", "error-norm-weight-size",
              "error-input-shape")


def _raiser(name):
    def forbidden(*args, **kwargs):
        raise AssertionError(f"np.{name} called on the golden path")
    return forbidden


def _executed_functions(run) -> set[tuple[str, int, str]]:
    seen = set()

    def profile(frame, event, arg):
        if event == "call":
            co = frame.f_code
            seen.add((co.co_filename, co.co_firstlineno, co.co_name))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return seen


def _matmul_operators(functions: set[tuple[str, int, str]]) -> list[str]:
    """``@`` operators inside the given functions of this repository's source (``a @ b`` on arrays calls
    BLAS without looking up np.matmul, so patching cannot catch it)."""
    found = []
    by_file: dict[str, set[tuple[int, str]]] = {}
    for filename, line, name in functions:
        if filename.startswith(str(ROOT)) and "/.venv/" not in filename and filename.endswith(".py"):
            by_file.setdefault(filename, set()).add((line, name))
    for filename, wanted in by_file.items():
        for node in ast.walk(ast.parse(Path(filename).read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            if (first, node.name) not in wanted:
                continue
            for sub in ast.walk(node):
                if isinstance(sub, ast.BinOp | ast.AugAssign) and isinstance(sub.op, ast.MatMult):
                    found.append(f"{Path(filename).relative_to(ROOT)}:{sub.lineno} in {node.name}")
    return found


def test_the_golden_path_uses_no_blas_no_simd_transcendentals_no_matmul_operator(manifest, monkeypatch):
    specs = [s for s in suite("default") if any(s.case_id(0).startswith(p) for p in PATH_CASES)]
    assert len(specs) == len(PATH_CASES)
    for name in FORBIDDEN:
        monkeypatch.setattr(np, name, _raiser(name))
    for name in np.linalg.__all__:
        if callable(getattr(np.linalg, name)) and name != "LinAlgError":
            monkeypatch.setattr(np.linalg, name, _raiser(f"linalg.{name}"))
    shas = {}
    seen = _executed_functions(lambda: shas.update({s.case_id(0): build_case(s, 0)[1]["sha256"] for s in specs}))
    monkeypatch.undo()
    want = {c["id"]: c["sha256"] for c in manifest["cases"]}
    assert shas == {cid: want[cid] for cid in shas}
    names = {n for _, _, n in seen}
    assert {"in_proj", "conv1d", "gates", "delta_rule_recurrent", "gated_norm", "mlp", "matmul", "tree_sum_last",
            "exp", "log1p_unit"} <= names, "the trace missed the reference's stages"
    assert _matmul_operators(seen) == []


def test_the_matmul_operator_check_finds_one():
    """The check above is not vacuous: the chunked delta rule (fast mode only) has ``@`` operators."""
    from gdncheck.reference import delta_rule_chunked
    from tests.helpers import delta_inputs

    q, k, v, g, beta = delta_inputs(np.random.default_rng(0), 1, 5, 1, 2, 4, 3)
    seen = _executed_functions(lambda: delta_rule_chunked(q, k, v, g, beta))
    assert any("unit_lower_inverse" in f for f in _matmul_operators(seen))


# --- golden values against the fast reference ---------------------------------------------------------
def test_goldens_agree_with_the_fast_reference_to_1e13(fixtures_dir, manifest):
    """The committed goldens (golden arithmetic, recurrent delta rule) against today's fast reference
    (BLAS, np.exp, the chunked rule for T > 1) on every call of every case: max |a − b| / max |b| per
    tensor (normwise: the sums cancel)."""
    worst = (0.0, "")
    for spec in suite("default"):
        if spec.error:
            continue
        case = spec.materialize(0)
        inp = CaseInput(case.id, case.config, case.weights, case.batch, case.program.steps, case.program.inputs,
                        case.expected)
        res = execute(reference, inp, profile="f64")
        f = SafetensorsFile(fixtures_dir / f"{case.id}.safetensors")
        assert res.outputs, case.id
        for key, fast in res.outputs.items():
            if key.endswith(".seq_len"):
                continue
            gold = f.read(key)
            scale = float(np.max(np.abs(gold))) if gold.size else 0.0
            err = float(np.max(np.abs(gold - fast))) / scale if scale else float(np.max(np.abs(fast), initial=0.0))
            worst = max(worst, (err, f"{case.id} {key}"))
    assert worst[0] <= 1e-13, f"golden and fast reference differ by {worst[0]:.2e} relative at {worst[1]}"


def test_the_query_scale_is_correctly_rounded_for_every_case(manifest):
    """dk^-0.5 comes from Python's pow (the C library's): the goldens need it correctly rounded."""
    with localcontext() as ctx:
        ctx.prec = 40
        for c in manifest["cases"]:
            if c["kind"] == "forward":
                exact = float(1 / Decimal(c["config"]["linear_key_head_dim"]).sqrt())
                assert GDNConfig.from_hf(dict(c["config"])).scale == exact, c["id"]


def test_goldens_refuse_a_process_that_flushes_subnormals():
    torch = pytest.importorskip("torch")
    spec = next(s for s in suite("default") if s.name == "decode")
    case = spec.materialize(0)
    torch.set_flush_denormal(True)
    try:
        if (np.array([5e-324]) * 1.0)[0] != 0.0:
            pytest.skip("torch cannot set flush-to-zero on this CPU")
        with pytest.raises(FixtureError, match="subnormal"):
            golden_tensors(case)
    finally:
        torch.set_flush_denormal(False)
