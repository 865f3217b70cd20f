"""gdncheck.reports: HTML diff reports of a verify summary, and short text / Markdown summaries.

Library API (what ``gdncheck report``, ``gdncheck verify --report`` and the gate call)::

    from gdncheck.reports import write_report, text_summary, markdown_summary

    index = write_report(summary, out_dir, *, fixtures_dir=None, outputs_dir=None, top_k=10,
                         progress=None) -> Path
    text = text_summary(summary, *, report=None, max_cases=20) -> str
    md = markdown_summary(summary, *, report=None, max_cases=50) -> str

- ``summary``: a verify summary, as a path to its JSON or the parsed dict (``Summary.to_json()``);
  it is checked against ``conformance/judge/summary.schema.json``; a bad one raises
  :class:`ReportInputError` (a ``GDNError``, code ``report_input``).
- ``write_report`` writes a static site into ``out_dir`` (replaced as a whole; a non-empty folder
  that is not an earlier report is refused) and returns the path of its ``index.html``. Plots
  need the full tensors: the files the records point to, or the same names in ``fixtures_dir`` /
  ``outputs_dir`` when they moved; without them a page says so and shows the summary's numbers.
- ``text_summary`` is a few lines for a CI log; ``markdown_summary`` is for a CI job summary
  (append it to ``$GITHUB_STEP_SUMMARY``); ``report`` is a path or URL of the site to mention.

Modules: :mod:`.model` (summary → view data), :mod:`.tensors` (reload tensors, errors, pooling,
worst elements), :mod:`.plots` (inline SVG, palette-PNG heatmaps), :mod:`.site` (Jinja2 pages), :mod:`.summaries`.
docs/report.md describes the pages.
"""

from .model import ReportInputError, load_summary
from .site import write_report
from .summaries import markdown_summary, text_summary

__all__ = ["ReportInputError", "load_summary", "markdown_summary", "text_summary", "write_report"]
