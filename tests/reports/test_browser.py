"""The report of a failing run in a real browser: Playwright drives headless Chromium (Debian's, found
on PATH: Playwright downloads no browser of its own), which opens the report from file:// with no
network; the tests read console errors, failed loads, the DOM and screenshots, and use the filters
as a person would (clicks, a select).

Screenshots and a copy of the report land in ``artifacts/`` (CI uploads it). Without Chromium or
without Playwright (the dev extra) the tests skip and say why; with ``GDN_REQUIRE_BROWSER=1``
(``.ci/run`` sets it once its install worked) they fail instead, so CI never passes without having
looked.
"""

from __future__ import annotations

import os
import shutil
from io import BytesIO
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gdncheck.reports.model import build

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
VIEWPORT = {"width": 1280, "height": 900}
# Playwright adds its own automation flags; these keep Chromium off the network and quiet on a
# machine whose only network is a package mirror (its background fetches would be refused at every start)
FLAGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars",
         "--mute-audio"]


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def unavailable(why: str):
    if os.environ.get("GDN_REQUIRE_BROWSER") == "1":
        pytest.fail(why + " (GDN_REQUIRE_BROWSER=1)")
    pytest.skip(why)


@pytest.fixture(scope="module")
def browser():
    exe = find_chromium()
    if exe is None:
        unavailable("no chromium on PATH: .ci/run installs Debian's chromium (apt-get install -y chromium); here the "
                    "install failed or was not run, so the report was not checked in a browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("playwright is not installed (it comes with the dev extra: scripts/bootstrap), so the report "
                    "was not checked in a browser")
    with sync_playwright() as pw:
        # Playwright starts Chromium on a new empty profile folder of its own and removes it at close
        chromium = pw.chromium.launch(executable_path=exe, headless=True, args=FLAGS)
        try:
            yield Browser(chromium)
        finally:
            chromium.close()


class Browser:
    """:meth:`open` loads a page in a fresh browser context (no cookies, storage or cache from an
    earlier page) and records what goes wrong on it."""

    def __init__(self, chromium):
        self.chromium = chromium
        self.page = None
        self.errors: list[str] = []

    def open(self, url: str, *, javascript: bool = True, viewport: dict | None = None) -> None:
        if self.page is not None:
            self.page.context.close()
        self.errors = []
        self.page = page = self.chromium.new_context(viewport=viewport or VIEWPORT,
                                                     java_script_enabled=javascript).new_page()
        page.on("console", lambda m: m.type in ("error", "assert") and self.errors.append(f"console: {m.text}"))
        page.on("pageerror", lambda e: self.errors.append(f"exception: {e}"))
        page.on("requestfailed", lambda r: self.errors.append(f"failed load: {r.url} ({r.failure})"))
        page.goto(url, wait_until="load")

    def evaluate(self, expression: str):
        return self.page.evaluate(expression)

    def console_errors(self) -> list[str]:
        """Console errors, uncaught exceptions and failed loads since the last :meth:`open`."""
        self.page.evaluate("0")  # a round trip: every event sent before it has arrived
        return list(self.errors)

    def load_images(self) -> list[dict]:
        """Load every image now (lazy ones too); each image's src, natural width and whether it decoded."""
        return self.page.evaluate(
            "Promise.all(Array.from(document.images).map(i => { i.loading = 'eager'; "
            "return i.decode().then(() => ({src: i.getAttribute('src'), width: i.naturalWidth, ok: true}), "
            "() => ({src: i.getAttribute('src'), width: i.naturalWidth, ok: false})); }))")

    def screenshot(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(path))
        return path


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
    # the filters as a person uses them: a click turns passing cases off, then one tag is chosen
    page = browser.page
    page.click("input[name=status][value=pass]")
    assert page.is_checked("input[name=status][value=pass]") is False
    assert visible_rows(browser) == 2
    page.select_option("select[name=tag]", "dk-ne-dv")
    assert visible_rows(browser) == 1
    assert browser.evaluate("document.querySelector('#grid tbody tr:not([hidden]) a').textContent") == \
        "dk-gt-dv_T63_Hk2_Hv6_dk16_dv8_s0"
    assert browser.console_errors() == []


def test_index_without_javascript(browser, tiled_report):
    browser.open(tiled_report.as_uri(), javascript=False)
    assert browser.evaluate("document.getElementById('shown').textContent") == ""  # filters.js did not run
    assert visible_rows(browser) == 4
    assert browser.evaluate("document.getElementById('filters').offsetParent") is None  # hidden filters
    stages = browser.evaluate("document.querySelectorAll('#grid thead th.stage').length")
    assert stages == 13  # docs/spec.md §2 stages but the input, and seq_len
    # three rows of cells; the expected-error case is one spanning cell
    assert browser.evaluate("document.querySelectorAll('#grid td.c').length") == 3 * stages


