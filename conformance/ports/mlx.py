"""The built-in `mlx` for implementations.py's import: the adapter lives in its engine's folder,
conformance/engines/mlx/adapter.py (docs/layout.md, "Adding an engine")."""

from gdncheck.conformance.engines.mlx.adapter import mlx  # noqa: F401
