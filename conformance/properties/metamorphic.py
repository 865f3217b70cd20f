"""Metamorphic properties: a transformed program or layer whose answer the reference of the
untransformed one predicts. The oracle is always the float64 reference (or an exact identity on
the implementation's own tensors), never the implementation run twice.

- split invariance: any split of the tokens into consecutive calls gives the reference's one prefill;
- chunk-size invariance: every chunk size gives the reference;
- decode = prefill: T one-token calls give the reference's prefill of T tokens;
- batch independence: a row's result is the reference's for that row alone, whatever the other
  rows hold (huge inputs, other positions, a seq-len reset);
- value-head permutation within a key group permutes the per-head tensors and leaves ``out`` alone;
- beta = 0 (writes switched off) leaves the state to decay only: ``S' = exp(Σg) · S``;
- a very negative g forgets the past: ``core_t = scale · beta_t · (q_t · k_t) · v_t``.
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from gdncheck.conformance.judge.metrics import CaseStats
from gdncheck.conformance.judge.verdicts import base_record, judge
from gdncheck.dtypes import round_to_common
from gdncheck.weights import LayerWeights

from .check import assert_close, concat_calls, property_bound
from .differential import consecutive_calls
from .registry import PropertySkip, Subject, prop, run_calls
from .strategies import build_inputs, build_weights, configs, group_permutations, input_draws, splits, weight_draws


def _setup(data, *, max_heads: int = 6, regimes=None):
    cfg = data.draw(configs(max_heads=max_heads), label="config")
    wd = data.draw(weight_draws() if regimes is None else weight_draws(regimes), label="weights")
    xd = data.draw(input_draws(), label="inputs")
    return cfg, wd, build_weights(cfg, wd), xd


@prop("metamorphic")
def split_invariance(subject: Subject, data) -> None:
    """Any split of T tokens into consecutive calls gives the reference's single prefill of T."""
    cfg, wd, weights, xd = _setup(data)
    T = data.draw(st.integers(2, 40), label="tokens")
    lengths = data.draw(splits(T), label="split")
    x = build_inputs(cfg, 1, T, xd)
    _, got = run_calls(subject.make(cfg, weights), consecutive_calls(x, lengths))
    _, want = run_calls(Subject.reference(cfg, weights), [(x, 0)])
    assert_close([concat_calls(got)], want, subject.profile, f"split invariance: {T} tokens as calls of {lengths}, "
                                                             f"{cfg.summary()}, {wd!r}, {xd!r}")


