"""fixtures/FORMAT.md read literally: its conv1d indexing (§5) against the reference, and the
manifest's vocabulary (§2) against the case files it describes."""

from __future__ import annotations

import json

import numpy as np

from gdncheck.fixtures.build import manifest_document
from gdncheck.fixtures.manifest import DEFAULT_DIR
from gdncheck.reference.conv1d import conv1d
from gdncheck.safetensors_io import SafetensorsFile


def format_conv1d(new: np.ndarray, state: np.ndarray, w: np.ndarray):
    """FORMAT.md §5 word for word: u[c, t] the new columns, u[c, -i] = conv_state[c, K - i]; output t
    = silu(sum_j w[c, 0, j] * u[c, t - (K-1) + j]); the new state conv_state[c, i] = u[c, T - K + i]."""
    C, T = new.shape
    K = w.shape[-1]

    def u(c, t):
        return new[c, t] if t >= 0 else state[c, K + t]

    out = np.empty((C, T))
    for c in range(C):
        for t in range(T):
            y = sum(w[c, 0, j] * u(c, t - (K - 1) + j) for j in range(K))
            out[c, t] = y / (1.0 + np.exp(-y))
    after = np.array([[u(c, T - K + i) for i in range(K)] for c in range(C)])
    return out, after


def test_conv1d_as_format_md_indexes_it():
    rng = np.random.default_rng(7)
    C, K = 5, 4
    w = rng.standard_normal((C, 1, K))
    for T in (1, 2, 3, 6):
        state = rng.standard_normal((C, K))
        new = rng.standard_normal((C, T))
        got, got_state = conv1d(np.ascontiguousarray(new.T[None]), state[None].copy(), w)
        want, want_state = format_conv1d(new, state, w)
        np.testing.assert_allclose(got[0].T, want, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(got_state[0], want_state, rtol=0, atol=0)
    # the worked example (K = 4, T = 2): output 1 reads u[-2], u[-1], u[0], u[1], and so does the new state
    state, new = np.arange(4.0).reshape(1, 4), np.array([[10.0, 20.0]])
    _, after = format_conv1d(new, state, np.ones((1, 1, 4)))
    assert after.tolist() == [[2.0, 3.0, 10.0, 20.0]]


def test_manifest_vocabulary_names_what_the_case_files_hold():
    vocab = manifest_document("default", [])["vocabulary"]
    manifest = json.loads((DEFAULT_DIR / "manifest.json").read_text())
    case = next(c for c in manifest["cases"] if c["state_in"] and c["batch"] > 1)
    f = SafetensorsFile(DEFAULT_DIR / case["file"])
    for stage in vocab["stages"][1:]:
        for name in stage["inputs"]:  # every stage-isolated input is a key of the file
            assert f"calls.0.{name}" in f, (stage["name"], name)
        for name, shape in stage["shapes"].items():
            assert shape[0] == "B" and len(shape) == len(f.read(f"calls.0.{name}").shape), name
    for name, shape in vocab["state_tensors"].items():
        if name != "seq_len":
            assert len(shape) == len(f.read(f"calls.0.{name}").shape) and shape[0] == "B"


def test_the_moe_vocabulary_names_what_a_sparse_case_file_holds():
    """``layer_kinds.moe``: the sparse block's stages with their stage-isolated inputs, every one a key of
    a sparse case file, in pipeline order between post_norm and mlp."""
    manifest = json.loads((DEFAULT_DIR / "manifest.json").read_text())
    moe = manifest["vocabulary"]["layer_kinds"]["moe"]
    names = [s["name"] for s in moe]
    assert names.index("post_norm") < names.index("router") < names.index("routing") < names.index("experts") \
        < names.index("mlp") and "shared_expert" in names
    assert next(s for s in moe if s["name"] == "mlp")["inputs"] == ["experts_out", "shared_out"]
    assert manifest["vocabulary"]["layer_kinds"]["dense"] == manifest["vocabulary"]["stages"]
    case = next(c for c in manifest["cases"] if c["kind"] == "forward" and c["config"].get("num_experts")
                and c["state_in"])
    f = SafetensorsFile(DEFAULT_DIR / case["file"])
    for stage in moe[1:]:
        for name in stage["inputs"]:
            assert f"calls.0.{name}" in f, (stage["name"], name)


def _error_table(text: str) -> dict[str, list[str]]:
    """FORMAT.md §6's table: code -> its family, as written (read here with plain string splitting)."""
    section = text.split("## 6. Expected errors", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            family = [] if cells[1] in ("—", "") else [f.strip(" `") for f in cells[1].split(",")]
            rows[cells[0].strip("`")] = family
    return rows


def test_the_error_table_holds_every_code_the_suite_expects_with_its_family():
    """Every expected error of the default suite is a row of FORMAT.md §6 whose family is the case's
    ``accept`` after the code; every row's code is a class of gdncheck/errors.py."""
    import inspect

    from gdncheck import errors

    table = _error_table((DEFAULT_DIR.parent / "FORMAT.md").read_text())
    manifest = json.loads((DEFAULT_DIR / "manifest.json").read_text())
    expected = {c["expected_error"]["code"]: c["expected_error"]["accept"] for c in manifest["cases"]
                if c["kind"] == "error"}
    assert len(expected) >= 15
    for code, accept in expected.items():
        assert code in table, f"FORMAT.md §6 has no row for {code!r}, which a committed case expects"
        assert table[code] == accept[1:], (code, table[code], accept)
    codes = {cls.code for _, cls in inspect.getmembers(errors, inspect.isclass)
             if issubclass(cls, errors.GDNError) and isinstance(getattr(cls, "code", None), str)}
    assert set(table) <= codes, set(table) - codes
