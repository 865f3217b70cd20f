"""The engine reference: the baseline row (its glue is the built-in reference, conformance/ports/implementations.py)."""
