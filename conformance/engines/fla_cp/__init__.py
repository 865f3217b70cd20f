"""The engine fla-cp: flash-linear-attention's context parallelism; its glue (adapter.py, cp.py), its registry entry
and findings (engine.py), its page (README.md)."""
