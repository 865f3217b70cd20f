"""llama.cpp's ``ggml_gated_delta_net`` op, judged stage-isolated (``conformance/engines/ggml/adapter.py``).

The op, called through ctypes from the libggml llama-cpp-python installs, conforms on every delta-rule case of
the committed suite in f32; each piece of glue the adapter does, done wrong, is caught by verify in the
delta_rule stage (the state untransposed, the value heads left grouped for the op's tiled broadcast, g handed
over as the decay exp(g) or with its sign flipped, q scaled twice or its scale missing); what the op cannot
express is not applicable with its reason, and a machine without llama-cpp-python gets one line saying how to
install it. The tests that call the op skip where llama-cpp-python is not installed."""

from __future__ import annotations

import importlib.util
import logging
import sys

import numpy as np
import pytest

from gdncheck.cli import main
from gdncheck.conformance.engines import probe, registry
from gdncheck.conformance.engines.ggml import adapter as ggml_port
from gdncheck.conformance.judge.verify import verify
from gdncheck.conformance.ports.plugin import check_options
from gdncheck.conformance.ports.run import run_impl
from gdncheck.errors import GDNError
from gdncheck.harness import NotApplicable
from tests.helpers import tiny_config, unit

#: prefill of 100 then 37 continuing from the kept state; 2 key heads read by 4 value heads
CHUNKED = "chunked_T137"
#: the cases of the committed suite the op cannot be judged on, and why
REAL_HEADS = ("real-heads_T3_Hk16_Hv32_dk128_dv128_s0", "real-heads_T3_Hk16_Hv48_dk128_dv128_s0")
DK_NE_DV = ("dk-gt-dv_T63_Hk2_Hv6_dk16_dv8_s0", "dk-lt-dv_T40_Hk2_Hv4_dk8_dv16_s0",
            "moe-e512-k10_T27_Hk2_Hv4_dk16_dv8_s0")


@pytest.fixture
def lib():
    """The loaded libggml, or a skip saying what is missing."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (built from its sdist)")
    try:
        return ggml_port.libs()
    except GDNError as exc:
        pytest.skip(str(exc))


def _judge(factory, fixtures_dir, out, cases=None, **options):
    rep = run_impl(factory, fixtures_dir, out, "f32", cases=cases, options=options, stage_isolated=True)
    assert all(c.status in ("ran", "not_applicable") for c in rep.cases), [(c.id, c.status, c.detail)
                                                                           for c in rep.cases]
    return verify(fixtures_dir, out, "f32", cases=cases, stage_isolated=True)


# --- the glue, each piece broken alone --------------------------------------------------------------------
class StateUntransposed(ggml_port.GgmlDeltaRule):
    """Hands the op gdncheck's [B, Hv, dk, dv] state as it is, where ggml keeps it key index fastest."""

    def state_in(self, s):
        return s

    def state_out(self, s):
        return s


class GroupedHeads(ggml_port.GgmlDeltaRule):
    """Leaves the value heads in gdncheck's grouped order: the op's tiled broadcast then has value head j read
    key head j % Hk instead of j // (Hv/Hk)."""

    def heads_in(self, x, axis):
        return x

    def heads_out(self, x, axis):
        return x


class DecayNotLog(ggml_port.GgmlDeltaRule):
    """Hands the op the decay exp(g) where it takes the log decay g (and applies expf itself)."""

    def log_decay(self, g):
        return np.exp(g)


class DecaySign(ggml_port.GgmlDeltaRule):
    """Hands the op -g: a state that grows by exp(|g|) a token instead of decaying."""

    def log_decay(self, g):
        return -g


class QScaledTwice(ggml_port.GgmlDeltaRule):
    """Scales q by dk^-1/2 before the op, as llama.cpp's non-fused paths do, though the op scales it again."""

    def query(self, q):
        return q * self.cfg.scale


class QScaleMissing(ggml_port.GgmlDeltaRule):
    """Undoes the op's 1/sqrt(S_v): the core an adapter that leaves out the q scale would hand over."""

    def query(self, q):
        return q / self.cfg.scale


def _with(impl_class):
    def factory(cfg, weights, *, profile, strict=False, threads=1):
        return ggml_port.ggml(cfg, weights, profile=profile, strict=strict, threads=threads, impl_class=impl_class)

    return factory


