"""Bad inputs, round 2 (issue 26 item 5 and its leftovers; docs/bad-inputs.md): every bad input is exit
2 and one line naming what was expected and what was found, from the CLI, an environment variable or
the pytest plugin, and the library raises gdncheck's own errors (a ``code`` each) instead of
``ValueError``, ``MemoryError`` or a silently accepted value. "internal error" is for gdncheck's bugs
only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gdncheck import errors as E
from gdncheck.fixtures.manifest import DEFAULT_DIR, FixtureError
from gdncheck.synthetic import DEMO_CONFIG, make_weights

GDNCHECK = Path(sys.executable).with_name("gdncheck")
MANIFEST = json.loads((DEFAULT_DIR / "manifest.json").read_text())


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GDN_DEBUG", "PYTEST_ADDOPTS")}
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env.update(extra)
    return env


def gdncheck(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(GDNCHECK), *args], capture_output=True, text=True, env=_env(**env), cwd=cwd,
                          timeout=600)


def one_line(result: subprocess.CompletedProcess, rc: int = 2) -> str:
    """The one line of stderr of a refused command (exit ``rc``: no traceback, not 'internal error')."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == rc, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    assert "internal error" not in result.stderr
    assert len(lines) == 1, result.stderr
    return lines[0]


def suite_copy(tmp_path: Path, edit=None, text_edit=None, files: tuple[str, ...] = ()) -> Path:
    """A fixture folder holding the default manifest (edited) and the files of the cases named."""
    folder = tmp_path / "suite"
    folder.mkdir()
    doc = json.loads(json.dumps(MANIFEST))
    if files:
        doc["cases"] = [c for c in doc["cases"] if c["id"] in files]
        for c in doc["cases"]:
            shutil.copyfile(DEFAULT_DIR / c["file"], folder / c["file"])
    if edit:
        edit(doc)
    text = json.dumps(doc, indent=1)
    if text_edit:
        text = text_edit(text)
    (folder / "manifest.json").write_text(text)
    return folder


# --- the implementation name: one parser for the CLI, the gate and the pytest plugin ---------------


@pytest.mark.parametrize("spec", [":", "../../etc/passwd:x", ".:x", "os:getcwd"])
def test_run_refuses_an_impl_that_is_no_factory_up_front(tmp_path, spec):
    out = tmp_path / "out"
    line = one_line(gdncheck("run", spec, "--profile", "f32", "--out", str(out)))
    assert line.startswith("gdncheck run: error: ")
    assert repr(spec) in line
    assert "expected an implementation" in line or "cannot be called as a factory" in line
    assert not out.exists()  # refused before anything was written


@pytest.mark.parametrize("spec", [":", "a:", ":b", ".:x", "..mod:f", "../../etc/passwd:x", "a/b:f", "a b:f",
                                  "mod:f.", "mod:.f", "mod:f:g", "-m:f"])
def test_parse_spec_refuses_what_is_no_dotted_name(spec):
    from gdncheck.conformance.ports.plugin import load_factory, parse_spec

    with pytest.raises(E.GDNError, match="expected an implementation .* or 'MODULE:CALLABLE'"):
        parse_spec(spec)
    with pytest.raises(E.GDNError):
        load_factory(spec)


def test_parse_spec_reads_builtins_and_dotted_names():
    from gdncheck.conformance.ports.plugin import parse_spec

    assert parse_spec("reference") is None
    assert parse_spec("pkg.mod:Factory.create") == ("pkg.mod", "Factory.create")
    assert parse_spec("mødule:fäctory") == ("mødule", "fäctory")


def test_load_checked_factory_refuses_a_callable_that_is_no_factory():
    from gdncheck.conformance.ports.implementations import reference
    from gdncheck.conformance.ports.plugin import load_checked_factory

    with pytest.raises(E.GDNError, match="'os:getcwd' cannot be called as a factory"):
        load_checked_factory("os:getcwd")
    with pytest.raises(E.GDNError, match="takes no option 'nope'"):
        load_checked_factory("reference", {"nope": 1})
    assert load_checked_factory("reference", {"chunk_size": 32}) is reference


