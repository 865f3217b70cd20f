"""The built-in `hf` for implementations.py's import: the adapter lives in its engine's folder,
conformance/engines/hf/adapter.py (docs/layout.md, "Adding an engine")."""

from gdncheck.conformance.engines.hf.adapter import hf  # noqa: F401
