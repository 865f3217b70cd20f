"""gdncheck.conformance: judging implementations against the float64 reference.

The comparison engine (:mod:`.metrics`, :mod:`.verdicts`, :mod:`.records`, :mod:`.messages`,
:mod:`.tolerances`), ``run`` and ``verify`` (:mod:`.run`, :mod:`.verify`, over the program executor
:mod:`.program` and the plug-in contract :mod:`.plugin`), the precision-emulating layer that earns
the tolerances (:mod:`.emulate`, :mod:`.lowp`, :mod:`.derive`), and the mutants that prove the
suite catches known bugs (:mod:`.meta`), the Hypothesis property suite (:mod:`.properties`, over
:mod:`.strategies`) and the CI gate (:mod:`.gate`: :mod:`.gate_plan`, :mod:`.gate_workers`,
:mod:`.junit`, :mod:`.gate_report`, known failures in :mod:`.xfails`). The only place where
``reference`` and ``gpu_impl`` meet.
"""
