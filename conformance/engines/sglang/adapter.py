"""SGLang's GDN kernels as a port of stages:
``gdncheck run gdncheck.conformance.engines.sglang.adapter:sglang --stage-isolated``.

A factory of the port contract (:mod:`gdncheck.harness.contract`) that judges SGLang's own Triton kernels for
Qwen3.5's gated delta net (``sglang.kernels.ops``: the conv1d of ``mamba/causal_conv1d_triton.py``, the gating of
``attention/linear/fused_gdn_gating.py``, the delta rule of ``attention/fla/fused_recurrent.py`` and
``attention/linear/fused_sigmoid_gating_recurrent.py``) on the suite's golden inputs, each driven through
SGLang's serving convention: every call's rows packed into one varlen stream (``cu_seqlens``) with a padding
sequence (slot -1), their states in slots of a state pool read and written in place at ``cache_indices``.
Under Triton's interpreter on a CPU, on a GPU compiled.

What it exposes, what it cannot and why, the interpreter workarounds, the version it knows: its page,
conformance/engines/sglang/README.md.
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

TESTED = "0.5.23"
INSTALL = "pip install --no-deps sglang==0.5.23 && pip install -e '.[sglang]'"
#: the delta-rule kernel: ``recurrent`` is stage-isolated (g and beta given); the others fuse SGLang's gating and
#: q/k L2 norm into the rule, fed from the golden ``qkv_conv``, ``a`` and ``b`` (judged with ``verify --fused``)
KERNELS = ("recurrent", "decode", "packed_decode", "verify")
FUSED = ("decode", "packed_decode", "verify")
PROFILES = ("f32", "bf16")
PAD_SLOT_ID = -1  # SGLang's (causal_conv1d_triton.PAD_SLOT_ID)
NO_LAYER = ("SGLang's GDN kernels are judged one stage at a time from golden inputs (conv1d, gates, delta_rule; "
            "the q/k L2 norm inside the fused delta-rule kernels); its Qwen3.5 layer needs SGLang's "
            "serving runtime (model runner, memory pools, a GPU), so only stage-isolated mode applies "
            "(gdncheck run gdncheck.conformance.engines.sglang.adapter:sglang --stage-isolated)")
NOT_INSTALLED = f"implementation 'sglang' needs SGLang's kernels, which cannot be imported here ({{exc}}); {INSTALL}"


# --- import, with the interpreter's workarounds (conformance/engines/sglang/README.md, Interpreter) --------
class Kernels:
    """SGLang's kernel modules, imported once."""

    def __init__(self, interpreted: bool):
        import importlib

        self.interpreted = interpreted
        fla = "sglang.kernels.ops.attention.fla"
        try:
            _bare_packages()
            utils = importlib.import_module(f"{fla}.utils")
            if interpreted:
                utils.custom_device_ctx = lambda index: contextlib.nullcontext()  # 1: no torch.cpu.device
                _jit_math_aliases(importlib.import_module(f"{fla}.op"))  # 2: before any kernel imports them
            self.recurrent = importlib.import_module(f"{fla}.fused_recurrent")
            self.sigmoid = importlib.import_module("sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent")
            self.gating = importlib.import_module("sglang.kernels.ops.attention.linear.fused_gdn_gating")
            self.conv = importlib.import_module("sglang.kernels.ops.mamba.causal_conv1d_triton")
        except ImportError as exc:
            raise GDNError(import_failure(exc, "sglang", NOT_INSTALLED)) from None
        if interpreted and not _interpreted(self.recurrent.fused_recurrent_gated_delta_rule_update_fwd_kernel):
            raise GDNError("SGLang's Triton kernels need a CUDA device or Triton's interpreter, and triton (or "
                           "sglang) was imported without TRITON_INTERPRET=1, too late to choose it now: set "
                           "TRITON_INTERPRET=1 before starting")
        self.version = _version()


def import_failure(exc: ImportError, engine_module: str, not_installed: str) -> str:
    """What an ImportError while importing an engine's kernels says: the engine not installed only where the
    module that could not be found is the engine's own (or triton, torch); anything else (a relative import
    of an adapter copied out of gdncheck, a name its version lacks) as what failed."""
    from gdncheck.untrusted import one_line

    missing = (getattr(exc, "name", None) or "").split(".")[0]
    if missing in (engine_module, "triton", "torch") and "cannot import name" not in str(exc):
        return not_installed.format(exc=one_line(exc))
    return (f"importing {engine_module}'s kernels failed, though {engine_module} is installed: "
            f"{type(exc).__name__}: {one_line(exc)}"
            + (f" (in module {exc.name})" if getattr(exc, "name", None) else "")
            + "; an adapter copied out of gdncheck imports gdncheck's modules by their full names")


