"""ONNX Runtime's GDN contrib ops, judged stage-isolated (``conformance/engines/onnxruntime/adapter.py``).

The three com.microsoft ops onnxruntime-genai's builder emits, each a one-node graph on the CPU execution
provider: CausalConvWithState (conv1d) and LinearAttention (delta_rule, and the fused GatedDeltaNet op) conform on
every case of the committed suite that keeps their inputs, in f32 and f16; LinearAttentionGate (gates) fails,
and the failure is adjudicated in float64: its softplus is log(1 + exp(x)) in float32 and its sigmoid has an
absolute error near 1e-7. Each piece of glue, done wrong, is caught at its stage. The tests skip where onnxruntime
is not installed (the onnxruntime extra)."""

from __future__ import annotations

import importlib.util
from collections import Counter

import numpy as np
import pytest

from gdncheck.conformance.engines import registry
from gdncheck.conformance.engines.onnxruntime import adapter as ort_port
from gdncheck.conformance.judge.verify import verify
from gdncheck.conformance.ports.run import run_impl
from gdncheck.errors import GDNError
from gdncheck.fixtures.packaged import default_suite
from gdncheck.harness import NotApplicable
from gdncheck.safetensors_io import read_safetensors
from tests.helpers import tiny_config

pytestmark = pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None
                                or importlib.util.find_spec("onnx") is None,
                                reason="onnxruntime is not installed (pip install -e '.[onnxruntime]')")

FIXTURES = default_suite()
#: a prefill then a decode (2 sequences, 6 value heads over 2 key heads), a 137-token chunked prefill,
#: the softplus edges (arguments far past +-20)
CASES = ["prefill-decode", "chunked_T137", "softplus-edges"]


def _judge(tmp_path, profile="f32", cases=CASES, **options):
    factory = options.pop("factory", ort_port.onnxruntime)
    out = tmp_path / f"out-{profile}"
    rep = run_impl(factory, FIXTURES, out, profile, cases=cases, options=options, stage_isolated=True)
    assert all(c.status in ("ran", "not_applicable") for c in rep.cases), [(c.id, c.status, c.detail)
                                                                           for c in rep.cases]
    return verify(FIXTURES, out, profile, cases=cases, stage_isolated=True).to_json()


def _verdicts(summary) -> Counter:
    return Counter((r["tensor"], r["verdict"]) for c in summary["cases"] for r in c["records"]
                   if r["verdict"] != "missing")


def _worst(summary, tensor) -> float:
    """The largest max scaled error / elem bound of ``tensor`` over the summary's records."""
    worst = 0.0
    for c in summary["cases"]:
        for r in c["records"]:
            if r["tensor"] == tensor and r.get("metrics") and r.get("bound"):
                worst = max(worst, r["metrics"]["max_err"] / r["bound"]["elem"])
    return worst


@pytest.mark.parametrize("op", ort_port.OPS)
def test_conv_and_delta_rule_conform_the_gate_fails_f32(tmp_path, op):
    summary = _judge(tmp_path, op=op)
    v = _verdicts(summary)
    for name in ("qkv_conv", "conv_state", "core", "recurrent_state"):
        assert v[(name, "pass")] >= 3 and v[(name, "fail")] == 0, (name, v)
    assert v[("g", "fail")] >= 3  # every case: the softplus (adjudicated below)


def test_f16_conforms_but_for_the_softplus_edges(tmp_path):
    summary = _judge(tmp_path, "f16")
    status = {c["id"].split("_T")[0]: c["status"] for c in summary["cases"]}
    # "softplus-edges" selects its depth variants too (a decode, Hv = 8 over Hk = 4): the same softplus fails them
    assert status == {"prefill-decode": "pass", "chunked": "pass", "softplus-edges": "fail",
                      "softplus-edges-decode": "fail", "softplus-edges-gva2": "fail"}, status
    first = {(c["first_divergence"]["stage"], c["first_divergence"]["tensor"]) for c in summary["cases"]
             if c["status"] == "fail"}
    assert first == {("gates", "g")}, first


