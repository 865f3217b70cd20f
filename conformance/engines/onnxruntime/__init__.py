"""The engine onnxruntime: its glue, its registry entry and findings (engine.py), its page (README.md), its repros."""
