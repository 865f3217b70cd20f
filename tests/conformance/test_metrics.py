"""The comparison metrics against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gdncheck.conformance.judge.metrics import (
    CaseStats,
    downsample_max,
    group_axes,
    scaled_error,
    tensor_metrics,
    token_errors,
    ulp_spacing,
)


def test_ulp_spacing_at_one_and_in_subnormals():
    one = np.array([1.0, 1.5, 2.0])
    assert ulp_spacing(one, "f32").tolist() == [2.0**-23, 2.0**-23, 2.0**-22]
    assert ulp_spacing(one, "bf16").tolist() == [2.0**-7, 2.0**-7, 2.0**-6]
    assert ulp_spacing(one, "f16").tolist() == [2.0**-10, 2.0**-10, 2.0**-9]
    # below the smallest normal the spacing stays at the smallest subnormal
    assert ulp_spacing(np.array([0.0, 2.0**-20]), "f16").tolist() == [2.0**-24, 2.0**-24]


def test_metrics_by_hand():
    e = np.array([[[3.0, 4.0]]])  # [B=1, T=1, 2]
    a = np.array([[[3.0, 4.5]]])
    m = tensor_metrics(a, e, "out", "f32")
    assert m.numel == 2 and m.nan == 0 and m.inf_mismatch == 0
    assert m.nmse == pytest.approx(0.25 / 25.0)
    assert m.sqnr_db == pytest.approx(-10 * math.log10(0.01))
    assert m.max_abs == 0.5 and m.max_abs_index == [0, 0, 1]
    assert m.max_rel == pytest.approx(0.125) and m.max_rel_index == [0, 0, 1]
    assert m.cosine == pytest.approx((9 + 18) / (5 * math.sqrt(9 + 20.25)))
    s = math.sqrt((9 + 16) / 2)  # the token's RMS
    assert m.max_err == pytest.approx(0.5 / (4 + s))
    assert m.max_ulp == pytest.approx(0.5 / 2.0**-21)  # 4.0 has float32 spacing 2^-21


def test_groups():
    assert group_axes("out", 3) == (2,)  # per token
    assert group_axes("core", 4) == (1, 2, 3)  # per sequence, whole call (and case)
    assert group_axes("g", 3) == (1,)  # per head over tokens
    assert group_axes("recurrent_state", 4) == (2, 3)  # per head
    assert group_axes("conv_state", 3) == (1, 2)  # per sequence


def test_case_stats_span_every_call():
    calls = [np.full((1, 2, 3), 1.0), np.full((1, 1, 3), 4.0)]  # core-like [B, T, ...] flattened heads
    st = CaseStats("core", [c[..., None] for c in calls])
    assert st.scale.ravel().tolist() == pytest.approx([math.sqrt((6 * 1 + 3 * 16) / 9)])
    assert st.mean_square == pytest.approx((6 + 48) / 9)
    # NMSE of a call is normalised by the case's mean square, not the call's own
    e = calls[0][..., None]
    m = tensor_metrics(e + 0.1, e, "core", "f32", st)
    assert m.nmse == pytest.approx(0.01 / st.mean_square)


def test_nan_and_infinities():
    e = np.array([[[1.0, 2.0, np.inf]]])
    a = np.array([[[np.nan, 2.0, np.inf]]])
    err = scaled_error(a, e, "out", "f32")
    assert np.isnan(err[0, 0, 0]) and err[0, 0, 2] == 0.0  # the same infinity on both sides matches
    m = tensor_metrics(a, e, "out", "f32")
    assert m.nan == 1 and m.inf_mismatch == 0 and m.first_nonfinite == [0, 0, 0]
    m = tensor_metrics(np.array([[[1.0, -np.inf, np.inf]]]), e, "out", "f32")
    assert m.inf_mismatch == 1 and m.first_nonfinite == [0, 0, 1]


def test_token_profile_and_downsampling():
    err = np.zeros((2, 130, 4))
    err[1, 100, 3] = 0.5
    prof = token_errors(err)
    assert prof.shape == (130,) and prof[100] == 0.5 and prof.sum() == 0.5
    starts, values = downsample_max(prof, 64)
    assert len(starts) <= 64 and starts[0] == 0
    assert max(values) == 0.5 and values[starts.index(max(s for s in starts if s <= 100))] == 0.5
