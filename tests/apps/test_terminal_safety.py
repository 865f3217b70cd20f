"""Terminal safety (issue 11, item 8): every string a port supplies (error messages and codes,
implementation names, reasons, tensor names) reaches the console as one line of visible characters:
no carriage return, ANSI escape or bidirectional override can forge, overwrite or hide a verdict."""

from __future__ import annotations

import json

from gdncheck.cli import main
from tests.apps.plugins import FORGED
from tests.fixtures.outputs import perfect_outputs

CASES = ["--case", "prefill_T1_", "--case", "decode_T12"]
RAW = ("\x1b", "\r", "\u202e")


def _clean(text: str, verdicts: int = 0) -> None:
    """No raw control character, and no line that a port's words forged (``verdicts``: the real ones)."""
    assert not any(ch in text for ch in RAW), repr(text)
    lines = text.splitlines()
    assert sum(line.startswith("gdncheck gate: ") for line in lines) == verdicts, lines
    assert not any(line.startswith("PASS everything") for line in lines), lines


def test_run_verify_and_gate_print_a_ports_words_as_visible_text(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["run", "tests.apps.plugins:forging", "--out", str(out), "--profile", "f32", *CASES])
    text = capsys.readouterr().out
    assert code == 0 and "refused" in text and "\\x1b[2K" in text  # shown, escaped
    _clean(text)
    code = main(["verify", "--outputs", str(out), "--profile", "f32", *CASES])
    text = capsys.readouterr().out
    assert code == 1 and "\\r\\x1b[2K" in text
    _clean(text)
    code = main(["gate", "--impl", "tests.apps.plugins:forging_name", "--profiles", "f32", *CASES,
                 "--no-properties", "--no-rebuild-check", "--jobs", "1", "--out", str(tmp_path / "gate"), "-q"])
    text = capsys.readouterr().out
    assert code == 0, text
    _clean(text, verdicts=1)
    doc = json.loads((tmp_path / "gate" / "gate-summary.json").read_text())
    assert "\\x1b" in doc["implementation"]["name"]


def test_names_and_reasons_in_an_outputs_file_are_visible_text(fixtures_dir, tmp_path, capsys):
    def hostile_name(t):
        t["calls.0.evil" + FORGED] = t["calls.0.out"]

    perfect_outputs(fixtures_dir, "prefill_T1_", tmp_path, alter=hostile_name,
                    meta={"implementation": "port" + FORGED})
    perfect_outputs(fixtures_dir, "snapshot-replay", tmp_path,
                    meta={"not_applicable": "no files" + FORGED, "not_applicable_step": "3"})
    code = main(["verify", "--outputs", str(tmp_path), "--profile", "f32", "--case", "prefill_T1_", "--case",
                 "snapshot-replay"])
    text = capsys.readouterr().out
    assert code == 0 and "unknown tensor name(s) ignored" in text and "no files\\r" in text
    _clean(text)


def test_safe_text_escapes_every_control():
    from gdncheck.untrusted import safe_text

    assert safe_text("a\rb\x1b[2Kc\nd\u202ee\x00\x9b\u2028") == "a\\rb\\x1b[2Kc\\nd\\u202ee\\x00\\x9b\\u2028"
    assert safe_text("line one\nline two", keep_newlines=True) == "line one\nline two"
    assert safe_text("plain ünïcödé ✓ — text") == "plain ünïcödé ✓ — text"
