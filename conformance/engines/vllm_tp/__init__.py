"""vLLM's whole engine at tensor parallel 1 and 2, judged rank by rank (README.md)."""
