"""Each Triton launch fits the shared memory of the GPUs it runs on: its default launches (KernelConfig, the
per-shape tiles) compiled ahead of time on a machine without a GPU for each arch that launches them, at the
stages the launcher picks there, and metadata.shared held to that arch's limit.

A program whose num_stages buffers of K-step tiles need more shared memory than it may opt into fails at launch
(OutOfResources). The limits: sm90 (H100, H200) 232448 bytes, sm80 (A100) 166912, sm89 (L4, L40S) 101376. Where
each kernel runs: the bf16 skinny and wide GEMMs on sm90 only (gemm.sm90); the e4m3 kernels on sm89+ (Triton has no
e4m3 type before sm89); the rest on any of them, PDL on sm90+ only (uses_pdl). The sm80 / sm89 builds pipeline their
mma.sync operands through num_stages - 1 buffers where sm90's wgmma builds keep num_stages, so a launch can fit
sm89 with less than its sm90 bytes: the MoE prefill tile (bf16, 128 x 128 x 64 with gate and up, 3 stages) takes
147456 bytes on sm90 and 98304 on sm89, 3072 under its limit.

The one launch found over a limit (Triton 3.8, Llama-3-8B / Qwen3-30B-A3B shapes): the e4m3 decode attention at
batch 17-32 (decode_attention.E4M3_BY_BATCH: 128 keys a step, 5 stages, two K / V buffers) took 107520 bytes on
sm89 (and sm90), over an L4's 101376; decode_stages now launches it at 3 stages there (74240). Without that clamp
test_every_default_launch_fits fails on "decode e4m3 batch 32 sm89" (107520 > 101376): the "unclamped" build.
"""

from __future__ import annotations

import json
import sys

import pytest

from sm90_compile import ROOT, compile_sm90, run_child

LIMITS = {80: 166912, 89: 101376, 90: 232448}  # bytes of shared memory a program may opt into, by arch
DECODE_POINTERS = dict(q_ptr="*bf16", indptr_ptr="*i32", indices_ptr="*i32", last_ptr="*i32", o_ptr="*bf16",
                       part_ptr="*fp32", lse_ptr="*fp32", ks_ptr="*fp32", vs_ptr="*fp32",
                       pos_ptr="*i64", cs_ptr="*fp32", slot_ptr="*i64", qn_ptr="*bf16", kn_ptr="*bf16")


def _decode_launches() -> dict:
    """{name: (arch, fp8, launch with the stages paged_decode_attention picks there)}: launch_for's distinct rows
    (e4m3 by batch, bf16) at Llama-3-8B's heads (GQA group 4, head_dim 128) on the GPUs that take them."""
    from model_wrapper.kernels import decode_attention

    out = {}
    for fp8, batches, archs in ((False, (64,), (80, 89)), (True, (1, 16, 32), (89,)), (True, (32,), (90,))):
        for B in batches:
            launch = decode_attention.launch_for(fp8, B)
            math_id = decode_attention.FP8_MATHS[launch["fp8_math"]] if fp8 else 0
            for arch in archs:
                stages = decode_attention.decode_stages(launch["num_stages"], launch["block_n"], 128, 1 if fp8 else 2,
                                                        math_id, 16, LIMITS[arch])
                name = f"decode {'e4m3' if fp8 else 'bf16'} batch {B} sm{arch}"
                out[name] = (arch, fp8, dict(launch, num_stages=stages))
    return out


