"""gdncheck.reports: HTML diff reports of a verify summary, and short text / Markdown summaries.

Library API (what `gdncheck report`, `gdncheck verify --report` and the gate call)::

    from gdncheck.reports import write_report, text_summary, markdown_summary

    index = write_report(summary, out_dir, *, fixtures_dir=None, outputs_dir=None, top_k=10,
                         progress=None) -> Path
    text = text_summary(summary, *, report=None, max_cases=20) -> str
    md = markdown_summary(summary, *, report=None, max_cases=50) -> str

`summary` is a verify summary (a path to its JSON or the parsed dict), checked against its schema;
a bad one raises `ReportInputError` (code `report_input`). `write_report` replaces `out_dir` as a
whole and refuses a non-empty folder that is not an earlier report.

The API, the modules and the pages: docs/report.md ("Library", "The site").
"""

from .model import ReportInputError, load_summary
from .site import write_report
from .summaries import markdown_summary, text_summary

__all__ = ["ReportInputError", "load_summary", "markdown_summary", "text_summary", "write_report"]
