"""The float64 NumPy reference of the Qwen3.5 Gated DeltaNet layer (``gdncheck.reference``).

One module per stage of docs/spec.md §2, each a plain function whose docstring holds the formula and
shapes (the sparse mixture-of-experts block: :mod:`.moe`); :class:`Layer` composes them and carries
the :class:`State`. :mod:`.serving` runs the layer as serving engines call it (packed sequences over a
:class:`StatePool`, speculative verify and commit, prefix snapshots; ``docs/serving.md``). Never
imports torch or ``gdncheck.gpu_impl``.
"""

from .conv1d import conv1d
from .delta_rule import delta_rule_recurrent, expand_heads
from .delta_rule_chunked import delta_rule_chunked
from .gated_norm import gated_norm
from .gates import gates
from .in_proj import in_proj
from .input_norm import input_norm
from .layer import Layer, layer_forward
from .mlp import mlp
from .moe import experts, mlp_moe, moe_sum, router, router_probs, routing, routing_margin, shared_expert
from .out_proj import out_proj
from .post_norm import post_norm
from .qk_norm import qk_norm
from .residual import output, residual
from .serving import SpecVerify, StatePool, commit, forward_mixed, forward_packed, prefix_snapshots, verify_spec
from .state import State

__all__ = [
    "Layer", "SpecVerify", "State", "StatePool", "commit", "conv1d", "delta_rule_chunked", "delta_rule_recurrent",
    "expand_heads", "forward_mixed", "forward_packed", "gated_norm", "gates", "in_proj", "input_norm",
    "layer_forward", "mlp", "out_proj", "output", "post_norm", "prefix_snapshots", "qk_norm", "residual", "verify_spec",
    # the sparse mixture-of-experts block (stage 11's variant, reference/moe.py)
    "experts", "mlp_moe", "moe_sum", "router", "router_probs", "routing", "routing_margin", "shared_expert",
]
