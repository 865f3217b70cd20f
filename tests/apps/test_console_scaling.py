"""verify's console for a failing port (issue 25, item 3): the failing cases in groups first (where
they first diverge, their likely causes), then one line per failing case, the full text of only the
first --details N; --max-fail N / -x stops judging early and says so; repro lines keep the paths as
typed; colour only on a terminal, never with NO_COLOR."""

from __future__ import annotations

import io
import json
import re
import shlex
from collections import Counter

import pytest

from gdncheck.cli import main
from gdncheck.commands.console import Console, use_colour
from gdncheck.commands.grouping import cause_label
from gdncheck.fixtures.manifest import DEFAULT_DIR

#: one bug (the gated norm's weight applied as 1 + w) through a port module of a typical name
PORT = "gdnscale_port:factory"
GATED = ["decode_T12", "chunked", "prefill_T1"]  # first diverge at gated_norm/core_gated
OTHER = "one-key-head"  # norm_weight_plain: first diverges at input_norm
PASSING = "error-head-ratio"  # gdncheck's parser raises the expected error
SELECTION = [a for c in [*GATED, OTHER, PASSING] for a in ("--case", c)]


#: the port: one implementation with two bugs, each seen on its own cases (one run writes one folder:
#: gdncheck run refuses to mix another run's outputs in, and verify a folder of several runs)
PORT_MODULE = """from gdncheck.conformance.meta.mutants import gated_norm_weight_one_plus, norm_weight_plain


def factory(cfg, weights, **options):
    # one-key-head (Hk 1, Hv 4) gets the plain norm weight; every other case the gated norm's 1 + w
    bug = norm_weight_plain if (cfg.num_k_heads, cfg.num_v_heads) == (1, 4) else gated_norm_weight_one_plus
    return bug(cfg, weights, **options)
"""


@pytest.fixture(scope="module")
def port_dir(tmp_path_factory):
    """A folder holding outputs in ``out/`` (written with relative paths from inside it): three cases
    with the gated-norm bug, one with the plain norm weight, one config-error case gdncheck answers."""
    base = tmp_path_factory.mktemp("scaling")
    (base / "gdnscale_port.py").write_text(PORT_MODULE)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(base)
        mp.syspath_prepend(str(base))
        assert main(["run", PORT, "--out", "out", "--profile", "f32", *SELECTION, "-q"]) == 0
    return base


def _verify(port_dir, monkeypatch, capsys, *extra, summary="s.json"):
    monkeypatch.chdir(port_dir)
    monkeypatch.syspath_prepend(str(port_dir))
    code = main(["verify", "--outputs", "out", "--profile", "f32", "--summary", summary, *SELECTION, *extra])
    text = capsys.readouterr().out
    doc = json.loads((port_dir / summary).read_text())
    return code, text, doc


def _groups(text: str, what: str) -> dict[str, int]:
    """The grouped lines ``  N first diverge at X`` / ``  N likely cause: X`` of the console."""
    return {m.group(2): int(m.group(1)) for m in re.finditer(rf"^  +(\d+) {what}(.+)$", text, re.M)}


def test_grouped_summary_counts_match_the_summary_json(port_dir, monkeypatch, capsys):
    code, text, doc = _verify(port_dir, monkeypatch, capsys, "--diagnose", "1")
    assert code == 1
    failing = [c for c in doc["cases"] if c["status"] == "fail"]
    assert len(failing) == 4 and doc["totals"]["failed"] == 4
    # counted here from the JSON, independently of the console's grouping
    stages = Counter(f"{c['first_divergence']['stage']}/{c['first_divergence']['tensor']}" for c in failing)
    assert stages == {"gated_norm/core_gated": 3, "input_norm/x_norm": 1}
    causes = Counter(f"matches: {c['diagnosis']['bug_class']}" if c["diagnosis"]["verdict"] == "matches"
                     else c["diagnosis"]["text"] for c in failing)
    assert sum(causes.values()) == 4 and len(causes) == 2  # one diagnosed, three past --diagnose 1
    lines = text.splitlines()
    head = lines.index(f"4 of {len(doc['cases'])} case(s) fail:")
    assert lines[head + 1].strip() == "3 first diverge at gated_norm/core_gated"  # most cases first
    assert _groups(text, "first diverge at ") == dict(stages)
    assert _groups(text, "likely cause: ") == dict(causes)
    # the groups come before the failing cases' lines, each failing case gets one FAIL line
    fails = [i for i, line in enumerate(lines) if line.startswith("FAIL  ")]
    assert len(fails) == 4 and min(fails) > head
    assert {lines[i].split()[1].rstrip(":") for i in fails} == {c["id"] for c in failing}


