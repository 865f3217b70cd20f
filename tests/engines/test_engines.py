"""``gdncheck engines``: the cross-engine conformance matrix (conformance/engines/, docs/engines.md).

On a narrowed selection the command writes a valid matrix in which every case that is no clean pass is
classified from verify's summary and explained by a known finding; an engine that is not installed is a
row with its pip line; bad input is exit 2 and one line; a wrong FINDINGS entry and a glue error (the mlx
adapter leaving MLX's [Hv, dv, dk] state untransposed) show as unexplained findings at their stage, never
hidden. That the committed docs/engines.md holds what the command writes for its stable part (the page of
reports/engines.py): tests/reports/test_engines_page.py."""

from __future__ import annotations

import ast
import json
import shutil
import sys
from pathlib import Path

import pytest

from gdncheck.cli import main as cli
from gdncheck.conformance.engines import matrix, probe, registry, schema

ROOT = Path(__file__).resolve().parents[2]
#: every engine's repros: conformance/engines/<name>/repros/
REPROS = ROOT / "conformance" / "engines"

#: the mlx findings known today, the case every port must run, a case MLX cannot express (per-head-norm_T69:
#: the prefix alone would take its depth variants too)
CASES = ["error-input-dtype", "error-moe-missing-moe-size", "moe-exact-tie", "prefill-decode_T65", "per-head-norm_T69"]


def _mlx_or_skip():
    pytest.importorskip("mlx.core", reason="MLX is not installed (pip install \"mlx[cpu]\" mlx-lm)")
    pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install \"mlx[cpu]\" mlx-lm)")


def _engines(tmp_path, *args, name="out", diagnose: int = 0) -> tuple[int, dict]:
    out = tmp_path / name
    rc = cli(["engines", "--out", str(out), "--diagnose", str(diagnose), "-q", *args])
    return rc, (json.loads((out / "matrix.json").read_text()) if (out / "matrix.json").is_file() else {})


def _selection(cases=CASES):
    return [a for c in cases for a in ("--case", c)]


def _row(matrix, name):
    return next(r for r in matrix["engines"] if r["name"] == name)


def _findings(matrix, name, profile):
    return {f["case"].split("_")[0]: f for f in _row(matrix, name)["results"][profile]["findings"]}


# --- the matrix ----------------------------------------------------------------------------------------
def test_the_matrix_of_mlx_and_the_reference_classifies_every_finding(tmp_path):
    _mlx_or_skip()
    rc, m = _engines(tmp_path, "--engine", "mlx", "--engine", "reference", *_selection(),
                     "--markdown", str(tmp_path / "page.md"), "--html", str(tmp_path / "page.html"))
    assert rc == 0
    assert m["schema"] == "gdncheck-engines-matrix" and [r["name"] for r in m["engines"]] == ["reference", "mlx"]
    ref, mlx = _row(m, "reference"), _row(m, "mlx")
    assert ref["baseline"] and ref["status"] == "ran" and mlx["versions"]["mlx-lm"]
    assert mlx["judged"] == "end_to_end" and mlx["profiles_run"] == ["f32", "bf16"]
    for row in (ref, mlx):
        for profile, r in row["results"].items():
            assert r["status"] == "ran" and r["counts"]["cases"] == len(CASES), (row["name"], profile)
            assert r["unexplained"] == 0 and r["stale_findings"] == [], r["findings"]
            assert all(f["class"] in matrix.CLASSES for f in r["findings"])
            assert (tmp_path / "out" / row["name"] / profile / f"verify-summary-{profile}.json").is_file()
    assert ref["results"]["f32"]["counts"]["pass"] == len(CASES) and not ref["results"]["f32"]["findings"]
    assert 0 < ref["results"]["f32"]["worst_ratio"]["ratio"] <= 1
    f32 = _findings(m, "mlx", "f32")
    dtype = f32["error-input-dtype"]
    assert dtype["status"] == "fail" and dtype["class"] == "deviation"
    assert dtype["adjudication"] == {"kind": "error_check", "reason": "error_expected", "expected": "input_dtype",
                                     "actual": None, "step": 1, "actual_step": None}
    assert (ROOT / dtype["repro"]).is_file() and dtype["repro"].endswith("mlx_int32_input.py")
    crash = f32["error-moe-missing-moe-size"]
    assert crash["status"] == "fail" and crash["verify_status"] == "pass" and crash["class"] == "engine_crash"
    assert crash["adjudication"]["exception"] == "ZeroDivisionError"
    assert crash["repro"].endswith("mlx_missing_moe_size.py")
    tie = f32.get("moe-exact-tie")  # which tied expert argpartition keeps is MLX's (and its machine's) choice
    if tie is not None:
        assert tie["class"] == "convention" and tie["adjudication"]["choice"] in ("higher index", "other", "mixed")
        assert not tie["unexplained"]
    assert f32["per-head-norm"]["class"] == "missing_feature" and "per_head" in f32["per-head-norm"]["detail"]
    assert "prefill-decode" not in f32  # a clean pass is no finding
    bf16 = _findings(m, "mlx", "bf16")
    assert bf16["moe-exact-tie"]["class"] == "missing_feature" and "gather_mm" in bf16["moe-exact-tie"]["detail"]
    assert bf16["error-input-dtype"]["class"] == "deviation"
    page = (tmp_path / "page.md").read_text()
    assert "| mlx | end-to-end | f32 | 5 | 2 | 2 | 1 |" in page  # the crash is a failure
    assert "[mlx_int32_input.py](" in page and "conformance/engines/mlx/repros/mlx_int32_input.py)" in page
    html = (tmp_path / "page.html").read_text()
    assert "mlx_int32_input.py" in html and "engine crash" in html and "<script" not in html
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".gdncheck-engines", "matrix.html", "matrix.json",
                                                                   "matrix.md", "mlx", "reference"]


