"""The likely cause of a failure through verify (conformance/judge/diagnose.py, handed
conformance/meta/catalogue.py's mutant catalogue as the CLI hands it): the catalogue names the bug, a
diagnosis never changes a verdict, and the mutants it runs print no NumPy warnings. The diagnosis on
tensors built by hand: tests/judge/test_diagnose.py."""

from __future__ import annotations

import numpy as np

from gdncheck.conformance.judge.diagnose import MATCH

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
    # the symptoms first (issue 42), then the class with its runner-up
    assert d["text"].startswith(f"symptoms of {d['tensor']}: ") and d["symptoms"], d["text"]
    assert "; matches: gated-norm weight applied as (1 + w) (residual " in d["text"]
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
    assert p.returncode == 1 and "likely cause: symptoms of " in p.stdout
    assert "matches: b clamped to ±15 before the sigmoid" in p.stdout
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
