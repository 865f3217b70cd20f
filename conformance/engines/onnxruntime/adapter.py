"""ONNX Runtime's GDN contrib ops as a port of three stages: ``gdncheck run
gdncheck.conformance.engines.onnxruntime.adapter:onnxruntime --stage-isolated``.

A factory of the port contract (:mod:`gdncheck.harness.contract`) that judges the ``com.microsoft`` ops
onnxruntime-genai's model builder emits for a Qwen3.5 linear-attention layer — ``CausalConvWithState``
(stage ``conv1d``), ``LinearAttentionGate`` (``gates``) and ``LinearAttention`` (``delta_rule``; option
``op=gated_delta_net`` judges the newer fused ``GatedDeltaNet`` op instead) — each as a one-node ONNX graph
wired as the builder wires it, on ONNX Runtime's CPU execution provider, fed the suite's golden stage inputs.

What it exposes, what it cannot and why, the versions it knows: conformance/engines/onnxruntime/README.md.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.errors import GDNError
from gdncheck.harness import NotApplicable, StageOnly

log = logging.getLogger("gdncheck.ports.onnxruntime")

TESTED = "1.32.0"
INSTALL = "pip install onnxruntime==1.32.0 onnx"
NOT_INSTALLED = f"implementation 'onnxruntime' needs onnxruntime and onnx, not installed here: {INSTALL}"
#: the profiles whose activation dtype the ops' CPU kernels take (float and float16; the state is float)
DTYPES = {"f32": np.float32, "f16": np.float16}
NO_LAYER = ("ONNX Runtime's GDN contrib ops are three nodes of an exported graph, not the Qwen3.5 layer; only "
            "stage-isolated mode applies (stages conv1d, gates, delta_rule): gdncheck run "
            "gdncheck.conformance.engines.onnxruntime.adapter:onnxruntime --stage-isolated")
NO_BF16 = ("profile {profile}: the com.microsoft GDN ops' CPU kernels take float and float16 activations only "
           "(onnxruntime-genai's builder exports Qwen3.5 in fp32 or fp16, and int4 weights with those "
           "activations): there is no bfloat16 form to judge; profiles f32 and f16 judge the ops")
OPS = ("linear_attention", "gated_delta_net")
_LOCK = threading.Lock()


def _modules():
    """(onnx, onnxruntime, onnx.helper, onnx.TensorProto), or one line saying how to install them."""
    if importlib.util.find_spec("onnxruntime") is None or importlib.util.find_spec("onnx") is None:
        raise GDNError(NOT_INSTALLED)
    import onnx
    import onnxruntime
    from onnx import TensorProto, helper

    return onnx, onnxruntime, helper, TensorProto


def ort_version() -> str:
    try:
        return version("onnxruntime")
    except PackageNotFoundError:
        return "?"


class Graphs:
    """One-node ``com.microsoft`` graphs on the CPU execution provider, one session per node signature."""

    def __init__(self):
        self.onnx, self.ort, self.helper, self.tp = _modules()
        self.sessions: dict[tuple, Any] = {}

    def run(self, op: str, inputs: list[tuple[str, np.ndarray | None]], outputs: list[tuple[str, Any]],
            **attrs) -> list[np.ndarray]:
        """``op`` with ``inputs`` (name, array; None for an omitted optional input) and ``outputs`` (name,
        NumPy dtype), attributes as given; returns the outputs."""
        h, tp = self.helper, self.tp
        kinds = {np.dtype(np.float32): tp.FLOAT, np.dtype(np.float16): tp.FLOAT16, np.dtype(np.int32): tp.INT32}
        given = [(n, a) for n, a in inputs if a is not None]
        key = (op, tuple((n, a.dtype.str, a.ndim) for n, a in given), tuple(n for n, _ in inputs),
               tuple(sorted(attrs.items())), tuple((n, np.dtype(d).str) for n, d in outputs))
        with _LOCK:
            sess = self.sessions.get(key)
            if sess is None:
                node = h.make_node(op, [n if a is not None else "" for n, a in inputs], [n for n, _ in outputs],
                                   domain="com.microsoft", **attrs)
                graph = h.make_graph(
                    [node], op, [h.make_tensor_value_info(n, kinds[a.dtype], [None] * a.ndim) for n, a in given],
                    [h.make_tensor_value_info(n, kinds[np.dtype(d)], None) for n, d in outputs])
                model = h.make_model(graph, opset_imports=[h.make_opsetid("", 21),
                                                           h.make_opsetid("com.microsoft", 1)])
                model.ir_version = 10
                options = self.ort.SessionOptions()
                options.intra_op_num_threads = 1
                options.log_severity_level = 3
                sess = self.sessions[key] = self.ort.InferenceSession(
                    model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return sess.run(None, {n: a for n, a in given})


class OnnxRuntimeStages(StageOnly):
    """The three ops behind ``run_stage``; every other part of the contract not applicable.

    The glue is in small methods (:meth:`conv_state_in`/:meth:`conv_state_out`, :meth:`decay_scale`,
    :meth:`query`, :meth:`state_in`/:meth:`state_out`) so that the tests can break each one alone and see verify
    catch it."""

    no_layer = NO_LAYER

    def __init__(self, cfg: GDNConfig, weights: Mapping[str, np.ndarray], *, profile: str, op: str,
                 graphs: Graphs):
        self.cfg, self.profile, self.op, self.graphs = cfg, profile, op, graphs
        self.dtype = DTYPES[profile]
        w = {k.rsplit("linear_attn.", 1)[-1]: v for k, v in weights.items() if "linear_attn." in k}
        # the builder's initializers: the conv weight in the model's dtype, dt_bias and -exp(A_log) as float
        self.conv_weight = np.asarray(w["conv1d.weight"]).astype(self.dtype)
        self.dt_bias = np.asarray(w["dt_bias"]).astype(self.dtype).astype(np.float32)
        self.neg_exp_a = self.decay_scale(np.asarray(w["A_log"]))
        self.name = f"onnxruntime {ort_version()} com.microsoft ops ({profile}, CPU EP, delta rule: {op})"

    # --- glue (see the class docstring) -----------------------------------------------------------------
    def conv_state_in(self, state: np.ndarray) -> np.ndarray:
        """gdncheck's [B, conv_dim, K] (the last K columns) as the op's carry [B, conv_dim, K-1]: the newest K-1."""
        return state[..., 1:]

    def conv_state_out(self, window: np.ndarray, present: np.ndarray, T: int) -> np.ndarray:
        """The new [B, conv_dim, K]: the op's carry (the newest K-1 columns) after the column before them,
        read from the window the op was given (the entering state's columns, then the call's)."""
        return np.concatenate([window[..., T:T + 1], present], axis=-1)

    def decay_scale(self, A_log: np.ndarray) -> np.ndarray:
        """The builder's ``neg_exp_A`` initializer, a float tensor: ``-exp(A_log)`` of the checkpoint's A_log (in
        the profile's weight dtype), taken in float32 (the op's ``decay_scale`` is float whatever the
        activations; -exp(A_log) in f16 would overflow for A_log > 11)."""
        return -np.exp(A_log.astype(self.dtype).astype(np.float32))

    def query(self, q: np.ndarray) -> np.ndarray:
        """LinearAttention: the builder scales q by ``1/sqrt(dk)`` (a Mul in the model's dtype) and sets
        ``scale=1.0``; GatedDeltaNet scales q itself."""
        if self.op == "gated_delta_net":
            return q.astype(self.dtype)
        return q.astype(self.dtype) * self.dtype(1.0 / np.sqrt(self.cfg.head_k_dim))

    def state_in(self, s: np.ndarray) -> np.ndarray:
        """gdncheck's [B, Hv, dk, dv]: LinearAttention's own layout; GatedDeltaNet's is V-major [B, Hv, dv, dk]."""
        s = np.asarray(s, dtype=np.float32)
        return np.ascontiguousarray(np.swapaxes(s, -1, -2)) if self.op == "gated_delta_net" else s

    def state_out(self, s: np.ndarray) -> np.ndarray:
        return np.swapaxes(s, -1, -2) if self.op == "gated_delta_net" else s

    # --- stage-isolated mode ---------------------------------------------------------------------------------
    def run_stage(self, stage: str, inputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
        if stage == "conv1d":
            conv, state = self.conv1d(inputs["qkv"], inputs["conv_state"])
            return {"qkv_conv": conv, "conv_state": state}
        if stage == "gates":
            g, beta = self.gates(inputs["a"], inputs["b"])
            return {"g": g, "beta": beta}
        if stage == "delta_rule":
            core, state = self.delta_rule(*(inputs[n] for n in ("q", "k", "v", "g", "beta", "recurrent_state")))
            return {"core": core, "recurrent_state": state}
        return {}  # not one of the ops' stages: no tensor (FORMAT.md §8, every output optional)

    def conv1d(self, qkv, conv_state):
        """qkv [B, T, conv_dim], conv_state [B, conv_dim, K] -> qkv_conv [B, T, conv_dim], the new state.
        The builder's node: input qkv transposed to [B, conv_dim, T], a zero bias, activation silu."""
        T, dt = qkv.shape[1], self.dtype
        x = np.ascontiguousarray(np.swapaxes(np.asarray(qkv).astype(dt), 1, 2))
        past = np.ascontiguousarray(self.conv_state_in(np.asarray(conv_state).astype(dt)))
        out, present = self.graphs.run(
            "CausalConvWithState", [("input", x), ("weight", self.conv_weight),
                                    ("bias", np.zeros(self.cfg.conv_dim, dt)), ("past_state", past)],
            [("output", dt), ("present_state", dt)], activation="silu")
        window = np.concatenate([np.asarray(conv_state).astype(dt), x], axis=-1)
        return np.swapaxes(out, 1, 2), self.conv_state_out(window, present, T)

    def gates(self, a, b):
        """a, b [B, T, Hv] -> g, beta: the builder's fused LinearAttentionGate node."""
        dt = self.dtype
        g, beta = self.graphs.run(
            "LinearAttentionGate", [("a", np.asarray(a).astype(dt)), ("dt_bias", self.dt_bias),
                                    ("decay_scale", self.neg_exp_a), ("b", np.asarray(b).astype(dt))],
            [("decay", dt), ("beta", dt)])
        return g, beta

    def delta_rule(self, q, k, v, g, beta, s0):
        """q, k [B,T,Hk,dk], v [B,T,Hv,dv], g, beta [B,T,Hv], s0 [B,Hv,dk,dv] -> core [B,T,Hv,dv], state."""
        cfg, dt = self.cfg, self.dtype
        B, T = v.shape[:2]
        k, v, g, beta = (np.asarray(t).astype(dt) for t in (k, v, g, beta))
        if self.op == "gated_delta_net":
            # token-major [B, T, H, d] (the rank-4 spelling), q and k at Hk heads, each read by Hv/Hk value heads
            core, state = self.graphs.run(
                "GatedDeltaNet", [("query", self.query(q)), ("key", k), ("value", v), ("cu_seqlens", None),
                                  ("decay", g), ("beta", beta), ("initial_state", self.state_in(s0))],
                [("output", dt), ("final_state", np.float32)])
            return core.reshape(B, T, cfg.num_v_heads, cfg.head_v_dim), self.state_out(state)
        # the builder's LinearAttention: 3-D packed [B, T, H*d], q_num_heads = Hk, kv_num_heads = Hv
        flat = [np.ascontiguousarray(t.reshape(B, T, -1)) for t in (self.query(q), k, v)]
        core, state = self.graphs.run(
            "LinearAttention", [("query", flat[0]), ("key", flat[1]), ("value", flat[2]),
                                ("past_state", self.state_in(s0)), ("decay", g), ("beta", beta)],
            [("output", dt), ("present_state", np.float32)],
            q_num_heads=cfg.num_k_heads, kv_num_heads=cfg.num_v_heads, update_rule="gated_delta", scale=1.0)
        return core.reshape(B, T, cfg.num_v_heads, cfg.head_v_dim), self.state_out(state)


def onnxruntime(cfg: GDNConfig, weights, *, profile: str = "f32", strict: bool = False,
                op: str = "linear_attention",
                impl_class: type[OnnxRuntimeStages] = OnnxRuntimeStages) -> OnnxRuntimeStages:
    """ONNX Runtime's com.microsoft GDN ops, stage-isolated only. Option ``op`` (``linear_attention``, what
    onnxruntime-genai's builder emits, or ``gated_delta_net``) picks the delta rule's op.

    ``impl_class`` (not an ``--option``): a subclass with other glue, for the tests' mutants."""
    if profile not in DTYPES:
        raise NotApplicable(NO_BF16.format(profile=profile))
    if op not in OPS:
        raise GDNError(f"onnxruntime: expected --option op= one of {', '.join(OPS)}, found {op!r}")
    graphs = Graphs()
    if ort_version() != TESTED:
        log.warning("implementation 'onnxruntime' was tested with onnxruntime %s, found %s", TESTED, ort_version())
    return impl_class(cfg, weights, profile=profile, op=op, graphs=graphs)


def _not_end_to_end(config, program) -> None:
    raise NotApplicable(NO_LAYER)


onnxruntime.options = ("op",)
onnxruntime.check_case = _not_end_to_end  # end to end, before gdncheck's parser answers (docs/plugins.md)
