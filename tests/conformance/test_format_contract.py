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
