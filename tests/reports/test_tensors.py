"""The pieces behind the plots: the report reloads the tensors and finds the engine's error again,
pooling keeps the largest error where it was, colours follow the bound."""

from __future__ import annotations

import numpy as np
import pytest

from gdncheck.reports import plots, tensors
from gdncheck.safetensors_io import SafetensorsFile

from .conftest import TILED_FAILING, tensor_counts


def failing_records(run):
    for case in run.doc["cases"]:
        for rec in case["records"]:
            if rec["verdict"] == "fail" and rec["metrics"]:
                yield case, rec


def test_reloaded_error_is_the_engines(tiled):
    """For every failing tensor: the largest error recomputed from the files, its index, and the two
    values there (read here straight from the files) are the summary's."""
    n = 0
    for case, rec in failing_records(tiled):
        files = tensors.CaseFiles(None, None, {"expected": tiled.doc["fixtures"]["dir"],
                                               "actual": tiled.doc["outputs"]["dir"]})
        loaded = tensors.load(files, rec, case["records"], tiled.doc["profile"])
        assert loaded.notes == [] and loaded.err is not None
        m = rec["metrics"]
        assert float(np.nanmax(loaded.err)) == pytest.approx(m["max_err"], rel=1e-12)
        idx = tuple(int(i) for i in np.unravel_index(int(np.nanargmax(loaded.err)), loaded.err.shape))
        assert list(idx) == m["max_err_index"]
        assert tensors.check_against_record(loaded.err, m) is None
        top = tensors.worst(loaded, rec["tensor"], rec["bound"]["elem"], 5, rec["seq_pos"])
        assert top[0]["index"] == m["max_err_index"]
        assert [w["err"] for w in top] == sorted((w["err"] for w in top), reverse=True)
        actual = SafetensorsFile(rec["actual_ref"]["file"]).read(rec["actual_ref"]["key"])
        expected = SafetensorsFile(rec["expected_ref"]["file"]).read(rec["expected_ref"]["key"])
        assert top[0]["actual"] == float(actual[idx]) and top[0]["expected"] == float(expected[idx])
        assert top[0]["ratio"] == pytest.approx(m["max_err"] / rec["bound"]["elem"])
        n += 1
    assert n == tensor_counts(TILED_FAILING, "delta_rule")[0]


def test_a_changed_file_is_noticed():
    err = np.array([[[0.1, 0.5]]])
    assert tensors.check_against_record(err, {"max_err": 0.5, "nan": 0}) is None
    note = tensors.check_against_record(err, {"max_err": 0.25, "nan": 0})
    assert "changed after verify" in note and "0.5" in note and "0.25" in note


def test_heatmap_pooling_keeps_the_largest_error_in_its_cell():
    rng = np.random.default_rng(1)
    err = rng.random((2, 300, 6, 40)) * 1e-3  # [B, T, Hv, dv]: 6 heads of 40 channels, pooled to 160 columns
    err[1, 211, 4, 17] = 9.0
    err[1, 5, 0, 0] = np.nan
    h = tensors.heat(err, "core", 1, None)
    assert h.values.shape == (tensors.HEAT_ROWS, 6 * (tensors.HEAT_COLS // 6))
    assert (h.rows, h.cols) == (300, 240)
    assert [label for _, _, label in h.blocks] == [f"head {i}" for i in range(6)]
    width = tensors.HEAT_COLS // 6
    r, c = np.unravel_index(np.nanargmax(np.where(np.isnan(h.values), -1, h.values)), h.values.shape)
    assert h.values[r, c] == 9.0
    assert r == 211 * tensors.HEAT_ROWS // 300 and c // width == 4  # the token's bin, head 4's block
    assert np.isnan(h.values[5 * tensors.HEAT_ROWS // 300, 0])  # NaN survives pooling (shown black)
    # within a head block, pooling is a max over consecutive channels
    assert np.nanmax(h.values[:, width * 2: width * 3]) == pytest.approx(np.max(err[1, :, 2, :]))


def test_state_and_conv_maps_have_their_own_axes():
    rs = np.zeros((1, 3, 16, 8))
    rs[0, 2, 5, 7] = 1.0
    h = tensors.heat(rs, "recurrent_state", 0, None)
    assert h.values.shape == (16, 24) and h.values[5, 2 * 8 + 7] == 1.0 and h.row_label.startswith("k")
    cs = np.zeros((1, 40, 4))  # conv_dim 40 = Q 8 | K 8 | V 24, K = 4 slots
    cs[0, 20, 3] = 2.0
    h = tensors.heat(cs, "conv_state", 0, (8, 8, 24))
    assert h.values.shape == (4, 40) and h.values[3, 20] == 2.0
    assert [(a, b, n) for a, b, n in h.blocks] == [(0, 8, "Q"), (8, 16, "K"), (16, 40, "V")]


def test_token_curve_is_the_largest_error_per_token():
    err = np.zeros((2, 1000, 3))
    err[1, 777, 2] = 5.0
    err[0, 10, 0] = np.nan
    tok, val = tensors.token_curve(err)
    assert len(tok) == tensors.DRIFT_POINTS and tok[0] == 0
    b = np.searchsorted(tok, 777, side="right") - 1
    assert val[b] == 5.0 and np.isinf(val[np.searchsorted(tok, 10, side="right") - 1])
    small = np.arange(6.0).reshape(1, 3, 2)
    assert tensors.token_curve(small)[1].tolist() == [1.0, 3.0, 5.0]


def test_heatmap_colours_follow_the_bound():
    bound = 0.2
    values = np.array([[0.0, bound * 1e-4, bound * 0.5, bound * 2, bound * 5e3, np.nan, np.inf]])
    idx = plots.color_index(values, bound)[0]
    n = plots.N_BINS
    assert idx[0] == n and idx[1] == n  # zero and far under: the "under" colour (white)
    assert idx[2] == 5  # half the bound: the last blue, just under the bound
    assert idx[3] == 6  # twice the bound: the first red
    assert idx[4] == n + 1 and idx[6] == n + 1  # far over, inf: the "over" colour
    assert idx[5] == n + 2  # NaN: black
    png = plots.heatmap(values, bound)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    from io import BytesIO

    from PIL import Image

    img = Image.open(BytesIO(png))
    assert img.size == (7, 1)
    assert img.convert("RGB").getpixel((5, 0)) == (0, 0, 0)


def test_axis_names_follow_the_vocabulary():
    assert tensors.axis_names("core", 4) == ["b", "t", "Hv", "dv"]
    assert tensors.axis_names("recurrent_state", 4) == ["b", "head", "k", "v"]
    assert tensors.axis_names("<odd>", 2) == ["axis0", "axis1"]
