"""No false fact on conforming outputs (issue 42, second round of symptom detectors): the correct emulating
ports in f32, bf16 and f16 and the float64 reference, each tensor of each call measured against its golden
with an element bound so tight that half the port's own rounding "fails"; none of the new detectors (a
precision grid, an elementwise map, the gated norm's parts, non-finite placement, the decay's order, an
absolute error in the gates, a gate lost to zero, an error growing as a norm's input shrinks, an error
only where the decay is extreme) may
speak, since none of those bugs is in a correct port."""

from __future__ import annotations

import numpy as np
import pytest

from gdncheck.conformance.judge.symptoms import grid_fact, measure
from gdncheck.conformance.ports.run import run_impl
from gdncheck.fixtures.manifest import load_manifest
from gdncheck.safetensors_io import read_safetensors
from gdncheck.stages import STATE_NAMES

NEW = {"relation:elementwise", "relation:norm_order", "relation:eps_placement", "relation:weight_offset",
       "error:absolute", "values:zero", "eps:grows_small", "decay:extreme"}
CASES = ("prefill-decode_T65", "chunked_T137", "softplus-edges_T68")


@pytest.mark.parametrize("impl,profile", [("emulated", "f32"), ("emulated", "bf16"), ("emulated", "f16"),
                                          ("reference", "f64")])
def test_no_new_fact_on_a_correct_port(fixtures_dir, tmp_path, impl, profile):
    run_impl("reference", fixtures_dir, tmp_path, profile, cases=list(CASES),
             options={"placement": "hf"} if impl == "emulated" else None)
    judged = "f32" if profile == "f64" else profile
    entries = {c["id"]: c for c in load_manifest(fixtures_dir)["cases"]}
    said, measured = [], 0
    for path in sorted(tmp_path.glob("*.safetensors")):
        entry = entries[path.stem]
        port, _ = read_safetensors(path)
        gold, _ = read_safetensors(fixtures_dir / entry["file"])
        for step in entry["program"]:
            if "call" not in step:
                continue
            c = step["call"]
            got = {n: np.asarray(port[f"calls.{c}.{n}"], np.float64) for n in step["expected"]
                   if f"calls.{c}.{n}" in port}
            want = {n: np.asarray(gold[f"calls.{c}.{n}"], np.float64) for n in got}
            goldens = {n: want.get(n) for n in ("q", "k", "v", "g", "beta", "x", "h")}  # x, h: the norms' inputs
            goldens["state_before"] = np.asarray(gold[f"calls.{c}.recurrent_state_in"], np.float64)
            states = {n: (got[n], want[n]) for n in STATE_NAMES if n in got}
            for name, a in got.items():
                e = want[name]
                f = grid_fact(a, e, name, judged)
                if f:
                    said.append(f"{path.stem} call {c} {name}: {f.text}")
                d = np.full(e.shape, max(float(np.max(np.abs(e), initial=0.0)), 1e-30))
                err = np.abs(a - e)[np.isfinite(a) & np.isfinite(e)] / d.ravel()[0]
                if not err.size or not np.any(err > 0):
                    continue
                elem = float(np.median(err))  # half the port's own rounding over the bound
                others = {f"this call's golden {n}": want[n] for n in want if n != name and want[n].shape == e.shape}
                facts = measure(a, e, name, scale=d, elem=elem, profile=judged, config=entry["config"], others=others,
                                call_step=step, call=c, goldens=goldens, port_states=states)
                measured += 1
                said += [f"{path.stem} call {c} {name}: {x.code} {x.text}" for x in facts
                         if x.kind in ("precision", "order", "nonfinite") or x.code in NEW]
    assert measured > 50
    assert not said, said


@pytest.mark.parametrize("mutant,case,fact", [
    ("conv_missing_silu", "decode_T12", "the golden is SiLU of the port's values"),
    ("bf16_recurrent_state", "decode_T12", "lies on the bf16 grid"),
    ("chunk_masked_exp", "chunked_T137", "cumulative log-decay"),
    ("decay_after_write", "decode_T12", "decay e^g applied after its write"),
    ("rmsnorm_eps_outside_sqrt", "decode_T12", "has the smallest mean square fail"),
    ("softplus_naive", "chunked_T137", "the error does not shrink with the value"),
    ("decay_clamped", "sigmoid-edges_T27", "where its decay e^g leaves"),
])
def test_the_new_facts_reach_console_summary_junit_and_report(fixtures_dir, tmp_path, capsys, mutant, case, fact):
    """The console's likely cause, the JSON summary, the JUnit XML and the HTML report each carry the new
    fact, on one line."""
    import html
    import json

    from gdncheck.cli import main

    out = tmp_path / "out"
    assert main(["run", f"gdncheck.conformance.meta.mutants:{mutant}", "--fixtures", str(fixtures_dir), "--profile",
                 "f32", "--case", case, "--out", str(out), "-q"]) == 0
    capsys.readouterr()
    summary, junit, report = tmp_path / "s.json", tmp_path / "j.xml", tmp_path / "report"
    code = main(["verify", "--fixtures", str(fixtures_dir), "--outputs", str(out), "--profile", "f32", "--case", case,
                 "--summary", str(summary), "--junit", str(junit), "--report", str(report)])
    text = capsys.readouterr().out
    assert code == 1
    lines = [ln for ln in text.splitlines() if fact in ln]
    assert len(lines) == 1 and "likely cause" in lines[0], text
    diag = json.loads(summary.read_text())["cases"][0]["diagnosis"]
    assert any(fact in f["text"] and "\n" not in f["text"] for f in diag["symptoms"]), diag
    assert fact in junit.read_text()
    assert any(fact in html.unescape(p.read_text()) for p in report.rglob("*.html"))
