"""The gate's index page is rendered from a Jinja template (reports/templates/gate.html.j2) like every
other report, escaping what a port or a case supplies."""

from __future__ import annotations

from pathlib import Path

from gdncheck.gate.report import index_page


def test_the_gate_index_is_the_template_escaped():
    doc = {"verdict": "does not conform", "exit_code": 1,
           "implementation": {"spec": "evil<script>x</script>", "device": "cpu"},
           "selection": {"run": 2, "skipped": [{"case": "c&d", "profiles": ["f32"], "reason": "<b>r</b>"}]},
           "properties": {"results": [{"profile": "f32", "name": "p<1>", "status": "fail", "message": "m\nmore",
                                       "replay": "gdncheck gate --property p"}]},
           "profiles": {"f32": {"totals": {"cases": 2, "passed": 1, "failed": 1}, "exit_code": 1,
                                "verdict": "does not conform",
                                "failures": [{"case": "a<b", "message": "<i>m</i>", "repro": "gdncheck run x"}]}}}
    page = index_page(doc, "console <text>", {"f32": Path("/r/f32/index.html")}, Path("/r"))
    assert "<script>x</script>" not in page and "evil&lt;script&gt;x&lt;/script&gt;" in page
    assert "&lt;i&gt;m&lt;/i&gt;" in page and "a&lt;b" in page and "c&amp;d" in page and "&lt;b&gt;r&lt;/b&gt;" in page
    assert "<pre>console &lt;text&gt;</pre>" in page and "<style>" in page and "property p&lt;1&gt;" in page
    row = page.split("<tbody>")[1].split("</tbody>")[0]
    assert row.startswith('<tr><td><a href="f32/index.html">f32</a></td>') and 'class="verdict fail"' in row
    assert (Path(__file__).parents[2] / "reports" / "templates" / "gate.html.j2").is_file()
