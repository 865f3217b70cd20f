"""The property draws of the tolerance derivation (conformance/properties/draws.py): a fixed, stratified
sample of what the differential property draws, whose errors make the table's ``properties`` rows (the
bounds of generated layers) and nothing else, and which the committed table was earned over."""

from __future__ import annotations

import re

import pytest

from gdncheck.conformance.earn import derive
from gdncheck.conformance.earn.emulate import emulated
from gdncheck.conformance.judge.tolerances import PROPERTY_ROWS, ToleranceTable, load_table
from gdncheck.conformance.properties import draws
from gdncheck.conformance.properties.check import compare_calls
from gdncheck.conformance.properties.registry import Subject, run_calls
from gdncheck.conformance.properties.strategies import GATE_REGIMES, INPUT_KINDS, REALISTIC


def test_the_sample_is_fixed_and_visits_every_stratum():
    first, again = draws.sample(1), draws.sample(1)
    assert [str(p) for p in first] == [str(p) for p in again]
    assert len(first) == len(draws.STRATA) * draws.PER_STRATUM == 13 * 7 * 3
    assert {(p.weights.regime, p.inputs.kind) for p in first} == set(draws.STRATA)
    assert {(r, k) for r in (REALISTIC, *GATE_REGIMES) for k in (REALISTIC, *INPUT_KINDS)} == set(draws.STRATA)
    # another seed draws other programs, but for each stratum's first: Hypothesis' simplest example
    shared = {str(p) for p in draws.sample(2)} & {str(p) for p in first}
    assert 0 < len(shared) <= len(draws.STRATA) and all("weights(seed=0," in p for p in shared)
    # Hypothesis varies the rest: every head size, conv width, batch and number of calls of the strategy
    assert {p.cfg.head_k_dim for p in first} == {p.cfg.head_v_dim for p in first} == {4, 8, 16}
    assert {p.cfg.conv_kernel for p in first} == {1, 2, 3, 4} and {p.batch for p in first} == {1, 2}
    assert {len(p.lengths) for p in first} == {1, 2, 3}


def test_draws_make_the_property_rows_only():
    """A draw widens the ``properties`` rows, which envelope the recipes too; it makes no recipe row and
    leaves ``global`` (the checkpoint-built fixtures' bound) the recipes' envelope."""
    env = derive.Envelope()
    for recipe, tensor, elem in (("decode", "core", 1e-5), (derive.PROPERTIES_ONLY + "qk_eps", "core", 3e-5),
                                 ("decode", "out", 2e-5), (derive.PROPERTIES_ONLY + "realistic", "out", 1e-5)):
        env.elem[("end_to_end", "f32", recipe, tensor)] = elem
        env.nmse[("end_to_end", "f32", recipe, tensor)] = elem * elem
    rows = derive.table_document(env, derive.SEEDS, ["decode_T12"])["modes"]["end_to_end"]["f32"]
    assert set(rows["cases"]) == {"decode"} and rows["cases"]["decode"]["core"]["observed_elem"] == 1e-5
    assert rows["global"]["core"]["observed_elem"] == 1e-5 and rows["global"]["out"]["observed_elem"] == 2e-5
    props = rows[PROPERTY_ROWS]
    assert props["core"]["observed_elem"] == 3e-5 and props["core"]["elem"] == pytest.approx(1.2e-4, rel=0.01)
    assert props["out"]["observed_elem"] == 2e-5  # the recipe's, larger than the draw's
    table = ToleranceTable({"modes": {"end_to_end": {"f32": rows}}}, "0" * 64, "-")
    assert table.property_bound("core", "f32").source == "properties"
    assert table.property_bound("core", "f32").elem == pytest.approx(1.2e-4, rel=0.01)
    # without draws, a table has no property rows, and generated layers get the global bound
    plain = derive.table_document(_one_recipe(), derive.SEEDS, ["decode_T12"])["modes"]["end_to_end"]["f32"]
    assert PROPERTY_ROWS not in plain
    table = ToleranceTable({"modes": {"end_to_end": {"f32": plain}}}, "0" * 64, "-")
    assert table.property_bound("core", "f32").source == "global"


def _one_recipe() -> derive.Envelope:
    env = derive.Envelope()
    env.elem[("end_to_end", "f32", "decode", "core")] = 1e-5
    env.nmse[("end_to_end", "f32", "decode", "core")] = 1e-10
    return env


def test_derive_runs_the_extra_jobs_in_its_pool(monkeypatch):
    """derive() merges the envelopes of its extra jobs (no recipe: an empty suite stands in)."""
    monkeypatch.setattr(derive, "forward_recipes", lambda suite_name="default": [])
    doc = derive.derive(seeds=(1,), extra_jobs=[(_one_observation, (2e-6,))], extra_note="one observation")
    g = doc["modes"]["end_to_end"]["bf16"]
    assert g["cases"] == {} and g["global"] == {} and g[PROPERTY_ROWS]["out"]["observed_elem"] == 2e-6
    assert doc["derivation"]["properties_also"] == "one observation"


