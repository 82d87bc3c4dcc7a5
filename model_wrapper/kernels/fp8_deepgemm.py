"""The block-FP8 prefill GEMM through FlashInfer's port of DeepGEMM (TensorRT-LLM's fp8_blockscale_gemm,
sm90 only): a second backend of kernels/fp8.py's "scaled_mm_block" path, beside cuBLASLt's
block-scaled GEMM (torch._scaled_mm). KernelConfig.fp8_block_gemm_backend picks it.

    block_mm(a, a_s, rows, weight, block_scale) -> y [rows, N] bf16
        a           float8_e4m3fn [Mp, K]   Mp = rows rounded up to 16, rows.. zero (fp8_act.py)
        a_s         float32 [Mp, K / 128], stride(0) == 1 (a [K / 128, Mp] buffer: cuBLASLt's layout)
        weight      float8_e4m3fn [N, K] row-major
        block_scale float32 [K / 128, N / 128] with stride(0) == 1 (Fp8Method.block_scale)

What the sources of flashinfer 0.7.2.post1 say (gemm_base.fp8_blockscale_gemm_sm90, the binding
csrc/fp8_blockscale_gemm_sm90_binding.cu, nv_internal/tensorrt_llm/deep_gemm/):
- Activation scales: float32 per token and 128 columns, column-major with the column stride M
  rounded up to 4 (TMA wants 16-byte columns): scale(m, g) at g * align4(M) + m. Only the pointer
  is read. Passing all Mp rows (Mp a multiple of 16, so align4(Mp) == Mp) makes that exactly the
  layout the producers in kernels/fp8_act.py already write for cuBLASLt: no other layout, the
  e4m3 values and scales bit-exact with quantize_fp8_reference as before. The output is then
  [Mp, N] and rows.. are dropped (as cuBLASLt's path does).
- Weight scales: float32 [ceil(N / 128), K / 128] row-major (or [N, K / 128] per row):
  block_scale.t(), which is contiguous.
- K % 128 == 0, N % 64 == 0 (the binding: N, K % 16); the output is bf16 whatever was asked
  (the binding writes __nv_bfloat16): bf16 models only.
- Accuracy: each 128-deep K block's WGMMA products start a fresh accumulator, promoted into an
  fp32 sum times scale_a * scale_b (no fast-accumulation drift).
- M < 32 runs a swapAB kernel (the weight as WGMMA's M side); this path starts at 17 tokens,
  so Mp >= 32 and the normal kernel runs. Tile config (block_m 64 up to 64 rows, else 128; block_n
  16..128 by waves over the SMs; stages; TMA multicast) is chosen from (M, N, K) on each call.
- Workspace: only bf16 inputs use it (internal quantization); e4m3 x e4m3 reads none, but the
  binding refuses a null one and FlashInfer's Python wrapper allocates, per call, the largest
  over its three runners (N * K bytes: 117 MB for Llama-3-8B's gate_up): the runner is called
  here directly with one small workspace configured once.
- JIT: the runner module is built by FlashInfer's JIT (nvcc with CUTLASS; the sources
  csrc/nv_internal and csrc/fused_moe/cutlass_backend/deepgemm_jit_setup.cu, the headers cublasLt.h,
  nvrtc.h, curand_kernel.h, -lnvrtc -lcuda; benchmarks/deepgemm_env.sh finds them in pip's nvidia
  packages) once a machine into FlashInfer's cache (~/.cache/flashinfer; 133 s on 2 CPU cores). Each
  kernel, one per (N, K, block_m, block_n, stages, multicast), is compiled on its first call by nvcc
  (the port's NVRTC path is switched off in its source: $TRTLLM_DG_NVCC_COMPILER, else
  $CUDA_HOME/bin/nvcc, else nvcc on PATH; 2.0-2.4 s each on the H100 machine) into
  $TRTLLM_DG_CACHE_DIR/cache (default ~/.tensorrt_llm/cache), which later processes reuse. The tile
  config follows M: Llama-3-8B's four shapes take 4-6 configs each over 17-4096 tokens, so the first
  steps of each size on a fresh machine pay those compiles.
- CUDA graphs: a call encodes four TMA descriptors on the host (passed by value) and launches on
  torch's current stream: capturable, but a compile must not happen inside a capture.
  Here a capture runs this GEMM only at sizes (N, K, Mp) that already ran outside one (the graph
  runners warm each bucket up eagerly first); any other takes cuBLASLt for that call.

warm(model, cfg, device, dtype), called by ModelWrapper at load (and on set_kernel_config), moves
those costs out of the first live steps: it builds the runner, checks each block-FP8 weight shape
and runs every padded size the backend takes up to AUTO_MAX_ROWS once (compiling their kernels, and
letting graph captures of those sizes use it); "deepgemm" compiles larger sizes on their first call.

usable(device, N, K) decides once per weight shape: sm90, the module builds, and one trial
product (256 rows) matches the float64 product of the same operands; otherwise cuBLASLt takes
the shape, with one logged warning. Never a wrong result.
"""