def test_the_op_conforms_on_every_delta_rule_case_of_the_suite(lib, fixtures_dir, tmp_path):
    s = _judge(ggml_port.ggml, fixtures_dir, tmp_path)
    status = {c.id: c.status for c in s.cases}
    assert s.exit_code == 1  # the two real-heads cases judge nothing: the coverage rule fails them
    assert {i for i, st in status.items() if st == "fail"} == set(REAL_HEADS)
    assert all(c.first_divergence.reason == "nothing_judged" for c in s.cases if c.id in REAL_HEADS)
    na = {c.id: c.not_applicable["reason"] for c in s.cases if c.status == "not_applicable"}
    assert set(na) == set(DK_NE_DV) and all(r.startswith("dk != dv") for r in na.values())
    passed = [c for c in s.cases if c.status == "pass"]
    assert len(passed) == 23 and CHUNKED in " ".join(c.id for c in passed)
    judged = [r for c in passed for r in c.records if r.verdict != "missing"]
    assert {(r.stage, r.tensor) for r in judged} == {("delta_rule", "core"), ("delta_rule", "recurrent_state")}
    assert all(r.verdict == "pass" for r in judged)
    assert s.implementation["name"].endswith(f"ggml gated_delta_net (f32, cpu, llama-cpp-python {lib.version})")


def _caught(s, failing) -> None:
    (case,) = s.cases
    assert s.exit_code == 1 and case.status == "fail"
    assert case.first_divergence.stage == "delta_rule"
    assert {r.tensor for r in case.records if r.verdict == "fail"} == failing


@pytest.mark.parametrize("impl_class, failing", [
    (StateUntransposed, {"core", "recurrent_state"}),
    (GroupedHeads, {"core", "recurrent_state"}),
    (DecayNotLog, {"core", "recurrent_state"}),
    (DecaySign, {"core", "recurrent_state"}),
    (QScaledTwice, {"core"}),  # the state never reads q
    (QScaleMissing, {"core"}),
])
def test_each_glue_mistake_fails_verify_in_the_delta_rule(lib, fixtures_dir, tmp_path, impl_class, failing):
    _caught(_judge(_with(impl_class), fixtures_dir, tmp_path, [CHUNKED]), failing)


def test_the_state_mistake_shows_once_a_state_is_carried(lib, fixtures_dir, tmp_path):
    """From zeros (call 0) an untransposed state is still zeros; the continuation (call 1) reads the kept one."""
    s = _judge(_with(StateUntransposed), fixtures_dir, tmp_path, [CHUNKED])
    failed = {(r.call, r.tensor) for c in s.cases for r in c.records if r.verdict == "fail"}
    assert (0, "core") not in failed and (1, "core") in failed


