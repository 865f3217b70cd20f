"""The engine vllm-triton: its glue, its registry entry and findings (engine.py), its page (README.md), its repros."""