from __future__ import annotations

import time

import torch
from loguru import logger

# "auto": DeepGEMM up to this many (padded) rows, cuBLASLt above. H100, bench_fp8_block_gemm.py, Llama-3-8B's four
# GEMMs a layer (us, cuBLASLt -> DeepGEMM): 17 tokens 121.8 -> 106.6, 64: 123.9 -> 93.8, 128: 124.0 -> 99.6, 256: 137.4
# -> 129.0, but 512: 200.4 -> 209.1, 1024: 384.3 -> 401.5, 4096: 1548 -> 1574 (its tile choice: block_n <= 128)
AUTO_MAX_ROWS = 256
_TRIAL_ROWS = 256
_TRIAL_BOUND = 0.02  # max |error| / max |product| of the trial (the e4m3 operands' own product in float64)

_RUNNER: dict = {}  # device index -> the runner module, or the exception its build raised
_USABLE: dict = {}  # (device index, N, K) -> bool
_SEEN: set = set()  # (device index, N, K, Mp) run outside a capture (its kernel compiled)
_WORKSPACE: dict = {}  # device index -> the small buffer configured as the runner's workspace
_WARNED: set = set()  # device indices whose runner failed (warned once)


def wants(cfg, device: torch.device, dtype: torch.dtype, N: int, K: int, rows_padded: int) -> bool:
    """Whether the block-scaled GEMM of an [Mp, K] e4m3 input and an [N, K] weight runs here:
    cfg.fp8_block_gemm_backend "deepgemm" (any Mp) or "auto" (Mp <= AUTO_MAX_ROWS), a bf16 output
    on sm90, usable(N, K), and inside a CUDA graph capture only a size that ran before outside one."""
    backend = cfg.fp8_block_gemm_backend
    if backend == "cublaslt" or (backend == "auto" and rows_padded > AUTO_MAX_ROWS):
        return False
    if dtype != torch.bfloat16 or device.type != "cuda" or N % 64 or K % 128 or rows_padded < 32:
        return False  # (under 32 rows the swapAB kernel, whose layouts the trial does not check)
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if torch.cuda.is_current_stream_capturing():
        return (idx, N, K, rows_padded) in _SEEN and _USABLE.get((idx, N, K), False)
    return usable(device, N, K)