def test_failing_case_in_a_browser(browser, tiled, tiled_report, artifacts):
    case = next(c for c in build(tiled.doc).cases if c.status == "fail")
    browser.open((tiled_report.parent / "cases" / f"{case.page}.html").as_uri())
    images = browser.load_images()
    assert images and all(i["ok"] and i["width"] > 0 for i in images), [i for i in images if not i["ok"]]
    assert browser.console_errors() == []
    plotted = browser.evaluate("document.querySelectorAll('section.tensor img.heatmap').length")
    assert plotted == 3  # the first divergence and the two worst others: not every failing tensor
    assert browser.evaluate("document.querySelectorAll('section.tensor svg.histogram').length") == plotted
    assert 1 <= browser.evaluate("document.querySelectorAll('section.tensor svg.drift').length") <= plotted
    assert browser.evaluate("document.querySelector('section.tensor').id") == \
        next(r.anchor for r in case.records if r.first)
    shot = browser.screenshot(artifacts / "report-case.png")
    not_blank(shot)
    browser.page.locator("section.tensor.first").scroll_into_view_if_needed()
    not_blank(browser.screenshot(artifacts / "report-case-first-divergence.png"))


def test_serving_case_in_a_browser(browser, leak, leak_report, artifacts):
    """A packed case: every image decodes (the per-sequence panels too), each failing step's
    sequence table is shown open, each failing stream tensor has its per-sequence figure."""
    case = build(leak.doc).cases[0]
    browser.open((leak_report.parent / "cases" / f"{case.page}.html").as_uri())
    images = browser.load_images()
    assert images and all(i["ok"] and i["width"] > 0 for i in images), [i for i in images if not i["ok"]]
    assert browser.console_errors() == []
    failing_steps = [st.step for st in case.steps if st.failed]
    shown = browser.evaluate("Array.from(document.querySelectorAll('table.seqs[id^=layout-]'))"
                             ".filter(t => t.offsetParent).map(t => t.id)")
    assert shown == [f"layout-{s}" for s in failing_steps]
    # a panel figure for each failing stream tensor with a sequence of more than one token
    streams = [r for r in case.records if r.verdict == "fail" and r.tensor in ("qkv_conv", "core", "out")
               and any(n > 1 for n in np.diff(case.serving[r.step]["cu_seqlens"]))]
    featured = [r for r in streams if r.anchor in browser.evaluate(
        "Array.from(document.querySelectorAll('section.tensor')).filter(s => s.querySelector('img.heatmap'))"
        ".map(s => s.id)")]
    assert featured  # the first divergence is a stream tensor
    assert browser.evaluate("document.querySelectorAll('figure.seq-plot svg').length") == len(featured)
    assert browser.evaluate("document.querySelector('figure.seq-plot svg').getBoundingClientRect().width") == 528
    browser.page.locator("figure.seq-plot").first.scroll_into_view_if_needed()
    not_blank(browser.screenshot(artifacts / "report-serving-case.png"))


WIDE = {"width": 1400, "height": 900}


@pytest.fixture(scope="module")
def one_token(tmp_path_factory):
    """norm_weight_plain on the one-token prefill: every call is one token long."""
    from .conftest import mutant_run

    run = mutant_run(tmp_path_factory, "norm_weight_plain", ["prefill_T1_"])
    from gdncheck.reports import write_report

    return run, write_report(run.doc, tmp_path_factory.mktemp("one-token") / "site")


def plot_elements(b) -> list[dict]:
    """Every plot element of the page: its kind, whether it holds data (an image that decoded with
    pixels; an SVG that drew values: its data-points, and a path for them) and its top on the page."""
    return b.evaluate(
        "Array.from(document.querySelectorAll('img.plot, svg.plot')).map(e => ({"
        "kind: e.getAttribute('class'), top: e.getBoundingClientRect().top + window.scrollY, "
        "data: e.tagName === 'IMG' ? (e.complete && e.naturalWidth > 0) : "
        "(Number(e.dataset.points) > 0 && e.querySelectorAll('path.data').length > 0)}))")


