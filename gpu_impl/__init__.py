"""The Triton production path of the Qwen3.5 GDN layer (``gdncheck.gpu_impl``).

One module per stage of docs/spec.md §2, mirroring ``gdncheck.reference`` by module, function name,
argument order and return tuple, on torch tensors; the formulas live in the reference
docstrings. :class:`Layer` composes the fused fast path and carries a device :class:`State`.

Target: compiled on CUDA tensors, Triton's interpreter on CPU tensors, chosen per launch by the
tensors' device; ``device=`` / ``GDN_DEVICE`` pick the device. Why this does not depend on
``TRITON_INTERPRET`` or on import order: :mod:`.target`. Never imports ``gdncheck.reference``.

Without a GPU (docs/gpu.md): :mod:`.interpreter` makes interpreted launches compute as sm_90 does
(tf32 dots, program order) and :mod:`.memory` models a call's device memory. The tooling that measures
and checks these kernels stands apart, in ``gdncheck.gpu_tools``: the compile check builds every launch
for sm_90 as the JIT does, and on a GPU the benchmark and the GPU check (scripts/gpu_check.sh) measure.

The serving patterns of docs/serving.md (packed calls over a pool of state slots, speculative
verify and commit, prefix snapshots) are :mod:`.serving`, with the API of
``gdncheck.reference.serving``; the packed kernels' layout is :mod:`.packed`.
"""

from .conv1d import conv1d, conv1d_qk_norm, conv1d_update
from .delta_rule import delta_rule_recurrent
from .delta_rule_chunked import delta_rule_chunked
from .gated_norm import gated_norm
from .gates import gates
from .in_proj import in_proj
from .input_norm import input_norm
from .layer import DTYPES, Layer
from .mlp import mlp, swiglu
from .moe import MoEWeights, experts, mlp_moe, moe_block, moe_sum, router, routing, shared_expert
from .out_proj import out_proj
from .post_norm import post_norm
from .qk_norm import qk_norm
from .residual import output, residual, residual_post_norm
from .serving import SpecVerify, StatePool, commit, forward_mixed, forward_packed, prefix_snapshots, verify_spec
from .state import DeviceSnapshot, State
from .target import fill_allocations, resolve_device

__all__ = [
    "DTYPES", "DeviceSnapshot", "Layer", "MoEWeights", "State", "conv1d", "conv1d_qk_norm", "conv1d_update",
    "delta_rule_chunked", "delta_rule_recurrent", "fill_allocations", "gated_norm", "gates", "in_proj",
    "input_norm", "mlp", "out_proj", "output", "post_norm", "qk_norm", "residual", "residual_post_norm",
    "resolve_device", "swiglu",
    # the serving patterns (docs/serving.md): the API of reference/serving.py
    "SpecVerify", "StatePool", "commit", "forward_mixed", "forward_packed", "prefix_snapshots", "verify_spec",
    # the sparse mixture-of-experts block (stage 11's variant, gpu_impl/moe.py)
    "experts", "mlp_moe", "moe_block", "moe_sum", "router", "routing", "shared_expert",
]
