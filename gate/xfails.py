"""The gate's known failures (xfails): ``gate/xfails.txt`` is the packaged default file.

The format, its parser and the classification are the judge's
(:mod:`gdncheck.conformance.judge.xfails`), shared with ``gdncheck verify --xfails`` and the pytest
plugin's ``--gdncheck-xfails``::

    IMPL  PROFILE  CASE  WHAT  # reason
    triton  f32  wide-d1024_T4_Hk1_Hv2_dk16_dv16  core_gated,attn_out  # why, and where it is tracked

``IMPL`` is the ``--impl`` spec (or the name the implementation gives itself) or ``*``; ``PROFILE``
a profile or ``*``; ``CASE`` a case id or id prefix; ``WHAT`` the only tensors or stages allowed to
fail (comma-separated, or ``*``). A failing case whose failing tensors are all covered by an entry
is reported as *known failure* with the reason and does not fail the gate; anything else it fails
still does. An entry that matches no failure of a case that ran is *stale* (the case passes now),
and one that matches no case in any profile is listed: the gate warns, so the file cannot rot
silently. The gate judges known failures through verify, so a known failure never makes a broken
coverage rule (a required case declared not applicable, nothing passed) a pass.
"""

from __future__ import annotations

from pathlib import Path

from gdncheck.conformance.judge.xfails import MAX_XFAILS_BYTES, XFail, classify
from gdncheck.conformance.judge.xfails import load_xfails as _load_xfails

__all__ = ["DEFAULT_PATH", "MAX_XFAILS_BYTES", "XFail", "classify", "load_xfails"]

DEFAULT_PATH = Path(__file__).with_name("xfails.txt")


def load_xfails(path: str | Path | None = None) -> list[XFail]:
    """The entries of ``path`` (default: the packaged ``gate/xfails.txt``)."""
    return _load_xfails(Path(path) if path else DEFAULT_PATH)
