"""Write the static report site: ``index.html``, one page per case, the plots beside them.

The site is a folder that opens from ``file://``: one stylesheet beside the index (``style.css``, shared
by every page: inline, it cost each case page 7 kB), a few lines of inline JavaScript for
the index filters (the pages read the same without it), heatmap PNGs in ``cases/<case>/`` and the
line plots inline (SVG), no network.
Pages come from the Jinja2 templates in ``templates/`` with autoescaping on, so every string from a
port's files (case and tensor names, metadata, messages) is shown as text.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from . import plots
from .assets import render_case
from .model import ReportInputError, ReportView, build, fmt_num, load_summary

TEMPLATES = Path(__file__).with_name("templates")
MARKER = ".gdncheck-report"
TOP_K = 10


def environment() -> Environment:
    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=True, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["num"] = fmt_num
    env.filters["times"] = lambda v: "—" if v is None else f"×{fmt_num(v)}"
    env.filters["idx"] = lambda v: "—" if v is None else "[" + ", ".join(str(i) for i in v) + "]"
    env.filters["under"] = lambda s: str(s).replace("_", " ")
    env.globals["EMPTY"] = defaultdict(lambda: None)  # metrics of a record that has none: every field "—"
    return env


def check_report_folder(out_dir: str | Path) -> Path:
    """``out_dir`` as a Path if a report may replace it (new, empty, or an earlier report), else
    :class:`ReportInputError`: the report replaces its folder whole, and someone's files are not its."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / MARKER).is_file())):
        raise ReportInputError(f"{out} exists and is not an earlier gdncheck report: choose another folder "
                               f"(the report replaces its folder as a whole)")
    return out


def write_report(summary: str | Path | dict, out_dir: str | Path, *, fixtures_dir: str | Path | None = None,
                 outputs_dir: str | Path | None = None, top_k: int = TOP_K, progress=None) -> Path:
    """Write the report of ``summary`` (a verify summary: path or parsed dict) into ``out_dir``.

    ``fixtures_dir`` / ``outputs_dir`` say where the fixture and output files are when they moved
    since verify ran (otherwise the paths the records name are used). Returns the path of
    ``index.html``. ``out_dir`` is replaced as a whole (written beside it, then renamed); a folder
    that is not empty and holds no earlier report is refused. ``progress(case_view)`` is called
    after each case page.
    """
    doc = load_summary(summary)
    out = check_report_folder(out_dir)
    view = build(doc)
    # files are read only inside the folders the summary records (or those given): never where a
    # record's file name alone would lead
    roots = {"expected": doc["fixtures"].get("dir"), "actual": doc["outputs"].get("dir")}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        env = environment()
        cases_dir = tmp / "cases"
        cases_dir.mkdir()
        (tmp / "colorbar.svg").write_bytes(plots.colorbar())
        shutil.copyfile(TEMPLATES / "style.css", tmp / "style.css")
        case_tpl = env.get_template("case.html.j2")
        for case in view.cases:
            render_case(case, cases_dir, doc["profile"], fixtures_dir, outputs_dir, top_k, roots)
            (cases_dir / f"{case.page}.html").write_text(case_tpl.render(view=view, s=doc, case=case), encoding="utf-8")
            if progress:
                progress(case)
        (tmp / "index.html").write_text(env.get_template("index.html.j2").render(view=view, s=doc), encoding="utf-8")
        (tmp / MARKER).write_text("written by gdncheck report; the folder is replaced as a whole\n")
        os.chmod(tmp, 0o755)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out / "index.html"


__all__ = ["write_report", "ReportInputError", "ReportView"]