@prop("metamorphic")
def chunk_size_invariance(subject: Subject, data) -> None:
    """A chunked prefill (and a continuation) gives the reference for chunk sizes 16, 32 and 64."""
    cfg, wd, weights, xd = _setup(data)
    chunk = data.draw(st.sampled_from((16, 32, 64)), label="chunk_size")
    lengths = [data.draw(st.integers(17, 48), label="prefill tokens"), data.draw(st.integers(1, 20),
                                                                                 label="continuation tokens")]
    try:
        impl = subject.make(cfg, weights, chunk_size=chunk)
    except (TypeError, ValueError) as exc:
        raise PropertySkip(f"the implementation takes no chunk_size option ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - a GDNError about unknown options means the same
        if "option" in str(exc):
            raise PropertySkip(f"the implementation takes no chunk_size option ({exc})") from None
        raise
    calls = consecutive_calls(build_inputs(cfg, 1, sum(lengths), xd), lengths)
    _, got = run_calls(impl, calls)
    _, want = run_calls(Subject.reference(cfg, weights), calls)
    assert_close(got, want, subject.profile, f"chunk size {chunk}: calls of {lengths} tokens, {cfg.summary()}, "
                                             f"{wd!r}, {xd!r}")


@prop("metamorphic")
def decode_equals_prefill(subject: Subject, data) -> None:
    """T one-token calls give the reference's prefill of the same T tokens."""
    cfg, wd, weights, xd = _setup(data)
    T = data.draw(st.integers(2, 10), label="tokens")
    x = build_inputs(cfg, 1, T, xd)
    _, got = run_calls(subject.make(cfg, weights), consecutive_calls(x, [1] * T))
    _, want = run_calls(Subject.reference(cfg, weights), [(x, 0)])
    assert_close([concat_calls(got)], want, subject.profile, f"decode = prefill: {T} one-token calls, "
                                                             f"{cfg.summary()}, {wd!r}, {xd!r}")


def _row(calls: list[dict], r: int) -> list[dict]:
    return [{k: v[r:r + 1] for k, v in c.items() if k != "seq_len"} for c in calls]


@prop("metamorphic")
def batch_independence(subject: Subject, data) -> None:
    """Row r of a batch gives the reference of row r alone, whatever the other rows hold: other
    input regimes, and a second call at position 0 for them (a reset) but not for row r."""
    cfg, wd, weights, xd = _setup(data)
    r = data.draw(st.integers(0, 2), label="row under test")
    others = data.draw(input_draws(), label="other rows' inputs")
    T1, T2 = data.draw(st.integers(1, 20), label="first call tokens"), data.draw(st.integers(1, 20),
                                                                                  label="second call tokens")
    x = build_inputs(cfg, 3, T1 + T2, others) * 4.0  # other rows: another regime, 4x larger
    x = round_to_common(x).astype(np.float32)
    x[r] = build_inputs(cfg, 1, T1 + T2, xd)[0]
    pos2 = np.zeros(3, dtype=np.int64)
    pos2[r] = T1
    _, got = run_calls(subject.make(cfg, weights), [(x[:, :T1], 0), (x[:, T1:], pos2)])
    _, want = run_calls(Subject.reference(cfg, weights), [(x[r:r + 1, :T1], 0), (x[r:r + 1, T1:], T1)])
    assert_close(_row(got, r), want, subject.profile, f"batch independence: row {r} of 3, other rows reset before "
                                                      f"the second call, {cfg.summary()}, {wd!r}, {xd!r}")


HEAD_TENSORS = {"v": 2, "z": 2, "g": 2, "beta": 2, "core": 2, "core_gated": 2, "recurrent_state": 1}
UNCHANGED = ("x_norm", "q", "k", "attn_out", "h", "h_norm", "mlp_out", "out")


def permute_value_heads(cfg, weights, perm: np.ndarray) -> LayerWeights:
    """The layer whose value head p is the original head perm[p] (rows, channels and columns moved)."""
    dv, kd = cfg.head_v_dim, cfg.key_dim
    vrows = np.concatenate([np.arange(j * dv, (j + 1) * dv) for j in perm])
    w = {k: np.array(v) for k, v in weights.items()}
    qkv_rows = np.concatenate([np.arange(2 * kd), 2 * kd + vrows])
    w["linear_attn.in_proj_qkv.weight"] = w["linear_attn.in_proj_qkv.weight"][qkv_rows]
    w["linear_attn.conv1d.weight"] = w["linear_attn.conv1d.weight"][qkv_rows]
    w["linear_attn.in_proj_z.weight"] = w["linear_attn.in_proj_z.weight"][vrows]
    for name in ("linear_attn.in_proj_a.weight", "linear_attn.in_proj_b.weight", "linear_attn.A_log",
                 "linear_attn.dt_bias"):
        w[name] = w[name][perm]
    if w["linear_attn.norm.weight"].size == cfg.value_dim and cfg.num_v_heads > 1:
        w["linear_attn.norm.weight"] = w["linear_attn.norm.weight"][vrows]
    w["linear_attn.out_proj.weight"] = w["linear_attn.out_proj.weight"][:, vrows]
    return LayerWeights(w, config=cfg)


@prop("metamorphic")
def value_head_permutation(subject: Subject, data) -> None:
    """Permuting value heads within their key group permutes every per-head tensor the same way
    and leaves the residual stream unchanged (value head j reads key head j // r)."""
    cfg, wd, weights, xd = _setup(data)
    assume(cfg.head_ratio > 1)
    perm = data.draw(group_permutations(cfg.num_k_heads, cfg.head_ratio), label="value-head permutation")
    T = data.draw(st.integers(1, 24), label="tokens")
    x = build_inputs(cfg, 1, T, xd)
    _, got = run_calls(subject.make(cfg, permute_value_heads(cfg, weights, perm)), [(x, 0)])
    _, ref = run_calls(Subject.reference(cfg, weights), [(x, 0)])
    want = {k: v for k, v in ref[0].items() if k in UNCHANGED}
    want.update({k: np.take(ref[0][k], perm, axis=axis) for k, axis in HEAD_TENSORS.items() if k in ref[0]})
    assert_close(got, [want], subject.profile, f"value heads permuted by {perm.tolist()} within key groups, "
                                               f"{cfg.summary()}, {wd!r}, {xd!r}", tensors=set(want))


def _judge_identity(name: str, actual: np.ndarray, predicted: np.ndarray, profile: str, what: str,
                    stats_from: list[np.ndarray] | None = None) -> None:
    bound = property_bound(name, profile, np.size(predicted))
    rec = base_record("property", 0, "forward", 1, name, actual_ref={"file": "-", "key": name})
    stats = CaseStats(name, stats_from) if stats_from is not None else None
    judge(rec, actual, "F64", predicted, bound, required=True, subject=name, where=f"[{what}]", stats=stats)
    if rec.verdict == "fail":
        raise AssertionError(rec.message)


@prop("metamorphic")
def beta_zero_decays_only(subject: Subject, data) -> None:
    """With writes switched off (b below -30, so beta < 1e-13) a call only decays the state:
    S_after = exp(Σ_t g_t) · S_before per head, with g the call's gates (A = e^-2: about -0.2 a
    token, so the decayed state stays far above what beta lets through)."""
    cfg, wd, weights, xd = _setup(data, regimes=("checkpoint",))
    w = {k: np.array(v, dtype=np.float64) for k, v in weights.items()}
    w["linear_attn.in_proj_b.weight"][:, 0] = -8.0  # a large feature 0 drives every b far below 0
    w["linear_attn.A_log"][:] = -2.0
    weights = LayerWeights({k: round_to_common(v).astype(np.float32) for k, v in w.items()}, config=cfg)
    T1, T2 = data.draw(st.integers(1, 16), label="writing call tokens"), data.draw(st.integers(1, 16),
                                                                                    label="decaying call tokens")
    x = build_inputs(cfg, 1, T1 + T2, xd)
    x[:, :T1, 0] = 0.0
    x[:, T1:, 0] = 64.0
    calls = [(x[:, :T1], 0), (x[:, T1:], T1)]
    _, got = run_calls(subject.make(cfg, weights), calls)
    _, ref = run_calls(Subject.reference(cfg, weights), calls)
    assume(float(ref[1]["beta"].max()) < 1e-9)
    g = got[1].get("g", ref[1]["g"])  # the implementation's own gates when it returns them
    decay = np.exp(g.sum(axis=1))  # [B, Hv]
    predicted = decay[:, :, None, None] * got[0]["recurrent_state"]
    _judge_identity("recurrent_state", got[1]["recurrent_state"], predicted, subject.profile,
                    f"beta = 0: calls of {T1} + {T2} tokens, {cfg.summary()}, {wd!r}, {xd!r}")


@prop("metamorphic")
def strong_decay_forgets(subject: Subject, data) -> None:
    """With g about -3e4 (exp(g) = 0) the past is forgotten: core_t = scale · beta_t · (q_t · k_t) · v_t,
    from the call's own q, k, v, beta (the implementation's when it returns them)."""
    cfg, wd, weights, xd = _setup(data, regimes=("checkpoint",))
    w = {k: np.array(v, dtype=np.float64) for k, v in weights.items()}
    w["linear_attn.A_log"][:] = 8.0
    w["linear_attn.dt_bias"][:] = 12.0
    weights = LayerWeights({k: round_to_common(v).astype(np.float32) for k, v in w.items()}, config=cfg)
    lengths = [data.draw(st.integers(1, 24), label="first call tokens"), data.draw(st.integers(1, 24),
                                                                                   label="second call tokens")]
    calls = consecutive_calls(build_inputs(cfg, 1, sum(lengths), xd), lengths)
    _, got = run_calls(subject.make(cfg, weights), calls)
    if "core" not in got[0]:
        raise PropertySkip("the implementation returns no core tensor (stage delta_rule) from forward")
    _, ref = run_calls(Subject.reference(cfg, weights), calls)
    assume(float(ref[0]["g"].max()) < -200.0)
    r = cfg.head_ratio
    cores, preds = [], []
    for c, rc in zip(got, ref):
        q, k, v, beta = (c.get(n, rc[n]) for n in ("q", "k", "v", "beta"))
        qk = np.repeat(np.sum(q * k, axis=-1), r, axis=2)  # [B, T, Hv]: value head j reads key head j // r
        preds.append(cfg.scale * (beta * qk)[..., None] * v)
        cores.append(c["core"])
    _judge_identity("core", np.concatenate(cores, axis=1), np.concatenate(preds, axis=1), subject.profile,
                    f"g = -3e4: calls of {lengths} tokens, {cfg.summary()}, {wd!r}, {xd!r}")