_KERNELS: dict[bool, Kernels] = {}
#: packages whose ``__init__`` imports SGLang's serving stack (``sglang/__init__.py``: its frontend language and
#: IPython; ``sglang.kernels``: the kernel registry of every backend); their kernel modules need none of it
BARE_PACKAGES = ("sglang", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.attention")


def _bare_packages() -> None:
    """Register :data:`BARE_PACKAGES` as plain namespace packages over SGLang's own folders (their
    ``__init__`` not run), unless SGLang is imported already; submodules then import from the installed
    files as they are."""
    import importlib.machinery
    import importlib.util
    import types

    if "sglang" in sys.modules:
        return
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("No module named 'sglang'")
    root = next(iter(spec.submodule_search_locations))
    for name in BARE_PACKAGES:
        module = types.ModuleType(name)
        module.__path__ = [os.path.join(root, *name.split(".")[1:])]
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        module.__spec__.submodule_search_locations = module.__path__
        sys.modules[name] = module


def kernels(interpreted: bool) -> Kernels:
    if interpreted and "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # precedes `import triton` (conformance/engines/fla/README.md)
    if interpreted not in _KERNELS:
        _KERNELS[interpreted] = Kernels(interpreted)
    return _KERNELS[interpreted]


def _interpreted(fn) -> bool:
    from gdncheck.conformance.engines.fla.adapter import (
        _interpreted as fla_interpreted,  # absolute: a copied-out adapter works
    )
    return fla_interpreted(fn)


def _jit_math_aliases(op) -> None:
    """``fla/op.py`` binds ``exp = tl.exp`` (and exp2, log, log2) at import; the interpreter swaps ``tl``'s
    builtins only inside ``triton.language``, so a kernel calling the alias meets the compiled builtin ("Did you
    forget to add @triton.jit?"). Rebind each to a one-line ``@triton.jit`` function calling ``tl``'s own
    (:mod:`.sglang_ops`) before any kernel module imports them."""
    from gdncheck.conformance.engines.sglang import ops as sglang_ops

    op.exp, op.exp2, op.log, op.log2 = sglang_ops.exp, sglang_ops.exp2, sglang_ops.log, sglang_ops.log2


@contextlib.contextmanager
def interpreter_casts() -> Iterator[None]:
    """While a kernel runs (nothing else in Triton changes):

    3. the interpreter casts float32 -> bfloat16 by cutting the mantissa (round toward zero); a GPU's
       ``.to(tl.bfloat16)`` rounds to nearest even: both directions go through torch's exact conversions;
    4. the interpreter's bfloat16 arithmetic runs NumPy's integer ops on the raw 16-bit patterns (bf16 is held
       as uint16): ``causal_conv1d_triton``'s ``x * w`` of two bf16 blocks gives garbage and NaN. A bf16
       add, sub, mul, div, min or max is computed in float32 (exact for a product of two bf16) and rounded to
       nearest even, as a GPU's bf16 instructions do;
    5. a mask built from a Python bool and a tensor (``causal_conv1d_triton``'s ``(idx_token < segment_len) &
       (idx_feats < dim)``, ``segment_len`` a Python ``min``) is int32 in the interpreter, int1 compiled, and
       the interpreter's store refuses it ("mask has unsupported dtype"): an integer mask is read as ``!= 0``."""
    import torch
    import triton.language as tl
    from triton.runtime import interpreter as interp

    old = interp._convert_float
    builder = interp.InterpreterBuilder
    old_store, old_load = builder.create_masked_store, builder.create_masked_load
    old_binary = builder.binary_op
    arithmetic = (np.add, np.subtract, np.multiply, np.divide, np.fmod, np.minimum, np.maximum, np.fmin, np.fmax)

    def to_f32(h):
        return (np.ascontiguousarray(h.data).view(np.uint16).astype(np.uint32) << 16).view(np.float32)

    def binary(self, lhs, rhs, op):
        if lhs.dtype.scalar != tl.bfloat16 or rhs.dtype.scalar != tl.bfloat16 or op not in arithmetic:
            return old_binary(self, lhs, rhs, op)
        out = np.asarray(op(to_f32(lhs), to_f32(rhs)), dtype=np.float32)
        bits = torch.from_numpy(np.ascontiguousarray(out)).to(torch.bfloat16).view(torch.int16).numpy()
        return interp.TensorHandle(bits.view(np.uint16).reshape(out.shape), tl.bfloat16)

    def boolean(mask):
        if mask is not None and mask.data.dtype != np.bool_:
            return interp.TensorHandle(mask.data != 0, tl.int1)
        return mask

    def store(self, ptrs, value, mask, cache_policy):
        return old_store(self, ptrs, value, boolean(mask), cache_policy)

    def load(self, ptrs, mask, other, cache_policy, is_volatile):
        return old_load(self, ptrs, boolean(mask), other, cache_policy, is_volatile)

    def convert(data, src, dst, rounding_mode):
        if src == tl.float32 and dst == tl.bfloat16 and rounding_mode in (None, interp._ir.ROUNDING_MODE.RTNE):
            t = torch.from_numpy(np.ascontiguousarray(data).view(np.float32).copy()).to(torch.bfloat16)
            return t.view(torch.int16).numpy().view(np.uint16).reshape(np.shape(data))
        if src == tl.bfloat16 and dst == tl.float32:
            bits = np.ascontiguousarray(data).view(np.uint16).astype(np.uint32) << 16
            return bits.view(np.float32).reshape(np.shape(data))
        return old(data, src, dst, rounding_mode)

    interp._convert_float = convert
    builder.create_masked_store, builder.create_masked_load, builder.binary_op = store, load, binary
    try:
        yield
    finally:
        interp._convert_float = old
        builder.create_masked_store, builder.create_masked_load, builder.binary_op = old_store, old_load, old_binary


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("sglang")
    except Exception:  # noqa: BLE001 - a name in a report only
        return "?"


# --- the implementation --------------------------------------------------------------------------------
class SGLangStages(StageOnly):
    """SGLang's kernels behind ``run_stage``; every layer method not applicable.

    Each call's B rows are N = B sequences of a packed stream plus one padding sequence; sequence i's state
    lives in pool slot :meth:`slots` ``[i]`` of a pool of B + 2 slots whose other slots hold NaN (a kernel
    reading a wrong slot shows). The glue is in small methods (:meth:`slots`, :meth:`recurrent_in`,
    :meth:`recurrent_out`, :meth:`conv_in`, :meth:`gate_inputs`) so that the tests can break each one alone."""

    no_layer = NO_LAYER

    #: the engine's name in errors and in ``name``
    label = "sglang"

    def __init__(self, cfg: GDNConfig, weights, *, profile: str, kernel: str, device: str):
        import torch

        self.torch, self.cfg, self.profile, self.kernel = torch, cfg, profile, kernel
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
        if device not in ("cpu", "cuda"):
            raise GDNError(f"{self.label}: expected --option device=auto|cpu|cuda, found {device!r}")
        self.device = torch.device(device)
        self.k = self.load_kernels(self.device.type == "cpu")
        self.dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[profile]
        w = weights
        K = cfg.conv_kernel
        self.conv_weight = self._t(np.asarray(w["linear_attn.conv1d.weight"]).reshape(cfg.conv_dim, K), self.dtype)
        # A_log float32, dt_bias in the model's dtype (SGLang's; vLLM's too: qwen_gdn_linear_attn.py:552-559)
        self.A_log = self._t(w["linear_attn.A_log"], torch.float32)
        self.dt_bias = self._t(w["linear_attn.dt_bias"], self.dtype)
        self.kept: dict[str, np.ndarray] = {}  # the fused kernels' inputs, from earlier stages of the same call
        where = "interpreted" if self.k.interpreted else device
        self.name = f"{self.label} {self.k.version} {kernel} ({profile}, {where})"

    def load_kernels(self, interpreted: bool) -> Kernels:
        """The engine's kernel modules (a subclass for another engine loads its own)."""
        return kernels(interpreted)

    def _t(self, a, dtype):
        a = np.asarray(a, dtype=np.float64)
        return self.torch.from_numpy(a.copy()).to(device=self.device).to(dtype)

    # --- glue: the serving convention ------------------------------------------------------------------
    def slots(self, batch: int) -> list[int]:
        """Pool slot of each row: the last slots, in reverse order (slot 0 and 1 never hold a row)."""
        return [batch + 1 - i for i in range(batch)]

    def pool_size(self, batch: int) -> int:
        return batch + 2

    def packed(self, a: np.ndarray, dtype) -> Any:
        """[B, T, ...] rows as one packed stream [B*T + 1, ...], the last token a padding sequence's."""
        flat = np.concatenate([a.reshape(-1, *a.shape[2:]), a[:1, :1].reshape(1, *a.shape[2:])])
        return self._t(flat, dtype)

    def cu_seqlens(self, B: int, T: int):
        return self.torch.tensor([i * T for i in range(B + 1)] + [B * T + 1], dtype=self.torch.int32,
                                 device=self.device)

    def placed(self, B: int):
        """Where the adapter puts (and reads back) each row's state: :meth:`slots`."""
        return self.torch.tensor(self.slots(B), dtype=self.torch.long, device=self.device)

    def indices(self, B: int):
        """The cache indices the kernels are given: each sequence's slot, then the padding sequence's -1."""
        return self.torch.tensor(self.slots(B) + [PAD_SLOT_ID], dtype=self.torch.int32, device=self.device)

    def pool(self, B: int, shape, dtype):
        return self.torch.full((self.pool_size(B), *shape), float("nan"), dtype=dtype, device=self.device)

    def recurrent_in(self, s: np.ndarray) -> np.ndarray:
        """gdncheck's state [B, Hv, dk, dv] as SGLang's pool rows [B, Hv, dv, dk] (V before K)."""
        return np.swapaxes(s, -1, -2)

    def recurrent_out(self, s: np.ndarray) -> np.ndarray:
        return np.swapaxes(s, -1, -2)

    def conv_in(self, c: np.ndarray) -> np.ndarray:
        """gdncheck's conv_state [B, conv_dim, K] (oldest first) as SGLang's [B, conv_dim, K-1]: the newest K-1."""
        return c[..., 1:]

    def gate_inputs(self, a, b):
        return a, b

    def unpack(self, t, B: int, T: int) -> np.ndarray:
        """The packed stream's first B*T rows (the padding sequence dropped) as [B, T, ...]."""
        from gdncheck.harness import to_numpy
        x = np.asarray(to_numpy(t), dtype=np.float64)
        return x[: B * T].reshape(B, T, *x.shape[1:])

    # --- stages ----------------------------------------------------------------------------------------
    def run_stage(self, stage: str, inputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
        run = {"conv1d": self.conv1d, "qk_norm": self.keep, "gates": self.gates,
               "delta_rule": self.delta_rule}.get(stage)
        if run is None:
            return {}  # not an SGLang kernel here (FORMAT.md §8: every output optional)
        ctx = interpreter_casts() if self.k.interpreted else contextlib.nullcontext()
        with ctx, self.torch.no_grad():
            return run(inputs)

    def keep(self, inputs) -> dict:
        """qk_norm: SGLang has no separate kernel (the L2 norm is inside the delta-rule kernels): its input
        is kept for a fused delta rule."""
        self.kept["qkv_conv"] = np.asarray(inputs["qkv_conv"])
        return {}

    def conv1d(self, inputs) -> dict:
        """SGLang's prefill conv (``causal_conv1d_fn``: varlen, cache_indices, has_initial_state), or for the
        decode kernels its ``causal_conv1d_update``, one token of every sequence at a time."""
        torch, cfg = self.torch, self.cfg
        qkv, c0 = np.asarray(inputs["qkv"]), np.asarray(inputs["conv_state"])
        B, T, C = qkv.shape
        K = cfg.conv_kernel
        pool = self.pool(B, (C, K - 1), self.dtype)
        idx = self.indices(B)
        pool[self.placed(B)] = self._t(self.conv_in(c0), self.dtype)
        if self.kernel in FUSED:
            x = self._t(qkv, self.dtype)
            outs = []
            for t in range(T):
                xt = torch.cat([x[:, t], x[:1, t]])  # B sequences' token t and the padding sequence's
                outs.append(self.k.conv.causal_conv1d_update(xt, pool, self.conv_weight, None, "silu",
                                                             conv_state_indices=idx)[:B])
            out = torch.stack(outs, dim=1)
        else:
            x = self.packed(qkv, self.dtype)  # [tokens, C]
            out = self.k.conv.causal_conv1d_fn(
                x.transpose(0, 1), self.conv_weight, None, conv_states=pool,
                query_start_loc=self.cu_seqlens(B, T), seq_lens_cpu=[T] * B + [1], cache_indices=idx,
                has_initial_state=torch.ones(B + 1, dtype=torch.bool, device=self.device),
                activation="silu").transpose(0, 1)
            out = out[: B * T].reshape(B, T, C)
        from gdncheck.harness import to_numpy
        newest = np.asarray(to_numpy(pool[self.placed(B)]), dtype=np.float64)
        history = np.concatenate([c0, np.swapaxes(qkv, 1, 2)], axis=-1)  # the oldest column SGLang drops
        state = np.concatenate([history[..., -K:-K + 1], newest], axis=-1)
        return {"qkv_conv": out, "conv_state": state}

    def gates(self, inputs) -> dict:
        """``fused_gdn_gating`` on the tokens as rows (as SGLang's prefill calls it)."""
        a, b = self.gate_inputs(np.asarray(inputs["a"]), np.asarray(inputs["b"]))
        self.kept["a"], self.kept["b"] = a, b
        B, T, Hv = a.shape
        g, beta = self.k.gating.fused_gdn_gating(self.A_log, self._t(a.reshape(B * T, Hv), self.dtype),
                                                 self._t(b.reshape(B * T, Hv), self.dtype), self.dt_bias)
        return {"g": g.reshape(B, T, Hv), "beta": beta.reshape(B, T, Hv)}

    def delta_rule(self, inputs) -> dict:
        torch, cfg = self.torch, self.cfg
        v = np.asarray(inputs["v"])
        B, T = v.shape[:2]
        Hv, dk, dv = cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim
        pool = self.pool(B, (Hv, dv, dk), torch.float32)
        idx = self.indices(B)
        pool[self.placed(B)] = self._t(self.recurrent_in(np.asarray(inputs["recurrent_state"])), torch.float32)
        if self.kernel == "recurrent":
            o = self._recurrent(inputs, pool, idx, B, T)
        else:
            if not {"qkv_conv", "a", "b"} <= set(self.kept):
                return {}  # the fused kernels start from qk_norm's and the gates' inputs: none kept
            o = {"decode": self._decode, "packed_decode": self._packed_decode, "verify": self._verify}[
                self.kernel](pool, idx, B, T)
        self.kept.clear()
        from gdncheck.harness import to_numpy
        state = self.recurrent_out(np.asarray(to_numpy(pool[self.placed(B)]), dtype=np.float64))
        return {"core": o, "recurrent_state": state}

    # --- packed calls of a serving program (FORMAT.md §8: the pool entering the call, the program's slots) ---
    def run_packed_stage(self, stage: str, inputs: Mapping[str, np.ndarray], call: Mapping[str, Any]) -> dict:
        """A stage of a packed call: the kernels on the program's own stream (``cu_seqlens``), pool and slots
        (:class:`Packed`); the states returned as the whole pool after the call."""
        run = {"conv1d": self.packed_conv1d, "qk_norm": self.keep, "gates": self.packed_gates,
               "delta_rule": self.packed_delta_rule}.get(stage)
        if run is None:
            return {}
        ctx = interpreter_casts() if self.k.interpreted else contextlib.nullcontext()
        with ctx, self.torch.no_grad():
            return run(inputs) if stage == "qk_norm" else run(inputs, call)

    #: the slot id of the adapter's own padding sequence in a packed call's launches
    packed_pad = PAD_SLOT_ID

    def packed_slot(self, slot: int, size: int) -> int:
        """The engine's pool slot of a program's slot (``size``: the program's scratch slot, past its pool)."""
        return slot

    def packed_pool_size(self, size: int) -> int:
        """The engine's pool for a program's pool of ``size`` slots: those and the scratch slot."""
        return size + 1

    def packed_conv_pool(self, n: int, C: int, K: int):
        """The conv pool of ``n`` slots as allocated (written with :meth:`conv_in`'s rows) and as the kernels
        take it ([n, C, K-1] both, for SGLang)."""
        pool = self.torch.zeros((n, C, K - 1), dtype=self.dtype, device=self.device)
        return pool, pool

    def conv_update(self, xt, view, idx):
        return self.k.conv.causal_conv1d_update(xt, view, self.conv_weight, None, "silu", conv_state_indices=idx)

    def _packed_indices(self, pk: Packed, seqs: list[int]):
        return self.torch.tensor([self.packed_slot(pk.slots[i], pk.S) for i in seqs] + [self.packed_pad],
                                 dtype=self.torch.int32, device=self.device)

    def packed_gates(self, inputs, call) -> dict:
        got = self.gates({n: np.asarray(inputs[n])[None] for n in ("a", "b")})
        return {n: got[n][0] for n in ("g", "beta")}

    def packed_conv1d(self, inputs, call) -> dict:
        """SGLang's extend conv (``causal_conv1d_fn`` over the varlen stream, ``cache_indices``,
        ``has_initial_state`` where ``seq_pos > 0``), or for the decode kernels ``causal_conv1d_update`` one token
        of every sequence still running a launch; a ``verify_spec`` call on a copy of the pool (not written)."""
        torch, cfg = self.torch, self.cfg
        qkv, c0 = np.asarray(inputs["qkv"]), np.asarray(inputs["conv_state"])
        pk = Packed(call, c0.shape[0])
        K, C = cfg.conv_kernel, qkv.shape[1]
        pool, work = self.packed_conv_pool(self.packed_pool_size(pk.S), C, K)
        rows = self._t(self.conv_in(c0), self.dtype)
        for s in range(pk.S):  # a verify_spec call's slots are read back from nowhere: its pool is not written
            pool[self.packed_slot(s, pk.S)] = rows[s]
        if self.kernel in FUSED:
            x = self._t(qkv, self.dtype)
            out = torch.zeros_like(x)
            for t in range(max(pk.lengths)):
                seqs = [i for i in range(pk.n) if pk.lengths[i] > t]
                rows = [pk.cu[i] + t for i in seqs]
                xt = torch.cat([x[rows], x[:1]])
                out[rows] = self.conv_update(xt, work, self._packed_indices(pk, seqs))[:-1]
        else:
            x = self._t(pk.rows(qkv), self.dtype)
            out = self.k.conv.causal_conv1d_fn(
                x.transpose(0, 1), self.conv_weight, None, conv_states=work,
                query_start_loc=torch.tensor(pk.cu + [pk.T + 1], dtype=torch.int32, device=self.device),
                seq_lens_cpu=pk.lengths + [1], cache_indices=self._packed_indices(pk, list(range(pk.n))),
                has_initial_state=torch.tensor([p > 0 for p in pk.pos] + [False], device=self.device),
                activation="silu").transpose(0, 1)[: pk.T]
        from gdncheck.harness import to_numpy
        state = np.array(c0, dtype=np.float64, copy=True)
        newest = {s: np.asarray(to_numpy(work[self.packed_slot(s, pk.S)]), dtype=np.float64) for s in range(pk.S)}
        for i in range(pk.n):
            slot = pk.slots[i]
            seq = np.swapaxes(qkv[pk.cu[i]: pk.cu[i + 1]], 0, 1)
            history = np.concatenate([c0[slot] if slot < pk.S else np.zeros_like(c0[0]), seq], axis=-1)
            for m, off, dest in pk.snaps:  # a prefix snapshot's window: the history's, as the engine keeps none
                if m == i:
                    cut = history[..., : K + off]
                    state[dest] = cut[..., -K:]
            if slot < pk.S and pk.op != "verify_spec":
                state[slot] = np.concatenate([history[..., -K:-K + 1], newest[slot]], axis=-1)
        return {"qkv_conv": out, "conv_state": state}

    def packed_delta_rule(self, inputs, call) -> dict:
        """The delta rule of a packed call on the program's pool (SGLang's [S, Hv, dv, dk] layout): the
        ``recurrent`` and ``verify`` kernels in one launch over the varlen stream, the state after every token
        cached (``intermediate_states_buffer``) for a prefix snapshot's slot; the decode kernels one token of
        every sequence still running a launch, a snapshot copied from the slot after its token. A ``verify_spec``
        call leaves the pool as it was (the target verify's ``disable_state_update``; the decode kernels on a
        copy)."""
        torch, cfg = self.torch, self.cfg
        s0 = np.asarray(inputs["recurrent_state"])
        pk = Packed(call, s0.shape[0])
        Hv, dk, dv = cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim
        pool = torch.zeros((self.packed_pool_size(pk.S), Hv, dv, dk), dtype=torch.float32, device=self.device)
        s0_rows = self._t(self.recurrent_in(s0), torch.float32)
        for s in range(pk.S):
            pool[self.packed_slot(s, pk.S)] = s0_rows[s]
        before = pool.clone()
        if self.kernel in ("recurrent", "verify"):
            if self.kernel == "verify" and not {"qkv_conv", "a", "b"} <= set(self.kept):
                return {}
            o = self._packed_launch(pk, inputs, pool)
        elif not {"qkv_conv", "a", "b"} <= set(self.kept):
            return {}
        else:
            o = self._packed_steps(pk, pool)
        self.kept.clear()
        if pk.op == "verify_spec" and not torch.equal(before, pool):
            raise GDNError(f"{self.label} verify: the target verify wrote the state pool (disable_state_update=True)")
        from gdncheck.harness import to_numpy
        slots = [self.packed_slot(s, pk.S) for s in range(pk.S)]
        state = self.recurrent_out(np.asarray(to_numpy(pool[slots]), dtype=np.float64))
        return {"core": o, "recurrent_state": state}

    def _packed_launch(self, pk: Packed, inputs, pool):
        torch, cfg = self.torch, self.cfg
        L = max(pk.lengths)
        cache = torch.full((pk.n + 1, L, cfg.num_v_heads, cfg.head_v_dim, cfg.head_k_dim), float("nan"),
                           dtype=torch.float32, device=self.device)
        cache_idx = torch.tensor(list(range(pk.n)) + [PAD_SLOT_ID], dtype=torch.int32, device=self.device)
        idx = self._packed_indices(pk, list(range(pk.n)))
        cu = torch.tensor(pk.cu + [pk.T + 1], dtype=torch.int32, device=self.device)
        keep = pk.op != "verify_spec"
        if self.kernel == "recurrent":
            q, k, v = (self._t(pk.rows(np.asarray(inputs[n])), self.dtype)[None] for n in ("q", "k", "v"))
            g, beta = (self._t(pk.rows(np.asarray(inputs[n])), torch.float32)[None] for n in ("g", "beta"))
            o = self.k.recurrent.fused_recurrent_gated_delta_rule_update(
                q, k, v, g, beta, scale=cfg.scale, initial_state_source=pool, initial_state_indices=idx,
                cu_seqlens=cu, use_qk_l2norm_in_kernel=False, disable_state_update=not keep,
                intermediate_states_buffer=cache, intermediate_state_indices=cache_idx, cache_steps=L)
        else:  # SGLang's target verify kernel; every token accepted where the call writes its slots
            qkv, a, b = (self._t(pk.rows(np.asarray(self.kept[n]).reshape(pk.T, -1)), self.dtype)
                         for n in ("qkv_conv", "a", "b"))
            q, k, v = self._split(qkv[None])
            o = self.k.sigmoid.fused_sigmoid_gating_delta_rule_update(
                A_log=self.A_log, dt_bias=self.dt_bias, q=q, k=k, v=v, a=a, b=b, initial_state_source=pool,
                initial_state_indices=idx, scale=cfg.scale, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
                softplus_beta=1.0, softplus_threshold=20.0, disable_state_update=True,
                intermediate_states_buffer=cache, intermediate_state_indices=cache_idx, cache_steps=L)
            if keep:
                for i in range(pk.n):
                    pool[self.packed_slot(pk.slots[i], pk.S)] = cache[i, pk.lengths[i] - 1]
        for m, off, dest in pk.snaps:
            pool[self.packed_slot(dest, pk.S)] = cache[m, off - 1]
        return self.unpack(o[0], pk.T, 1)[:, 0]

    def _packed_steps(self, pk: Packed, pool):
        """The decode kernels on a packed call: launch t holds token t of every sequence that has one."""
        torch, cfg = self.torch, self.cfg
        work = pool.clone() if pk.op == "verify_spec" else pool
        qkv, a, b = (np.asarray(self.kept[n]).reshape(pk.T, -1) for n in ("qkv_conv", "a", "b"))
        out = torch.zeros((pk.T, cfg.num_v_heads, cfg.head_v_dim), dtype=self.dtype, device=self.device)
        for t in range(max(pk.lengths)):
            seqs = [i for i in range(pk.n) if pk.lengths[i] > t]
            rows = [pk.cu[i] + t for i in seqs]
            xt, at, bt = (self._t(np.concatenate([z[rows], z[:1]]), self.dtype) for z in (qkv, a, b))
            idx = self._packed_indices(pk, seqs)
            if self.kernel == "decode":
                q, k, v = self._split(xt[None])
                o = self.k.sigmoid.fused_sigmoid_gating_delta_rule_update(
                    A_log=self.A_log, dt_bias=self.dt_bias, q=q, k=k, v=v, a=at, b=bt, initial_state_source=work,
                    initial_state_indices=idx, scale=cfg.scale,
                    cu_seqlens=torch.arange(len(seqs) + 2, dtype=torch.int32, device=self.device),
                    use_qk_l2norm_in_kernel=True, softplus_beta=1.0, softplus_threshold=20.0)[0]
            else:
                o = xt.new_empty(len(seqs) + 1, 1, cfg.num_v_heads, cfg.head_v_dim)
                self.k.recurrent.fused_recurrent_gated_delta_rule_packed_decode(
                    mixed_qkv=xt, a=at, b=bt, A_log=self.A_log, dt_bias=self.dt_bias, scale=cfg.scale,
                    initial_state=work, out=o, ssm_state_indices=idx, use_qk_l2norm_in_kernel=True)
                o = o[:, 0]
            out[rows] = o[: len(seqs)].to(out.dtype)
            for m, off, dest in pk.snaps:
                if off == t + 1:
                    work[self.packed_slot(dest, pk.S)] = work[self.packed_slot(pk.slots[m], pk.S)]
        return out

    def _recurrent(self, inputs, pool, idx, B, T):
        q, k, v = (self.packed(np.asarray(inputs[n]), self.dtype)[None] for n in ("q", "k", "v"))
        g, beta = (self.packed(np.asarray(inputs[n]), self.torch.float32)[None] for n in ("g", "beta"))
        o = self.k.recurrent.fused_recurrent_gated_delta_rule_update(
            q, k, v, g, beta, scale=self.cfg.scale, initial_state_source=pool, initial_state_indices=idx,
            cu_seqlens=self.cu_seqlens(B, T), use_qk_l2norm_in_kernel=False)
        return self.unpack(o[0], B, T)

    def _split(self, qkv):
        """[..., conv_dim] as SGLang's q, k, v views (``torch.split`` by q_dim, k_dim, v_dim, then heads)."""
        cfg = self.cfg
        qd, vd = cfg.num_k_heads * cfg.head_k_dim, cfg.num_v_heads * cfg.head_v_dim
        q, k, v = self.torch.split(qkv, [qd, qd, vd], dim=-1)
        lead = qkv.shape[:-1]
        return (q.reshape(*lead, cfg.num_k_heads, cfg.head_k_dim), k.reshape(*lead, cfg.num_k_heads, cfg.head_k_dim),
                v.reshape(*lead, cfg.num_v_heads, cfg.head_v_dim))

    def _fused_inputs(self):
        return (self.packed(self.kept["qkv_conv"], self.dtype), self.packed(self.kept["a"], self.dtype),
                self.packed(self.kept["b"], self.dtype))

    def _decode(self, pool, idx, B, T):
        """SGLang's decode path without packed decode (``TritonGDNKernel.decode``): one token of every
        sequence a call, gating and the q/k L2 norm fused."""
        qkv, a, b = (self.kept[n] for n in ("qkv_conv", "a", "b"))
        outs = []
        for t in range(T):
            xt, at, bt = (self._t(np.concatenate([z[:, t], z[:1, t]]), self.dtype) for z in (qkv, a, b))
            q, k, v = self._split(xt[None])
            o = self.k.sigmoid.fused_sigmoid_gating_delta_rule_update(
                A_log=self.A_log, dt_bias=self.dt_bias, q=q, k=k, v=v, a=at, b=bt, initial_state_source=pool,
                initial_state_indices=idx, scale=self.cfg.scale,
                cu_seqlens=self.torch.arange(B + 2, dtype=self.torch.int32, device=self.device),
                use_qk_l2norm_in_kernel=True, softplus_beta=1.0, softplus_threshold=20.0)
            outs.append(o[0, :B])
        return self.torch.stack(outs, dim=1)

    def _packed_decode(self, pool, idx, B, T):
        """SGLang's default decode path on a GPU (``TritonGDNKernel.packed_decode``): the post-conv qkv rows,
        a and b in, one kernel for the split, the L2 norms, the gates and the rule."""
        cfg = self.cfg
        qkv, a, b = (self.kept[n] for n in ("qkv_conv", "a", "b"))
        outs = []
        for t in range(T):
            xt, at, bt = (self._t(np.concatenate([z[:, t], z[:1, t]]), self.dtype) for z in (qkv, a, b))
            out = xt.new_empty(B + 1, 1, cfg.num_v_heads, cfg.head_v_dim)
            self.k.recurrent.fused_recurrent_gated_delta_rule_packed_decode(
                mixed_qkv=xt, a=at, b=bt, A_log=self.A_log, dt_bias=self.dt_bias, scale=cfg.scale,
                initial_state=pool, out=out, ssm_state_indices=idx, use_qk_l2norm_in_kernel=True)
            outs.append(out[:B, 0])
        return self.torch.stack(outs, dim=1)

    def _verify(self, pool, idx, B, T):
        """SGLang's speculative target verify (``TritonGDNKernel.target_verify``): the call's T tokens as draft
        tokens, the pool not written, the state after every token cached at ``intermediate_state_indices``;
        then every draft token accepted: the slot takes the cached state of the last one, as
        ``update_mamba_state_after_mtp_verify`` does."""
        torch, cfg = self.torch, self.cfg
        qkv, a, b = self._fused_inputs()
        q, k, v = self._split(qkv[None])
        cache = torch.full((B + 2, T, cfg.num_v_heads, cfg.head_v_dim, cfg.head_k_dim), float("nan"),
                           dtype=torch.float32, device=self.device)
        cache_idx = torch.tensor(list(range(2, B + 2)) + [PAD_SLOT_ID], dtype=torch.int32, device=self.device)
        before = pool.clone()
        o = self.k.sigmoid.fused_sigmoid_gating_delta_rule_update(
            A_log=self.A_log, dt_bias=self.dt_bias, q=q, k=k, v=v, a=a, b=b, initial_state_source=pool,
            initial_state_indices=idx, scale=cfg.scale, cu_seqlens=self.cu_seqlens(B, T),
            use_qk_l2norm_in_kernel=True, softplus_beta=1.0, softplus_threshold=20.0, disable_state_update=True,
            intermediate_states_buffer=cache, intermediate_state_indices=cache_idx, cache_steps=T)
        if not torch.equal(torch.nan_to_num(before, 7.0), torch.nan_to_num(pool, 7.0)):
            raise GDNError("sglang verify: the target verify wrote the state pool (disable_state_update=True)")
        pool[self.placed(B)] = cache[cache_idx[:B].long(), T - 1]
        return self.unpack(o[0], B, T)


class Packed:
    """A packed call of a serving program (``run_packed_stage``'s ``call``: FORMAT.md §4.1) as the kernels take
    it: the program's sequences with their own slots, then the adapter's padding sequence of one token (slot
    -1, SGLang's ``PAD_SLOT_ID``). The program's own padding sequence (slot -1 there: computed from a zero state
    whose state is neither read nor written) runs from a zeroed scratch slot ``S`` past the pool, its rows
    judged as every sequence's; SGLang's kernels compute nothing for a -1 sequence (no rows written, or zeros)."""

    def __init__(self, call: Mapping[str, Any], pool_size: int):
        self.op = call["op"]
        self.cu = [int(c) for c in call["cu_seqlens"]]
        self.lengths = [b - a for a, b in zip(self.cu, self.cu[1:])]
        self.pos = [int(p) for p in call["seq_pos"]]
        self.S = pool_size
        self.slots = [int(x) if int(x) != PAD_SLOT_ID else pool_size for x in call["slots"]]
        self.snaps = list(zip(*(np.asarray(call[f]).tolist() for f in ("snap_seq", "snap_offset", "snap_slot")))) \
            if "snap_seq" in call else []
        self.T = self.cu[-1]

    @property
    def n(self) -> int:
        return len(self.lengths)

    def rows(self, a: np.ndarray) -> np.ndarray:
        """The stream [T, ...] and the adapter's padding token (a copy of the first row)."""
        return np.concatenate([a, a[:1]])


def sglang(cfg: GDNConfig, weights, *, profile: str = "f32", strict: bool = False, kernel: str = "packed_decode",
           device: str = "auto", impl_class: type[SGLangStages] = SGLangStages) -> SGLangStages:
    """SGLang's Triton GDN kernels, stage-isolated (``kernel=recurrent``) or fused (``decode``,
    ``packed_decode``, ``verify``: judge with ``verify --fused``).

    ``impl_class`` (not an ``--option``): a subclass with other glue, for the tests' mutants."""
    if kernel not in KERNELS:
        raise GDNError(f"sglang: expected --option kernel={'|'.join(KERNELS)}, found {kernel!r}")
    if profile not in PROFILES:
        raise NotApplicable(f"profile {profile}: SGLang serves Qwen3.5 in bf16 (and float32); profiles "
                            f"{', '.join(PROFILES)}")
    if np.asarray(weights["linear_attn.norm.weight"]).size != cfg.head_v_dim:
        raise NotApplicable(f"per_head gated norm ({cfg.num_v_heads * cfg.head_v_dim} = Hv·dv weights): "
                            f"SGLang's RMSNormGated holds one [head_v_dim = {cfg.head_v_dim}] weight shared by "
                            f"every head")
    return impl_class(cfg, weights, profile=profile, kernel=kernel, device=device)


def _not_end_to_end(config, program) -> None:
    raise NotApplicable(NO_LAYER)


sglang.options = ("kernel", "device")
sglang.check_case = _not_end_to_end  # end to end, before gdncheck's parser answers (docs/plugins.md)
