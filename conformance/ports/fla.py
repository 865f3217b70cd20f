"""The built-in `fla` for implementations.py's import: the adapter lives in its engine's folder,
conformance/engines/fla/adapter.py (docs/layout.md, "Adding an engine")."""

from gdncheck.conformance.engines.fla.adapter import fla  # noqa: F401
