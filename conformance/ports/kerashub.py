"""The built-in `keras` for implementations.py's import: the adapter lives in its engine's folder,
conformance/engines/keras/adapter.py (docs/layout.md, "Adding an engine")."""

from gdncheck.conformance.engines.keras.adapter import keras  # noqa: F401