def _one_observation(elem: float) -> derive.Envelope:
    env = derive.Envelope()
    env.elem[("end_to_end", "bf16", derive.PROPERTIES_ONLY + "realistic", "out")] = elem
    env.nmse[("end_to_end", "bf16", derive.PROPERTIES_ONLY + "realistic", "out")] = elem * elem
    return env


def test_the_committed_table_was_earned_over_the_draws():
    table = load_table()
    d = table.data["derivation"]
    # the Hypothesis release that drew them is provenance, not a requirement: a fresh install gets a later
    # one (6.170.17 drew the committed rows; CI met 6.170.27), whose programs the two tests below judge
    release = re.compile(r"Hypothesis \d+\.\d+\.\d+")
    assert release.search(d["properties_also"]), d["properties_also"]
    assert release.sub("Hypothesis X", d["properties_also"]) == release.sub("Hypothesis X", draws.note(d["seeds"]))
    for profile in ("f32", "bf16", "f16"):
        rows = table.data["modes"]["end_to_end"][profile]
        props = rows[PROPERTY_ROWS]
        assert set(props) == set(rows["global"])
        for tensor, row in rows["global"].items():  # the property rows envelope the recipes
            assert props[tensor]["observed_elem"] >= row["observed_elem"]
            assert props[tensor]["observed_nmse"] >= row["observed_nmse"]
        assert table.property_bound("core", profile).source == "properties"


@pytest.mark.parametrize("regime", ["state_norms", "realistic"])
def test_the_committed_property_rows_cover_the_draws_they_were_earned_over(regime):
    """Re-observe one seed's programs of a regime (f16, the first placement): within the property rows'
    recorded envelope. Slack 1.5 for another CPU's roundings (the re-observation is one placement of
    the recorded maximum over every placement and order, so it is usually well inside)."""
    env = derive.Envelope()
    for program in draws.sample(derive.SEEDS[0], regime):
        draws.observe_program(env, program, profiles=("f16",), placements=("hf",))
    rows = load_table().data["modes"]["end_to_end"]["f16"][PROPERTY_ROWS]
    assert env.elem
    for (_mode, _profile, _recipe, tensor), elem in env.elem.items():
        assert elem <= rows[tensor]["observed_elem"] * 1.5, (tensor, elem, rows[tensor]["observed_elem"])


@pytest.mark.parametrize("profile", ["f32", "bf16", "f16"])
def test_new_draws_pass_the_property_bounds(profile):
    """Programs the derivation never saw (seed 0 is none of its seeds), each stratum of two regimes, run
    by the emulated correct layer: they pass the differential property's judge."""
    assert 0 not in derive.SEEDS
    for regime in ("state_norms", "qk_eps"):
        for program in draws.sample(0, regime, count=1):
            weights, calls = program.build()
            _, want = run_calls(Subject.reference(program.cfg, weights), calls)
            _, got = run_calls(emulated(program.cfg, weights, profile=profile, placement="fla"), calls)
            assert not compare_calls(got, want, profile, str(program))


def test_a_malformed_property_row_is_refused_in_one_line(tmp_path, capsys):
    """A table whose property row is no {elem, nmse} of finite non-negative numbers: property_bound
    refuses it naming the row, and `tolerances show --properties --table` exits 2 with one line."""
    import json

    from gdncheck.cli import main
    from gdncheck.conformance.judge.tolerances import ToleranceError

    rows = {"global": {"core": {"elem": 1e-5, "nmse": 1e-10}}, "cases": {},
            PROPERTY_ROWS: {"core": {"elem": float("nan"), "nmse": 1e-10}}}
    table = ToleranceTable({"modes": {"end_to_end": {"f32": rows}}}, "0" * 64, "-")
    with pytest.raises(ToleranceError, match=r"bound of 'core' \(f32, end_to_end, properties\) must be"):
        table.property_bound("core", "f32")
    path = tmp_path / "table.json"
    doc = {"format": "gdncheck-tolerances", "version": 3, "modes": {"end_to_end": {p: dict(rows) for p in
                                                                                   ("f32", "bf16", "f16")}}}
    path.write_text(json.dumps(doc).replace("NaN", "-1"))
    assert main(["tolerances", "show", "--properties", "--table", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    # one line either way: the malformed row, or (checked first) the bounds this small table lacks
    assert len(err.splitlines()) == 1, err
    assert "must be {elem, nmse} of finite non-negative numbers" in err or "which the shipped table bounds" in err, err
