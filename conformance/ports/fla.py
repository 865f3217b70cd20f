"""flash-linear-attention as a port of one stage: ``gdncheck run conformance.ports.fla:fla --stage-isolated``.

A factory of the port contract (:mod:`gdncheck.harness.contract`) that judges fla's gated delta rule
(the ``fla-core`` package, ``fla.ops.gated_delta_rule``) on the suite's golden inputs, stage-isolated
(fixtures/FORMAT.md §8): ``run_stage("delta_rule", {q, k, v, g, beta, recurrent_state})`` returns fla's
``core`` and new ``recurrent_state``. ``--option kernel=`` picks fla's form of the rule:

``naive`` (default)
    ``fla.ops.gated_delta_rule.naive.naive_recurrent_gated_delta_rule``: fla's torch reference, one token
    at a time, in float32.
``naive_chunk``
    ``naive_chunk_gated_delta_rule``: fla's torch reference of the chunked (WY/UT) form, float32, chunks
    of ``chunk_size`` (option, default 64).
``fused_recurrent``
    ``fused_recurrent_gated_delta_rule``, fla's Triton decode kernel.
``chunk``
    ``chunk_gated_delta_rule``, fla's Triton prefill pipeline (cumsum, KKᵀ + triangular solve, WY, the
    chunk state recurrence, the output), chunks of ``chunk_size`` (16, 32 or 64).

The Triton forms run compiled on a CUDA device when torch sees one and the interpreter is not forced,
else in Triton's interpreter on the CPU. The interpreter must be chosen before ``triton`` is imported
(``@triton.jit`` reads ``TRITON_INTERPRET`` when it decorates, and Triton's own library is decorated at
``import triton``): where triton is not imported yet and there is no GPU, this module sets
``TRITON_INTERPRET=1`` itself before importing fla; where triton was already imported without it, a
Triton form is refused with that explanation (set ``TRITON_INTERPRET=1`` before starting).

Everything else is not applicable: fla-core ships kernels, not the Qwen3.5 layer (its ``GatedDeltaNet``
layer lives in the separate ``flash-linear-attention`` package, with its own projection, convolution and
norm modules and weight names; mapping the checkpoint onto it would be a port of its own, not glue), so
``forward`` and the state methods raise :class:`~gdncheck.harness.NotApplicable`, and ``run_stage``
returns no tensor for every other stage (FORMAT.md §8: every output is optional; a stage that raised
would be recorded as the case raising). A case whose delta_rule inputs the fixture does not keep (no
``*_in`` state: the real-heads cases, the packed serving cases) therefore judges nothing and fails by
the coverage rule, a limit of a one-stage adapter, not an fla deviation.

The glue, and nothing more:

- **layouts**: gdncheck's q, k ``[B,T,Hk,dk]``, v ``[B,T,Hv,dv]``, g, beta ``[B,T,Hv]`` are fla's
  ``[B,T,H,K]``, ``[B,T,HV,V]``, ``[B,T,HV]`` as they are.
- **state**: fla's default state (``state_v_first=False``) is ``[N, HV, K, V]``, key axis first, which
  is gdncheck's ``recurrent_state`` ``[B, Hv, dk, dv]`` ``S[head, k, v]``: no transpose (fla's naive
  forms build it as ``h + k[..., None] * v[..., None, :]``, the kernels index it ``o_k[:, None] * V +
  o_v[None, :]``). ``state_v_first=True`` (the ``[V, K]`` layout docs/math.md's "state transposed"
  names) is not used.
- **q and k**: the stage inputs are already L2-normalised and q is unscaled (FORMAT.md §5), so
  ``use_qk_l2norm_in_kernel=False`` and ``scale=cfg.scale`` (dk^-0.5, which fla applies to q).
- **g and beta**: gdncheck's ``g`` is the log decay ``-exp(A_log)·softplus(a + dt_bias)``, what fla
  takes (``use_gate_in_kernel=False``: g "must be in log space"); ``beta`` is post-sigmoid
  (``use_beta_sigmoid_in_kernel=False``).
- **grouped heads**: value head j reads key head ``j // (Hv/Hk)`` (FORMAT.md §5), which is what fla's
  Triton kernels do natively (``i_h = i_hv // (HV // H)``): they get Hk heads. fla's naive forms take
  one key head per value head, so q and k are expanded with ``repeat_interleave`` (interleaved, never
  ``repeat``, which tiles: head j would read ``j % Hk``).
- **dtypes**: golden float64 inputs are stored in the profile dtype as an engine would hold them (q, k, v
  f32/bf16/f16; g, beta and the state float32, as ``triton_stage_runner`` does); outputs are what fla
  returns (core in v's dtype for the kernels and the naive recurrent form, float32 from the naive chunk
  form; the state float32).

Workarounds for the interpreter, applied only around an interpreted ``chunk`` call and undone after it
(``_interpreter_workarounds``; nothing in site-packages is edited):

1. **autotuner**: fla's Triton kernels are ``@triton.autotune``d; with more than one config Triton
   benchmarks them, which asks for a GPU driver and raises "0 active drivers". ``Autotuner.prune_configs``
   is wrapped to keep the first config that Triton's own pruning keeps, so every launch has one config and
   Triton skips benchmarking (as it does for a single-config autotune). The configs differ only in block
   sizes, warps and stages: the same math.
2. **loop counter**: ``fla/ops/common/chunk_delta_h.py`` writes ``for i_t in range(NT): i_t.to(tl.int64)``;
   compiled, ``i_t`` is a Triton scalar, interpreted it is a Python ``int``, which has no ``.to``. While
   the call runs, that module's ``range`` is one whose counters are ints with a ``.to`` that returns the
   int itself (a Python int is already wider than int64 needs here).
3. **bf16/f16 ``tl.dot``**: the interpreter's ``tl.dot`` on bf16 operands is wrong (Triton 3.9), and the
   chunk pipeline is ``tl.dot`` throughout. Interpreted, q, k, v already rounded to bf16 (f16) are cast to
   float32 exactly before the call and fla's core is rounded back to the profile dtype after it. This
   judges fla's math on bf16 inputs, not the bf16 rounding of its temporaries (w, u, v_new are held in
   k's dtype on a GPU). ``fused_recurrent`` has no ``tl.dot`` and gets bf16 as it is.
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
from gdncheck.harness import NotApplicable

KERNELS = ("naive", "naive_chunk", "fused_recurrent", "chunk")
TRITON_KERNELS = ("fused_recurrent", "chunk")
CHUNK_SIZES = (16, 32, 64)
PROFILES = ("f32", "bf16", "f16")
#: Stage inputs fla takes in float32 whatever the profile (the gates and the state).
FP32_INPUTS = ("g", "beta", "recurrent_state")
NO_LAYER = ("fla-core ships the gated delta rule kernels, not the Qwen3.5 layer (projections, conv1d, norms "
            "are not in fla.ops); only stage-isolated mode, stage delta_rule, applies (gdncheck run "
            "conformance.ports.fla:fla --stage-isolated)")


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
class FlaDeltaRule:
    """fla's gated delta rule behind ``run_stage``; every other part of the contract not applicable.

    The glue is in three small methods (:meth:`key_heads`, :meth:`state_in`/:meth:`state_out`,
    :meth:`log_decay`) so that the tests can break each one alone and see verify catch it."""

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

    # --- the rest of the contract: no layer in fla-core --------------------------------------------------
    def forward(self, x, state, seq_pos):
        raise NotApplicable(NO_LAYER)

    def new_state(self, batch: int):
        raise NotApplicable(NO_LAYER)

    def state_arrays(self, state):
        raise NotApplicable(NO_LAYER)

    def snapshot(self, state):
        raise NotApplicable(NO_LAYER)

    def restore(self, state, snap) -> None:
        raise NotApplicable(NO_LAYER)

    def save_snapshot(self, snap, path: str) -> None:
        raise NotApplicable(NO_LAYER)

    def load_snapshot(self, path: str):
        raise NotApplicable(NO_LAYER)


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
