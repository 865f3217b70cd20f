"""gdncheck.conformance.judge: the judge of a port's outputs against the goldens.

:mod:`.verify` judges every (case, call, stage tensor) of an outputs folder; :mod:`.verdicts` applies
the rules to one tensor with the error :mod:`.metrics` and the bounds of :mod:`.tolerances`
(``tolerances.json``); :mod:`.messages` words every failure; :mod:`.records` holds the results
(``summary.schema.json``); :mod:`.aliases` reads a port's own tensor names through a name table
(``names/*.json``).
"""