def _compile_all() -> dict:
    """-> {"launched": {name: [arch, stages, shared bytes]} of every default launch, "probes": the same of builds
    no launcher makes (what a clamp keeps out, a formula's check)}, run in a process without TRITON_INTERPRET."""
    from model_wrapper.kernels import decode_attention, fp8, fp8_skinny_mma, gemm, moe, prefill_attention
    from model_wrapper.kernels import verify_attention
    from model_wrapper.kernels.config import KernelConfig

    cfg = KernelConfig()
    launched, probes = {}, {}

    def build(name, arch, fn, pointers, constexprs, scalars=(), probe=False, **options):
        if "PDL" in constexprs:
            constexprs = dict(constexprs, PDL=arch >= 90)
        kernel = compile_sm90(fn, pointers, constexprs, scalars, aligned=True, arch=arch, **options)
        (probes if probe else launched)[name] = [arch, options["num_stages"], kernel.metadata.shared]

    def decode(name, arch, fp8_cache, launch, probe=False):
        cache = "*fp8e4nv" if fp8_cache else "*bf16"
        opts = {} if launch["maxnreg"] is None else {"maxnreg": launch["maxnreg"]}
        build(name, arch, decode_attention._decode_kernel, dict(DECODE_POINTERS, k_ptr=cache, v_ptr=cache),
              dict(PAGE=16, GROUP=4, GROUP_PAD=16, D=128, BLOCK_N=launch["block_n"], SPLITS=4, FP8=fp8_cache,
                   MATH=decode_attention.FP8_MATHS[launch["fp8_math"]] if fp8_cache else 0, INTERPRET=False, PDL=True,
                   PF_LINES=0), ("scale_log2",), probe, num_warps=launch["num_warps"], num_stages=launch["num_stages"],
              **opts)

    for name, (arch, fp8_cache, launch) in _decode_launches().items():
        decode(name, arch, fp8_cache, launch)
    # what decode_stages keeps out on sm89: batch 32's row at its 5 stages; and a 16-bit cache's two buffers (bf16
    # at 5 stages, not a default) for decode_stages' byte count of 16-bit tiles
    decode("decode e4m3 batch 32 sm89 unclamped", 89, True, decode_attention.launch_for(True, 32), probe=True)
    decode("decode bf16 5 stages sm80", 80, False, dict(decode_attention.launch_for(False, 64), num_stages=5),
           probe=True)

    # the MoE grouped GEMMs (kernels/moe.py; Qwen3-30B-A3B, gate_up: the larger), decode-sized tiles on sm89, the
    # prefill tiles on each arch that runs them
    for fp8_w, w8a8, archs in ((False, False, (80, 89, 90)), (True, False, (89,)), (True, True, (89,))):
        for pairs in (cfg.moe_small_pairs, cfg.moe_small_pairs + 1):
            bm, bn, bk, warps, stages = moe.grouped_tile(cfg, pairs, fp8_w, w8a8)
            for arch in archs if pairs > cfg.moe_small_pairs else (89,):
                build(f"moe gate_up {'w8a8' if w8a8 else 'fp8' if fp8_w else 'bf16'} {bm}x{bn}x{bk} sm{arch}", arch,
                      moe._moe_gemm_kernel,
                      dict(a_ptr="*fp8e4nv" if w8a8 else "*bf16", as_ptr="*fp32" if w8a8 else "*bf16",
                           w_ptr="*fp8e4nv" if fp8_w else "*bf16", s_ptr="*fp32" if fp8_w else "*bf16", o_ptr="*bf16",
                           pairs_ptr="*i32", block_expert_ptr="*i32", rw_ptr="*bf16"),
                      dict(TOP_K=8, SILU=True, WEIGHTED=False, FP8=fp8_w, W8A8=w8a8, GROUP=128, BLOCK_M=bm, BLOCK_N=bn,
                           BLOCK_K=bk, PDL=True), num_warps=warps, num_stages=stages)

    # the FP8 linears on sm89 (kernels/fp8.py, fp8_skinny_mma.py; Llama-3-8B's gate_up [28672, 4096])
    fp8_linear = dict(w_ptr="*fp8e4nv", s_ptr="*fp32", b_ptr="*bf16", o_ptr="*bf16")
    build("fp8 gemm sm89", 89, fp8._fp8_gemm_kernel, dict(fp8_linear, a_ptr="*fp8e4nv", as_ptr="*fp32", ws_ptr="*fp32"),
          dict(GROUP=128, BM=cfg.fp8_gemm_block_m, BN=cfg.fp8_gemm_block_n, BK=128, GROUP_M=cfg.fp8_gemm_group_m,
               HAS_BIAS=False), num_warps=cfg.fp8_gemm_warps, num_stages=cfg.fp8_gemm_stages)
    launch = fp8._skinny_launch(16, 14336, 4096, 128, True, cfg)
    build("fp8 skinny gate_up sm89", 89, fp8._fp8_skinny_kernel, dict(fp8_linear, x_ptr="*bf16"),
          dict(K=4096, GROUP=128, PER_GROUP=True, HAS_BIAS=False, SILU=True, PDL=True,
               F32_UPCAST=cfg.fp8_skinny_f32_upcast, **{k: v for k, v in launch.items() if not k.startswith("num_")}),
          num_warps=launch["num_warps"], num_stages=launch["num_stages"])
    for name, group, tokens in (("block", 128, 16), ("row 32 tokens", 4096, 32)):
        launch = fp8_skinny_mma.skinny_mma_launch(tokens, 14336, 4096, group, True, cfg, LIMITS[89])
        build(f"skinny_mma gate_up {name} sm89", 89, fp8_skinny_mma._fp8_skinny_mma_kernel,
              dict(fp8_linear, q_ptr="*fp8e4nv", qs_ptr="*fp32", ws_ptr="*fp32", cnt_ptr="*i32"),
              dict(K=4096, **launch.constexprs(4096, group, True, False, True, cfg)),
              num_warps=launch.warps, num_stages=launch.stages)

    # the verify and mixed-prefill attention (default 2 stages), their largest row tiles: Qwen3-30B-A3B's group 8
    # at 16 tokens a request (128 rows), the mixed graphs' 64 rows
    build("verify 128 rows sm89", 89, verify_attention._verify_kernel,
          dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", indptr_ptr="*i32", indices_ptr="*i32", last_ptr="*i32",
               qlen_ptr="*i32", bits_ptr="*i32", pos_ptr="*i64", o_ptr="*bf16", part_ptr="*fp32", lse_ptr="*fp32"),
          dict(PAGE=16, Q=16, QP=16, GROUP=8, ROWS=128, D=128, BLOCK_N=verify_attention.BLOCK_N, SPLITS=1,
               HAS_WINDOW=False), ("scale_log2",), num_warps=8, num_stages=2)
    build("prefill 64 rows sm89", 89, prefill_attention._prefill_kernel,
          dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", qo_ptr="*i32", indptr_ptr="*i32", indices_ptr="*i32",
               last_ptr="*i32", treq_ptr="*i32", ttok_ptr="*i32", tn_ptr="*i32", pos_ptr="*i64", o_ptr="*bf16",
               part_ptr="*fp32", lse_ptr="*fp32", ks_ptr="*fp32", vs_ptr="*fp32"),
          dict(PAGE=16, BLOCK_T=16, GROUP=4, ROWS=cfg.mixed_block_rows, D=128, BLOCK_N=cfg.mixed_block_n, SPLITS=1,
               HAS_WINDOW=False, FP8=False, MATH=0, INTERPRET=False), ("scale_log2",), num_warps=4, num_stages=2)

    # the bf16 GEMMs of sm90 alone, their largest: the skinny qkv at 64 tokens, the wide gate_up + SiLU
    bn, bk, stages, warps = gemm._skinny_config(64, 6144, 4096)
    build("skinny qkv 64 tokens sm90", 90, gemm._skinny_kernel, dict(x_ptr="*bf16", w_ptr="*bf16", b_ptr="*bf16",
                                                                     o_ptr="*bf16"),
          dict(K=4096, BM=64, BLOCK_N=bn, BLOCK_K=bk, HAS_BIAS=False, SILU=False, PDL=True), num_warps=warps,
          num_stages=stages)
    bm, bn, bk, stages, warps, group_m = gemm._wide_config(4096)
    build("wide gate_up sm90", 90, gemm._wide_kernel,
          dict(a_desc=f"tensordesc<bf16[{bm},{bk}]>", b_desc=f"tensordesc<bf16[2,{bn},{bk}]>",
               c_desc=f"tensordesc<bf16[{bm},{bn}]>", b_ptr="*bf16"),
          dict(K=4096, BM=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m, HAS_BIAS=False, PERSISTENT=True),
          num_warps=warps, num_stages=stages)
    return dict(launched=launched, probes=probes)