def test_cause_labels_group_every_diagnosis_state():
    assert cause_label({"verdict": "matches", "bug_class": "w instead of 1 + w", "residual": 1e-7}) == \
        "matches: w instead of 1 + w"
    assert cause_label({"verdict": "none", "bug_class": "x", "text": "no known bug class matches (closest: x)"}) == \
        "no known bug class matches"
    assert cause_label({"verdict": "skipped", "text": "not diagnosed (only the first 8 failing cases are)"}) == \
        "not diagnosed (only the first 8 failing cases are)"
    assert cause_label(None) == "no diagnosis"
    assert cause_label({"verdict": "error", "text": "no diagnosis: ValueError: x"}).startswith("no diagnosis")


@pytest.mark.parametrize("details, shown", [(None, 3), ("0", 0), ("1", 1), ("2", 2), ("all", 4)])
def test_details_are_limited(port_dir, monkeypatch, capsys, details, shown):
    extra = ["--details", details] if details is not None else []
    code, text, doc = _verify(port_dir, monkeypatch, capsys, "--diagnose", "0", *extra)
    assert code == 1
    lines = text.splitlines()
    assert sum(line.startswith("FAIL  ") for line in lines) == 4  # every failing case has its line
    repros = [i for i, line in enumerate(lines) if line.startswith("      repro: ")]
    assert len(repros) == shown
    for i in repros:  # each detail under its case's FAIL line: the message, then the repro
        assert lines[i - 2].startswith("FAIL  ") and lines[i - 1].startswith("      ")
    hidden = re.search(r"^\((\d+) failing case\(s\) on one line only: --details all", text, re.M)
    assert (int(hidden.group(1)) if hidden else 0) == 4 - shown
    if shown >= 2:  # the first of each first-divergence group: the one input_norm case is among them
        detailed = {lines[i - 2].split()[1].rstrip(":") for i in repros}
        assert any(c.startswith(OTHER) for c in detailed), detailed


@pytest.mark.parametrize("details", ["1", "3", "all"])
def test_the_first_case_printed_in_full_is_of_the_shared_failure(port_dir, monkeypatch, capsys, details):
    # the input_norm case is the smaller group (1 of 4), another bug than the three gated_norm cases
    # share: the shared failure leads, the lone one comes after it, said so (issue 42 item 3; before,
    # issue 36 printed the earliest in the layer first, which put an unrelated failure first)
    _, text, _ = _verify(port_dir, monkeypatch, capsys, "--diagnose", "0", "--details", details)
    lines = text.splitlines()
    full = [i - 2 for i, line in enumerate(lines) if line.startswith("      repro: ")]
    assert "stage gated_norm" in lines[full[0]], lines[full[0]]
    assert next(line for line in lines if line.startswith("FAIL  ")) == lines[full[0]]
    assert "  (1 case(s) fail alone, apparently unrelated to the 3 that first diverge at gated_norm/core_gated: " \
           f"{OTHER}" in text, text
    if details != "1":  # printed in full after the group's case, with the note that says why
        other = next(i for i in full if lines[i].startswith(f"FAIL  {OTHER}"))
        assert other > full[0] and "apparently unrelated" in "\n".join(lines[other:other + 6])


def test_verbose_means_every_detail_unless_details_says(port_dir, monkeypatch, capsys):
    _, text, _ = _verify(port_dir, monkeypatch, capsys, "--diagnose", "0", "--verbose")
    assert text.count("      repro: ") == 4
    _, text, _ = _verify(port_dir, monkeypatch, capsys, "--diagnose", "0", "--verbose", "--details", "1")
    assert text.count("      repro: ") == 1


@pytest.mark.parametrize("flag, n", [(["-x"], 1), (["--max-fail", "2"], 2)])
def test_max_fail_stops_early_and_never_passes(port_dir, monkeypatch, capsys, flag, n):
    code, text, doc = _verify(port_dir, monkeypatch, capsys, "--diagnose", "0", *flag)
    assert code == 1 and doc["exit_code"] == 1 and doc["verdict"] == "does not conform"
    assert doc["totals"]["failed"] == n and len(doc["cases"]) < 5
    assert doc["cases"][-1]["status"] == "fail"  # judging stopped right after the n-th failure
    assert doc["stopped_early"] == {"max_fail": n, "cases_judged": len(doc["cases"]),
                                    "cases_not_judged": 5 - len(doc["cases"])}
    assert any(note.startswith("stopped early:") for note in doc["notes"])
    verdict = text.strip().splitlines()[-1]
    assert verdict.startswith("does not conform: ") and f"stopped early after {n} failing case(s)" in verdict
    from gdncheck.reports.model import load_summary

    load_summary(port_dir / "s.json")  # the schema holds the field (and that it never passes)


