"""The engine fla: its glue (adapter.py), its registry entry and findings (engine.py), its page (README.md)."""
