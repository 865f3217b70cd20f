"""The float32 checkpoint weights rounded at load (issue 44; docs/meta.md, "Weights as the checkpoints hold
them"): each rounding of A_log or the gated norm's weight to bf16 or f16 is caught by run + verify alone, in
f32, at its own stage (gates: g; gated_norm: core_gated) on the cases that hold those weights as released
checkpoints do, far past the goal; in bf16 and f16 it stays below what the profile resolves (at most half an
ulp of the weight's dtype, under the one-ulp floor of every bound), and the matrix says so. On every other
case the weights are bf16/f16-exact and the rounding changes nothing."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from gdncheck.conformance.judge.verify import verify
from gdncheck.conformance.meta.catalogue import mutant_diagnoser
from gdncheck.conformance.meta.kill_matrix import GOAL, kill
from gdncheck.conformance.meta.mutants import CHECKPOINT_DTYPE_MUTANTS
from gdncheck.conformance.ports.run import run_impl
from gdncheck.safetensors_io import SafetensorsFile

LIGHT = ["f32-weights", "f32-weights-decode"]  # d128-f32-weights is real-size: docs/meta.md runs all three
BY_NAME = {m.name: m for m in CHECKPOINT_DTYPE_MUTANTS}


@pytest.mark.parametrize("mutant", CHECKPOINT_DTYPE_MUTANTS, ids=[m.name for m in CHECKPOINT_DTYPE_MUTANTS])
def test_a_weight_rounded_at_load_fails_in_f32_at_its_stage(mutant, fixtures_dir):
    r = kill(mutant, "f32", fixtures_dir, cases=LIGHT)
    assert r.killed and r.first_stage == mutant.stage, r.cell()
    assert r.stage_margin >= 100 * GOAL, r.cell()  # measured x7.5e5 to x1.5e6 (gates), x2.3e4 to x7.7e5 (gated_norm)
    fd = next(iter(r.first_by_case.values()))
    assert (fd.call, fd.stage, fd.tensor) == (0, mutant.stage, {"gates": "g", "gated_norm": "core_gated"}[mutant.stage])


HALF = [(m, p) for m in CHECKPOINT_DTYPE_MUTANTS for p in ("bf16", "f16") if not (p == "f16" and "bf16" in m.name)]


@pytest.mark.parametrize("mutant,profile", HALF, ids=[f"{m.name}-{p}" for m, p in HALF])
def test_in_the_half_profiles_the_rounding_is_below_what_the_bounds_resolve(mutant, profile, fixtures_dir):
    """A rounding to the profile's own dtype (or to bf16 in bf16) is below the bounds' one-ulp floor."""
    r = kill(mutant, profile, fixtures_dir, cases=LIGHT)
    assert not r.killed, r.message
    assert r.stage_margin < 1.0  # measured 0.22-0.55 of the bound at its stage


@pytest.mark.parametrize("mutant", [m for m in CHECKPOINT_DTYPE_MUTANTS if "bf16" in m.name],
                         ids=[m.name for m in CHECKPOINT_DTYPE_MUTANTS if "bf16" in m.name])
def test_a_bf16_rounding_in_the_f16_profile_is_at_the_edge_of_what_f16_resolves(mutant, fixtures_dir):
    """Half a bf16 ulp is four f16 ulps: an f16 port that rounds a weight to bf16 lands near its bounds
    (measured: g x0.72; post_norm x1.04 on f32-weights-decode for the norm weight), never ten times past."""
    r = kill(mutant, "f16", fixtures_dir, cases=LIGHT)
    assert r.margin < GOAL, r.cell()


def test_on_a_case_with_half_exact_weights_the_rounding_changes_nothing(fixtures_dir, tmp_path):
    case = "decode_T12"
    run_impl("reference", fixtures_dir, tmp_path / "correct", "f32", cases=[case])
    for m in CHECKPOINT_DTYPE_MUTANTS:
        run_impl(m.factory, fixtures_dir, tmp_path / m.name, "f32", cases=[case])
        (name,) = [p.name for p in (tmp_path / m.name).glob("decode_T12*.safetensors")]
        a, b = SafetensorsFile(tmp_path / "correct" / name), SafetensorsFile(tmp_path / m.name / name)
        assert set(a) == set(b)
        for key in a:
            assert np.array_equal(np.asarray(a.read(key)), np.asarray(b.read(key))), (m.name, key)


def test_the_catalogue_names_a_log_rounded_to_bf16(fixtures_dir, tmp_path):
    """A port in another engine's roundings (fp32_once) that rounds A_log to bf16 at load: verify's
    diagnosis names the bug class."""
    m = BY_NAME["a_log_bf16_at_load"]
    run_impl(functools.partial(m.factory, placement="fp32_once"), fixtures_dir, tmp_path, "f32", cases=LIGHT)
    s = verify(fixtures_dir, tmp_path, "f32", cases=LIGHT, diagnose=mutant_diagnoser(fixtures_dir))
    d = s.cases[0].diagnosis
    assert s.cases[0].status == "fail" and d["candidate"] == "a_log_bf16_at_load", d
    assert "matches: A_log rounded to bf16 at load" in d["text"], d["text"]
