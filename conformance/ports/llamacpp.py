"""The built-in `llamacpp` for implementations.py's import: the adapter lives in its engine's folder,
conformance/engines/llamacpp/adapter.py (docs/layout.md, "Adding an engine")."""

from gdncheck.conformance.engines.llamacpp.adapter import llamacpp  # noqa: F401
