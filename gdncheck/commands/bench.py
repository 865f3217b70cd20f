"""``gdncheck bench``: the reference benchmark (same as ``python -m gdncheck.bench``)."""

from __future__ import annotations

from gdncheck.bench import __doc__ as DESCRIPTION  # noqa: N812
from gdncheck.bench import add_arguments as configure
from gdncheck.bench import run_from_args as run

__all__ = ["DESCRIPTION", "configure", "run"]
