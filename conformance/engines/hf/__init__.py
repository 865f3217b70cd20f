"""The engine hf: Hugging Face transformers (engine.py: its registry entry and findings; README: docs/engines.md)."""
