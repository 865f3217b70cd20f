"""The built-in `onnxruntime` for implementations.py's import: the adapter lives in its engine's folder,
conformance/engines/onnxruntime/adapter.py (docs/layout.md, "Adding an engine")."""

from gdncheck.conformance.engines.onnxruntime.adapter import onnxruntime  # noqa: F401
