"""flash-linear-attention as a port of one stage: ``gdncheck run fla --stage-isolated`` (the built-in; the plug-in
``gdncheck.conformance.engines.fla.adapter:fla`` is the same factory).

A factory of the port contract (:mod:`gdncheck.harness.contract`) that judges fla's gated delta rule
(``fla-core``) on the suite's golden inputs, stage-isolated, in the form ``--option kernel=`` picks.

What it exposes, what it cannot and why, the engine versions it knows: conformance/engines/fla/README.md.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.errors import GDNError
from gdncheck.harness import NotApplicable, StageOnly

KERNELS = ("naive", "naive_chunk", "fused_recurrent", "chunk")
TRITON_KERNELS = ("fused_recurrent", "chunk")
CHUNK_SIZES = (16, 32, 64)
PROFILES = ("f32", "bf16", "f16")
#: Stage inputs fla takes in float32 whatever the profile (the gates and the state).
FP32_INPUTS = ("g", "beta", "recurrent_state")
NO_LAYER = ("fla-core ships the gated delta rule kernels, not the Qwen3.5 layer (projections, conv1d, norms "
            "are not in fla.ops); only stage-isolated mode, stage delta_rule, applies (gdncheck run "
            "gdncheck.conformance.engines.fla.adapter:fla --stage-isolated)")


def _interpreted(fn) -> bool:
    """Whether ``@triton.jit`` made ``fn`` (through its autotune/heuristics wrappers) an interpreted function."""
    while not type(fn).__name__.endswith("Function") and hasattr(fn, "fn"):
        fn = fn.fn
    return type(fn).__name__ == "InterpretedFunction"


def _import_fla(triton_kernel: bool):
    """fla's gated delta rule functions; for a Triton form without a GPU, with the interpreter chosen first.

    What counts is how ``@triton.jit`` decorated Triton's library (at ``import triton``) and fla's kernels
    (at the import of fla's ops), not the variable now."""
    import torch

    if triton_kernel and not torch.cuda.is_available() and "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede `import triton` (module docstring)
    try:
        import fla.ops.gated_delta_rule as gdr
        from fla.ops.gated_delta_rule import naive
    except ImportError as exc:
        raise GDNError(f"implementation 'fla' needs flash-linear-attention's kernels, which cannot be imported "
                       f"here ({exc}); pip install fla-core einops (the fla extra)") from None
    if triton_kernel and not torch.cuda.is_available():
        import triton.language.standard as tl_standard
        from fla.ops.gated_delta_rule import fused_recurrent
        if not (_interpreted(tl_standard.sum)
                and _interpreted(fused_recurrent.fused_recurrent_gated_delta_rule_fwd_kernel)):
            raise GDNError("fla's Triton kernels need a CUDA device or Triton's interpreter, and triton (or fla) "
                           "was imported without TRITON_INTERPRET=1, too late to choose it now: set "
                           "TRITON_INTERPRET=1 before starting, or use --option kernel=naive|naive_chunk")
    return gdr, naive


# --- the interpreter workarounds (module docstring, 1 and 2) -------------------------------------------
class _LoopCounter(int):
    """A Python loop counter that takes ``.to(dtype)`` as a Triton scalar does."""

    def to(self, *_args, **_kwargs) -> int:
        return int(self)


def _counting_range(*args):
    return (_LoopCounter(i) for i in range(*args))


@contextlib.contextmanager
def _interpreter_workarounds() -> Iterator[None]:
    import fla.ops.common.chunk_delta_h as chunk_delta_h
    from triton.runtime.autotuner import Autotuner

    prune = Autotuner.prune_configs

    def one_config(self, kwargs):
        return prune(self, kwargs)[:1]

    had_range = "range" in vars(chunk_delta_h)
    old_range = vars(chunk_delta_h).get("range")
    Autotuner.prune_configs = one_config
    chunk_delta_h.range = _counting_range
    try:
        yield
    finally:
        Autotuner.prune_configs = prune
        if had_range:
            chunk_delta_h.range = old_range
        else:
            del chunk_delta_h.range


# --- the implementation --------------------------------------------------------------------------------
class FlaDeltaRule(StageOnly):
    """fla's gated delta rule behind ``run_stage``; every other part of the contract not applicable.

    The glue is in three small methods (:meth:`key_heads`, :meth:`state_in`/:meth:`state_out`,
    :meth:`log_decay`) so that the tests can break each one alone and see verify catch it."""

    no_layer = NO_LAYER

    def __init__(self, cfg: GDNConfig, *, profile: str, kernel: str, chunk_size: int, device: str):
        import torch

        self.torch = torch
        self.cfg, self.profile, self.kernel, self.chunk_size = cfg, profile, kernel, chunk_size
        self.gdr, self.naive = _import_fla(kernel in TRITON_KERNELS)
        if device == "auto":
            from fla.ops.gated_delta_rule import fused_recurrent
            interp = _interpreted(fused_recurrent.fused_recurrent_gated_delta_rule_fwd_kernel)
            device = "cuda" if (kernel in TRITON_KERNELS and torch.cuda.is_available() and not interp) else "cpu"
        if device not in ("cpu", "cuda"):
            raise GDNError(f"fla: expected --option device=auto|cpu|cuda, found {device!r}")
        self.device = torch.device(device)
        self.interpreted = kernel in TRITON_KERNELS and self.device.type == "cpu"
        self.dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[profile]
        where = "interpreted" if self.interpreted else device
        self.name = f"fla {kernel} ({profile}, {where}, fla-core {_fla_version()})"

    # --- glue (see the module docstring) ---------------------------------------------------------------
    def key_heads(self, x, native_gva: bool):
        """q or k [B,T,Hk,dk] as fla takes them: as they are for a kernel with grouped value heads, else one
        key head per value head, value head j reading key head j // (Hv/Hk)."""
        ratio = self.cfg.num_v_heads // self.cfg.num_k_heads
        return x if native_gva or ratio == 1 else x.repeat_interleave(ratio, dim=2)

    def state_in(self, s):
        """gdncheck's [B,Hv,dk,dv] state as fla's initial_state [N,HV,K,V]: the same layout."""
        return s

    def state_out(self, s):
        """fla's final_state [N,HV,K,V] as gdncheck's [B,Hv,dk,dv]: the same layout."""
        return s

    def log_decay(self, g):
        """gdncheck's g is already fla's log-space decay."""
        return g

    # --- stage-isolated mode -------------------------------------------------------------------------
    def _tensor(self, name: str, a):
        torch = self.torch
        dtype = torch.float32 if name in FP32_INPUTS else self.dtype
        a = np.asarray(a, dtype=np.float64)
        return torch.empty(a.shape, dtype=dtype, device=self.device).copy_(torch.from_numpy(a.copy()))

    def run_stage(self, stage: str, inputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
        if stage != "delta_rule":
            return {}  # not an fla stage: no tensor (FORMAT.md §8, every output optional)
        t = {name: self._tensor(name, inputs[name]) for name in ("q", "k", "v", "g", "beta", "recurrent_state")}
        core, state = self.delta_rule(t["q"], t["k"], t["v"], t["g"], t["beta"], t["recurrent_state"])
        return {"core": core, "recurrent_state": state}

    def delta_rule(self, q, k, v, g, beta, s0):
        scale = self.cfg.scale
        g, s0 = self.log_decay(g), self.state_in(s0)
        with self.torch.no_grad():
            if self.kernel == "naive":
                o, s = self.naive.naive_recurrent_gated_delta_rule(
                    q=self.key_heads(q, False), k=self.key_heads(k, False), v=v, beta=beta, g=g, scale=scale,
                    initial_state=s0, output_final_state=True)
            elif self.kernel == "naive_chunk":
                o, s = self.naive.naive_chunk_gated_delta_rule(
                    q=self.key_heads(q, False), k=self.key_heads(k, False), v=v, g=g, beta=beta,
                    chunk_size=self.chunk_size, scale=scale, initial_state=s0, output_final_state=True)
            elif self.kernel == "fused_recurrent":
                o, s = self.gdr.fused_recurrent_gated_delta_rule(
                    q=self.key_heads(q, True), k=self.key_heads(k, True), v=v, g=g, beta=beta, scale=scale,
                    initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=False)
            else:
                o, s = self._chunk(self.key_heads(q, True), self.key_heads(k, True), v, g, beta, s0, scale)
        return o, self.state_out(s)

    def _chunk(self, q, k, v, g, beta, s0, scale):
        torch = self.torch
        call = dict(g=g, beta=beta, scale=scale, initial_state=s0, output_final_state=True,
                    use_qk_l2norm_in_kernel=False, chunk_size=self.chunk_size)
        if not self.interpreted:
            return self.gdr.chunk_gated_delta_rule(q=q, k=k, v=v, **call)
        out_dtype = v.dtype  # workaround 3: exact casts around the interpreter's wrong bf16 tl.dot
        q, k, v = (x.to(torch.float32) for x in (q, k, v))
        with _interpreter_workarounds():
            o, s = self.gdr.chunk_gated_delta_rule(q=q, k=k, v=v, **call)
        return o.to(out_dtype), s


def _fla_version() -> str:
    try:
        from importlib.metadata import version
        return version("fla-core")
    except Exception:  # noqa: BLE001 - a name in a report only
        return "?"


def fla(cfg: GDNConfig, weights, *, profile: str = "f32", strict: bool = False, kernel: str = "naive",
        chunk_size: int = 64, device: str = "auto", impl_class: type[FlaDeltaRule] = FlaDeltaRule) -> FlaDeltaRule:
    """fla's gated delta rule (``kernel=naive|naive_chunk|fused_recurrent|chunk``), stage-isolated only.

    ``impl_class`` (not an ``--option``): a subclass with other glue, for the tests' mutants."""
    if kernel not in KERNELS:
        raise GDNError(f"fla: expected --option kernel={'|'.join(KERNELS)}, found {kernel!r}")
    if kernel in ("naive_chunk", "chunk") and chunk_size not in CHUNK_SIZES:
        raise GDNError(f"fla: chunk_size must be one of {', '.join(map(str, CHUNK_SIZES))}, found {chunk_size!r}")
    if profile not in PROFILES:
        raise NotApplicable(f"profile {profile}: fla computes in float32 at most (profiles {', '.join(PROFILES)})")
    return impl_class(cfg, profile=profile, kernel=kernel, chunk_size=chunk_size, device=device)


def _not_end_to_end(config, program) -> None:
    raise NotApplicable(NO_LAYER)


fla.options = ("kernel", "chunk_size", "device")
fla.check_case = _not_end_to_end  # end to end, before gdncheck's parser answers for fla (docs/plugins.md)
