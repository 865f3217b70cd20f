"""The engine hf: its glue (adapter.py, trace.py), its registry entry and findings (engine.py), its page (README.md)."""