def test_a_case_page_reads_top_down_and_fits_1400_px(browser, tiled, tiled_report, artifacts):
    """At 1400 × 900: the verdict and the first divergence (its message, the likely cause) come first,
    then its plots, then the folded tables; nothing is wider than the window, the metrics tables
    included (they fit their box); the calls other than the first divergence's are folded."""
    view = build(tiled.doc)
    for case in (c for c in view.cases if c.status == "fail"):
        browser.open((tiled_report.parent / "cases" / f"{case.page}.html").as_uri(), viewport=WIDE)
        browser.load_images()
        assert browser.console_errors() == []
        assert browser.evaluate("document.documentElement.scrollWidth") <= 1400
        assert browser.evaluate("Array.from(document.querySelectorAll('details.call')).every(d => { const o = d.open; "
                                "d.open = true; const fits = Array.from(d.querySelectorAll('.scroll')).every("
                                "s => s.scrollWidth <= s.clientWidth); d.open = o; return fits; })")
        assert browser.evaluate("document.documentElement.scrollWidth") <= 1400
        first = browser.evaluate("document.getElementById('first').getBoundingClientRect().top + window.scrollY")
        plots = plot_elements(browser)
        assert plots and all(p["data"] for p in plots), plots
        assert first < min(p["top"] for p in plots)  # the first divergence above the first plot
        assert first < 900  # in the first screen
        section = browser.evaluate("document.querySelector('section.tensor').id")
        assert section == next(r.anchor for r in case.records if r.first)
        pipeline = browser.evaluate("document.getElementById('pipeline').getBoundingClientRect().top + window.scrollY")
        assert min(p["top"] for p in plots) < pipeline  # the plots before the tables
        opened = browser.evaluate("Array.from(document.querySelectorAll('details.call')).filter(d => d.open)"
                                  ".map(d => d.id)")
        assert opened == [f"call-{case.first.step}"], opened
    not_blank(browser.screenshot(artifacts / "report-case-1400.png"))


def test_a_one_token_call_gets_no_empty_plot(browser, one_token, artifacts):
    """Every call of the case is one token: the failing tensors' sections show a heatmap and a
    histogram (the token's elements) and no error-over-tokens curve, and no plot element is empty."""
    run, report = one_token
    case = build(run.doc).cases[0]
    assert case.status == "fail"
    browser.open((report.parent / "cases" / f"{case.page}.html").as_uri(), viewport=WIDE)
    browser.load_images()
    assert browser.console_errors() == []
    plots = plot_elements(browser)
    assert plots and all(p["data"] for p in plots), plots
    assert not [p for p in plots if "drift" in p["kind"]]  # one token: a number, not a curve
    assert browser.evaluate("document.querySelectorAll('section.tensor.first img.heatmap').length") == 1
    assert browser.evaluate("document.documentElement.scrollWidth") <= 1400
    not_blank(browser.screenshot(artifacts / "report-one-token-case.png"))


def test_the_index_fits_1400_px(browser, tiled_report):
    browser.open(tiled_report.as_uri(), viewport=WIDE)
    assert browser.console_errors() == []
    assert browser.evaluate("document.documentElement.scrollWidth") <= 1400


def test_a_sharded_case_in_a_browser(browser, sharded, sharded_report, artifacts):
    """A sharded case (docs/sharding.md) at 1400 px: its metrics tables show each rank's figures as the summary
    holds them (the first divergence's row: rank 0's out_proj partial), nothing wider than the window, the first
    divergence box names the rank; a passing sharded case's rows are numbers, none a dash."""
    from gdncheck.reports.model import fmt_num

    from .conftest import SHARDED_CASES

    uneven, even = SHARDED_CASES
    case = next(c for c in sharded.doc["cases"] if c["id"] == uneven)
    f = next(r for r in case["records"] if r["verdict"] == "fail")["shard"]
    browser.open((sharded_report.parent / "cases" / f"{uneven}.html").as_uri(), viewport=WIDE)
    assert browser.console_errors() == []
    assert browser.evaluate("document.documentElement.scrollWidth") <= 1400
    assert browser.evaluate("Array.from(document.querySelectorAll('details.call')).map(d => { d.open = true; "
                            "const s = d.querySelector('table.ranks').closest('.scroll'); "
                            "return s.offsetParent !== null && s.scrollWidth <= s.clientWidth; })") == [True, True]
    row = browser.evaluate("Array.from(document.querySelector('table.ranks tr.first').cells).map(c => c.innerText)")
    assert row[2:4] == ["rank 0", "attn_out_partial"], row
    assert row[6:] == [fmt_num(f["max_err"]), fmt_num(f["elem_bound"]), "×" + fmt_num(f["max_err"] / f["elem_bound"]),
                       fmt_num(f["nmse"]), fmt_num(f["nmse_bound"]), "×" + fmt_num(f["nmse"] / f["nmse_bound"])], row
    assert "rank 0: attn_out_partial" in browser.evaluate("document.getElementById('first').innerText")
    not_blank(browser.screenshot(artifacts / "report-sharded-case.png"))
    browser.open((sharded_report.parent / "cases" / f"{even}.html").as_uri(), viewport=WIDE)
    assert browser.console_errors() == []
    numbers = browser.evaluate("Array.from(document.querySelectorAll('table.ranks tbody tr')).map(r => "
                               "Array.from(r.cells).slice(6).map(c => c.innerText))")
    assert len(numbers) > 10 and all("—" not in n for n in numbers), numbers
    not_blank(browser.screenshot(artifacts / "report-sharded-pass.png"))