def test_an_engine_not_installed_is_a_row_with_its_pip_line(tmp_path, monkeypatch):
    real = probe.module_available
    monkeypatch.setattr(probe, "module_available", lambda name: name != "mlx_lm" and real(name))
    rc, m = _engines(tmp_path, "--engine", "mlx", "--engine", "reference", "--profile", "f32",
                     "--case", "prefill-decode_T65")
    assert rc == 0
    row = _row(m, "mlx")
    assert row["status"] == "not_installed" and row["results"] == {} and row["missing"] == ["mlx_lm"]
    assert row["problem"] == "not installed (mlx_lm missing): pip install \"mlx[cpu]\" mlx-lm"
    assert _row(m, "reference")["results"]["f32"]["counts"]["pass"] == 1
    assert "not installed (mlx_lm missing): pip install" in (tmp_path / "out" / "matrix.md").read_text()


@pytest.mark.parametrize("args, words", [
    (["--engine", "no-such-engine"], f"expected an engine {', '.join(registry.ENGINES)}, found 'no-such-engine'"),
    (["--profile", "f64"], "expected --profile one of"),
    (["--case", "no-such-case"], "no-such-case"),
    (["--option", "kernel=chunk"], "expected --option ENGINE:KEY=VALUE"),
])
def test_bad_input_is_exit_2_and_one_line(tmp_path, capsys, args, words):
    rc = cli(["engines", "--out", str(tmp_path / "out"), "--engine", "reference", *args])
    err = capsys.readouterr().err
    assert rc == 2 and words in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_an_out_that_is_a_file_or_someone_elses_folder_is_refused(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("mine")
    for out, words in (("file", "found a file"), ("theirs", "is not empty")):
        rc = cli(["engines", "--out", str(tmp_path / out), "--engine", "reference", "--case", "prefill-decode_T65"])
        err = capsys.readouterr().err
        assert rc == 2 and words in err and err.count("\n") == 1, err
    assert (tmp_path / "file").read_text() == "x" and sorted(p.name for p in (tmp_path / "theirs").iterdir()) == [
        "notes.txt"]


# --- nothing hidden --------------------------------------------------------------------------------------
def test_a_wrong_findings_entry_leaves_the_case_unexplained(tmp_path, monkeypatch):
    _mlx_or_skip()
    wrong = dict(registry.FINDINGS)
    wrong[("mlx", "error-input-dtype", "*")] = schema.Finding("convention", "wrongly filed as a convention")
    monkeypatch.setattr(registry, "FINDINGS", wrong)
    rc, m = _engines(tmp_path, "--engine", "mlx", "--profile", "f32", "--case", "error-input-dtype")
    assert rc == 0
    r = _row(m, "mlx")["results"]["f32"]
    (f,) = r["findings"]
    assert f["class"] == "deviation" and f["unexplained"] and f["explanation"] is None and r["unexplained"] == 1
    assert "class deviation (FINDINGS: convention)" in f["mismatch"]
    assert "**unexplained**" in (tmp_path / "out" / "matrix.md").read_text()


def test_a_glue_error_is_an_unexplained_deviation_at_its_stage(tmp_path, monkeypatch):
    _mlx_or_skip()
    from gdncheck.conformance.engines.mlx import adapter as port

    monkeypatch.setattr(port, "recurrent_to_format", lambda S: S)  # MLX's [B, Hv, dv, dk] written as it is
    rc, m = _engines(tmp_path, "--engine", "mlx", "--profile", "f32", "--case", "prefill-decode_T65")
    assert rc == 0
    (f,) = _row(m, "mlx")["results"]["f32"]["findings"]
    assert f["status"] == "fail" and f["class"] == "deviation" and f["unexplained"]
    assert f["adjudication"]["stage"] == "delta_rule" and f["adjudication"]["tensor"] == "recurrent_state"
    assert f["adjudication"]["ratio"] > 1


def test_classify_reads_crashes_and_deviations_from_the_summary():
    raised = {"id": "x", "status": "fail", "first_divergence": {"step": 1, "op": "forward", "reason": "raised"},
              "message": "the implementation raised IndexError at step 1 (forward): list index out of range, but ..."}
    assert matrix.classify(raised)["class"] == "engine_crash"
    assert matrix.classify(raised)["adjudication"]["exception"] == "IndexError"
    refused = {**raised, "message": "the implementation raised input_error at step 1 (forward): bad, but ..."}
    assert matrix.classify(refused)["class"] == "deviation"
    tensor = {"id": "y", "status": "fail", "first_divergence": {"step": 1, "call": 0, "stage": "gates", "tensor": "g",
                                                               "reason": "elem_bound", "token": 3},
              "records": [{"step": 1, "stage": "gates", "tensor": "g", "verdict": "fail",
                           "metrics": {"max_err": 4e-3, "nmse": 1e-9}, "bound": {"elem": 1e-3, "nmse": 1e-6}}]}
    adj = matrix.classify(tensor)["adjudication"]
    assert (adj["stage"], adj["tensor"], adj["measure"]) == ("gates", "g", "elem") and adj["ratio"] == pytest.approx(4)
    assert matrix.classify({"id": "z", "status": "pass", "records": []}) is None
    found = matrix.explain(matrix.classify(tensor), "mlx", "y_T3", "f32", "fail")
    assert found["unexplained"] and found["finding"] is None


def test_the_probe_imports_nothing_of_an_engine():
    import subprocess

    code = ("import sys; from gdncheck.conformance.engines import probe, registry as r; "
            "p = [probe.probe(e) for e in r.ENGINES.values()]; "
            "print(sorted(m for m in ('mlx', 'mlx_lm', 'transformers', 'torch', 'fla') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- the registry, the repros, the committed page --------------------------------------------------------
def test_every_findings_entry_is_of_a_registered_engine_with_an_existing_repro():
    for (name, prefix, profile), f in registry.FINDINGS.items():
        assert name in registry.ENGINES and prefix and f.cls in matrix.CLASSES
        assert profile == "*" or profile in registry.ENGINES[name].profiles
        assert f.repro is None or (ROOT / f.repro).is_file(), f.repro
    assert registry.ENGINES["fla"].stage_isolated and registry.ENGINES["fla"].options == {"kernel": "chunk"}
    assert all(e.judged in schema.JUDGED for e in registry.ENGINES.values())


def test_repros_import_only_the_engine_numpy_and_the_stdlib():
    allowed = {"mlx", "mlx_lm", "numpy", "transformers", "torch", "fla", "llama_cpp", "onnxruntime", "onnx", "vllm",
               "sglang", "keras", "keras_hub", "triton"} | set(sys.stdlib_module_names)
    scripts = sorted(REPROS.glob("*/repros/*.py"))
    assert {p.name for p in scripts} >= {"mlx_int32_input.py", "mlx_missing_moe_size.py"}
    for path in scripts:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            for n in names:
                assert n.split(".")[0] in allowed, f"{path.name} imports {n}"


def test_doppler_is_a_fused_engine_run_by_its_own_program(tmp_path, monkeypatch):
    """doppler's glue is Node: the registry runs its run.js (no gdncheck run) and judges it fused; a folder
    without the glue or its npm packages is a row 'not installed (...)' with the install line, no traceback."""
    eng = registry.ENGINES["doppler"]
    assert eng.fused and eng.stage_isolated and eng.command[0] == "node" and eng.profiles == ("f32",)
    assert not registry.ENGINES["fla"].fused and registry.ENGINES["fla"].stage_isolated
    monkeypatch.setenv("GDN_DOPPLER_DIR", str(tmp_path / "empty"))
    assert eng.glue_folder() == tmp_path / "empty"
    pr = probe.probe(eng)
    assert not pr.installed and str(tmp_path / "empty" / ".") in pr.missing, pr.missing
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "run.js").write_text("")
    pr = probe.probe(eng)
    node = [] if shutil.which("node") else ["node"]
    assert not pr.installed and pr.missing == node + [str(tmp_path / "empty" / "node_modules/doppler-gpu"),
                                                      str(tmp_path.parent.parent / "examples" / "ports" / "node" /
                                                          "safetensors.js")]
    assert pr.hint(eng).startswith("not installed (") and "npm install" in pr.hint(eng)
    # issue 43, item 7: a copy outside a checkout, without the Node port its run.js imports from
    # ../../../examples/ports/node/, is a row saying so (before: installed, then run.js died on the import)
    (tmp_path / "empty" / "node_modules" / "doppler-gpu").mkdir(parents=True)
    pr = probe.probe(eng)
    assert pr.missing == node + [str(tmp_path.parent.parent / "examples" / "ports" / "node" / "safetensors.js")], \
        pr.missing
    assert "../../../examples/ports/node holds a copy of examples/ports/node" in pr.hint(eng)
    rc, m = _engines(tmp_path, "--engine", "doppler")
    [row] = m["engines"]
    # nothing ran: the matrix is written, and the exit says nothing was judged
    assert rc == 1 and row["status"] == "not_installed" and row["problem"].startswith("not installed (")
