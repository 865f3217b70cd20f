"""The built-in `ggml` for implementations.py's import: the adapter lives in its engine's folder,
conformance/engines/ggml/adapter.py (docs/layout.md, "Adding an engine")."""

from gdncheck.conformance.engines.ggml.adapter import ggml  # noqa: F401