def test_the_gate_is_adjudicated_in_float64(tmp_path):
    """On softplus-edges, ORT's g equals -exp(A_log) · log(1 + exp(a + dt_bias)) taken in float32 to a few ulp,
    while the float64 value it misses is far from 0; its beta's error is absolute, under 2e-7."""
    out = tmp_path / "o"
    run_impl(ort_port.onnxruntime, FIXTURES, out, "f32", cases=["softplus-edges"], stage_isolated=True)
    (case,) = [p for p in out.glob("softplus-edges_T*.safetensors")]  # not its depth variants
    golden = read_safetensors(FIXTURES / case.name)[0]
    got = read_safetensors(case)[0]
    a, b = golden["calls.0.a"], golden["calls.0.b"]
    w = {k: v for k, v in golden.items() if k.startswith("weights.")}
    A_log = next(v for k, v in w.items() if k.endswith("A_log"))
    dt_bias = next(v for k, v in w.items() if k.endswith("dt_bias"))
    f = np.float32
    x = a.astype(f) + dt_bias.astype(f)
    g32 = (-np.exp(A_log.astype(f)) * np.log(f(1) + np.exp(x))).astype(np.float64)
    g = got["calls.0.g"].astype(np.float64)
    np.testing.assert_allclose(g, g32, rtol=4e-7, atol=1e-30)
    missed = (g == 0) & (golden["calls.0.g"] != 0)
    assert missed.any() and np.abs(golden["calls.0.g"][missed]).max() > 1e-9  # a decay the f32 form drops
    beta64 = 1 / (1 + np.exp(-b.astype(np.float64)))
    err = np.abs(got["calls.0.beta"].astype(np.float64) - beta64)
    # absolute accuracy: relative errors 50x past what a float32 1 / (1 + exp(-x)) has (2e-7)
    assert err.max() < 2e-7 and (err / beta64).max() > 1e-5


# --- the glue, each piece broken alone --------------------------------------------------------------------
class OldestConvColumns(ort_port.OnnxRuntimeStages):
    """Hands the op the oldest K-1 columns of the state as its carry, where it wants the newest."""

    def conv_state_in(self, state):
        return state[..., :-1]


class CarryOnly(ort_port.OnnxRuntimeStages):
    """Writes the op's K-1 carry columns and the newest input again as the new state (a column shifted)."""

    def conv_state_out(self, window, present, T):
        return np.concatenate([present, window[..., -1:]], axis=-1)


class QueryScaledTwice(ort_port.OnnxRuntimeStages):
    """Scales q by 1/sqrt(dk) and leaves the op's scale at its default 1/sqrt(dk) too."""

    def query(self, q):
        return super().query(q) * self.dtype(1.0 / np.sqrt(self.cfg.head_k_dim))


class StateTransposed(ort_port.OnnxRuntimeStages):
    """Hands LinearAttention gdncheck's [B, Hv, dk, dv] state transposed, as GatedDeltaNet's V-major layout."""

    def state_in(self, s):
        return np.ascontiguousarray(np.swapaxes(np.asarray(s, dtype=np.float32), -1, -2))

    def state_out(self, s):
        return np.swapaxes(s, -1, -2)


class DecayScaleNotNegated(ort_port.OnnxRuntimeStages):
    """Stores exp(A_log) where the builder stores -exp(A_log): a growing state."""

    def decay_scale(self, A_log):
        return np.exp(A_log.astype(np.float32))


def _factory(cls):
    return lambda cfg, weights, **kw: ort_port.onnxruntime(cfg, weights, impl_class=cls, **kw)


@pytest.mark.parametrize("cls, tensor", [(OldestConvColumns, "qkv_conv"), (CarryOnly, "conv_state"),
                                         (QueryScaledTwice, "core"), (StateTransposed, "core"),
                                         (DecayScaleNotNegated, "g")])
def test_each_glue_error_is_caught_at_its_stage(tmp_path, cls, tensor):
    shipped = _worst(_judge(tmp_path / "shipped", cases=CASES[:2]), tensor)
    broken = _judge(tmp_path / "broken", cases=CASES[:2], factory=_factory(cls))
    assert _verdicts(broken)[(tensor, "fail")] >= 1
    # g fails as shipped too (the softplus): the glue error is orders of magnitude past it
    assert _worst(broken, tensor) > 100 * max(shipped, 1.0), (shipped, _worst(broken, tensor))


def test_what_it_cannot_express_and_bad_options():
    cfg = tiny_config(Hk=1, Hv=2, dk=4, dv=4, D=8, I=8)
    from gdncheck.synthetic import make_weights

    w = make_weights(cfg, seed=0)
    with pytest.raises(NotApplicable, match="no bfloat16 form"):
        ort_port.onnxruntime(cfg, w, profile="bf16")
    with pytest.raises(GDNError, match="expected --option op= one of linear_attention, gated_delta_net, found 'x'"):
        ort_port.onnxruntime(cfg, w, op="x")
    impl = ort_port.onnxruntime(cfg, w)
    with pytest.raises(NotApplicable, match="only stage-isolated mode applies"):
        impl.forward(None, None, None)
    assert impl.run_stage("in_proj", {}) == {}
    assert registry.engine("onnxruntime").option_values["op"] == ort_port.OPS


def test_the_repro_runs_the_op_and_says_it_reproduces():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[3] / "conformance/engines/onnxruntime/repros/onnxruntime_gates.py"
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stdout + run.stderr  # 1: the defect reproduces (0 once fixed)
    assert "exactly 0 (no decay at all) for x <= -16.6" in run.stdout and "sigmoid defect: reproduces" in run.stdout
