"""Online FP8: a bf16 / fp16 / fp32 checkpoint quantized to block FP8 while it loads (quantization="fp8").

The loader is made to see a transformers fine-grained FP8 checkpoint (quantization.py's "fp8" method),
produced on the fly from the float tensors as they are read, so that everything downstream is the
block-FP8 checkpoint path unchanged (fp8_weights.plan_fp8 / keep_fp8_storage, TP's block_split and scale
slicing, the FP8 MoE experts, Fp8Method with cuBLASLt / DeepGEMM on CUDA, the dequantization on the CPU):

    with_quantization(cfg, "fp8")  cfg.quant = ONLINE_FP8 (block 128 x 128, dynamic activations per token
                                   and 128 columns); an "fp8" checkpoint as it is; refused for another
                                   quant_method (compressed-tensors)
    OnlineFp8(tensors, quant)      the headers as the loader sees them: every quantized linear's
                                   `<linear>.weight` is F8_E4M3 and `<linear>.weight_scale_inv` F32
                                   [ceil(N/128), ceil(K/128)] exists, in the weight's file
    OnlineFp8.open(path)           a safe_open stand-in serving those two names from the float weight
    OnlineFp8.scales               scale name -> float32 scale (the loader's `small`), filled as weights are read

Quantized: every decoder projection (q / k / v / o, gate / up / down, shared experts) and every expert
(gate / up / down, Mixtral's w1 / w2 / w3). Left as floats, as the shipped FP8 checkpoints leave them:
lm_head, the embeddings, norms, biases, the MoE router (`mlp.gate`, Mixtral's `block_sparse_moe.gate`)
and Qwen2-MoE's `shared_expert_gate`.

Per weight W [N, K] (fp32 arithmetic, deterministic): for each 128 x 128 block b (edge blocks partial),
    scale_b = amax(|W_b|) / 448          (448: e4m3's largest finite value; an all-zero block: scale 1)
    q_b     = e4m3(W_b / scale_b)        (torch's float8_e4m3fn cast: round to nearest even)
so that W ~ q * scale, exactly the `weight_scale_inv` convention of a fine-grained FP8 checkpoint.

Cost: one pass over the float weights. A weight is read (its whole tensor, also under TP, before any
slice: every rank computes the same scales), quantized on the load device (a CUDA device when loading
onto one) and handed to the loader as e4m3 + scales on the CPU; peak memory is one float weight and its
fp32 copy at a time. Its scale is kept for the loader (small); a scale asked for before its weight (none
in the loader's order) reads that weight once more.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from safetensors import safe_open

from model_wrapper.checkpoint import FLOAT_DTYPES, TensorInfo
from model_wrapper.errors import ModelErrorCode, ModelLoadError
from model_wrapper.fp8_weights import is_linear_weight
from model_wrapper.layers.fp8_linear import E4M3
from model_wrapper.quantization import BLOCK, Fp8Config

QUANTIZATIONS = ("fp8",)  # the values of the `quantization` argument (None: load as the checkpoint is)
E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
# the routers and lm_head stay floats (Fp8Config.ignores: a name, or a module ending in ".<name>")
ONLINE_FP8 = Fp8Config("fp8", "block", BLOCK, "dynamic", ignore=("lm_head", "gate", "shared_expert_gate"),
                       online=True)


def with_quantization(cfg, quantization: str | None):
    """cfg (a ModelConfig) with online quantization `quantization` applied (None: cfg unchanged).

    As vLLM's `quantization` argument: "fp8" on a checkpoint that is already an FP8 one of quant_method
    "fp8" (a fine-grained block checkpoint) names what it is, and it loads as it is (nothing re-quantized).
    Raises UNSUPPORTED_QUANTIZATION for a value other than None / "fp8", or for "fp8" on a checkpoint
    of another quant_method (compressed-tensors: the method named would not be the one served)."""
    if quantization is None:
        return cfg
    if not isinstance(quantization, str) or quantization not in QUANTIZATIONS:
        raise ModelLoadError(ModelErrorCode.UNSUPPORTED_QUANTIZATION,
                             f"quantization: expected None or one of {list(QUANTIZATIONS)}, got {quantization!r}")
    if cfg.quant is not None and cfg.quant.method == quantization:
        return cfg  # already what was asked for: the checkpoint's own scales, as vLLM serves it
    if cfg.quant is not None:
        raise ModelLoadError(ModelErrorCode.UNSUPPORTED_QUANTIZATION,
                             f"quantization: expected a float (bf16 / fp16 / fp32) checkpoint or one of "
                             f"quant_method {quantization!r} for {quantization!r}, got one already quantized "
                             f"(config.json quantization_config: {cfg.quant.method} {cfg.quant.kind}); load it "
                             f"without quantization=")
    return dataclasses.replace(cfg, quant=ONLINE_FP8)


def quantize_block_fp8(w: torch.Tensor, device: torch.device | str | None = None,
                       scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """w float [N, K] -> (e4m3 [N, K], float32 scale [ceil(N/128), ceil(K/128)]), both on the CPU.

    Computed in fp32 on `device` (None: w's); scale: the block scales when already known (the same
    values this function would compute). W ~ q.float() * scale repeated over each 128 x 128 block."""
    w = w.to(device=device if device is not None else w.device, dtype=torch.float32)
    n, k = w.shape
    nb, kb = math.ceil(n / BLOCK), math.ceil(k / BLOCK)
    blocks = F.pad(w, (0, kb * BLOCK - k, 0, nb * BLOCK - n)).view(nb, BLOCK, kb, BLOCK)
    if scale is None:
        # the scale on the CPU: CUDA divides a tensor by a Python number as a product with its reciprocal,
        # one ulp off the CPU's division for some blocks (then some e4m3 bytes too); amax is exact anywhere
        amax = blocks.abs().amax(dim=(1, 3)).cpu()
        scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    scale = scale.to(torch.float32).cpu()
    # |w / scale| <= 448 up to the division's rounding; the clamp keeps that last ulp finite in e4m3
    q = (blocks / scale.to(w.device)[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q.view(nb * BLOCK, kb * BLOCK)[:n, :k].cpu(), scale


class OnlineFp8:
    """The checkpoint as an FP8 one: headers (`tensors`), reads (`open`) and scales (`scales`).

    tensors: the float checkpoint's headers (checkpoint.read_checkpoint); quant: cfg.quant (ONLINE_FP8);
    device: where the quantization runs (CUDA when loading onto it; else the CPU)."""

    def __init__(self, tensors: dict[str, TensorInfo], paths: dict[str, str], quant: Fp8Config, device):
        self.device = torch.device(device) if torch.device(device).type == "cuda" else torch.device("cpu")
        self.paths = paths
        self.weights: dict[str, str] = {}  # scale name -> its weight's name
        self.tensors = dict(tensors)
        for name, info in tensors.items():
            module = name[: -len(".weight")]
            if (is_linear_weight(name) and not quant.ignores(module) and info.dtype in FLOAT_DTYPES
                    and len(info.shape) == 2):
                scale = f"{module}.{quant.scale_suffix}"
                if scale in tensors:  # a float checkpoint with a scale tensor: not ours to invent
                    raise ModelLoadError(ModelErrorCode.UNEXPECTED_TENSOR,
                                         f"{scale} in {tensors[scale].file}: expected no scale tensors in a float "
                                         f"checkpoint (quantization='fp8' makes them), got one")
                n, k = info.shape
                self.tensors[name] = TensorInfo(info.file, "F8_E4M3", info.shape)
                self.tensors[scale] = TensorInfo(info.file, "F32", (math.ceil(n / BLOCK), math.ceil(k / BLOCK)))
                self.weights[scale] = name
        self.scale_of = {w: s for s, w in self.weights.items()}
        self.scales = _Scales(self)

    def open(self, path: str) -> "_File":
        """safe_open(path, framework="pt", device="cpu") serving the quantized names."""
        return _File(self, safe_open(path, framework="pt", device="cpu"), path)

    def quantize(self, f, name: str, file: str) -> torch.Tensor:
        """Weight `name` read from open safetensors file f, as e4m3 [N, K] (its scale kept in self.scales)."""
        w = f.get_tensor(name)
        if not bool(torch.isfinite(w).all()):
            raise ModelLoadError(ModelErrorCode.NONFINITE_WEIGHT,
                                 f"{name} in {file}: expected finite weights, got NaN or inf")
        scale_name = self.scale_of[name]
        q, scale = quantize_block_fp8(w, self.device, self.scales.get(scale_name))
        self.scales[scale_name] = scale
        return q


class _Scales(dict):
    """scale name -> float32 scale; one asked for before its weight was read is computed from it."""

    def __init__(self, online: OnlineFp8):
        super().__init__()
        self.online = online

    def __missing__(self, scale_name: str) -> torch.Tensor:
        online = self.online
        weight = online.weights[scale_name]
        file = online.tensors[weight].file
        with online.open(online.paths[file]) as f:
            online.quantize(f._f, weight, file)
        return self[scale_name]


class _File:
    """A safe_open handle whose quantized weights come as e4m3 and whose scale names exist."""

    def __init__(self, online: OnlineFp8, f, path: str):
        self.online, self._f, self.path = online, f, path

    def __enter__(self):
        self._f.__enter__()
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)

    def get_tensor(self, name: str) -> torch.Tensor:
        if name in self.online.weights:
            return self.online.scales[name]
        if name in self.online.scale_of:
            return self.online.quantize(self._f, name, self.online.tensors[name].file)
        return self._f.get_tensor(name)

    def get_slice(self, name: str):
        if name in self.online.weights or name in self.online.scale_of:
            return _Slice(self.get_tensor(name))  # the whole tensor quantized, then sliced
        return self._f.get_slice(name)


class _Slice:
    """safetensors' slice interface (get_shape, indexing) over a tensor already in memory."""

    def __init__(self, t: torch.Tensor):
        self.t = t

    def get_shape(self) -> list[int]:
        return list(self.t.shape)

    def __getitem__(self, index) -> torch.Tensor:
        return self.t[index].contiguous()
