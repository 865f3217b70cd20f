"""Coverage depth (issue 44 item 2; docs/meta.md, "Depth"): per mutant and profile, how many cases catch
it and which, computed from hand-made kill-matrix results and manifest entries, so that a wrong count,
a profile where the class is invisible counted as depth 0, or a class below the goal left off the list
fails here; and the command's fast mode writing the depth block alone."""

from __future__ import annotations

import pytest

from gdncheck.conformance.meta import kill_matrix as km
from gdncheck.conformance.meta.kill_matrix import (
    DEPTH_BEGIN,
    DEPTH_END,
    BEGIN,
    END,
    KillResult,
    case_traits,
    depths,
    format_depth,
)
from gdncheck.conformance.meta.mutants import Mutant


def _entry(cid, hk, hv, program, regime="realistic"):
    return {"id": cid, "config": {"linear_num_key_heads": hk, "linear_num_value_heads": hv}, "program": program,
            "regime": regime}


ENTRIES = [
    _entry("a_T5_Hk2_Hv4_dk16_dv16_s0", 2, 4, [{"op": "construct"}, {"op": "forward", "T": 4}, {"op": "forward", "T": 1}]),
    _entry("b_T5_Hk2_Hv4_dk16_dv16_s0", 2, 4, [{"op": "construct"}, {"op": "forward", "T": 4}, {"op": "forward", "T": 1}]),
    _entry("c_T3_Hk3_Hv3_dk16_dv16_s0", 3, 3, [{"op": "construct"}, {"op": "decode", "T": 3}], "edge: x"),
    _entry("d_T9_Hk2_Hv6_dk16_dv16_s0", 2, 6,
           str([{"op": "construct"}, {"op": "forward_mixed", "cu_seqlens": [0, 4, 5, 9]}, {"op": "commit"}]),
           "serving: y"),
]


def _r(mutant, profile, failing, cases=4, margin=50.0):
    return KillResult(mutant, profile, bool(failing), "delta_rule" if failing else None, len(failing), cases,
                      margin=margin, first_by_case=dict.fromkeys(failing))


def test_case_traits_read_the_layout_the_call_lengths_and_the_regime():
    t = [case_traits(e) for e in ENTRIES]
    assert (t[0].name, t[0].layout, t[0].calls, t[0].regime) == ("a", "Hk 2, Hv 4 (gva-2)", "4 | 1", "realistic")
    assert t[0].signature == t[1].signature  # a and b exercise the same thing
    assert (t[2].layout, t[2].calls, t[2].regime) == ("Hk 3, Hv 3 (mha)", "decode×3", "edge")
    assert (t[3].layout, t[3].calls, t[3].regime) == ("Hk 2, Hv 6 (gva-3)", "mixed[4+1+4] | commit", "serving")


def test_depth_is_the_fewest_catching_cases_over_the_profiles_where_the_class_is_visible():
    ids = [e["id"] for e in ENTRIES]
    results = [_r("m1", "f32", ids[:3]), _r("m1", "bf16", ids[:2]), _r("m1", "f16", [], margin=0.4),
               _r("m2", "f32", ids), _r("m2", "bf16", ids[1:]), _r("m2", "f16", ids[2:]),
               _r("m3", "f32", [])]
    ds = depths(results, [Mutant("m1", object, "gates"), Mutant("m2", object, "gates"), Mutant("m3", object, "gates")])
    traits = {e["id"]: case_traits(e) for e in ENTRIES}
    assert ds["m1"].visible() == ["f32", "bf16"]
    assert (ds["m1"].count("f32"), ds["m1"].count("bf16"), ds["m1"].count("f16")) == (3, 2, 0)
    assert ds["m1"].depth() == 2  # f16, where no case catches it, does not make it 0
    assert ds["m1"].distinct(traits) == 1  # a and b: the same layout, calls and regime
    assert ds["m2"].depth() == 2 and ds["m2"].distinct(traits) == 2
    assert ds["m3"].depth() == 0 and ds["m3"].visible() == []
    assert ds["m1"].caught["bf16"] == tuple(sorted(ids[:2]))


def test_the_depth_tables_list_every_class_below_the_goal_with_its_cases_and_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(km, "load_manifest", lambda _dir: {"cases": ENTRIES})
    ids = [e["id"] for e in ENTRIES]
    muts = [Mutant("deep", object, "gates"), Mutant("thin", object, "gates"), Mutant("was_thin", object, "gates")]
    results = [_r("deep", p, ids) for p in ("f32", "bf16")] + \
              [_r("thin", "f32", ids[2:]), _r("thin", "bf16", [], margin=0.46)] + \
              [_r("was_thin", p, ids[1:]) for p in ("f32", "bf16")]
    text = format_depth(results, ("f32", "bf16"), muts, tmp_path, before={"was_thin": {"f32": 1, "bf16": 2}},
                        reasons={"thin": "measured: x"}, added={"c", "d"})
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| `")}
    main = [line for line in text.splitlines() if line.startswith("| `")]
    assert main[0] == "| `deep` | 4 | 4 | 4 (3) | Hk 2, Hv 4 (gva-2): a, b; Hk 2, Hv 6 (gva-3): d; Hk 3, Hv 3 (mha): c |"
    assert main[1].startswith("| `thin` | 2 | 0 (below rounding, ×0.46) | 2 (2) **(below 3)** |")
    below = main[3:]
    assert [line.split(" | ")[0] for line in below] == ["| `thin`", "| `was_thin`"]  # deep is not listed
    assert below[0] == "| `thin` | 2 | 0 (×0.46) | c, d | measured: x |"
    assert below[1] == "| `was_thin` | 1 -> 3 | 2 -> 3 | c, d | - |"
    assert rows  # (parsed)
    no_reason = format_depth(results, ("f32", "bf16"), muts, tmp_path, before={}, reasons={}, added=set())
    assert "| `thin` | 2 | 0 (×0.46) | - | **no reason stated** |" in no_reason


def test_depth_only_writes_the_depth_block_alone(tmp_path, capsys):
    """`--depth-only --write-docs FILE`: the depth block rewritten, the kill-matrix block untouched;
    a file without a depth block is refused (exit 2, one line) before anything runs."""
    from gdncheck.conformance.meta.__main__ import main

    doc = tmp_path / "meta.md"
    doc.write_text(f"# x\n\n{BEGIN}\nmatrix kept\n{END}\n\n{DEPTH_BEGIN}\nstale\n{DEPTH_END}\n\nafter\n")
    rc = main(["--profiles", "f32", "--mutant", "scale_doubled", "--case", "decode_T12", "--depth-only",
               "--write-docs", str(doc)])
    assert rc == 0
    text = doc.read_text()
    assert "matrix kept" in text and "stale" not in text and text.endswith("\n\nafter\n")
    block = text.split(DEPTH_BEGIN, 1)[1].split(DEPTH_END, 1)[0].strip()
    assert block == capsys.readouterr().out.strip()
    row = next(line for line in block.splitlines() if line.startswith("| `scale_doubled`"))
    assert row.startswith("| `scale_doubled` | 1 | 1 (1) **(below 3)** | Hk 2, Hv 4 (gva-2): decode |"), row
    bare = tmp_path / "bare.md"
    bare.write_text(f"{BEGIN}\nx\n{END}\n")
    with pytest.raises(SystemExit) as e:
        main(["--profiles", "f32", "--mutant", "scale_doubled", "--depth-only", "--write-docs", str(bare)])
    assert e.value.code == 2
    assert "expected a generated depth block" in capsys.readouterr().err
    assert bare.read_text() == f"{BEGIN}\nx\n{END}\n"