def test_an_import_that_raises_is_the_ports_error_not_a_gdncheck_bug(tmp_path, monkeypatch):
    from gdncheck.conformance.ports.plugin import load_factory

    (tmp_path / "broken_port_r2.py").write_text("raise RuntimeError('port is broken')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(E.GDNError, match="importing module 'broken_port_r2' .* raised RuntimeError: port is broken"):
        load_factory("broken_port_r2:factory")


@pytest.mark.parametrize(("spec", "says"), [(":", "expected an implementation"), (".:x", "expected an implementation"),
                                            ("os:getcwd", "cannot be called as a factory")])
def test_pytest_plugin_refuses_a_bad_impl_as_one_usage_error(tmp_path, spec, says):
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--gdncheck-impl", spec],
                            capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=600)
    line = one_line(result, rc=pytest.ExitCode.USAGE_ERROR)
    assert "INTERNALERROR" not in result.stdout + result.stderr
    assert line.startswith("ERROR: gdncheck: --gdncheck-impl: ") and says in line and repr(spec) in line
    assert "failed" not in result.stdout  # nothing ran


# --- environment variables -------------------------------------------------------------------------


def test_blas_threads_beyond_the_bound_is_one_line(tmp_path):
    line = one_line(gdncheck("fixtures", "list", GDN_BLAS_THREADS="99999999999999999999"))
    assert "GDN_BLAS_THREADS: expected a positive integer of at most 4096" in line
    assert "found '99999999999999999999'" in line


@pytest.mark.parametrize(("text", "ok"), [("4096", True), ("4097", False), ("9" * 5000, False)])
def test_blas_threads_is_bounded(monkeypatch, text, ok):
    from gdncheck.env import blas_threads

    monkeypatch.setenv("GDN_BLAS_THREADS", text)
    if ok:
        assert blas_threads() == int(text)
    else:
        with pytest.raises(E.EnvironmentVariableError, match="at most 4096") as err:
            blas_threads()
        assert err.value.code == "environment_variable" and len(str(err.value)) < 300


def test_an_unknown_hypothesis_profile_is_a_gdncheck_error(monkeypatch):
    from gdncheck.conformance.properties.hypothesis_profiles import register_profiles

    monkeypatch.setenv("GDN_HYPOTHESIS_PROFILE", "weekly")
    with pytest.raises(E.GDNError, match="GDN_HYPOTHESIS_PROFILE: expected one of dev, ci, nightly, found 'weekly'"):
        register_profiles()


# --- fixture suites and manifests ------------------------------------------------------------------


def test_fixtures_check_of_an_unknown_suite_names_the_known_ones(tmp_path):
    folder = suite_copy(tmp_path, edit=lambda d: d.update(suite="bogus"))
    line = one_line(gdncheck("fixtures", "check", "--fixtures", str(folder)))
    assert "manifest.json" in line and "'bogus'" in line and "default, full, serving" in line


def test_fixtures_build_of_an_unknown_suite_is_one_line(tmp_path):
    line = one_line(gdncheck("fixtures", "build", "--suite", "bogus", "--out", str(tmp_path / "out")))
    assert "'bogus'" in line and "default" in line
    assert not (tmp_path / "out").exists()


def test_the_suite_lookup_is_a_fixture_error(tmp_path):
    from gdncheck.fixtures.build import build_suite, check_suite
    from gdncheck.fixtures.cases import suite

    with pytest.raises(FixtureError,
                       match="expected a suite name, one of default, full, serving, sharded .* found 'bogus'"):
        suite("bogus")
    with pytest.raises(FixtureError, match="found 'bogus'"):
        build_suite("bogus", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(FixtureError, match=r"manifest\.json: expected a suite name"):
        check_suite(suite_copy(tmp_path, edit=lambda d: d.update(suite="bogus")))


def test_a_manifest_naming_a_key_twice_is_refused(tmp_path):
    folder = suite_copy(tmp_path, text_edit=lambda t: t.replace('"suite": "default",',
                                                                '"suite": "default",\n "suite": "serving",', 1))
    assert (folder / "manifest.json").read_text().count('"suite":') == 2
    line = one_line(gdncheck("fixtures", "list", "--fixtures", str(folder)))
    assert "manifest.json" in line and "'suite' twice" in line


def test_a_duplicate_key_inside_a_case_entry_is_refused_too(tmp_path):
    from gdncheck.fixtures.manifest import load_manifest

    case = MANIFEST["cases"][0]["id"]
    folder = suite_copy(tmp_path, text_edit=lambda t: t.replace(f'"id": "{case}",', f'"id": "{case}",\n"id": "x",', 1))
    with pytest.raises(FixtureError, match="'id' twice"):
        load_manifest(folder)


def test_fixtures_check_compares_the_bytes_field(tmp_path):
    case = min(MANIFEST["cases"], key=lambda c: c["bytes"])
    folder = suite_copy(tmp_path, edit=lambda d: d["cases"][0].update(bytes=d["cases"][0]["bytes"] + 7),
                        files=(case["id"],))
    result = gdncheck("fixtures", "check", "--fixtures", str(folder))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("changed"))
    assert case["file"] in line and f"has {case['bytes']} bytes" in line
    assert f"records bytes {case['bytes'] + 7}" in line


