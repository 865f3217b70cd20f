"""gdncheck.conformance: judging implementations against the float64 reference.

The comparison engine (:mod:`.metrics`, :mod:`.verdicts`, :mod:`.records`, :mod:`.messages`,
:mod:`.tolerances`), ``run`` and ``verify`` (:mod:`.run`, :mod:`.verify`, over the program executor
:mod:`.program` and the plug-in contract :mod:`.plugin`), the precision-emulating layer that earns
the tolerances (:mod:`.emulate`, :mod:`.lowp`, :mod:`.derive`), and the mutants that prove the
suite catches known bugs (:mod:`.meta`). The only place where ``reference`` and ``gpu_impl`` meet.
"""
