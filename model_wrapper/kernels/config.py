"""KernelConfig: every tuned launch constant and kernel switch of the CUDA path, in one object.

The kernels object (layers/kernels.FlashInferKernels), the K/V store and the decode graph runner
hold one and pass it to the kernels' host functions; ModelWrapper / TextGenerator take it as
`kernel_config` (default: the values below) and a benchmark passes its variant as a new config
(`dataclasses.replace(config, gemv_max_tokens=4)`, then ModelWrapper.set_kernel_config) instead
of patching module globals. The measurements behind each value are in benchmarks/RESULTS.md and
benchmarks/results/; a comment here says why in one line. No Triton import: the CPU path reads it too.
"""

from __future__ import annotations

from dataclasses import dataclass

from model_wrapper.errors import ModelErrorCode, ModelLoadError

FP8_KV_DECODE = ("triton", "flashinfer")
FP8_KV_PREFILL = ("auto", "fa2", "fa3")
FP8_BLOCK_GEMM = ("auto", "cublaslt", "deepgemm")


@dataclass(frozen=True)
class KernelConfig:
    # programmatic dependent launch on sm90+: a kernel launches while the one before it drains
    # and waits (gdc_wait) before reading its output: hides the launch gap between dependent kernels
    pdl: bool = True

    # gemv (kernels/gemv.py): steps of 1..gemv_max_tokens tokens (beyond: skinny GEMM / cuBLAS)
    gemv_max_tokens: int = 2  # at 4 tokens its fp32 FMAs lose to cuBLAS's tensor cores
    gemv_tile: int = 16384  # weights a program holds in registers (8k / 32k within noise)
    gemv_warps: int = 8
    # warps of the GEMV at steps of 2+ tokens (the 1-token steps: gemv_warps). Llama-3-8B shape, bench_fp8.py
    # --decode-only batch 2, ms 4 warps / 8 / 8 again (session 53): H200 (c3) bf16 4.325 / 5.048 / 5.032, block FP8
    # (its bf16 lm_head) 3.409 / 3.501 / 3.477, per-channel 3.230 / 3.286 / 3.300, Qwen3-30B-A3B (bench_moe.py) bf16
    # 3.65 / 3.74 / 3.74, FP8 experts 3.04 / 3.11 / 3.11; H100 (c4) bf16 5.545 / 5.709 / 5.794, block FP8 4.254 /
    # 4.287 / 4.291, Qwen3-30B-A3B bf16 4.41 / 4.47 / 4.41; batch 1 unchanged
    gemv_multi_token_warps: int = 4
    gemv_max_k: int = 32768  # widest row a program holds; wider rows go to cuBLAS
    # row blocks a program takes in turn (its tile split into that many; the next block's loads issued before
    # the products of the one before), at steps of up to gemv_rounds_max_tokens tokens over rows of up to
    # gemv_rounds_max_k columns (qkv / o: down and 2-token steps lost, ab_gemv / ab_fp8_gemv); not with add_norm.
    # bf16: gemv_rounds, FP8: fp8_gemv_rounds. 1: one block, all of it loaded before the PDL wait. bf16 stays at 1:
    # per call qkv / o -6 / -10% (Qwen3-30B-A3B o -24%), but the steps even (H100, 8B batch 1: 5.290 / 5.311 ms
    # against 5.366 / 5.285; Qwen3-30B-A3B, 16 layers, batch 1: 1.419 against 1.413)
    gemv_rounds: int = 1
    gemv_rounds_max_tokens: int = 1
    gemv_rounds_max_k: int = 8192

    # add_rms_norm (kernels/norm.py): steps of up to this many tokens, those that run gemv or the
    # skinny GEMM next (it lets them launch at once; FlashInfer's norm only when it ends)
    norm_max_tokens: int = 64
    # at steps of 1..gemv_add_norm_max_tokens tokens, the residual add + RMSNorm inside the prologue of the
    # GEMV that consumes the normalized rows (kernels/gemv.py, fp8_gemv.py), for the consumers switched on
    # below: one kernel fewer at each such norm; False: the add_rms_norm kernel, then the GEMV (the A/B arm).
    # Every program of the GEMV recomputes the norm from h and the residual after its PDL wait (H100,
    # bench_fp8.py at batch 1, two runs, benchmarks/RESULTS.md session 34: 8B bf16 5.32-5.39 -> 5.24-5.26 ms,
    # FP8 3.39-3.41 -> 3.35)
    gemv_add_norm: bool = True
    gemv_add_norm_max_tokens: int = 1  # at 2 tokens each program normalizes two rows: 8B gate_up +13-26%
    # qkv after the input norm: off (8B bf16 even, FP8 -0.6% beside gate_up's; Qwen3-30B-A3B +2-3%)
    gemv_add_norm_qkv: bool = False
    gemv_add_norm_gate_up: bool = True  # a dense MLP's gate_up after the post-attention norm
    # a sparse MLP's router + routing kernel after the post-attention norm (kernels/moe_route.moe_router_route_norm:
    # program 0 also writes the normalized rows the experts read), where moe_fused_router takes the step (H100,
    # Qwen3-30B-A3B shape, bench_moe.py batch 1, three runs: bf16 3.02 / 3.04 / 3.06 -> 3.00 / 3.00 / 2.99 ms, FP8
    # experts 2.80 / 2.78 / 2.81 -> 2.77 / 2.75 / 2.76; logits bit-equal)
    gemv_add_norm_router: bool = True

    # skinny tensor-core GEMM (kernels/gemm.py), sm90: steps of gemv_max_tokens + 1 .. this many
    skinny_max_tokens: int = 64  # at 64 tokens qkv and o are even with cuBLAS

    # wide gate_up + SiLU GEMM (kernels/gemm.py), sm90: steps of at least this many tokens
    wide_min_tokens: int = 1024  # at 512 tokens it loses to cuBLAS + silu_and_mul

    # RoPE + K/V store in one kernel (kernels/kv_store.py) up to this many tokens. A program a token and head lost
    # at 4k to FlashInfer's RoPE + the store kernel (1024 until session 46); with token tiles (below) it wins at
    # every prefill size (H200, ab_rope_store.py, us a layer at 4k: Llama-3-8B 41.8 -> 36.4; Qwen3 with its q / k
    # norms, which the unfused chain runs as FlashInfer RMSNorms on copied heads, 266 -> 33)
    rope_store_max_tokens: int = 1 << 30
    # ... in a step that names LoRA adapters: their deltas take the program-a-token kernel (session 34's bound)
    rope_store_lora_max_tokens: int = 1024
    # steps of at least rope_store_block_t_min_tokens tokens (without LoRA or a row scale): a program a head and
    # rope_store_block_t tokens, one tile (a program a token and head is mostly launch and reduction latency there)
    rope_store_block_t: int = 16
    rope_store_block_t_min_tokens: int = 256
    rope_rows_warps: int = 4
    rope_warps: int = 4  # (1 / 2 within noise, base and LoRA)
    # Qwen3's per-head q / k RMSNorms inside that kernel (before RoPE) instead of their own kernels (two
    # norms, the copies of the strided q and k, FlashInfer's RoPE and the store; H100, Qwen3-30B-A3B shape,
    # bench_moe.py: batch 1 3.76 -> 3.43 ms, batch 32 21.69 -> 20.99)
    rope_store_qk_norm: bool = True

    # the LoRA-fused epilogues (kernels/lora_epilogues.py)
    silu_lora_block: int = 128  # columns per program
    silu_lora_block_t: int = 16  # tokens of one group per tensor-core product (its smallest M)
    silu_lora_warps: int = 4  # (64 / 128 columns x 2 / 4 / 8 warps within noise)
    add_norm_block: int = 128  # columns per program of add_lora_rms_norm
    add_norm_warps: int = 4  # (2 / 8 within noise)

    # mixture-of-experts decode path (kernels/moe_gemv.py, or moe_decode.py's K loops): steps of at most
    # moe_decode_pairs token-expert pairs (FP8 experts: moe_fp8_decode_pairs), and few per expert (a
    # repeated expert is read once per pair), skip the sort and read each pair's expert in GEMVs (0: every
    # step sorts). H100 sweep (sweep_moe.py, one Qwen3-30B-A3B layer in a graph, x its bytes): 1 token
    # 1.57x (sorted 1.90x), 2 tokens 1.43x (1.64x), 4 tokens 1.31x (1.34x), 8 tokens sorted 1.17x. FP8,
    # with the tiles dequantized (moe_fp8_direct off): the GEMVs stopped paying after one token (2 tokens:
    # 2.72x against 2.51x sorted; 4 tokens 2.31x against 1.78x), hence that mode's bound of 8 pairs
    moe_decode_pairs: int = 32
    # (8 before moe_fp8_direct; with it, bench_moe.py FP8 experts, H100 c6: 2 tokens 4.11 -> 3.52 ms at 16 pairs; H200
    # c7: 2 tokens 3.64 -> 3.10 at 16, 4 tokens 4.67 -> 4.51 at 32, batch 1 and 8 unchanged; H100 c11: 4 tokens 5.63
    # at 16 -> 4.96 / 4.99 at 32)
    moe_fp8_decode_pairs: int = 32
    moe_decode_pairs_per_expert: int = 1  # and per expert of the layer (Mixtral: 8 pairs, 4 tokens)
    moe_decode_block_n: int = 16  # gate_up columns a program (each a gate and an up row)
    moe_decode_block_k: int = 256
    moe_decode_down_block_n: int = 8  # down rows of each of the token's k experts a program: [k x 8, 128] a tile
    moe_decode_down_block_k: int = 128
    moe_decode_warps: int = 4
    moe_decode_stages: int = 3
    # the decode path's experts as register-tile GEMVs (kernels/moe_gemv.py: a program loads its whole
    # tile at once, PDL; down's weights stream in before gate_up ends); False: the K-looped kernels above
    moe_decode_gemv: bool = True
    moe_gemv_tile: int = 16384  # gate_up weights a program holds (model dtype; FP8 experts: moe_fp8_gemv_tile)
    # (H100 sweep: 40 us a layer at one token; 8192 was 1.7x slower in a variant since removed)
    moe_gemv_down_tile: int = 16384  # down weights a program holds (k experts x rows x padded I)
    moe_gemv_warps: int = 8
    # at 2+ tokens (session 53: sm90 SASS instructions a weight at 8 / 4 warps, gate_up 8.1 / 5.8, down 13.5 / 10.8; at
    # 2 warps down spills). Qwen3-30B-A3B bf16, bench_moe.py --decode-only, ms at batch 2 / 3 / 4 with 4 warps against
    # 8 and 8 again, three H100 runs (c10-c12): 4.34 / 6.61 / 6.68 against 4.42 / 6.77 / 6.84 and 4.41 / 6.75 / 6.81;
    # 4.35 / 6.63 / 6.62 against 4.42 / 6.78 / 6.77 and 4.41 / 6.78 / 6.80; 4.38 / 6.70 / 6.71 against 4.42 / 6.80 /
    # 6.83 and 4.44 / 6.84 / 6.89. H200 (session 54 c1): 3.58 / 5.39 / 5.42 (and again 3.58 / 5.39 / 5.41) against
    # 3.67 / 5.61 / 5.59 at 8 warps
    moe_gemv_multi_warps: int = 4
    # bf16 gate_up GEMV: every load of a program's tile issued before its products (a fence ptxas does not move
    # loads past; else it interleaves them, one or two 16-byte loads in flight a thread: sm90 SASS, 37 -> 63 registers)
    # (H100, sweep_moe.py --switches, a layer: 2 tokens 67.0 against 70.3 us, 4 tokens 108 against 114; 1 token within
    # the rounds' spread; bench_moe.py batch 1 3.18 against 3.25 ms)
    moe_gemv_loads_first: bool = True
    # FP8 experts in those GEMVs, tiles dequantized (moe_fp8_direct off): each dequantized weight's rounding to the model
    # dtype two at a time (cvt.rn.bf16x2.f32) instead of Triton's one-value conversion (sm90 SASS: 132 F2F a thread for
    # 128 weights); the same values
    moe_fp8_packed_round: bool = True
    # FP8 experts' GEMV tiles: e4m3 weights a gate_up / down program holds (32k: the bf16 tiles' bytes; sm90
    # registers a thread, packed rounding: gate_up 73 / 48 / 40, down 199 / 114 / 59 at 32k / 16k / 8k). H100, one
    # layer at 1 token: 39.4 us (32k, one-value rounding), 37.3 (32k, packed), 36.2 (16k), 35.6 (16k, packed);
    # bench_moe.py FP8 batch 1 3.22 (32k, one-value) -> 3.06 / 3.02 (16k, packed; two runs) -> 2.93 (8k, packed)
    moe_fp8_gemv_tile: int = 8192
    # FP8 experts' grouped GEMMs (the sorted path: more pairs than moe_fp8_decode_pairs) as W8A8 e4m3 products
    # (kernels/moe.py) instead of weight tiles dequantized to the model dtype in registers. H200, bench_moe.py
    # Qwen3-30B-A3B FP8 decode at batch 8 / 32 / 128: 4.75 / 10.81 / 13.56 ms weight-only, 4.41 / 10.41 / 12.87 W8A8
    # (a zeroed cache: batch 8 / 32 6.53 / 11.07 against 6.25 / 10.65); prefill 1k / 4k 24.7 / 89.2 against 21.3 / 82.0
    moe_fp8_w8a8: bool = True
    # its prefill tiles (more than moe_small_pairs pairs; BLOCK_K is 128, one scale group a step). H200, sweep_moe.py
    # --prefill-only, one layer at 1k / 4k tokens: 64 x 64, 4 warps 354 / 1024 us; the bf16 large tile's 128 rows
    # (128 x 64, 8 warps) 507 / 1263; weight-only FP8 489 / 1321, bf16 410 / 890 (128 x 128 at 8 warps spills)
    moe_w8a8_large_block_m: int = 64
    moe_w8a8_large_block_n: int = 64
    moe_w8a8_large_warps: int = 4
    moe_w8a8_large_stages: int = 3
    moe_fp8_gemv_down_tile: int = 8192
    # FP8 experts in those GEMVs kept e4m3 in registers (1 byte a weight), each 128-column group's sum of products
    # scaled after the sum (W = e4m3 * scale in fp32, kernels/fp8_reference.py's, as the dense FP8 GEMV) instead of
    # the tile dequantized and rounded to the model dtype before the products (2-4 bytes of registers a weight: the
    # 8k tiles above, whose programs re-read x / act from L2 about as many bytes as their weights); its own tiles.
    # H100, session 44 c6 (bench_moe.py, Qwen3-30B-A3B FP8 experts, ctx 512), ms at batch 1: dequantized 8k tiles 2.77
    # / 2.72 (two rows), direct 32k 2.52, 16k 2.47, gate_up 32k + down 16k 2.51; batch 2 with the decode path up to 16
    # pairs (moe_fp8_decode_pairs, was 8: 2 tokens sorted) 3.52 against 4.11. H200 (c7): batch 1 2.45 -> 2.10 ms (32k
    # tiles 2.15), sweep_moe.py --switches (c8) a layer at 1 / 2 tokens 28.2 / 46.8 -> 20.7 / 35.8 us
    moe_fp8_direct: bool = True
    moe_fp8_direct_tile: int = 16384
    moe_fp8_direct_down_tile: int = 16384
    # the direct GEMVs' warps at 2+ tokens (1 token: moe_gemv_warps). Session 53: sm90 SASS instructions a weight at 8
    # / 4 / 2 warps, gate_up 7.25 / 6.12 / 4.59, down 12.3 / 9.4 / 7.6 (a program's fixed costs over more weights a
    # thread). Qwen3-30B-A3B FP8 experts, bench_moe.py --decode-only, ms at batch 1 / 2 / 3 / 4, 2 warps from 2 tokens
    # against 8 (and again): H200 (c8) 2.11 / 2.95 / 4.13 / 4.15 against 2.10 / 3.04 / 4.51 / 4.52 (2.09 / 3.03 /
    # 4.50 / 4.52); H100 (c9) 2.45 / 3.37 / 4.77 / 4.81 and 2.45 / 3.38 / 4.75 / 4.79 against 2.42 / 3.43 / 4.94 /
    # 5.00 (2.45 / 3.44 / 4.96 / 4.99). At 1 token 4 or 2 warps are no faster (H200 c7: 2.11 / 2.13 against 2.09).
    # Measured and taken out: down's act loaded a copy a row in the tile's layout (no exchange through shared memory):
    # H200 (c7) batch 2 / 4 2.96 / 4.39 against 3.02 / 4.52 at 8 warps, but at 2 warps (c8) 3.00 / 4.25 against
    # 2.95 / 4.15 without it
    moe_fp8_direct_multi_warps: int = 2
    # routing (kernels/moe_route.py): softmax, top-k, renormalisation and cast in one kernel after the
    # router's projection (kernels.linear: the GEMV at 1-2 tokens); False: torch's ops (layers/moe.route)
    moe_fused_route: bool = True  # (H100 sweep: 40 us a layer at one token against 53 with torch's ops)
    moe_route_warps: int = 4  # (2 / 8 within noise)
    # the top-k of both routing kernels by a bitonic top-k of packed (probability, index) keys (tl.topk) instead of
    # the [E, E] rank comparison (sm90 SASS of the router + routing kernel's routing part: 363 instructions a thread
    # against 1907); the same experts, order and weights (H100, bench_moe.py: batch 1 3.20 -> 3.02 ms, 8 10.88 ->
    # 10.65, 32 20.72 -> 20.53)
    moe_route_sort: bool = True
    # the router's projection and the routing as one kernel (kernels/moe_route.moe_router_route: the last of its
    # programs routes) at steps of 1..gemv_max_tokens tokens; False: the GEMV, then the routing kernel
    moe_fused_router: bool = True  # (H100 bench_moe.py, batch 1: 3.46 -> 3.43 ms; -1% in two runs)

    # the sort of larger steps (kernels/moe_align.py): two Triton kernels, moe_align_chunk pairs a
    # program; False: the torch ops (about eight kernels), the A/B switch of the benchmarks
    moe_fused_align: bool = True
    moe_align_chunk: int = 128  # its rank step compares a chunk's pairs pairwise: [chunk, chunk] in registers
    # ... at steps of at most moe_small_pairs pairs (decode): more, smaller programs (each scatter program also reads
    # every chunk's counts: [P / chunk, E], so prefill keeps 128). H100, session 51 c1 / c2, bench_moe.py
    # Qwen3-30B-A3B, ms at batch 8 / 16 / 32, ctx 512, chunk 128 (twice) against 16: FP8 experts 7.69 / 7.63 -> 7.56,
    # 10.37 / 10.39 -> 10.26, 13.16 / 13.16 -> 12.87; bf16 10.69 / 10.67 -> 10.51, 15.26 / 15.46 -> 15.33, 20.45 /
    # 20.37 -> 20.18; ctx 2048 alike (FP8 batch 32 14.85 / 14.85 -> 14.55); batch 128 16.58 -> 16.52 (even); 32 as 16
    moe_align_small_chunk: int = 16

    # fused mixture-of-experts (kernels/moe.py): token-expert pairs per block of one expert,
    # output / K tiles, warps and stages of its two grouped GEMMs; steps of at most
    # moe_small_pairs token-expert pairs (decode) take the first set, larger ones the second
    # (benchmarks/sweep_moe.py, results/moe_sweep.json: Qwen3-30B-A3B's experts on an H200)
    moe_small_pairs: int = 2048
    moe_block_m: int = 16  # a decode step's experts get a token or two each: the smallest dot
    moe_block_n: int = 64
    moe_block_k: int = 128  # the best of 9 tilings at 1-128 tokens, by 3-7 %
    moe_warps: int = 4
    moe_stages: int = 3
    moe_large_block_m: int = 128  # prefill: hundreds of pairs per expert fill wide tiles
    moe_large_block_n: int = 128  # (4096 tokens: 1.05 ms a layer against 2.2 ms with 16-row tiles)
    moe_large_block_k: int = 64
    moe_large_warps: int = 8
    moe_large_stages: int = 3
    # the grouped GEMMs' weight tiles (steps past moe_small_pairs, Hopper) through TMA tensor descriptors instead of
    # pointer loads (H200, Qwen3-30B-A3B 4k prefill, the grouped GEMMs' profiled time: bf16 34.80 -> 32.89 ms, W8A8
    # 38.91 -> 37.89; 1k prefill 17.31 -> 16.81 / 19.54 -> 19.13 ms)
    moe_tma_weights: bool = True
    # ... and in the small tiles (decode batches past the decode path: 16-row tiles streaming the experts' weights):
    # off, session 47 c1 (H200, bench_moe.py --decode-only, ms at batch 8 / 32 / 128, off / on): bf16 8.18 / 8.09,
    # 14.99 / 14.98, 18.31 / 18.24; FP8 experts 6.32 / 6.69, 10.53 / 10.40, 12.83 / 12.89 (within the run's spread,
    # and FP8 batch 8 slower)
    moe_tma_small_weights: bool = False
    # FP8 experts' W8A8 small tiles (decode batches past the decode path) as W a^T, the weight rows on the MMA's M
    # side: wgmma e4m3 products instead of mma.sync on fp16 conversions of both operands (kernels/moe.py SWAP), with
    # their weight tiles through TMA (Hopper only; elsewhere the tiles stay unswapped). Swapped alone, session 45
    # (H100, c6) was within the run's spread; with TMA, session 47 (H200, bench_moe.py --decode-only, Qwen3-30B-A3B
    # FP8 experts, ms at batch 8 / 32 / 128, unswapped / swapped with TMA / unswapped again): c7 6.05 / 6.11 / 6.20,
    # 10.35 / 9.93 / 10.31, 12.63 / 12.37 / 12.60 (swapped with pointer loads 6.40, 10.29, 12.62); c8 at 32 / 128
    # 10.16 / 9.92 / 10.30, 12.57 / 12.38 / 12.58. Its arithmetic is the prefill tiles' and the dense block skinny
    # kernel's: the e4m3 products' accumulator keeps fewer bits than fp32, so a layer's output moves from the float64
    # oracle's values (the unswapped mma.sync: 0 at 3 / 16 pairs a tile) to 7-9e-3 of its largest entry (c8)
    moe_w8a8_swap: bool = True
    # FP8 experts' W8A8 small tiles take x quantized by the add + RMSNorm before them (fp8_act.add_rms_norm_fp8, which
    # also writes the normed rows for the router; layers/moe.SparseMoE.input_quant) instead of a quantize kernel of
    # their own: a kernel a layer fewer, the same values, at steps of moe_w8a8_norm_quant_min_pairs to
    # moe_small_pairs pairs. Session 48 c5 (H200, bench_moe.py --decode-only, Qwen3-30B-A3B FP8 experts, ms at batch
    # 8 / 32 / 128, off / on / on again / off again): 6.05 / 6.27 / 6.25 / 6.19, 10.07 / 10.01 / 10.00 / 10.16,
    # 12.64 / 12.48 / 12.47 / 12.64 (with block-FP8 attention, off / on: 6.33 / 6.41, 10.29 / 10.28, 13.13 / 12.95):
    # batch 8's 64 pairs lose, hence the bound; the prefill tiles (more pairs) were not measured and quantize x
    # themselves
    moe_w8a8_norm_quant: bool = True
    moe_w8a8_norm_quant_min_pairs: int = 256
    # the grouped GEMMs' grid as (column blocks, pair blocks): programs launched together read neighbouring row blocks
    # of one expert instead of one row block of each of many experts (kernels/moe.py N_FIRST); the same tiles and
    # values. Session 56 (H100, bench_moe.py, Qwen3-30B-A3B, ms, default grid twice / this twice): c4 decode ctx 512,
    # FP8 experts batch 8 7.66 / 7.62, 7.62 / 7.60, batch 32 12.62 / 12.60, 12.47 / 12.46, batch 128 16.28 / 16.28,
    # 16.08 / 16.05; bf16 (once) batch 8 10.44 / 10.57, 10.53, batch 32 19.95 / 19.86, 19.74, batch 128 24.84 /
    # 24.81, 24.55; c5 prefill 1k bf16 18.19 / 18.07, 17.77 / 17.82, FP8 experts 19.49 / 19.59, 19.39 / 19.38
    moe_grid_n_first: bool = True
    moe_sum_block: int = 1024  # columns a program of the sorted path's sum over a token's k rows

    # FP8 (e4m3) weights (kernels/fp8.py). Steps of 1..fp8_gemv_max_tokens tokens: the weight-only
    # GEMV (fp32 FMAs on weights held in registers); up to fp8_skinny_max_tokens: the weight-only
    # skinny tensor-core GEMM (e4m3 upcast in registers); beyond: activations quantized, then
    # torch._scaled_mm (one scale per row, or 128 x 128 blocks where torch takes them) or the
    # block-scaled Triton GEMM (benchmarks/bench_fp8_gemm.py times each path at each M)
    # (H100, benchmarks/ab_fp8_gemv.py, a layer's four projections: 2 tokens 124.6 us against the skinny
    # kernel's 140.5, 4 tokens 229 against 141)
    fp8_gemv_max_tokens: int = 2
    # at 2..fp8_gemv_max_tokens tokens, only weights of at most this many values (N x K) stay on the GEMV; larger ones
    # take skinny_mma where it runs. H200, session 44 c9 (bench_fp8.py / bench_moe.py decode at batch 2, the GEMV at 1
    # token only against 1-2): Llama-3-8B block FP8 (qkv / o / gate_up / down 25-117M values) 4.51 -> 3.46-3.48 ms,
    # per-channel 4.48-4.49 -> 4.38-4.39; Qwen3-30B-A3B block-FP8 attention (qkv 10.5M, o 8.4M) 3.01 -> 3.68 (hence
    # the bound). With it against without (c10 H200 / c11 H100, rows twice): 8B block 3.49-3.52 / 4.52-4.53 and
    # 4.84-4.85 / 4.66-4.70 (an H100 loss of 3.5%), per-channel 4.38-4.40 / 4.48-4.50 and 4.07 / 4.67-4.69
    fp8_gemv_multi_token_max_weights: int = 12 << 20
    fp8_gemv_tile: int = 32768  # weights x tokens a program holds (kernels/fp8_gemv.gemv_block_n; H100, 1
    # token: 8k-32k within 0.5%, 64k 7% slower)
    fp8_gemv_warps: int = 4  # (8: 1-2% slower at 1 token, 20% at 2)
    # the FP8 GEMV's x loaded a copy for each row of blocks of at most fp8_gemv_x_rows_max rows, in the weights' own
    # layout: no exchange of x's halves between threads (SHFL + FSEL) before the products (sm90 SASS, Triton 3.8:
    # gate_up 5.09 -> 4.72 instructions a weight, down 6.14 -> 5.46; qkv / o at 4 rows a block 4.59 -> 5.31).
    # Session 53, Llama-3-8B batch 1 (bench_fp8.py --decode-only), ms with 2 / default 0 and again: H200 (c5) block
    # FP8 2.637 / 2.732 / 2.747, per-channel 2.583 / 2.601 / 2.622; H100 (c6) block 3.249, 3.253 / 3.295 / 3.299,
    # per-channel 3.203, 3.194 / 3.192 / 3.218 (4 rows: 3.255 / 3.192; with down at 64k weights 3.268 / 3.209);
    # Qwen3-30B-A3B with block-FP8 attention projections (bench_moe.py ckpt-fp8, H100) 2.29 / 2.27 / 2.29.
    # Not kept: a chunk's 16 products as one FMA chain in column order (instructions a weight -7 to -9%, H200 c5
    # batch 1 block FP8 3.005-3.041 ms against 2.732 / 2.747); down (rows past 8192 columns) at its own tile / warps
    # (64k weights: H200 c3 2.689 against 2.743 / 2.744 block, H100 c4 3.299 against 3.321 / 3.281 block and 3.259
    # against 3.215 / 3.231 per-channel; 8 warps, 16k, 64k in two row blocks slower on both cards)
    fp8_gemv_x_rows_max: int = 2
    # a 1-token program of several rounds (qkv / o / gate_up) loads x once for all of them instead of once a round
    # (kernels/fp8_gemv.py). sm90 SASS instructions a weight: qkv / o 4.59 -> 4.19 (registers 159 -> 228), gate_up
    # 4.72 (x a copy a row) -> 4.53 (139 registers). bench_fp8.py / bench_moe.py --decode-only batch 1, ms on / off /
    # off again (H200, session 54): block FP8 2.624 / 2.617 / 2.650 (c1), 2.620 / 2.642 / 2.632 (c2); per-channel
    # 2.564 / 2.578 / 2.592 (c1); Qwen3-30B-A3B with block-FP8 attention projections 1.96 / 1.99 / 2.01 (c1). H100
    # (c8): block 3.247 / 3.270 / 3.266, per-channel 3.186 / 3.211 / 3.215, Qwen3-30B-A3B 2.19 / 2.31 / 2.26
    fp8_gemv_x_once: bool = True
    fp8_gemv_max_k: int = 32768  # padded row (chunks padded to a power of 2 x chunk) a program holds
    fp8_gemv_chunk: int = 16  # columns a thread sums alone (16: one 16-byte load; 32 within noise)
    # gemv_rounds of the FP8 GEMV (same bounds): 2 blocks of 16k (H100, bench_fp8.py --decode-only, two rows each,
    # 8B batch 1: 3.349 / 3.353 ms against 3.365 / 3.380 with 1; per call qkv 11.13 -> 10.73 us, o 7.64 -> 6.81)
    fp8_gemv_rounds: int = 2
    fp8_skinny_max_tokens: int = 16  # beyond, this kernel loses to bf16 (o at 64 tokens: 29.6 against 14.9 us, H100)
    fp8_skinny_block_k: int = 256  # K step; with groups it holds block_k // group sub-steps of one scale a row
    fp8_skinny_dequant: bool = True  # scale the e4m3 tile in registers, one product a K step (16 tokens, H100:
    # o 15.6 us against 23.1 with a product per group; qkv 20.4 / gate_up 58.8 / down 38.1 against bf16's
    # 19.9 / 82.9 / 42.9; benchmarks/pick_fp8_config.py on bench_fp8_gemm.py --sweep-only)
    fp8_skinny_block_n: int = 64  # rows a program, halving (to 16) until fp8_skinny_min_programs programs
    fp8_skinny_min_programs: int = 128  # (H200 sweep: 32 / 128 even, 512 slower)
    fp8_skinny_warps: int = 4  # up to 16 tokens (8 warps: 1.6-2x slower, H200 sweep)
    fp8_skinny_stages: int = 3
    # 17 to fp8_skinny_max_tokens tokens (a token tile of 32-128): the x tile grows with the tokens
    # (shared memory per stage) and every program re-reads x from L2, so these have their own values
    fp8_skinny_wide_block_k: int = 256  # (the best swept at 64 tokens, still ~2x bf16's time)
    fp8_skinny_wide_dequant: bool = True
    fp8_skinny_wide_min_programs: int = 128
    fp8_skinny_wide_warps: int = 4
    fp8_skinny_wide_stages: int = 3
    # one scale a row (per channel / tensor): the e4m3 tile upcast through fp32 (kernels/fp8.py _fp8_skinny_kernel; the
    # same values: e4m3 is exact in bf16). H100, bench_fp8_gemm.py --scales channel (session 39, e4), us at 8 tokens,
    # direct / through fp32: qkv 26.9 / 16.4, o 22.7 / 12.8, gate_up + SiLU 91.5 / 50.0, down 53.5 / 34.2 (bf16 19.9 /
    # 14.9 / 83.0 / 43.3); decode step B=4 7.49 -> 4.67 ms (bench_fp8.py --kind channel --decode-only)
    fp8_skinny_f32_upcast: bool = True
    # up to 16 tokens (since session 47 up to 32: below), the skinny step on the e4m3 tensor cores instead
    # (kernels/fp8_skinny_mma.py: x quantized first per token, and 128 columns for block weights, as the prefill paths
    # quantize it; W8A8 where "skinny" is weight-only; a scale a row with bf16 x only). H100 (session 39, e6),
    # Llama-3-8B shape, decode step ms at batch 4 / 8 / 16, weight-only skinny (fp32 upcast where per-channel)
    # against this: per-channel 4.76 / 6.07 / 6.86 against 4.39 / 4.64 / 4.94; block 5.67 / 5.89 / 6.09 against 5.26 /
    # 5.47 / 5.64 (bf16, e4: 5.87 / 6.05 / 6.26)
    fp8_skinny_mma: bool = True
    # the most tokens skinny_mma takes (16, 32 or 64: its token tile; beyond fp8_skinny_max_tokens it replaces the
    # prefill paths' cuBLASLt GEMMs, whose tiles are wider than a decode batch). Block weights: 32 since their tiles
    # come through TMA (fp8_skinny_mma_tma, session 47); Llama-3-8B decode step ms at batch 24 / 32 / 48, cuBLASLt
    # (16, before) / skinny_mma up to 32 / up to 64 / 16 again: H200 c5 5.251 / 4.257 / 4.253 / 5.250, 5.142 / 4.404 /
    # 4.414 / 5.128, 5.371 / 5.354 / 5.427 / 5.371 (64 tokens: 5.659 against 5.873 up to 64); H100 c6 (no 64 row)
    # 5.727 / 5.086 / - / 5.909, 5.796 / 5.333 / - / 5.757, 6.220 / 6.172 / - / 6.160
    fp8_skinny_mma_max_tokens: int = 32
    # the same for a scale a weight row (per channel / tensor). H100 (session 43, c3), Llama-3-8B shape, decode step ms
    # at batch 24 / 32, cuBLASLt's row-wise GEMM against skinny_mma's 32-token tile: 5.78 / 5.67 against 5.00 / 5.13
    # (block weights, pointer loads then: 5.87 / 5.74 against 5.93 / 6.02; at 32 since session 47, above)
    fp8_skinny_mma_row_max_tokens: int = 32
    # rows a program, halving (to 32) until fp8_skinny_mma_min_programs programs; with the stages and the
    # per-channel K step below from session 42's sweep (c8 H200, c9 H100; rewritten as sweep_fp8_skinny_mma.py;
    # was 64 rows, 4 stages, 512 columns). us a layer at 4-16 tokens, block / per-channel: H200 125-127 -> 121-122 /
    # 103 -> 88-89, H100 135-137 -> 132-133 / 113-114 -> 106-107. Decode steps at batch 4 / 8 / 16 (bench_fp8.py,
    # rows twice): per-channel H200 -8 / -10 / -10.5%, H100 -2 / -5.5 / -5.4%; block H200 +1.3 / -1.5 / -3.7%,
    # H100 -0.5 / -2.3 / -3.9%
    fp8_skinny_mma_block_n: int = 128
    fp8_skinny_mma_min_programs: int = 64  # (session 45: was 128; split K below)
    # K step (a multiple of 128): block weights (one product per 128 columns), a scale a row (products in place).
    # H100, bench_fp8_gemm.py --tokens 8 (session 39, e5), us of qkv / o / gate_up + SiLU / down at K steps 128 / 256
    # / 512: block 18.9 / 16.7 / 54.0 / 48.8, 21.4 / 17.5 / 63.4 / 49.2, 21.5 / 16.5 / 70.6 / 42.9 (weight-only skinny
    # 21.8 / 15.8 / 68.3 / 38.7); a scale a row 17.5 / 15.2 / 51.4 / 43.5, 15.8 / 13.0 / 61.3 / 34.4, 16.2 / 12.5 /
    # 55.0 / 32.5 (skinny 16.9 / 13.0 / 50.2 / 34.1)
    fp8_skinny_mma_block_k: int = 128
    fp8_skinny_mma_row_block_k: int = 256
    fp8_skinny_mma_warps: int = 4
    # warps of a program of 32 rows or fewer (session 44's halving gave Llama-3-8B's qkv, o and down 32 rows at 4
    # warps). Below 64 rows Triton builds no wgmma: the e4m3 operands are converted to fp16 for mma.sync products, and
    # at 4 warps a 32-row tile is computed twice over (warps 4 x 1 over 32 rows for block weights, 2 x 2 a scale a
    # row). sm90 SASS of the K loop, warp instructions per KB of weight at 4 / 2 warps: block 135 / 86, a scale a row
    # 92 / 61 (64 rows on wgmma: 58). Measured (H200, session 45 c1, 32-row tiles as session 44 launched them): 2
    # warps gained block weights 1-2.5% at batch 4-16 and cost per-channel ones 15% (bench_fp8.py decode, 3.40-3.78 ->
    # 4.05-4.36 ms); with the 64-row tiles below the 8B's projections no longer take 32-row tiles. Kept at 4
    fp8_skinny_mma_narrow_warps: int = 4
    # split K: a launch of fewer row tiles than this many programs sums each tile's K columns in that many parts (each
    # at least fp8_skinny_mma_split_min_steps K steps), the tile's last program to finish adding the parts in order
    # (0: off). One program a row tile, Llama-3-8B's o and down (4096 rows) ran 128 programs of 32 rows, or 64 of 64,
    # each streaming its whole K: H200, sweep_fp8_skinny_mma.py --per-shape at 2-16 tokens (session 45 c1), us against
    # their bytes' floor, block / per-channel: o 14.2-14.9 / 10.5-11.5 (floor 4.0), down 39.8-40.4 / 25.2-27.7 (13.9),
    # qkv 15.0-17.9 / 11.8-14.0 (6.0); gate_up (224-448 programs) 40.1-40.3 / 34.2 (27.9). Rows halved to 64 programs
    # (was 128: 64-row tiles, wgmma) and block weights split to 132 programs (c2 H200, c3 H100, --per-shape), us a layer
    # at 2-16 tokens, session 44's launch -> now: H200 block 110-119 -> 102-109, H100 block 127-131 -> 116-119,
    # H100 per-channel 106-108 -> 102-104 (split: no gain a scale a row, where the products add in place). Decode steps
    # (bench_fp8.py, H100 c3, rows twice) at batch 2 / 4 / 8 / 16, ms: block 4.88 / 4.95 / 5.06 / 5.38 -> 4.51-4.54 /
    # 4.55-4.57 / 4.73-4.74 / 5.00; per-channel 4.08 / 4.16 / 4.30 / 4.53 -> 3.95 / 4.06-4.07 / 4.19-4.20 / 4.44-4.45
    fp8_skinny_mma_split_programs: int = 132
    fp8_skinny_mma_row_split_programs: int = 0  # the same for a scale a weight row
    fp8_skinny_mma_split_min_steps: int = 2
    # where K splits, rows are not halved below this many a program (64: the smallest wgmma tile; Qwen3-30B-A3B's o,
    # 2048 rows, would halve to 32-row mma.sync tiles for 64 programs)
    fp8_skinny_mma_split_min_rows: int = 64
    # block weights: each K step's scales (x's per 128 columns, the weight rows') loaded a step ahead instead of in
    # the step that uses them (plain loads, which Triton's pipeliner does not stage: in every step a memory round trip
    # before the product could be scaled; the block path took 29.5 us a call against per-channel's 22.3, H100 session
    # 43 c7 profile, batch 8). Decode steps (c8, bench_fp8.py --kind block --decode-only, ahead / in the step / ahead
    # again) ms at batch 4 / 8 / 16: 4.764 / 5.016 / 4.899, 5.074 / 5.154 / 5.054, 5.374 / 5.384 / 5.342
    fp8_skinny_mma_scales_ahead: bool = True
    # block weights' tiles (64 rows x 128 e4m3 columns, the 128-byte swizzle) through TMA tensor descriptors (Hopper)
    # instead of cp.async pointer loads (sm90 SASS of 8B down: 5 UTMALDG a pipeline round against 25 LDGSTS). Written
    # in session 46; decode steps (session 47 c1, H200, bench_fp8.py --kind block --decode-only, default / tma /
    # default again) ms at batch 2 / 4 / 8 / 16: 3.769 / 3.589 / 3.881, 3.852 / 3.560 / 3.849, 3.982 / 3.677 /
    # 3.975, 4.233 / 3.901 / 4.238; c2 (H200, default now tma / ptr / again / ptr again) 3.458 / 3.859 / 3.565 / 3.861
    # ... 3.875 / 4.225 / 3.899 / 4.226 at 16 (4 or 6 stages: no better); c3 (H100) 4.299 / 4.524 / 4.356 / 4.524 ...
    # 4.808 / 4.984 / 4.798 / 4.999
    fp8_skinny_mma_tma: bool = True
    # the same for a scale a row (fp8_skinny_mma_row_block_k columns a tile: at 256 the box is wider than the
    # swizzle, one unswizzled copy a round): off, session 47 c1 (H200, --kind channel, default / tma / default
    # again) at batch 2 / 4 / 8 / 16: 3.202 / 3.343 / 3.303, 3.342 / 3.371 / 3.345, 3.447 / 3.476 / 3.473,
    # 3.637 / 3.700 / 3.655; c2 (H200) the same, and 128-column tiles (the swizzle's width) 3.727-4.067 through TMA,
    # 3.644-3.996 without, against 3.211-3.641; c3 (H100) 3.861-4.437 off, 3.979-4.467 on, 3.938-4.442 off again;
    # c4 (H200): the 256-column step as two swizzled 128-column boxes (10 UTMALDG a round in sm90 SASS), batch 2-32
    # 3.540-4.208 against 3.211-3.980 off (that kernel was not kept)
    fp8_skinny_mma_row_tma: bool = False
    fp8_skinny_mma_stages: int = 5
    # skinny_mma's x quantized by the add + RMSNorm before qkv / gate_up (kernels/fp8_act.add_rms_norm_fp8, the
    # same bytes as its own quantize kernel: one launch a linear fewer; fp8.quantized_input_group); down's input
    # comes out of gate_up's SiLU epilogue in bf16 and is still quantized by a kernel of its own. Off: even in
    # the step (H100, session 40 c3, bench_fp8.py --decode-only --batches 4,8,16, ms on / off / off again:
    # block 5.10 / 5.18 / 5.26, 5.39 / 5.33 / 5.40, 5.56 / 5.57 / 5.56; per-channel 4.35 / 4.28 / 4.46,
    # 4.64 / 4.54 / 4.65, 4.79 / 4.80 / 4.80): the norm's quantizing program a row costs what the launch saved
    fp8_skinny_mma_fused_quant: bool = False
    # o's input on skinny_mma (block weights, head_dim 128: a head is one 128-column group of x's quantization)
    # quantized by the decode attention's split merge (decode_attention.merge_splits(quant=True)) in the graphs'
    # decode steps, instead of a quantize kernel of its own after the merge (Linear.attention_input_quant). On since
    # session 53 c1 (H200; its CUDA tests passed): bench_fp8.py --decode-only block FP8, ms on / off / off again at
    # batch 2 / 4 / 8 / 16 / 32: 3.516 / 3.487 / 3.584, 3.508 / 3.561 / 3.564, 3.611 / 3.684 / 3.680, 3.841 / 3.906 /
    # 3.909, 4.402 / 4.396 / 4.381; Qwen3-30B-A3B with block-FP8 attention projections (bench_moe.py ckpt-fp8) at
    # batch 4 / 8 / 32: 4.53 / 4.53 / 4.60, 6.14 / 6.26 / 6.23, 9.90 / 10.05 / 10.02
    fp8_attention_out_quant: bool = True
    fp8_gemm_block_m: int = 128  # the block-scaled prefill GEMM (K step: the scale group, at most 128)
    fp8_gemm_block_n: int = 128
    fp8_gemm_group_m: int = 8  # row blocks a band (L2 reuse of the weight)
    fp8_gemm_warps: int = 8
    fp8_gemm_stages: int = 3
    # prefill steps on the "scaled_mm_block" path: the activation quantization fused into the kernel
    # that produces the activation (kernels/fp8_act.py: residual add + RMSNorm before qkv / gate_up,
    # SiLU-and-mul before down) instead of a quantize kernel per linear; off: the unfused A/B baseline
    fp8_fused_act_quant: bool = True
    # the same on the row-wise "scaled_mm" path (one weight scale a row: compressed-tensors' channel / tensor
    # strategies with dynamic activations): the producers quantize per token (one group of K columns) for
    # qkv / gate_up (the norm, hidden a power of 2 up to 16k) and down (SiLU-and-mul, a row of up to 16k)
    # (H100, bench_fp8.py --kind channel, Llama-3-8B shape, 4k prefill: 68.16 ms against 71.12 / 71.45; the same
    # e4m3 operands as the standalone quantize kernel's)
    fp8_fused_act_quant_per_token: bool = True
    # the activation quantize kernels (kernels/fp8_act.py: the norm's, SiLU-and-mul's, the standalone one) divide
    # each value by its group's scale through the scale's reciprocal and one fused correction (div_by_scale:
    # Markstein's theorem, the same e4m3 values bit for bit) instead of div.rn a value, which made the per-token
    # SiLU-and-mul + quantize instruction-bound (154 us a 4k x 14336 call against 98 of bytes, H100). Session 58,
    # H200 (benchmarks/ab_fp8_quant.py): that kernel 96.5-100.7 us against 144.2, per 128 columns 79.6 against 107.6;
    # per-channel 4k prefill 59.9-61.1 ms against 61.8 (bf16 96.4-96.9: 1.58-1.61x against 1.56x)
    fp8_quant_reciprocal: bool = True
    # cuBLASLt's fast accumulation on the row-wise / per-tensor torch._scaled_mm path (prefill and mixed steps;
    # torch refuses it with block scales): the FP8 tensor cores keep partial sums in their narrower accumulator,
    # as vLLM's sm90 FP8 GEMMs do (CUTLASS's FP8FastAccum schedules). A GEMM's max rel. error against float64 at
    # K = 14336: 1.3e-4 -> 7.4e-3, bf16 output rounding alone 2-4e-3. Per-channel 4k prefill on an H100: 63.6 ms
    # against 68.6-70.8 without (bf16 98.0; session 42 c2). Off in sessions 35-41 after one failure of
    # test_fp8_checkpoint.py's FP8-vs-fp32 bound, which session 42 measured at the edge for either setting
    # (tiny per-channel model, seeds 3-4: 0.157-0.160 off, 0.127-0.168 on, bound 0.166)
    fp8_fast_accum: bool = True
    # the GEMM of the block-FP8 "scaled_mm_block" path (128 x 128 weight blocks, 17+ tokens): "cublaslt"
    # (torch._scaled_mm), "deepgemm" (FlashInfer's DeepGEMM port, kernels/fp8_deepgemm.py: sm90, bf16; checked
    # once per weight shape, else cuBLASLt with a warning) or "auto": DeepGEMM up to fp8_deepgemm.AUTO_MAX_ROWS =
    # 256 padded rows, cuBLASLt above. H100, session 36 (benchmarks/RESULTS.md; the same logits as cuBLASLt's):
    # decode at batch 32 / 64 / 128 5.82 / 6.68 / 8.36 -> 5.20 / 5.68 / 7.60 ms, a 128-token prefill 6.21-6.35 ->
    # 5.47; the 4k prefill stays on cuBLASLt (DeepGEMM's GEMMs 48.3-50.7 ms there against 45.5-46.9). Not
    # "cublaslt": the model's load builds FlashInfer's runner and nvcc compiles the kernels of 32-256 rows
    # (fp8_deepgemm.warm: once a machine, then cached on disk); without FlashInfer's full sources or nvcc: cuBLASLt
    fp8_block_gemm_backend: str = "auto"

    # decode CUDA graphs (model_wrapper/cuda_graph.py)
    triton_decode: bool = True  # decode attention on kernels/decode_attention.py where it fits (16-bit caches)
    # the graphs' decode attention (and its split merge) launched with PDL at batches up to this (0: never):
    # it launches while RoPE + store drains, and o's GEMV reads its weights while attention runs (H100,
    # Qwen3-30B-A3B shape, bench_moe.py: batch 1 3.43 -> 3.26 ms; at every batch, batch 8 11.17 -> 11.38)
    decode_attention_pdl_max_batch: int = 2
    # there, the decode kernel reads its page metadata and prefetches each program's first K / V tile into L2
    # (prefetch.global.L2) before its PDL wait, while the kernels before it drain; False: all after the wait. H100,
    # batch 1 / ctx 512 (benchmarks/RESULTS.md, session 35): Qwen3-30B-A3B shape 3.05 / 3.03 (new, run twice) ->
    # 3.00 ms, FP8 experts 2.80 -> 2.76; Llama-3-8B FP8 3.327 / 3.354 -> 3.321; logits bit-equal
    decode_attention_prefetch: bool = True
    # the graphs' decode steps of at least this many rows (1 << 30: none): RoPE (with Qwen3's q / k norms), the K/V
    # store and the decode attention in one kernel (decode_attention.rope_decode_attention) where the step would
    # otherwise run kv_store's fused RoPE + store and then the Triton decode kernel (no LoRA delta or deferred norm on
    # qkv, not the e4m3 CUDA kernel): one launch and one kernel boundary less a layer. Session 52 (bench_fp8.py /
    # bench_moe.py --decode-only, ctx 512, against the two kernels in the same run): H100 Llama-3-8B shape batch 64 /
    # 128 bf16 -0.8% / -1.8%, block FP8 -2.4% / -2.0%, Qwen3-30B-A3B shape batch 128 bf16 -0.9%, FP8 experts -1.4%
    # (batch 64 even); H200 batch 128 bf16 -2.8%, FP8 -2.5%; batches 2-32 even, batch 1 +2-3% slower on Qwen3-30B-A3B
    # (the q / k norms and RoPE on the attention's critical path, where PDL hid the separate kernel's)
    decode_rope_attention_min_batch: int = 64
    # the graphs' single-token decode steps over a 16-bit cache whose (request, KV head) pairs fill from about a third of
    # the SMs (decode_attention.FAT_MAX_SPLITS) to all of them: one program a SM (decode_attention.FAT: 128 keys a step,
    # two K / V buffers of 64 KB, so one program fits a SM) with sms // pairs splits, instead of LAUNCH["16-bit"] (64
    # keys, one buffer, several programs a SM) at decode_splits' ~2 programs a SM. H100, session 55: c2 (bench_fp8_kv.py
    # --sweep --kv-dtype bf16 --kv-heads 4, Qwen3-30B-A3B's 32 q / 4 KV heads, the kernel and its merge alone, us)
    # 32 x 512 16.9 against the default's 22.1 (4 splits), 32 x 2048 52.1 against 59.0. c3 (decode steps, ms, default
    # / on / default again): Qwen3-30B-A3B FP8 experts batch 32 ctx 512 12.90 / 12.59 / 12.84, ctx 2048 14.57 / 14.26
    # / 14.55, batch 16 10.19 / 10.09 / 10.14; bf16 batch 32 20.28 / 19.90 / 20.10, batch 16 15.28 / 15.08 / 15.27;
    # Llama-3-8B bf16 batch 16 (128 pairs) 7.293 / 7.177 / 7.290, batch 8 (2 splits) 6.554 / 6.504 / 6.527; FP8 at
    # 8-16 within the spread; 4 splits (Qwen3-30B-A3B batch 8) even to 1% slower, hence the bound. Hopper only (its
    # two 64 KB buffers do not fit an sm89 GPU's shared memory, and no other GPU was measured)
    decode_attention_fat: bool = True
    # decode attention over an FP8 (e4m3) cache, eager steps and graphs: "triton" (kernels/
    # decode_attention.py, its launch in decode_attention.LAUNCH["e4m3"]) or "flashinfer" (its e4m3
    # decode wrapper); the faster in benchmarks/bench_fp8_kv.py --sweep (H200, K/V bytes / time / copy
    # bandwidth: Triton 0.47-0.65 against FlashInfer 0.34-0.60, faster at every batch 32-128 x 512-8k;
    # H100, --sweep --occupancy, its launch since: 0.57-0.86 against FlashInfer's 0.42-0.77)
    fp8_kv_decode: str = "triton"
    # with fp8_kv_decode "triton": the single-token decode rows over an e4m3 cache on kernels/e4m3_decode_cuda.py
    # (CUDA C++ compiled by NVRTC at first use: every operand straight from its registers into mma.sync) where it
    # fits (head_dim 128, GQA groups of 1-8, pages of a multiple of 16, no window, sm89+), at steps of at least
    # fp8_kv_decode_cuda_min_batch rows (under PDL where decode_attention_pdl_max_batch says, as the Triton kernel);
    # its splits by decode_splits(cuda=True). H200, session 50 (benchmarks/ab_e4m3_cuda_attention.py, K/V bytes /
    # time / copy bandwidth): 0.85-0.96 at batch 64-128 x 2k-8k against Triton's 0.62-0.68; batch 32 0.73 / 0.88
    # (2k / 8k) against 0.62 / 0.66. Llama-3-8B block FP8 + FP8 KV decode steps at context 2048 (c3): batch 128
    # 10.92 -> 9.42 ms, batch 32 5.27 -> 5.05-5.07; batch 8 even; at batch 1 without PDL 2.97 against Triton's
    # 2.87-2.88 under PDL
    fp8_kv_decode_cuda: bool = True
    fp8_kv_decode_cuda_min_batch: int = 3
    # eager prefill / chunked prefill steps (and the prefill rows of eager mixed steps) over an FP8 (e4m3) cache,
    # FlashInfer backend: "fa2" (bf16 q over the e4m3 cache; the A/B arm), "fa3" (sm90: q rounded to e4m3 with
    # scale 1.0, all-e4m3 tensor-core products, the K/V scales per head in the kernel; attention/fa3_fp8.py; other
    # GPUs, head dims and sliding-window layers stay on fa2; its FlashInfer module is built on first use where it
    # is not prebuilt: minutes) or "auto": fa3 where that module is already built (benchmarks/fa3_fp8_env.sh's
    # prebuilt one, or an earlier build), else fa2. H200, session 38 (benchmarks/bench_fp8_attention.py, Llama-3-8B
    # heads, one 4k prompt): fa2 0.659 ms a layer, fa3 e4m3 0.232 (+0.037 for q's quantization; fa3 bf16 over bf16
    # K/V 0.240); bench_fp8.py --kind channel, fast accumulation, 4k prefill: FP8 + FP8 KV 74.31 -> 64.75 ms
    # (bf16 98.05, FP8 + bf16 KV 63.04 / 64.16); error against float64 attention over the e4m3 inputs 1.6e-2
    # (fa2 3.6e-3), against bf16 attention on the unrounded inputs 6.0e-2 (fa2 5.8e-2: the cache's own rounding)
    fp8_kv_prefill: str = "auto"
    unsplit_kv: bool = True  # FlashInfer graph buckets whose (request, KV head) pairs fill the SMs plan unsplit
    # multi-token decode steps (q_len 2..16 per request: speculative verify, small chunks) replay graphs
    # of (batch bucket, tokens-per-request bucket) with kernels/verify_attention.py; off: they run eagerly
    verify_graphs: bool = True
    # mixed and small prefill steps (any mix of 1..T new tokens per request, causal, one logit row
    # per request: model_wrapper/mixed_graph.py) of at most mixed_max_tokens tokens replay graphs of
    # (token bucket, request bucket) with kernels/prefill_attention.py; off: they run eagerly
    mixed_graphs: bool = True
    mixed_max_tokens: int = 2048  # 8B on H100: graphs even with eager past 1024 tokens, far ahead below
    mixed_block_rows: int = 64  # query rows (tokens x GQA group) a program of the prefill attention (128: no better)
    mixed_block_n: int = 64  # keys a step of its loop
    # steps that use LoRA adapters in the mixed graphs too (the Triton LoRA kernels over the bucket's
    # static per-token slots and slot groups); off: such steps run eagerly (H100, session 33: within the
    # bf16 bound of peft's fp32 logits with folded / unfolded A stacks, fused epilogues or expand kernels)
    mixed_lora_graphs: bool = True

    def adds_norm(self, tokens: int, consumer: str) -> bool:
        """Whether a step of `tokens` tokens runs the residual add + RMSNorm inside the GEMV of `consumer`
        ("qkv", "gate_up" or "router"): gemv_add_norm, its token bound and the consumer's switch."""
        return self.gemv_add_norm and 0 < tokens <= self.gemv_add_norm_max_tokens and getattr(
            self, f"gemv_add_norm_{consumer}")

    def __post_init__(self):
        if self.fp8_block_gemm_backend not in FP8_BLOCK_GEMM:
            raise ModelLoadError(ModelErrorCode.BAD_CONFIG, f"KernelConfig.fp8_block_gemm_backend: expected one of "
                                 f"{list(FP8_BLOCK_GEMM)}, got {self.fp8_block_gemm_backend!r}")
        if self.fp8_kv_decode not in FP8_KV_DECODE:
            raise ModelLoadError(ModelErrorCode.BAD_CONFIG, f"KernelConfig.fp8_kv_decode: expected one of "
                                 f"{list(FP8_KV_DECODE)}, got {self.fp8_kv_decode!r}")
        if self.fp8_kv_prefill not in FP8_KV_PREFILL:
            raise ModelLoadError(ModelErrorCode.BAD_CONFIG, f"KernelConfig.fp8_kv_prefill: expected one of "
                                 f"{list(FP8_KV_PREFILL)}, got {self.fp8_kv_prefill!r}")
        if self.rope_store_block_t < 1 or self.rope_store_block_t & (self.rope_store_block_t - 1):
            raise ModelLoadError(ModelErrorCode.BAD_CONFIG, f"KernelConfig.rope_store_block_t: expected a power of 2 "
                                 f"(the token tile's rows), got {self.rope_store_block_t!r}")
        if self.fp8_gemv_chunk < 1 or self.fp8_gemv_chunk & (self.fp8_gemv_chunk - 1):
            raise ModelLoadError(ModelErrorCode.BAD_CONFIG, f"KernelConfig.fp8_gemv_chunk: expected a power of 2, "
                                 f"got {self.fp8_gemv_chunk!r}")