# --- files gdncheck writes ---------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fchmod"), reason="POSIX file modes")
@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_get_the_mode_of_the_umask(tmp_path, umask, mode):
    from gdncheck.safetensors_io import write_bytes_atomic

    old = os.umask(umask)
    try:
        path = write_bytes_atomic(tmp_path / "f.json", b"{}\n")
        write_bytes_atomic(tmp_path / "f.json", b"{}\n")  # and over an existing file
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == mode


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a write there: No space left on device)")
@pytest.mark.parametrize("how", ["pathlib", "open"])
def test_no_space_left_names_the_file(monkeypatch, capsys, how):
    import gdncheck.commands.demo as demo
    from gdncheck.cli import main

    def fill(args):
        if how == "pathlib":
            Path("/dev/full").write_text("x" * 100_000)
        else:
            with open("/dev/full", "w") as fh:
                fh.write("x" * 100_000)

    monkeypatch.setattr(demo, "run", fill)
    assert main(["demo"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == ["gdncheck demo: error: cannot use /dev/full: No space left on device"]


# --- layer options and state sizes -------------------------------------------------------------------


def test_reference_refuses_an_unknown_delta_rule_everywhere():
    from gdncheck.reference import Layer
    from gdncheck.reference.layer import layer_forward
    from gdncheck.synthetic import make_inputs

    w = make_weights(DEMO_CONFIG)
    with pytest.raises(E.LayerOptionError, match="expected delta_rule one of auto, recurrent, chunked, found 'foo'"):
        Layer(DEMO_CONFIG, w, delta_rule="foo")
    layer = Layer(DEMO_CONFIG, w)
    state = layer.new_state(1)
    x = make_inputs(DEMO_CONFIG, 1, 3)
    with pytest.raises(E.LayerOptionError, match="found 'foo'") as err:
        layer.forward(x, state, 0, delta_rule="foo")  # accepted (and run chunked) before
    assert err.value.code == "layer_option" and isinstance(err.value, ValueError)
    assert state.seq_len.tolist() == [0]  # refused before anything changed
    with pytest.raises(E.LayerOptionError, match="found 'foo'"):
        layer_forward(DEMO_CONFIG, layer.params, x, state.conv_state, state.recurrent_state, delta_rule="foo")


@pytest.mark.parametrize("chunk_size", [-4, 0, 2.5, True, "64"])
def test_reference_refuses_a_chunk_size_that_is_no_positive_integer(chunk_size):
    from gdncheck.reference import Layer
    from gdncheck.synthetic import make_inputs

    with pytest.raises(E.LayerOptionError, match="expected chunk_size a positive integer"):
        Layer(DEMO_CONFIG, make_weights(DEMO_CONFIG), chunk_size=chunk_size)
    layer = Layer(DEMO_CONFIG, make_weights(DEMO_CONFIG))
    with pytest.raises(E.LayerOptionError, match="expected chunk_size a positive integer"):
        layer.forward(make_inputs(DEMO_CONFIG, 1, 3), layer.new_state(1), 0, chunk_size=chunk_size)


@pytest.mark.parametrize("batch", [0, -1, True, 1.0, "2"])
def test_new_state_refuses_a_batch_that_is_no_positive_integer(batch):
    from gdncheck.reference import Layer

    layer = Layer(DEMO_CONFIG, make_weights(DEMO_CONFIG))
    with pytest.raises(E.BatchSizeError, match="expected batch a positive integer") as err:
        layer.new_state(batch)
    assert err.value.code == "batch_size" and isinstance(err.value, E.InputError)


def test_new_state_is_bounded_before_anything_is_allocated():
    from gdncheck.reference import Layer
    from gdncheck.reference.state import MAX_BATCH_STATE_ELEMENTS

    layer = Layer(DEMO_CONFIG, make_weights(DEMO_CONFIG))
    with pytest.raises(E.BatchSizeError, match=f"at most {MAX_BATCH_STATE_ELEMENTS} elements .* found batch "
                                               f"1000000000000"):
        layer.new_state(10**12)  # a MemoryError (2.7 PiB) before
    assert layer.new_state(np.int64(3)).batch == 3


def test_triton_layer_options_and_state_are_gdncheck_errors():
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from gdncheck.gpu_impl import Layer
    from gdncheck.gpu_impl.state import State

    with pytest.raises(E.LayerOptionError, match="expected delta_rule one of auto, recurrent, chunked, found 'foo'"):
        Layer.shaped(DEMO_CONFIG, delta_rule="foo")
    with pytest.raises(E.LayerOptionError, match="expected chunk_size one of 16, 32, 64, found -4"):
        Layer.shaped(DEMO_CONFIG, chunk_size=-4)
    with pytest.raises(E.LayerOptionError, match="expected profile one of f32, bf16, f16, found 'f8'"):
        Layer.shaped(DEMO_CONFIG, profile="f8")
    for batch in (0, True):
        with pytest.raises(E.BatchSizeError, match="expected batch a positive integer"):
            State(DEMO_CONFIG, batch, dtype=torch.float32, device=torch.device("cpu"))
    with pytest.raises(E.BatchSizeError, match="found batch 1000000000000"):
        State(DEMO_CONFIG, 10**12, dtype=torch.float32, device=torch.device("cpu"))


# --- weights -----------------------------------------------------------------------------------------


FUSED = ("linear_attn.in_proj_qkvz.weight", "linear_attn.in_proj_ba.weight")


@pytest.mark.parametrize("fused", FUSED)
def test_fused_and_canonical_projections_together_are_refused(fused):
    from gdncheck.weights import validate_weights

    w = dict(make_weights(DEMO_CONFIG))
    w[fused] = np.zeros((4, DEMO_CONFIG.hidden_size), np.float32)
    with pytest.raises(E.ProjectionLayoutError, match=f"found both {fused} and linear_attn.in_proj_") as err:
        validate_weights(DEMO_CONFIG, w, layer=0)
    assert err.value.code == "projection_layout" and isinstance(err.value, E.WeightError)


def _checkpoint_with_both_layouts(tmp_path: Path) -> Path:
    from gdncheck.safetensors_io import SafetensorsFile, write_safetensors
    from gdncheck.synthetic import write_hf_checkpoint
    from tests.helpers import tiny_config

    cfg = tiny_config(Hk=2, Hv=6, dk=4, dv=2)
    layers = {0: make_weights(cfg, seed=3)}
    canon, fused = tmp_path / "canonical", tmp_path / "fused"
    write_hf_checkpoint(canon, cfg, layers, prefix="model.layers.{i}.")
    write_hf_checkpoint(fused, cfg, layers, prefix="model.layers.{i}.", layout="qwen3_next")
    arrays, dtypes = {}, {}
    for folder, keep in ((canon, lambda n: True), (fused, lambda n: n.endswith(FUSED))):
        st = SafetensorsFile(folder / "model.safetensors")
        for name in st:
            if keep(name):
                arrays[name], dtypes[name] = st.read(name), st.dtype_of(name)
        del st
    assert sum(n.endswith(FUSED) for n in arrays) == 2
    write_safetensors(canon / "model.safetensors", arrays, dtypes=dtypes)
    return canon


def test_a_checkpoint_with_both_projection_layouts_is_refused(tmp_path):
    from gdncheck.checkpoint import load_layer

    with pytest.raises(E.ProjectionLayoutError, match="found both linear_attn.in_proj_qkvz.weight and"):
        load_layer(_checkpoint_with_both_layouts(tmp_path), 0)


# --- the error classes -------------------------------------------------------------------------------


def test_the_new_errors_have_codes_and_stay_value_errors():
    for cls, code in ((E.LayerOptionError, "layer_option"), (E.BatchSizeError, "batch_size"),
                      (E.EnvironmentVariableError, "environment_variable"),
                      (E.ProjectionLayoutError, "projection_layout")):
        assert issubclass(cls, E.GDNError) and cls.code == code and E.error_class_for_code(code) is cls
    for cls in (E.LayerOptionError, E.BatchSizeError, E.EnvironmentVariableError):
        assert issubclass(cls, ValueError)  # what these were before: callers catching ValueError still do