@pytest.fixture(scope="module")
def built():
    return run_child(__file__)


def test_every_default_launch_fits_its_gpus(built):
    launched, probes = built["launched"], built["probes"]
    assert len(launched) == 22, sorted(launched)
    assert {name: shared for name, (arch, _, shared) in launched.items() if shared > LIMITS[arch]} == {}
    # decode_stages' case: e4m3 batch 32, 128 keys a step, over sm89's limit at its 5 stages, inside it at 3; sm90
    # keeps its tuned depth
    assert probes["decode e4m3 batch 32 sm89 unclamped"][1:] == [5, 107520]
    assert launched["decode e4m3 batch 32 sm89"][1:] == [3, 74240]
    assert launched["decode e4m3 batch 32 sm90"][1:] == [5, 107520]


def test_decode_stages_counts_the_decode_kernels_bytes(built):
    """decode_stages' bytes are the builds' to the byte: a 5-stage build (two K / V buffers) keeps its 5 stages
    at exactly its shared memory plus the reserve (1024), drops to 3 (one buffer) a byte below."""
    from model_wrapper.kernels import decode_attention

    every = {**built["launched"], **built["probes"]}
    for name, fp8, launch in (("decode e4m3 batch 32 sm89 unclamped", True, decode_attention.launch_for(True, 32)),
                              ("decode e4m3 batch 16 sm89", True, decode_attention.launch_for(True, 16)),
                              ("decode bf16 5 stages sm80", False, decode_attention.launch_for(False, 64))):
        _, stages, shared = every[name]
        math_id = decode_attention.FP8_MATHS[launch["fp8_math"]] if fp8 else 0
        picks = [decode_attention.decode_stages(stages, launch["block_n"], 128, 1 if fp8 else 2, math_id, 16,
                                                shared + 1024 - less) for less in (0, 1)]
        assert (stages, picks) == (5, [5, 3]), (name, shared, picks)


def test_decode_stages_keeps_the_sm90_launches():
    from model_wrapper.kernels import decode_attention

    for fp8 in (False, True):
        for B in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            launch = decode_attention.launch_for(fp8, B)
            math_id = decode_attention.FP8_MATHS[launch["fp8_math"]] if fp8 else 0
            for group_pad in (16, 32):
                assert decode_attention.decode_stages(launch["num_stages"], launch["block_n"], 128, 1 if fp8 else 2,
                                                      math_id, group_pad, LIMITS[90]) == launch["num_stages"]


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    print(json.dumps(_compile_all()))
