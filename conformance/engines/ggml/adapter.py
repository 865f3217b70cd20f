"""llama.cpp's ``ggml_gated_delta_net`` op as a port of one stage: ``gdncheck run
gdncheck.conformance.engines.ggml.adapter:ggml --stage-isolated``.

A factory of the port contract (:mod:`gdncheck.harness.contract`) that judges ``ggml_gated_delta_net``,
the fused delta rule of llama.cpp's graph (through llama-cpp-python's libggml), on the suite's golden inputs,
stage-isolated.

What it exposes, what it cannot and why, the engine versions it knows: conformance/engines/ggml/README.md.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.errors import GDNError
from gdncheck.harness import NotApplicable, StageOnly

log = logging.getLogger("gdncheck.ports.ggml")

TESTED = "0.3.36"
INSTALL = ('CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF" pip install '
           '--no-binary llama-cpp-python "llama-cpp-python==0.3.36"')
NOT_INSTALLED = ("implementation 'ggml' needs the libggml that llama-cpp-python installs, not installed here: "
                 f"{INSTALL}")
PROFILES = ("f32",)
NO_LAYER = ("ggml_gated_delta_net is one op of llama.cpp's graph, not the Qwen3.5 layer; only stage-isolated mode, "
            "stage delta_rule, applies (gdncheck run gdncheck.conformance.engines.ggml.adapter:ggml --stage-isolated); "
            "the whole "
            "layer through llama.cpp is implementation llamacpp")
NO_BF16 = ("profile {profile}: ggml_gated_delta_net takes f32 tensors only (GGML_ASSERT type == GGML_TYPE_F32 on q, k, "
           "v, g, beta and the state), and llama.cpp runs it in f32 in every model (a bf16 GGUF's activations are "
           "f32; only its weights are bf16): there is no {profile} form of the op to judge, profile f32 judges it")
GGML_TYPE_F32 = 0
#: the op's inputs, in its argument order
INPUTS = ("q", "k", "v", "g", "beta", "recurrent_state")
#: ggml's GGML_MEM_ALIGN and the CPU backend's cache line (the op's work buffer holds one per thread)
_ALIGN, _CACHE_LINE = 16, 64


# --- the libraries -----------------------------------------------------------------------------------------
class _InitParams(ctypes.Structure):
    """``struct ggml_init_params`` (ggml.h): mem_size, mem_buffer, no_alloc."""

    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


@dataclass
class Libs:
    base: Any  # ctypes.CDLL of libggml-base
    cpu: Any  # ctypes.CDLL of libggml-cpu
    version: str  # llama-cpp-python's
    lib_dir: Path


_LIBS: Libs | None = None
_LOCK = threading.RLock()


def _lib_dir() -> Path:
    """``llama_cpp/lib`` of the installed llama-cpp-python, found without importing it."""
    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise GDNError(NOT_INSTALLED)
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


def _one(lib_dir: Path, stem: str) -> Path:
    names = sorted(lib_dir.glob(f"lib{stem}.so*")) + sorted(lib_dir.glob(f"lib{stem}.dylib")) + \
        sorted(lib_dir.glob(f"{stem}.dll"))
    if not names:
        raise GDNError(f"implementation 'ggml': no lib{stem} shared library in {lib_dir} ({NOT_INSTALLED})")
    return names[0]


def _declare(base, cpu) -> None:
    vp, i64, sz = ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t
    sigs = [(base, "ggml_init", vp, [_InitParams]), (base, "ggml_free", None, [vp]),
            (base, "ggml_new_tensor_4d", vp, [vp, ctypes.c_int, i64, i64, i64, i64]),
            (base, "ggml_gated_delta_net", vp, [vp, vp, vp, vp, vp, vp, vp, i64]),
            (base, "ggml_new_graph", vp, [vp]), (base, "ggml_build_forward_expand", None, [vp, vp]),
            (base, "ggml_get_data", vp, [vp]), (base, "ggml_nbytes", sz, [vp]),
            (base, "ggml_tensor_overhead", sz, []), (base, "ggml_graph_overhead", sz, []),
            (cpu, "ggml_cpu_init", None, []),
            (cpu, "ggml_graph_compute_with_ctx", ctypes.c_int, [vp, vp, ctypes.c_int])]
    for lib, name, restype, argtypes in sigs:
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise GDNError(f"implementation 'ggml': {Path(lib._name).name} has no {name} (written against "
                           f"llama-cpp-python {TESTED}, whose llama.cpp has ggml_gated_delta_net)") from None
        fn.restype, fn.argtypes = restype, argtypes


def libs() -> Libs:
    """libggml-base and libggml-cpu of the installed llama-cpp-python (one line saying how to install it
    otherwise), their functions declared; loaded once."""
    global _LIBS
    with _LOCK:
        if _LIBS is not None:
            return _LIBS
        lib_dir = _lib_dir()
        try:
            ver = version("llama-cpp-python")
        except PackageNotFoundError:
            ver = "?"
        if ver != TESTED:
            log.warning("implementation 'ggml' was tested with llama-cpp-python %s, found %s", TESTED, ver)
        try:
            base = ctypes.CDLL(str(_one(lib_dir, "ggml-base")), mode=ctypes.RTLD_GLOBAL)
            cpu = ctypes.CDLL(str(_one(lib_dir, "ggml-cpu")), mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            raise GDNError(f"{NOT_INSTALLED} (loading its libggml failed: {exc})") from None
        _declare(base, cpu)
        cpu.ggml_cpu_init()
        _LIBS = Libs(base, cpu, ver, lib_dir)
        return _LIBS


# --- the op ------------------------------------------------------------------------------------------------
def _padded(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def gated_delta_net(lib: Libs, q, k, v, g, beta, state, *, threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """One ``ggml_gated_delta_net`` call (``K = 1``) on ggml's CPU backend.

    Arrays in NumPy order, i.e. ggml's ``ne`` reversed: q, k ``[B, T, Hk, S]``, v ``[B, T, Hv, S]``, g, beta
    ``[B, T, Hv, 1]``, state ``[B, Hv, S, S]`` (ggml's own state layout); returns the core ``[B, T, Hv, S]`` and the
    new state ``[B, Hv, S, S]`` in the same layouts. Every precondition the op asserts is checked first (a failed
    GGML_ASSERT aborts the process)."""
    arrs = [np.ascontiguousarray(a, dtype=np.float32) for a in (q, k, v, g, beta, state)]
    q, k, v, g, beta, state = arrs
    B, T, Hv, S = v.shape
    Hk = q.shape[2]
    want = {"q": (B, T, Hk, S), "k": (B, T, Hk, S), "g": (B, T, Hv, 1), "beta": (B, T, Hv, 1), "state": (B, Hv, S, S)}
    for name, a in zip(("q", "k", "g", "beta", "state"), (q, k, g, beta, state)):
        if a.shape != want[name]:
            raise GDNError(f"ggml_gated_delta_net: {name} must be {want[name]} (NumPy order) for v {v.shape}, "
                           f"found {a.shape}")
    if Hk < 1 or Hv % Hk or min(B, T, S) < 1:
        raise GDNError(f"ggml_gated_delta_net: needs H_v % H_k == 0 and non-empty tensors, found q {q.shape}, "
                       f"v {v.shape}")
    out_rows = T * B + S * B
    data = sum(_padded(a.nbytes) for a in arrs) + _padded(4 * S * Hv * out_rows)
    work = threads * (4 * S + _CACHE_LINE) + _CACHE_LINE
    mem = data + 8 * lib.base.ggml_tensor_overhead() + lib.base.ggml_graph_overhead() + work + (1 << 16)
    ctx = lib.base.ggml_init(_InitParams(mem, None, False))
    if not ctx:
        raise GDNError(f"ggml_init failed for a context of {mem} bytes")
    try:
        leaves = []
        for a in arrs:
            ne = a.shape[::-1]
            t = lib.base.ggml_new_tensor_4d(ctx, GGML_TYPE_F32, *ne)
            assert lib.base.ggml_nbytes(t) == a.nbytes
            ctypes.memmove(lib.base.ggml_get_data(t), a.ctypes.data, a.nbytes)
            leaves.append(t)
        out = lib.base.ggml_gated_delta_net(ctx, *leaves, 1)
        graph = lib.base.ggml_new_graph(ctx)
        lib.base.ggml_build_forward_expand(graph, out)
        status = lib.cpu.ggml_graph_compute_with_ctx(ctx, graph, int(threads))
        if status != 0:
            raise GDNError(f"ggml_graph_compute_with_ctx returned status {status}")
        n = S * Hv * out_rows
        assert lib.base.ggml_nbytes(out) == 4 * n
        flat = np.ctypeslib.as_array((ctypes.c_float * n).from_address(lib.base.ggml_get_data(out))).copy()
    finally:
        lib.base.ggml_free(ctx)
    n_core = B * T * Hv * S
    return flat[:n_core].reshape(B, T, Hv, S), flat[n_core:].reshape(B, Hv, S, S)


# --- the implementation ------------------------------------------------------------------------------------
def tiled_order(num_k_heads: int, num_v_heads: int) -> np.ndarray:
    """For each of the op's value-head positions (tiled: position ``m*Hk + h`` reads key head ``h``), the grouped
    head it holds (grouped head ``h*r + m`` reads key head ``h``)."""
    r = num_v_heads // num_k_heads
    return np.array([h * r + m for m in range(r) for h in range(num_k_heads)], dtype=np.int64)


class GgmlDeltaRule(StageOnly):
    """ggml's ``ggml_gated_delta_net`` behind ``run_stage``; every other part of the contract not applicable.

    The glue is in small methods (:meth:`heads_in`/:meth:`heads_out`, :meth:`state_in`/:meth:`state_out`,
    :meth:`log_decay`, :meth:`query`) so that the tests can break each one alone and see verify catch it."""

    no_layer = NO_LAYER

    def __init__(self, cfg: GDNConfig, *, lib: Libs, threads: int):
        self.cfg, self.lib, self.threads = cfg, lib, threads
        self.order = tiled_order(cfg.num_k_heads, cfg.num_v_heads)
        self.name = f"ggml gated_delta_net (f32, cpu, llama-cpp-python {lib.version})"

    # --- glue (see the module docstring) -----------------------------------------------------------------
    def heads_in(self, x: np.ndarray, axis: int) -> np.ndarray:
        """A per-value-head tensor in gdncheck's grouped order, in the op's tiled order."""
        return np.take(x, self.order, axis=axis)

    def heads_out(self, x: np.ndarray, axis: int) -> np.ndarray:
        """A per-value-head tensor of the op (tiled order) in gdncheck's grouped order."""
        return np.take(x, np.argsort(self.order), axis=axis)

    def state_in(self, s: np.ndarray) -> np.ndarray:
        """gdncheck's [B, Hv, dk, dv] as ggml's state (NumPy [B, Hv, dv, dk]): transposed."""
        return np.swapaxes(s, -1, -2)

    def state_out(self, s: np.ndarray) -> np.ndarray:
        """ggml's state (NumPy [B, Hv, dv, dk]) as gdncheck's [B, Hv, dk, dv]: transposed."""
        return np.swapaxes(s, -1, -2)

    def log_decay(self, g: np.ndarray) -> np.ndarray:
        """gdncheck's g is already the log decay the op takes."""
        return g

    def query(self, q: np.ndarray) -> np.ndarray:
        """q as it is: the op scales it by 1/sqrt(S_v) itself."""
        return q

    # --- stage-isolated mode -----------------------------------------------------------------------------
    def run_stage(self, stage: str, inputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
        if stage != "delta_rule":
            return {}  # not this op's stage: no tensor (FORMAT.md §8, every output optional)
        t = {name: np.asarray(inputs[name], dtype=np.float32) for name in INPUTS}
        core, state = self.delta_rule(t["q"], t["k"], t["v"], t["g"], t["beta"], t["recurrent_state"])
        return {"core": core, "recurrent_state": state}

    def delta_rule(self, q, k, v, g, beta, s0):
        """q, k [B,T,Hk,dk], v [B,T,Hv,dv], g, beta [B,T,Hv], s0 [B,Hv,dk,dv] -> core [B,T,Hv,dv], state."""
        g = self.heads_in(self.log_decay(g), 2)[..., None]
        beta = self.heads_in(beta, 2)[..., None]
        core, state = gated_delta_net(self.lib, self.query(q), k, self.heads_in(v, 2), g, beta,
                                      self.heads_in(self.state_in(s0), 1), threads=self.threads)
        return self.heads_out(core, 2), self.state_out(self.heads_out(state, 1))


def ggml(cfg: GDNConfig, weights, *, profile: str = "f32", strict: bool = False, threads: int = 1,
         impl_class: type[GgmlDeltaRule] = GgmlDeltaRule) -> GgmlDeltaRule:
    """llama.cpp's ``ggml_gated_delta_net`` op, stage-isolated only. Option ``threads`` (default 1).

    ``impl_class`` (not an ``--option``): a subclass with other glue, for the tests' mutants."""
    if profile not in PROFILES:
        raise NotApplicable(NO_BF16.format(profile=profile))
    try:
        n_threads = int(threads)
    except (TypeError, ValueError):
        n_threads = 0
    if n_threads < 1:
        raise GDNError(f"ggml: expected --option threads=N with N >= 1, found {threads!r}")
    if cfg.head_k_dim != cfg.head_v_dim:
        raise NotApplicable(f"dk != dv ({cfg.head_k_dim} != {cfg.head_v_dim}): ggml_gated_delta_net's contract is "
                            "S_k == S_v (ggml.h; its state is [S_v, S_v, H_v, n_seqs] and the CPU kernel walks q and k "
                            "with S_v), and llama.cpp's graph asserts it (build_delta_net_fused)")
    return impl_class(cfg, lib=libs(), threads=n_threads)


def _not_end_to_end(config, program) -> None:
    raise NotApplicable(NO_LAYER)


ggml.options = ("threads",)
ggml.check_case = _not_end_to_end  # end to end, before gdncheck's parser answers for ggml (docs/plugins.md)
