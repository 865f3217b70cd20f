"""Precision lost in a per-element map of the gates (conformance/judge/symptoms.py: ``error:absolute``,
``values:zero``; issue 42 item 2): against gates built by hand, softplus as log(1 + e^x) in float32 beside
a correct float32 softplus, a float16 one and a scale, each fact stated where it holds and not where it
does not."""

import math

import numpy as np

from gdncheck.conformance.judge import symptoms as S
from gdncheck.conformance.judge.symptoms import measure

CFG = {"linear_num_key_heads": 1, "linear_num_value_heads": 4, "linear_key_head_dim": 4, "linear_value_head_dim": 4,
       "linear_conv_kernel_dim": 4, "hidden_size": 8, "rms_norm_eps": 1e-6}
A = np.array([0.5, 3.0, 20.0, 1.0])  # exp(A_log) per value head


def gates(x: np.ndarray, softplus) -> np.ndarray:
    return -A * softplus(x)


def exact(x):
    return np.logaddexp(0.0, x)  # float64, no cancellation


def naive32(x):
    x = x.astype(np.float32)
    with np.errstate(over="ignore"):
        return np.log(np.float32(1.0) + np.exp(x)).astype(np.float64)


def stable32(x):
    x = x.astype(np.float32)
    return np.log1p(np.exp(x)).astype(np.float64)