def test_max_fail_not_reached_judges_everything(port_dir, monkeypatch, capsys):
    code, text, doc = _verify(port_dir, monkeypatch, capsys, "--diagnose", "0", "--max-fail", "5")
    assert code == 1 and len(doc["cases"]) == 5 and doc["stopped_early"] is None
    assert "stopped early" not in text


def test_max_fail_and_details_are_checked(capsys):
    for argv in (["--max-fail", "0"], ["--max-fail", "x"], ["--details", "-1"], ["--details", "some"]):
        with pytest.raises(SystemExit) as exc:
            main(["verify", "--outputs", ".", "--profile", "f32", *argv])
        assert exc.value.code == 2
        assert "expected a number of" in capsys.readouterr().err


def test_repro_keeps_relative_paths_and_is_short(port_dir, monkeypatch, capsys):
    """The port is a plug-in of the user's (not a built-in, not a gdncheck module): its repro line is verify's own
    command alone (issue 43: a module named by the outputs' metadata is never pasted into a command)."""
    code, text, doc = _verify(port_dir, monkeypatch, capsys, "--diagnose", "0", "--details", "all")
    repros = [line.strip()[len("repro: "):] for line in text.splitlines() if line.startswith("      repro: ")]
    assert len(repros) == 4
    for r in repros:
        assert str(port_dir) not in r and str(DEFAULT_DIR) not in r and "site-packages" not in r, r
        assert r.startswith("gdncheck verify --outputs out ") and "--fixtures" not in r and PORT not in r, r
        assert len("      repro: " + r) <= 160, r
    # the summary keeps the judge's full form (absolute default fixtures, full case ids)
    ours = next(r for r in repros if " --case dec" in r)
    full = next(c["repro"] for c in doc["cases"] if c["status"] == "fail" and c["id"].startswith("decode_T12"))
    assert str(DEFAULT_DIR) in full and len(full) > len(ours)
    # the short case name selects that case alone, and the line re-judges it
    verify = shlex.split(ours)
    case = verify[verify.index("--case") + 1]
    assert main(verify[1:] + ["--summary", "one.json"]) == 1
    one = json.loads((port_dir / "one.json").read_text())
    assert [c["id"] for c in one["cases"]] == [next(c["id"] for c in doc["cases"] if c["id"].startswith(case))]


def test_repro_keeps_a_typed_fixture_folder_and_verify_options(port_dir, monkeypatch, capsys):
    (port_dir / "fx").symlink_to(DEFAULT_DIR, target_is_directory=True) if not (port_dir / "fx").exists() else None
    _, text, _ = _verify(port_dir, monkeypatch, capsys, "--diagnose", "0", "--fixtures", "fx", "--names", "hf",
                         "--details", "1")
    repro = next(line for line in text.splitlines() if line.startswith("      repro: "))
    verify = shlex.split(repro.split(" && ")[-1])
    assert verify[verify.index("--fixtures") + 1] == "fx" and verify[verify.index("--names") + 1] == "hf"


def test_colour_only_on_a_terminal_and_never_with_no_color(port_dir, monkeypatch, capsys):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert use_colour(Tty(), {}) and use_colour(Tty(), {"NO_COLOR": ""})
    assert not use_colour(Tty(), {"NO_COLOR": "1"}) and not use_colour(Tty(), {"TERM": "dumb"})
    assert not use_colour(io.StringIO(), {})

    class Args:
        quiet = json = False

    con = Console(Args())
    con.colour = True
    assert con.mark("FAIL  x: y") == "\x1b[1;31mFAIL\x1b[0m  x: y" and con.mark("note: FAIL") == "note: FAIL"
    con.colour = False
    assert con.mark("FAIL  x: y") == "FAIL  x: y"
    _, text, _ = _verify(port_dir, monkeypatch, capsys, "--diagnose", "0")  # captured: no terminal
    assert "\x1b" not in text


def test_the_new_options_have_help(capsys):
    with pytest.raises(SystemExit):
        main(["verify", "--help"])
    text = capsys.readouterr().out
    for option in ("--details N|all", "--max-fail N", "-x "):
        assert option in text, option