def usable(device: torch.device, N: int, K: int) -> bool:
    """Once per (device, N, K), never inside a capture: sm90, FlashInfer's runner builds and loads,
    and a trial product agrees with float64 within _TRIAL_BOUND. A refusal is logged once."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    key = (idx, N, K)
    if key not in _USABLE:
        cap = torch.cuda.get_device_capability(idx)
        if cap != (9, 0):
            if idx not in _WARNED:
                _WARNED.add(idx)
                logger.warning(f"FlashInfer's DeepGEMM block-FP8 GEMM runs on sm90 only, this GPU is "
                               f"sm{cap[0]}{cap[1]}: cuBLASLt's block-scaled GEMM takes the block-FP8 linears")
            _USABLE[key] = False
            return False
        try:
            _runner(idx)
        except Exception as e:  # noqa: BLE001 (no FlashInfer, its sources, nvcc or a header: not here)
            if idx not in _WARNED:  # once a device, not per shape
                _WARNED.add(idx)
                logger.warning(f"FlashInfer's DeepGEMM block-FP8 GEMM is unavailable on cuda:{idx} ({e!r:.400}); "
                               "cuBLASLt's block-scaled GEMM takes the block-FP8 linears")
            _USABLE[key] = False
            return False
        try:
            err = _trial(torch.device("cuda", idx), N, K)
        except Exception as e:  # noqa: BLE001 (a refused shape: not here)
            logger.warning(f"FlashInfer's DeepGEMM block-FP8 GEMM is unavailable for [{N}, {K}] weights "
                           f"({e!r:.400}); cuBLASLt's block-scaled GEMM takes them")
            _USABLE[key] = False
            return False
        if err > _TRIAL_BOUND:
            logger.warning(f"FlashInfer's DeepGEMM block-FP8 GEMM is {err:.3g} off for [{N}, {K}] weights; "
                           "cuBLASLt's block-scaled GEMM takes them")
        _USABLE[key] = err <= _TRIAL_BOUND
    return _USABLE[key]


def block_mm(a: torch.Tensor, a_s: torch.Tensor, rows: int, weight: torch.Tensor,
             block_scale: torch.Tensor) -> torch.Tensor | None:
    """e4m3 a [Mp, K] (scales a_s [Mp, K / 128], stride(0) == 1) times weight^T with its
    [K / 128, N / 128] block scales -> bf16 [rows, N] (a view of [Mp, N]); wants() must hold.
    None where the runner raised on the host (a kernel that did not compile, say): logged, and the
    shape is cuBLASLt's from then on."""
    mp, (N, K) = a.shape[0], weight.shape
    idx = a.device.index
    if a_s.stride(0) != 1 or a_s.stride(1) != mp:  # the column-major layout the TMA descriptor reads
        a_s = a_s.t().contiguous().t()
    w_s = block_scale.t()  # [N/128, K/128] row-major (Fp8Method keeps it so: a view, no copy)
    w_s = w_s if w_s.is_contiguous() else w_s.contiguous()
    out = torch.empty(mp, N, dtype=torch.bfloat16, device=a.device)
    try:
        # only the scales' pointers are read: [K/128, Mp] column-major and [N/128, K/128] row-major
        _runner(idx).run_gemm(a, weight, out, a_s.t(), w_s)
    except Exception as e:  # noqa: BLE001
        logger.warning(f"FlashInfer's DeepGEMM block-FP8 GEMM failed for [{N}, {K}] weights at {mp} rows "
                       f"({e!r:.400}); cuBLASLt's block-scaled GEMM takes them from now on")
        _USABLE[(idx, N, K)] = False
        return None
    if not torch.cuda.is_current_stream_capturing():
        _SEEN.add((idx, N, K, mp))
    return out[:rows] if rows != mp else out


def _runner(idx: int):
    """FlashInfer's Fp8BlockScaleGemmRunner (built on first use), its workspace configured."""
    got = _RUNNER.get(idx)
    if isinstance(got, Exception):
        raise got
    if got is None:
        try:
            from flashinfer.gemm.gemm_base import get_fp8_blockscale_gemm_runner_sm90

            with torch.cuda.device(idx):
                got = get_fp8_blockscale_gemm_runner_sm90()
                # e4m3 x e4m3 reads no workspace; the binding wants a non-null one all the same
                _WORKSPACE[idx] = ws = torch.zeros(256, dtype=torch.uint8, device=torch.device("cuda", idx))
                got.configure_workspace(ws)
        except Exception as e:  # noqa: BLE001
            _RUNNER[idx] = e
            raise
        _RUNNER[idx] = got
    return got


