"""The built-in implementations, each a factory of the port contract (`gdncheck.harness.contract`).

`reference` (profile `f64`: the float64 reference; `f32`, `bf16`, `f16`: its math with the
profile's roundings emulated, `--option placement=...`), `triton` (`gdncheck.gpu_impl.Layer`),
`hf`, `mlx`, `llamacpp`, `keras` (end to end) and `fla`, `ggml`, `onnxruntime` (stage-isolated only). Heavy and optional
dependencies are imported on first use; what an engine cannot express is reported not applicable.

Each one's profiles and options: docs/ports.md §1.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.conformance.earn.emulate import emulated
from gdncheck.errors import GDNError
from gdncheck.fixtures.reference_impl import reference_f64
from gdncheck.harness import LayerAdapter, module_stage_runner
from gdncheck.harness.sharded import standalone_ranks
from gdncheck.conformance.engines.fla.adapter import fla
from gdncheck.conformance.engines.ggml.adapter import ggml
from gdncheck.conformance.engines.hf.adapter import hf
from gdncheck.conformance.engines.keras.adapter import keras
from gdncheck.conformance.engines.llamacpp.adapter import llamacpp
from gdncheck.conformance.engines.mlx.adapter import mlx
from gdncheck.conformance.engines.onnxruntime.adapter import onnxruntime

from .distributed import reference_context_parallel


def reference(cfg: GDNConfig, weights, *, profile: str = "f64", strict: bool = False, placement: str = "hf",
              chunk_size: int = 64, **options) -> LayerAdapter:
    """The float64 reference (profile f64) or its precision emulation (f32, bf16, f16)."""
    if options:
        raise GDNError(f"reference: unknown option(s) {', '.join(sorted(options))}; known: placement, chunk_size")
    if profile == "f64":
        return reference_f64(cfg, weights, strict=strict, chunk_size=chunk_size)
    return emulated(cfg, weights, profile=profile, placement=placement, strict=strict, chunk_size=chunk_size)


def triton_stage_runner(layer, cfg: GDNConfig, weights: Mapping[str, np.ndarray]):
    """``run_stage`` with ``gdncheck.gpu_impl``'s stage functions on the layer's device: golden inputs
    stored in the profile dtype as a port reading them would (g, beta, the recurrent state and the
    routing weights fp32, selected experts int64), weights as the layer holds them (1-D parameters
    fp32, matrices in the profile dtype)."""
    import torch  # the triton extra: only a Triton run needs it

    from gdncheck import gpu_impl
    from gdncheck.gpu_impl.layer import FP32_PARAMS

    def tensor(a, dtype):  # fresh row-major strides (numpy's may differ on size-1 axes)
        a = np.asarray(a, dtype=np.float64)
        return torch.empty(a.shape, dtype=dtype, device=layer.device).copy_(torch.from_numpy(a.copy()))

    w = {k: tensor(v, torch.float32 if k in FP32_PARAMS else layer.dtype) for k, v in weights.items()}
    fp32 = ("g", "beta", "recurrent_state", "routing_weights")
    return module_stage_runner(gpu_impl, cfg, w,
                               lambda name, a: tensor(a, torch.float32 if name in fp32 else layer.dtype),
                               lambda v: v,
                               to_index=lambda a: torch.tensor(np.asarray(a, dtype=np.int64), device=layer.device))


class CapturingAdapter(LayerAdapter):
    """A :class:`~gdncheck.harness.LayerAdapter` whose layer returns every stage tensor when asked with
    ``capture=True`` (``gdncheck.gpu_impl.Layer``): verify then judges, and localises, every stage, not
    only ``out``."""

    def forward(self, x: np.ndarray, state, seq_pos: np.ndarray):
        return self.layer.forward(self._prepare(x), state, seq_pos, capture=True)


def triton(cfg: GDNConfig, weights, *, profile: str = "f32", strict: bool = False, capture: bool = True,
           **options) -> LayerAdapter:
    """``gdncheck.gpu_impl.Layer`` on ``GDN_DEVICE`` (default ``auto``); every stage tensor is returned
    (``capture``; ``--option capture=false`` hands out ``out`` and the states only, as a fast path would)."""
    try:  # the triton extra (torch, triton): imported on first use, so that the rest runs without it
        from gdncheck.gpu_impl import DeviceSnapshot, Layer, serving
    except ImportError as exc:
        raise GDNError(
            f"implementation 'triton' needs gdncheck.gpu_impl.Layer, which cannot be imported here ({exc}); "
            "install the triton extra (pip install -e '.[triton]')"
        ) from None
    if profile == "f64":
        raise GDNError("implementation 'triton' runs in profile f32, bf16 or f16, found f64")
    device = options.pop("device", os.environ.get("GDN_DEVICE", "auto"))
    layer = Layer(cfg, weights, profile=profile, device=device, strict=strict, **options)
    runner = getattr(layer, "run_stage", None) or triton_stage_runner(layer, cfg, weights)
    adapter = CapturingAdapter if capture else LayerAdapter
    return adapter(layer, f"triton ({profile}, device {device})", load_snapshot=DeviceSnapshot.load,
                   stage_runner=runner, serving=serving, serving_options={"capture": capture})


def triton_context_parallel(cfg: GDNConfig, weights, plan, rank: int, comm, xs, conv_state, recurrent_state, *,
                            profile: str = "f32", strict: bool = False, **options):
    """The Triton path's ``context_parallel`` (gdncheck.gpu_impl.sharded.context_parallel_rank): halos and
    summaries exchanged through ``comm``, each segment's summary by its own recurrent kernel."""
    if profile == "f64":
        raise GDNError("implementation 'triton' runs in profile f32, bf16 or f16, found f64")
    from gdncheck.gpu_impl.sharded import context_parallel_rank

    options.pop("capture", None)  # every stage of a segment is run; what a rank writes is fixed (§7.1)
    device = options.pop("device", os.environ.get("GDN_DEVICE", "auto"))
    return context_parallel_rank(cfg, weights, plan, rank, comm, xs, conv_state, recurrent_state, profile=profile,
                                 device=device, strict=strict, **options)


# the sharded methods (gdncheck.harness.sharded, docs/sharding.md): a tensor-parallel rank as a layer of its
# heads; context parallelism exchanges halos and summaries (the reference's in float64, the Triton path's in
# its profile, each segment's summary from its own recurrent kernel)
reference.tensor_parallel = standalone_ranks(reference)
reference.context_parallel = reference_context_parallel
triton.tensor_parallel = standalone_ranks(triton)
triton.context_parallel = triton_context_parallel

BUILTIN = {"reference": reference, "triton": triton, "hf": hf, "mlx": mlx, "fla": fla, "llamacpp": llamacpp,
           "ggml": ggml, "onnxruntime": onnxruntime, "keras": keras}