def test_grouped_heads_are_tiled_for_the_op_and_back():
    """Tiled position m*Hk + h holds grouped head h*(Hv/Hk) + m: both read key head h."""
    order = ggml_port.tiled_order(2, 6)
    assert order.tolist() == [0, 3, 1, 4, 2, 5]
    assert all(order[p] // 3 == p % 2 for p in range(6))
    assert ggml_port.tiled_order(1, 4).tolist() == [0, 1, 2, 3] and ggml_port.tiled_order(3, 3).tolist() == [0, 1, 2]


# --- the op's calls ------------------------------------------------------------------------------------------
def _inputs(B=2, T=5, Hk=2, Hv=6, d=8, seed=0):
    rng = np.random.default_rng(seed)
    return dict(q=unit(rng, B, T, Hk, d), k=unit(rng, B, T, Hk, d), v=rng.normal(size=(B, T, Hv, d)),
                g=-rng.uniform(0.01, 1.0, size=(B, T, Hv)), beta=rng.uniform(size=(B, T, Hv)),
                recurrent_state=rng.normal(size=(B, Hv, d, d)))


def test_the_thread_count_changes_no_bit(lib):
    cfg = tiny_config(Hk=2, Hv=6, dk=8, dv=8)
    inputs = _inputs()
    one = ggml_port.ggml(cfg, {}, threads=1).run_stage("delta_rule", inputs)
    two = ggml_port.ggml(cfg, {}, threads=2).run_stage("delta_rule", inputs)
    assert one["core"].shape == (2, 5, 6, 8) and one["recurrent_state"].shape == (2, 6, 8, 8)
    assert all(np.array_equal(one[n], two[n]) for n in ("core", "recurrent_state"))


def test_a_wrong_shape_is_refused_before_ggml_can_abort(lib):
    t = _inputs(B=1, T=2, Hk=1, Hv=2, d=4)
    g, beta = t["g"][..., None], t["beta"][..., None]
    state = np.swapaxes(t["recurrent_state"], -1, -2)
    with pytest.raises(GDNError, match=r"state must be \(1, 2, 4, 4\)"):
        ggml_port.gated_delta_net(lib, t["q"], t["k"], t["v"], g, beta, state[..., :3])
    with pytest.raises(GDNError, match="H_v % H_k"):
        ggml_port.gated_delta_net(lib, t["q"][:, :, :0], t["k"][:, :, :0], t["v"], g, beta, state)


# --- the contract around the one op --------------------------------------------------------------------------
def test_everything_but_the_delta_rule_is_not_the_op(lib):
    cfg = tiny_config(dk=4, dv=4)
    impl = ggml_port.ggml(cfg, {}, profile="f32")
    assert impl.run_stage("gated_norm", {}) == {} and impl.run_stage("conv1d", {}) == {}
    for call in (lambda: impl.forward(None, None, None), lambda: impl.new_state(1)):
        with pytest.raises(NotApplicable, match="not the Qwen3.5 layer"):
            call()


def test_what_the_op_cannot_express_is_not_applicable_without_loading_it(monkeypatch):
    monkeypatch.setattr(ggml_port, "libs", lambda: pytest.fail("the library was loaded"))
    for profile in ("bf16", "f16"):
        with pytest.raises(NotApplicable, match=f"profile {profile}: ggml_gated_delta_net takes f32 tensors only"):
            ggml_port.ggml(tiny_config(dk=4, dv=4), {}, profile=profile)
    with pytest.raises(NotApplicable, match=r"dk != dv \(4 != 3\)"):
        ggml_port.ggml(tiny_config(), {}, profile="f32")
    with pytest.raises(GDNError, match="threads=N with N >= 1, found 'many'"):
        ggml_port.ggml(tiny_config(dk=4, dv=4), {}, threads="many")
    with pytest.raises(NotApplicable, match="not the Qwen3.5 layer"):
        ggml_port.ggml.check_case({}, [])
    check_options(ggml_port.ggml, {"threads": 2})
    with pytest.raises(GDNError, match="takes no option 'impl_class'"):
        check_options(ggml_port.ggml, {"impl_class": "x"})


def test_a_machine_without_llama_cpp_gets_one_line_saying_how_to_install_it(monkeypatch):
    monkeypatch.setattr(ggml_port, "_LIBS", None)
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # find_spec now says: not there
    with pytest.raises(GDNError) as exc:
        ggml_port.libs()
    assert str(exc.value) == ggml_port.NOT_INSTALLED and "\n" not in str(exc.value)
    assert "pip install --no-binary llama-cpp-python \"llama-cpp-python==0.3.36\"" in str(exc.value)
    monkeypatch.setattr(probe, "module_available", lambda name: name != "llama_cpp")
    hint = probe.probe(registry.ENGINES["ggml"]).hint(registry.ENGINES["ggml"])
    assert hint.startswith("not installed (llama_cpp missing): CMAKE_ARGS=") and "\n" not in hint


def test_another_llama_cpp_python_version_is_warned_about(lib, monkeypatch, caplog):
    monkeypatch.setattr(ggml_port, "_LIBS", None)
    monkeypatch.setattr(ggml_port, "version", lambda dist: "0.3.20")
    with caplog.at_level(logging.WARNING, logger="gdncheck.ports.ggml"):
        assert ggml_port.libs().version == "0.3.20"
    assert "tested with llama-cpp-python 0.3.36, found 0.3.20" in caplog.text


def test_from_the_command_line(lib, fixtures_dir, tmp_path, capsys):
    out = str(tmp_path / "out")
    assert main(["run", "ggml", "--out", out, "--profile", "f32", "--case", CHUNKED, "--stage-isolated",
                 "--option", "threads=2", "-q"]) == 0
    assert main(["verify", "--outputs", out, "--profile", "f32", "--case", CHUNKED, "--stage-isolated"]) == 0
    assert "ggml gated_delta_net (f32" in capsys.readouterr().out
