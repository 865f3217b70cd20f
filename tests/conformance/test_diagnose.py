"""The likely cause of a failure (conformance/judge/diagnose.py): each transform is recognised on a
tensor built by hand, noise matches nothing, NaN must sit where the candidate has NaN, and the
diagnosis never changes a verdict; through verify, the mutant catalogue names the bug."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gdncheck.conformance.judge.diagnose import MATCH, Diagnoser, diagnose_tensor, residual, tiled_order

CONFIG = {"hidden_size": 32, "intermediate_size": 48, "linear_num_key_heads": 2, "linear_num_value_heads": 6,
          "linear_key_head_dim": 4, "linear_value_head_dim": 4, "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6}


@pytest.fixture()
def core():
    return np.random.default_rng(0).normal(size=(1, 9, 6, 4))  # [B, T, Hv, dv]


def noisy(x, rel=1e-6, seed=1):
    return x + rel * np.random.default_rng(seed).normal(size=x.shape) * np.sqrt(np.mean(x * x))


def test_tiled_order_by_hand():
    # Hk = 2, r = 3: interleaved heads 0 1 2 | 3 4 5 belong to key heads 0 | 1; tiled puts them 0 3 1 4 2 5
    assert tiled_order(2, 6).tolist() == [0, 3, 1, 4, 2, 5]


@pytest.mark.parametrize("name,make", [
    ("uniform_scale", lambda e: 0.25 * e),
    ("sign_flip", lambda e: -e),
    ("per_head_scale", lambda e: e * np.array([1.0, 2.0, 0.5, 1.0, 3.0, 1.0])[None, None, :, None]),
    ("heads_tiled", lambda e: e[:, :, [0, 3, 1, 4, 2, 5]]),
    ("token_late", lambda e: np.concatenate([e[:, :1] * 0.3, e[:, :-1]], axis=1)),
])
def test_each_transform_is_recognised(core, name, make):
    d = diagnose_tensor(noisy(make(core)), core, "core", call=2, config=CONFIG)
    assert d.verdict == "matches" and d.candidate == name and d.source == "transform", d
    assert d.residual < 1e-3 and d.call == 2 and d.text().startswith("matches: ")


def test_a_transposed_state_is_recognised():
    S = np.random.default_rng(2).normal(size=(1, 6, 4, 4))
    d = diagnose_tensor(noisy(np.swapaxes(S, -1, -2)), S, "recurrent_state", config=CONFIG)
    assert (d.verdict, d.candidate) == ("matches", "state_transposed")


def test_noise_matches_nothing(core):
    a = core + 0.3 * np.random.default_rng(3).normal(size=core.shape)
    d = diagnose_tensor(a, core, "core", config=CONFIG)
    assert d.verdict == "none" and d.residual is None and d.bug_class is None
    assert d.text() == "no known bug class matches"  # silent: never "closest: ..." without evidence
    assert d.closest["residual"] > MATCH and d.to_json()["closest"]["bug_class"]  # kept for the curious


def test_two_bug_classes_with_the_same_numbers_are_ambiguous(core):
    """Two mutants of different bug classes produce the same tensor on this case: neither is named alone."""
    a = noisy(2.0 * core)
    d = diagnose_tensor(a, core, "core", config=CONFIG, extra={"doubled": ("the core doubled", 2.0 * core),
                                                               "gain": ("an output gain of 2", 2.0 * core)})
    assert d.verdict == "ambiguous" and set((d.bug_class, *d.alternatives)) == {"the core doubled", "an output gain of 2"}
    assert d.text().startswith("ambiguous: ") and " or " in d.text() and "cannot tell them apart" in d.text()
    doc = d.to_json()
    assert doc["verdict"] == "ambiguous" and len(doc["alternatives"]) == 1


def test_a_candidate_that_explains_half_the_error_is_not_a_match(core):
    """A residual of 0.5 (half the error left unexplained) names nothing."""
    rng = np.random.default_rng(5)
    err = 0.05 * rng.normal(size=core.shape)
    cand = core + 0.5 * err  # leaves half of the port's error
    d = diagnose_tensor(core + err, core, "core", config=CONFIG, extra={"half": ("half of it", cand)})
    assert d.verdict == "none" and d.text() == "no known bug class matches"
    assert d.closest["candidate"] == "half" and d.closest["residual"] == pytest.approx(0.5, rel=1e-9)


def test_a_mutant_candidate_names_the_bug_and_beats_an_equal_transform(core):
    a = noisy(2.0 * core)
    d = diagnose_tensor(a, core, "core", config=CONFIG, extra={"doubled": ("the core doubled", 2.0 * core)})
    assert (d.verdict, d.candidate, d.source, d.bug_class) == ("matches", "doubled", "mutant", "the core doubled")


def test_residual_compares_finite_elements_and_nan_positions():
    e = np.array([1.0, 2.0, 3.0, 4.0])
    a = np.array([1.0, np.nan, 3.0, 5.0])
    assert residual(a, e, np.array([1.0, np.nan, 3.0, 5.0])) == 0.0
    assert residual(a, e, np.array([1.0, 2.0, 3.0, 5.0])) == math.inf  # a NaN the candidate does not have
    assert residual(a, e, np.array([1.0, np.nan, 3.0, 4.5])) == pytest.approx(0.5)


def test_the_diagnoser_advises_only_and_respects_its_limit():
    class Report:
        first_divergence = None
        records = []
    assert Diagnoser()(None, Report()) is None  # nothing to diagnose without a first divergence


# --- through verify: the catalogue names the bug, and a diagnosis never changes a verdict -------------
CASE = "decode_T12"


def _verdicts(summary):
    return [(c.id, c.status, c.message, [(r.tensor, r.call, r.verdict) for r in c.records]) for c in summary.cases]


def test_through_verify_the_catalogue_names_the_bug_of_another_engine(fixtures_dir, tmp_path):
    """A gated-norm weight applied as (1 + w), in another engine's roundings (placement fp32_once),
    is named by the mutant catalogue (placement hf) at its first divergence; the verdicts are those
    of verify without the diagnosis."""
    import functools

    from gdncheck.conformance.judge.verify import verify
    from gdncheck.conformance.meta.catalogue import mutant_diagnoser
    from gdncheck.conformance.meta.mutants import MUTANT_BY_NAME
    from gdncheck.conformance.ports.run import run_impl

    m = MUTANT_BY_NAME["gated_norm_weight_one_plus"]
    run_impl(functools.partial(m.factory, placement="fp32_once"), fixtures_dir, tmp_path, "bf16", cases=[CASE])
    plain = verify(fixtures_dir, tmp_path, "bf16", cases=[CASE])
    told = verify(fixtures_dir, tmp_path, "bf16", cases=[CASE], diagnose=mutant_diagnoser(fixtures_dir))
    assert _verdicts(told) == _verdicts(plain) and plain.cases[0].status == "fail"
    d = told.cases[0].diagnosis
    assert plain.cases[0].diagnosis is None
    assert (d["verdict"], d["candidate"], d["source"]) == ("matches", "gated_norm_weight_one_plus", "mutant"), d
    assert d["tensor"] == told.cases[0].first_divergence.tensor and d["residual"] < MATCH
    assert d["text"].startswith("matches: gated-norm weight applied as (1 + w) (residual ")
    doc = told.to_json()
    assert doc["cases"][0]["diagnosis"]["text"] == d["text"]  # the summary JSON carries it


def test_a_diagnosis_never_changes_a_verdict(fixtures_dir, tmp_path):
    """A diagnoser that claims a match for everything, or raises, leaves every verdict as it was: a
    passing case is never diagnosed, a failing one keeps its status and records."""
    from gdncheck.conformance.judge.verify import verify
    from gdncheck.conformance.ports.run import run_impl

    run_impl("reference", fixtures_dir, tmp_path / "ok", "f32", cases=[CASE])
    calls = []

    def always(judge, report):
        calls.append(report.id)
        return {"verdict": "matches", "text": "matches: everything", "tensor": None, "call": None}

    ok = verify(fixtures_dir, tmp_path / "ok", "f32", cases=[CASE], diagnose=always)
    assert ok.cases[0].status == "pass" and ok.cases[0].diagnosis is None and calls == [] and ok.exit_code == 0

    def boom(judge, report):
        raise RuntimeError("catalogue broke")

    from gdncheck.conformance.meta.mutants import MUTANT_BY_NAME

    run_impl(MUTANT_BY_NAME["scale_doubled"].factory, fixtures_dir, tmp_path / "bad", "f32", cases=[CASE])
    plain = verify(fixtures_dir, tmp_path / "bad", "f32", cases=[CASE])
    for hook in (always, boom):
        s = verify(fixtures_dir, tmp_path / "bad", "f32", cases=[CASE], diagnose=hook)
        assert _verdicts(s) == _verdicts(plain) and s.exit_code == plain.exit_code != 0
    assert s.cases[0].diagnosis["verdict"] == "error" and "catalogue broke" in s.cases[0].diagnosis["text"]


def test_the_catalogue_prints_no_numpy_warnings(fixtures_dir, tmp_path):
    """The catalogue runs mutants that overflow by design (a missing L2 norm in bf16 on sigmoid-edges);
    verify's console (a real process, as a user runs it) shows the diagnosis, never NumPy's
    RuntimeWarnings about those candidates."""
    import subprocess
    import sys

    from gdncheck.conformance.meta.mutants import MUTANT_BY_NAME
    from gdncheck.conformance.ports.run import run_impl

    run_impl(MUTANT_BY_NAME["beta_clamped_15"].factory, fixtures_dir, tmp_path, "bf16", cases=["sigmoid-edges"])
    p = subprocess.run([sys.executable, "-m", "gdncheck", "verify", "--fixtures", str(fixtures_dir), "--outputs",
                        str(tmp_path), "--profile", "bf16", "--case", "sigmoid-edges"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and "likely cause: matches: b clamped to ±15 before the sigmoid" in p.stdout
    assert "Warning" not in p.stderr and "Warning" not in p.stdout, p.stderr



def test_a_mutant_that_overflows_runs_without_numpy_warnings(tmp_path):
    """The emulated layer models float32 hardware, where an overflow is an infinity and no message:
    a missing L2 norm overflows on state-norms (its huge state times unnormalised q is past float32:
    17 RuntimeWarnings once), and ``gdncheck run`` of that mutant, as a port author runs it, shows
    its progress lines only."""
    import subprocess
    import sys

    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "gdncheck", "run", "gdncheck.conformance.meta.mutants:missing_l2_norm",
                        "--profile", "f32", "--case", "state-norms", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "Warning" not in p.stderr and "Warning" not in p.stdout, p.stderr
    assert len(list(out.glob("state-norms_*.safetensors"))) == 1


def test_the_emulated_layer_overflows_to_inf_silently_in_both_modes():
    """Whole-layer and stage-isolated calls of the emulated layer: an input past float32's square
    root gives an infinite mean square in the input norm (x / sqrt(inf) = 0), as a float32 kernel
    does, with no warning."""
    import warnings

    from gdncheck.config import GDNConfig
    from gdncheck.conformance.earn.emulate import emulated
    from gdncheck.synthetic import make_weights

    cfg = GDNConfig(hidden_size=32, intermediate_size=48, num_k_heads=2, num_v_heads=4, head_k_dim=16,
                    head_v_dim=8)
    port = emulated(cfg, make_weights(cfg, seed=0), profile="f32")
    x = np.full((1, 2, cfg.hidden_size), 1e30, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, trace = port.forward(x, port.new_state(1), np.zeros(1, dtype=np.int64))
        isolated = port.run_stage("input_norm", {"x": x})
    assert np.all(trace["x_norm"] == 0) and np.all(isolated["x_norm"] == 0)


def test_a_packed_stage_tensor_is_diagnosed_in_the_judges_layout(fixtures_dir, tmp_path):
    """A serving case's stage tensors are packed, [total_tokens, ...], and judged as one row; the
    diagnosis reads them the same way (it raised "input operand has more dimensions than allowed"
    on the first packed `core` it met, and shifted tokens along the heads axis). A sigmoid in place
    of softplus, run as a port in another engine's roundings, first shows in spec-decode's packed
    `core` and is named there."""
    from gdncheck.conformance.judge.verify import verify
    from gdncheck.conformance.meta.catalogue import mutant_diagnoser
    from gdncheck.conformance.meta.mutants import MUTANT_BY_NAME
    from gdncheck.conformance.ports.run import run_impl

    factory = MUTANT_BY_NAME["softplus_replaced"].factory
    run_impl(lambda *a, **k: factory(*a, **{**k, "placement": "fp32_once"}), fixtures_dir, tmp_path, "bf16",
             cases=["spec-decode"])
    s = verify(fixtures_dir, tmp_path, "bf16", cases=["spec-decode"], diagnose=mutant_diagnoser(fixtures_dir))
    (c,) = s.cases
    assert c.status == "fail" and c.first_divergence.tensor == "core"
    assert c.diagnosis["verdict"] == "matches" and c.diagnosis["candidate"] == "softplus_replaced", c.diagnosis
