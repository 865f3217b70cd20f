"""The engines of the cross-engine matrix, one folder each (docs/layout.md, "Adding an engine").

``<name>/`` holds an engine's glue (``adapter.py``: a factory of the port contract, or a program of its own),
``engine.py`` (``ENGINE``: its registry entry; ``FINDINGS``: its known findings), its page (``README.md``) and
its repros (``repros/``: standalone scripts, not installed). :mod:`.registry` finds the folders, :mod:`.matrix`
judges a verify summary with their findings, :mod:`.probe` says whether an engine is installed.
"""
