"""The report of a failing run in a real browser: headless Chromium opens it from file:// with no
network, and the DevTools protocol reports console errors, the DOM and a screenshot.

Screenshots and a copy of the report land in ``artifacts/`` (CI uploads it). Without Chromium the
tests skip and say why; with ``GDN_REQUIRE_BROWSER=1`` (``.ci/run`` sets it once its install
worked) they fail instead, so CI never passes without having looked.
"""

from __future__ import annotations

import os
import shutil
from io import BytesIO
from pathlib import Path

import pytest
from PIL import Image

from gdncheck.reports.model import build

from .cdp import Browser, find_chromium

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


@pytest.fixture(scope="module")
def browser():
    exe = find_chromium()
    if exe is None:
        why = ("no chromium on PATH: .ci/run installs Debian's chromium (apt-get install -y chromium); here the "
               "install failed or was not run, so the report was not checked in a browser")
        if os.environ.get("GDN_REQUIRE_BROWSER") == "1":
            pytest.fail(why + " (GDN_REQUIRE_BROWSER=1)")
        pytest.skip(why)
    with Browser(exe) as b:
        yield b


@pytest.fixture(scope="module")
def artifacts(tiled_report):
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copytree(tiled_report.parent, ARTIFACTS / "report", dirs_exist_ok=True)
    return ARTIFACTS


def not_blank(png: Path) -> None:
    img = Image.open(BytesIO(png.read_bytes())).convert("RGB").resize((320, 225))
    colors = img.getcolors(maxcolors=1 << 16) or []
    white = sum(n for n, (r, g, b) in colors if min(r, g, b) > 245)
    assert len(colors) > 20 and white < 0.95 * 320 * 225, f"{png} looks blank"


def visible_rows(b) -> int:
    return b.evaluate("Array.from(document.querySelectorAll('#grid tbody tr')).filter(r => r.offsetParent).length")


def test_index_in_a_browser(browser, tiled, tiled_report, artifacts):
    browser.open(tiled_report.as_uri())
    assert browser.console_errors() == []
    assert browser.evaluate("document.title").startswith("gdncheck report: does not conform")
    assert visible_rows(browser) == 4
    assert browser.evaluate("document.querySelectorAll('#grid td.c.fail').length") > 10
    assert browser.evaluate("Array.from(document.querySelectorAll('#grid td.first')).map(td => "
                            "td.closest('table').querySelectorAll('thead th')[td.cellIndex].textContent)") == \
        ["delta_rule", "delta_rule"]
    assert browser.evaluate("getComputedStyle(document.getElementById('verdict')).backgroundColor") == \
        "rgb(165, 29, 29)"
    assert browser.evaluate("document.getElementById('filters').hidden") is False
    assert browser.evaluate("document.getElementById('shown').textContent") == "4 of 4 cases shown"
    shot = browser.screenshot(artifacts / "report-index.png")
    not_blank(shot)
    # the filters: passing cases off, then one tag
    browser.evaluate("document.querySelector('input[name=status][value=pass]').click()")
    assert visible_rows(browser) == 2
    browser.evaluate("var s = document.querySelector('select[name=tag]'); s.value = 'decode'; "
                     "s.dispatchEvent(new Event('change', {bubbles: true}))")
    assert visible_rows(browser) == 1
    assert browser.evaluate("document.querySelector('#grid tbody tr:not([hidden]) a').textContent") == \
        "decode_T12_Hk2_Hv4_dk16_dv8_s0"
    assert browser.console_errors() == []


def test_index_without_javascript(browser, tiled_report):
    browser.open(tiled_report.as_uri(), javascript=False)
    assert visible_rows(browser) == 4
    assert browser.evaluate("document.getElementById('filters').offsetParent") is None  # hidden filters
    stages = browser.evaluate("document.querySelectorAll('#grid thead th.stage').length")
    assert stages == 13  # SPEC §2 stages but the input, and seq_len
    # three rows of cells; the expected-error case is one spanning cell
    assert browser.evaluate("document.querySelectorAll('#grid td.c').length") == 3 * stages


def test_failing_case_in_a_browser(browser, tiled, tiled_report, artifacts):
    case = next(c for c in build(tiled.doc).cases if c.status == "fail")
    browser.open((tiled_report.parent / "cases" / f"{case.page}.html").as_uri())
    images = browser.load_images()
    assert images and all(i["ok"] and i["width"] > 0 for i in images), [i for i in images if not i["ok"]]
    assert browser.console_errors() == []
    failing = sum(r.verdict == "fail" for r in case.records)
    for kind in ("heatmap", "histogram", "drift"):
        assert browser.evaluate(f"document.querySelectorAll('section.tensor img.{kind}').length") == failing, kind
    assert browser.evaluate("document.querySelector('section.tensor').id") == \
        next(r.anchor for r in case.records if r.first)
    shot = browser.screenshot(artifacts / "report-case.png")
    not_blank(shot)
    browser.evaluate("document.querySelector('section.tensor.first').scrollIntoView()")
    not_blank(browser.screenshot(artifacts / "report-case-first-divergence.png"))