def _trial(device: torch.device, N: int, K: int) -> float:
    """max |DeepGEMM - float64| / max |float64| of one random product of _TRIAL_ROWS rows (the
    first 256 output columns checked), with the scale layouts block_mm gets from the model."""
    g = torch.Generator(device=device).manual_seed(0)
    w = torch.randint(-64, 64, (N, K), device=device, generator=g, dtype=torch.int8).to(torch.float8_e4m3fn)
    blocks = torch.rand(N // 128, K // 128, device=device, generator=g) + 0.5  # [N/128, K/128]
    a = torch.randn(_TRIAL_ROWS, K, device=device, generator=g).to(torch.float8_e4m3fn)
    a_s = (torch.rand(K // 128, _TRIAL_ROWS, device=device, generator=g) + 0.5).t()  # stride(0) == 1
    got = block_mm(a, a_s, _TRIAL_ROWS, w, blocks.t())
    if got is None:
        return float("inf")
    got = got[:, :256].double()
    ad = a.double() * a_s.double().repeat_interleave(128, dim=1)
    n = min(N, 256)
    wd = w[:n].double() * blocks[: -(-n // 128)].double().repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)
    want = ad @ wd.t()
    return float((got[:, :n] - want).abs().max() / want.abs().max())


def block_weights(model: torch.nn.Module) -> dict:
    """{(N, K): (e4m3 weight [N, K], block scales [K / 128, N / 128])}: one linear of each shape among
    the model's FP8 linears that keep 128 x 128 block scales (Fp8Method.block_scale)."""
    out = {}
    for m in model.modules():
        method = getattr(m, "method", None)
        if getattr(method, "name", None) == "fp8" and hasattr(method, "block_scale"):
            bs = method.block_scale(m)
            if bs is not None:
                out.setdefault(tuple(m.weight.shape), (m.weight, bs))
    return out


def warm(model: torch.nn.Module, cfg, device: torch.device, dtype: torch.dtype) -> None:
    """Where cfg.fp8_block_gemm_backend is not "cublaslt", on a CUDA device with a bf16 model: build
    the runner, check each block-FP8 weight shape (usable) and run each padded size from 32 to
    AUTO_MAX_ROWS rows once (their kernels compiled now, and graph captures of them allowed). Never
    raises: whatever fails here is cuBLASLt's later, with its warning."""
    if cfg.fp8_block_gemm_backend == "cublaslt" or device.type != "cuda" or dtype != torch.bfloat16:
        return
    try:
        weights = block_weights(model)
        t0, runs = time.perf_counter(), 0
        for (N, K), (w, bs) in weights.items():
            if N % 64 or K % 128 or not usable(device, N, K):
                continue
            a = torch.zeros(AUTO_MAX_ROWS, K, dtype=torch.float8_e4m3fn, device=device)
            for mp in range(32, AUTO_MAX_ROWS + 1, 16):
                a_s = torch.ones(K // 128, mp, device=device).t()  # the producers' layout, stride(0) == 1
                if block_mm(a[:mp], a_s, mp, w, bs) is None:
                    break
                runs += 1
        if runs:
            torch.cuda.synchronize(device)
            logger.info(f"FlashInfer's DeepGEMM block-FP8 GEMM ready for {len(weights)} weight shapes, "
                        f"{runs} sizes, in {time.perf_counter() - t0:.1f} s")
    except Exception as e:  # noqa: BLE001 (a warm-up must not fail a load)
        logger.warning(f"warming FlashInfer's DeepGEMM block-FP8 GEMM failed ({e!r:.400}); sizes not run yet "
                       "compile on their first call")