def bf16(x):
    """Round to nearest even bf16 (through the bit pattern, independent of the code under test)."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


def codes(a, e, profile="f32", elem=1e-6):
    d = 1.0 + np.abs(e)  # the judge's unit for a log decay
    return {f.code for f in measure(a, e, "g", scale=d, elem=elem, profile=profile, config=CFG)}


def inputs(seed=0, shape=(1, 40, 4), low=-9.0, high=2.0):
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32).astype(np.float64)


def test_naive_softplus_is_an_absolute_error_and_a_correct_one_is_not():
    x = inputs()
    e = gates(x, exact)
    assert "error:absolute" in codes(gates(x, naive32), e)
    # the same softplus computed stably in float32: relative rounding only
    assert "error:absolute" not in codes(gates(x, stable32), e, elem=1e-9)


def test_an_error_failing_on_its_mean_square_alone_is_still_measured():
    # no element past the bound (elem 1): only the absolute error can be said
    x = inputs(1)
    assert codes(gates(x, naive32), gates(x, exact), elem=1.0) == {"error:absolute"}
    assert codes(gates(x, stable32), gates(x, exact), elem=1.0) == set()


def test_a_relative_error_is_no_absolute_one():
    x = inputs(2)
    e = gates(x, exact)
    # g in float16: an error relative to the value, 2^-11, shrinking with it
    f16 = e.astype(np.float16).astype(np.float64)
    assert "error:absolute" not in codes(f16, e)
    # a scale: relative, and no precision loss
    assert "error:absolute" not in codes(e * 1.001, e)
    # an absolute error within the profile's rounding (a few float32 units of the smaller values) is none
    assert "error:absolute" not in codes(e - 2e-10, e, elem=1e-12)
    # a large relative error (another map) is no lost precision either
    assert "error:absolute" not in codes(gates(x, lambda t: 1.0 / (1.0 + np.exp(-t))), e)


def test_one_token_a_sequence_pools_the_heads():
    x = inputs(3, shape=(4, 1, 4))  # 4 elements a head: too few for a head's halves
    assert S.absolute_error_fact(gates(x, naive32), gates(x, exact), "g", "f32", 2) is not None
    assert S.absolute_error_fact(gates(x, stable32), gates(x, exact), "g", "f32", 2) is None


def test_a_value_lost_whole_is_zero_where_the_golden_is_small():
    x = inputs(4)
    x[0, ::5, 2] = -30.0  # 1 + e^-30 is 1 in float32: softplus 0 exactly, the golden −20·e^-30
    e = gates(x, exact)
    a = gates(x, naive32)
    assert np.all(a[0, ::5, 2] == 0) and np.all(e[0, ::5, 2] != 0)
    # the judge's bound relative to the value there (e^-30 ≈ 1e-13): only those elements fail
    assert "values:zero" in {f.code for f in measure(a, e, "g", scale=np.abs(e), elem=1e-3, profile="f32",
                                                      config=CFG)}
    # a failing element that is not zero in the port: no such fact
    a2 = a.copy()
    a2[0, 1, 0] *= 1.5
    assert "values:zero" not in {f.code for f in measure(a2, e, "g", scale=np.abs(e), elem=1e-3, profile="f32",
                                                          config=CFG)}
    # not on a tensor that is not a per-element map of the gates
    assert S.lost_zero_fact(a, e, np.abs(a - e) > 1e-3 * np.abs(e), "core") is None


# --- an error growing as a norm's input shrinks ----------------------------------------------------------


def normed(seed=5, eps=1e-6, outside=False, n=40, d=16):
    """core vectors whose mean squares span 1e-14 .. 1 (a few tiny ones), RMS-normed with eps inside the
    root (the golden) or outside it (x / (√ms + eps))."""
    r = np.random.default_rng(seed)
    x = r.normal(size=(1, n, 1, d)) * 10.0 ** r.uniform(-1.0, 0.0, size=(1, n, 1, 1))
    x[0, :6, 0] *= 10.0 ** -np.arange(2.0, 8.0)[:, None]  # six vectors from 1e-2 to 1e-7 of the rest
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return x, x / (np.sqrt(ms) + eps) if outside else x / np.sqrt(ms + eps)


def eps_codes(a, e, x, elem=1e-3):
    return {f.code for f in measure(a, e, "core_gated", scale=1.0 + np.abs(e), elem=elem, profile="f32",
                                    config=CFG, others={"this call's golden core": x})}


def test_eps_outside_the_root_grows_as_the_mean_square_falls():
    x, e = normed()
    _, a = normed(outside=True)
    f = S.eps_growth_fact(a, e, "core_gated", {}, {"this call's golden core": x}, 1e-6)
    assert f is not None and f.code == "eps:grows_small"
    # the factor on the smallest vector, by hand: √(ms + eps) / (√ms + eps)
    ms = float(np.mean(x[0, 5, 0] ** 2))
    assert f"is {math.sqrt(ms + 1e-6) / (math.sqrt(ms) + 1e-6):.3g} on the vector" in f.text, f.text
    # a tensor failing on its mean square error alone (no element past the bound): measured all the same
    assert eps_codes(a, e, x, elem=1e6) == {"eps:grows_small"}


def test_no_eps_growth_where_the_error_is_elsewhere():
    x, e = normed(6)
    r = np.random.default_rng(7)
    # a correct port's rounding (relative 1e-6 per element) and a random scale per vector: none
    assert "eps:grows_small" not in eps_codes(e * (1 + 1e-6 * r.normal(size=e.shape)), e, x, elem=1e-9)
    assert "eps:grows_small" not in eps_codes(e * r.uniform(0.5, 2.0, size=(1, e.shape[1], 1, 1)), e, x)
    # off on the smallest vectors but in both directions: no one eps
    a = e.copy()
    a[0, 4, 0] *= 3.0
    a[0, 5, 0] /= 3.0
    assert "eps:grows_small" not in eps_codes(a, e, x)
    # off on small vectors that are not the smallest ones
    a = e.copy()
    order = np.argsort(np.mean(x * x, axis=-1).ravel())
    a[0, order[6:9], 0] *= 3.0
    assert "eps:grows_small" not in eps_codes(a, e, x)
    # without the norm's input: nothing to order by
    assert S.eps_growth_fact(normed(outside=True)[1], e, "core_gated", {}, {}, 1e-6) is None


# --- an error only where the decay is extreme ---------------------------------------------------------


def test_an_error_from_a_full_forget_on_is_said_at_the_extreme_decay():
    B, T, H, dv = 1, 12, 4, 4
    g = np.full((B, T, H), -0.1)
    g[0, 5, 2] = -30.0  # e^g ≈ 1e-13 at token 5 of head 2: a full forget
    e = np.random.default_rng(8).normal(size=(B, T, H, dv))
    a = e.copy()
    a[0, 5:, 2] += 0.5  # wrong from that token on, on that head only
    bad = np.abs(a - e) > 1e-3
    f = S.decay_extreme_fact(bad, "core", {"g": g}, None)
    assert f is not None and f.code == "decay:extreme" and "heads 2 of 4" in f.text, f
    assert "decay:extreme" in {x.code for x in measure(a, e, "core", scale=1.0, elem=1e-3, profile="f32", config=CFG,
                                                        goldens={"g": g})}
    # wrong before the forget: not the decay's extreme
    a2 = e.copy()
    a2[0, 3:, 2] += 0.5
    assert S.decay_extreme_fact(np.abs(a2 - e) > 1e-3, "core", {"g": g}, None) is None
    # wrong on a head whose decay stays inside: no such fact
    a3 = a.copy()
    a3[0, 8:, 0] += 0.5
    assert S.decay_extreme_fact(np.abs(a3 - e) > 1e-3, "core", {"g": g}, None) is None
    # every head extreme: nothing told apart
    assert S.decay_extreme_fact(bad, "core", {"g": np.full((B, T, H), -30.0)}, None) is None
    # a state: the failing heads by (sequence, head), none of a token
    S_bad = np.zeros((B, H, 3, 3), bool)
    S_bad[0, 2] = True
    assert S.decay_extreme_fact(S_bad, "recurrent_state", {"g": g}, None).code == "decay:extreme"
    S_bad[0, 1, 0, 0] = True
    assert S.decay_extreme_fact(S_bad, "recurrent_state", {"g": g}, None) is None
    # a decay of 1 (g = 0) is the other extreme
    g1 = np.full((B, T, H), -0.1)
    g1[0, :, 2] = 0.0
    assert S.decay_extreme_fact(bad, "core", {"g": g1}, None) is not None
