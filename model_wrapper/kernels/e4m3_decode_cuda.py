"""Paged decode attention over an e4m3 (float8_e4m3fn) KV cache in CUDA C++, compiled at run time by NVRTC
(torch.cuda._compile_kernel: no nvcc, no host compiler), for the decode steps where Triton's kernel
(kernels/decode_attention.py) cannot keep an H200 streaming (0.63-0.69 of copy bandwidth, session 49).

Why a second kernel: Triton builds the e4m3 decode loop with the K / V tiles changing layout through
shared memory before fp16 tensor-core products whose 16 rows hold the 4-8 query heads of a GQA group
(457 sm90 instructions a 64-key step, issued at ~29% of the SMs' rate). Here every operand reaches
`mma.sync.m16n8k16` straight from the registers it was loaded into:

- S^T = K q^T: the keys are the product's 16 rows (M), the group's query heads its 8 columns (N <= 8),
  head_dim its K. A thread's 4 values of each 16-deep step are 4 adjacent bytes of a key row: the dims
  of q and K are permuted alike (thread t of a quad holds dims 32t..32t+31 of its two keys, 2 x 16-byte
  loads a key), which leaves q.k unchanged; one cvt.rn.f16x2.e4m3x2 per two values.
- softmax over the keys (the rows, across the warp's 8 row groups: 3 shuffles a column), p -> fp16, and
  P^T as the second product's B operand by movmatrix.trans (the C layout of S^T transposed in registers).
- O^T = V^T P^T: head_dim as the 16 rows of 8 m-tiles, the keys as K. A thread loads 16 bytes (16 dims)
  of 4 key rows and pairs its keys' bytes with prmt (the product reads V along keys), then the same cvt.
  The output's dims come out permuted and are written back in order.

Each of a program's warps takes every NW-th 16-key chunk of the program's split with its own online
softmax; the warps' (max, sum, output) are combined through shared memory at the end. With several splits
the program writes its normalised partial output and log2-sum-exp in the Triton kernel's layout, and
Triton's merge kernel (decode_attention._merge_kernel) combines them.

Scales: K's scale goes into the softmax scale and V's onto the output (float32 device scalars read once a
program); q enters as fp16(q * 2^-8) with the 2^8 in the softmax scale (decode_attention's "fp16" maths:
no overflow of fp16 for any bf16 q); p rounds to fp16. The same attention over the same e4m3 values as
the Triton kernel's fp16 maths, up to the order of fp32 sums and ex2.approx.

What it takes (fits): head_dim 128, a GQA group of 1-8 query heads a KV head, pages of a multiple of 16
tokens, no sliding window, q bf16 or fp16, sm89+ (the e4m3 conversion), and a build that succeeded (usable).
Anything else: the Triton kernel. Callers reach it through decode_attention.paged_decode_attention(cuda=True)
(KernelConfig.fp8_kv_decode_cuda), with decode_splits(cuda=True)'s splits and launch_warps' warps.

Measured (session 50, benchmarks/ab_e4m3_cuda_attention.py, K/V bytes / time / copy bandwidth, H200): 0.86-0.99 at
batch 64-128 x 2k-8k, 0.77 / 0.89-0.92 at batch 32 x 2k / 8k, where the Triton kernel reaches 0.61-0.68
(benchmarks/RESULTS.md, "Session 50"). On an H100, where Triton is at 0.79-0.91, the two are about even.
"""

from __future__ import annotations

import ctypes
import functools
import math

import torch

D = 128
NW = 4  # warps a program

_SOURCE = r"""
// defined by the compile: GROUP (1..8), PAGE (multiple of 16), NW (warps a program), QBF16 (q / out bf16, else fp16),
// PDL (launched as a programmatic dependent: griddepcontrol),
// VBITS (V's bytes to fp16 by bit moves, else cvt), PREFETCH (the next chunk's loads before this chunk's math),
// MINB (programs a SM the register budget allows)
#define D 128
#define NEG_INF __int_as_float(0xff800000)
typedef unsigned int u32;
typedef unsigned short u16;

struct __align__(16) u32x4 { u32 x, y, z, w; };

// a word's four e4m3 bytes -> fp16x2 of bytes 0, 1 (lo) and of bytes 2, 3 (hi)
__device__ __forceinline__ void e4m3x4_to_f16x2(u32 w, u32& lo, u32& hi) {
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.rn.f16x2.e4m3x2 %0, l; cvt.rn.f16x2.e4m3x2 %1, h; }"
        : "=r"(lo), "=r"(hi) : "r"(w));
}
// a word whose bytes 1 and 3 are e4m3 values (bytes 0 and 2 anything) -> fp16x2 of the values * 2^-8: sign to
// bit 15, exponent and mantissa to bits 13..7 (exact, subnormals included)
__device__ __forceinline__ u32 bits_f16x2(u32 a) { return (a & 0x80008000u) | ((a >> 1) & 0x3f803f80u); }
__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}
__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ u32 transpose8x8(u32 x) {
    u32 r;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(r) : "r"(x));
    return r;
}
__device__ __forceinline__ void mma16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ float ex2(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ float q_to_float(u16 x) {
#if QBF16
    return __uint_as_float(((u32)x) << 16);
#else
    float r;
    asm("{ .reg .f16 h; mov.b16 h, %1; cvt.f32.f16 %0, h; }" : "=f"(r) : "h"(x));
    return r;
#endif
}
__device__ __forceinline__ u16 float_to_out(float x) {
    u16 r;
#if QBF16
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
#else
    asm("{ .reg .f16 h; cvt.rn.f16.f32 h, %1; mov.b16 %0, h; }" : "=h"(r) : "f"(x));
#endif
    return r;
}
__device__ __forceinline__ u32x4 ldg16(const unsigned char* p) {
    u32x4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// one chunk's raw bytes: K rows g and g + 8 (dims 32t..32t+31 each), V rows 2t, 2t+1, 2t+8, 2t+9 (dims 16g..16g+15)
struct Chunk { u32x4 k[4]; u32x4 v[4]; };

__device__ __forceinline__ void load_chunk(Chunk& c, const unsigned char* kc, const unsigned char* vc,
                                           const int* indices, int p0, int k0, int stride_kb, int stride_kt,
                                           int head_off, int g, int t) {
    const int pg = indices[p0 + k0 / PAGE];
    const long long base = (long long)pg * stride_kb + (long long)(k0 % PAGE) * stride_kt + head_off;
    const unsigned char* kr0 = kc + base + (long long)g * stride_kt + 32 * t;
    const unsigned char* kr1 = kr0 + 8LL * stride_kt;
    c.k[0] = ldg16(kr0); c.k[1] = ldg16(kr0 + 16);
    c.k[2] = ldg16(kr1); c.k[3] = ldg16(kr1 + 16);
    const unsigned char* vr = vc + base + (long long)(2 * t) * stride_kt + 16 * g;
    c.v[0] = ldg16(vr);
    c.v[1] = ldg16(vr + stride_kt);
    c.v[2] = ldg16(vr + 8LL * stride_kt);
    c.v[3] = ldg16(vr + 9LL * stride_kt);
}

__device__ __forceinline__ u32 w_of(const u32x4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

extern "C" __global__ void __launch_bounds__(NW * 32, MINB)
e4m3_decode(const u16* __restrict__ q, const unsigned char* __restrict__ kc, const unsigned char* __restrict__ vc,
            const int* __restrict__ indptr, const int* __restrict__ indices, const int* __restrict__ last,
            u16* __restrict__ out, float* __restrict__ part, float* __restrict__ lse_out,
            const float* __restrict__ ks, const float* __restrict__ vs, const float* __restrict__ sm_scale_log2,
            int stride_qt, int stride_qh, int stride_kb, int stride_kt, int stride_ot, int stride_oh, int H,
            int splits) {
    __shared__ float sm_m[NW][8], sm_l[NW][8];
    __shared__ float sm_o[NW][8][D];
    const int r = blockIdx.x, h = blockIdx.y, s = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#if PDL
    // launched as a programmatic dependent: the next kernel (the split merge, or o's GEMV) may launch now; the
    // page metadata is no kernel's output within a step (the graphs copy it from the host before the step)
    asm volatile("griddepcontrol.launch_dependents;");
#endif
    const int p0 = indptr[r], p1 = indptr[r + 1];
    const int L = (p1 - p0 - 1) * PAGE + last[r];
    const int CH = 16 * NW;
    const int chunk = ((L + splits - 1) / splits + CH - 1) / CH * CH;
    const int start = s * chunk;
    const int end = min(start + chunk, L);
    const float sl = sm_scale_log2[0] * ks[0] * 256.0f;
#if VBITS
    const float out_scale = vs[0] * 256.0f;
#else
    const float out_scale = vs[0];
#endif
    const int head_off = h * D;
#if PDL
    if (start + 16 * warp < end) {  // the first chunk's K / V lines into L2 while the kernels before drain (a hint)
        const int k0 = start + 16 * warp;
        const long long base = (long long)indices[p0 + k0 / PAGE] * stride_kb + (long long)(k0 % PAGE + (lane & 15)) * stride_kt
                               + head_off;
        const unsigned char* line = (lane < 16 ? kc : vc) + base;
        asm volatile("prefetch.global.L2 [%0];" :: "l"(line));
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");  // q and the step's new K / V are written by then
#endif

    // q^T as the B operand: column g = query head h * GROUP + g, dims 32t..32t+31 as 16 fp16 pairs
    u32 qf[16];
    if (g < GROUP) {
        const u16* qp = q + (long long)r * stride_qt + (long long)(h * GROUP + g) * stride_qh + 32 * t;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32x4 v = *reinterpret_cast<const u32x4*>(qp + 8 * i);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const u32 w = w_of(v, j);
                qf[4 * i + j] = pack_f16x2(q_to_float((u16)(w & 0xffff)) * 0.00390625f,
                                           q_to_float((u16)(w >> 16)) * 0.00390625f);
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < 16; ++i) qf[i] = 0u;
    }

    float o[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;

    int k0 = start + 16 * warp;
    Chunk cur;
    if (k0 < end) load_chunk(cur, kc, vc, indices, p0, k0, stride_kb, stride_kt, head_off, g, t);
    for (; k0 < end; k0 += CH) {
#if PREFETCH
        Chunk nxt;
        if (k0 + CH < end) load_chunk(nxt, kc, vc, indices, p0, k0 + CH, stride_kb, stride_kt, head_off, g, t);
#endif
        // S^T [16 keys x 8 heads]
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
            u32 a0, a1, a2, a3;
            e4m3x4_to_f16x2(w_of(cur.k[kk >> 2], kk & 3), a0, a2);
            e4m3x4_to_f16x2(w_of(cur.k[2 + (kk >> 2)], kk & 3), a1, a3);
            mma16816(c, a0, a1, a2, a3, qf[2 * kk], qf[2 * kk + 1]);
        }
        const bool last_chunk = k0 + 16 > end;
        float x0 = c[0] * sl, x1 = c[1] * sl, x2 = c[2] * sl, x3 = c[3] * sl;
        if (last_chunk) {
            if (k0 + g >= end) { x0 = NEG_INF; x1 = NEG_INF; }
            if (k0 + g + 8 >= end) { x2 = NEG_INF; x3 = NEG_INF; }
        }
        float mx0 = fmaxf(x0, x2), mx1 = fmaxf(x1, x3);
#pragma unroll
        for (int sh = 4; sh < 32; sh <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, sh));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, sh));
        }
        const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        const float mu0 = mn0 == NEG_INF ? 0.0f : mn0, mu1 = mn1 == NEG_INF ? 0.0f : mn1;
        const float a0 = ex2(m0 - mu0), a1 = ex2(m1 - mu1);
        const float e0 = ex2(x0 - mu0), e1 = ex2(x1 - mu1), e2 = ex2(x2 - mu0), e3 = ex2(x3 - mu1);
        l0 = l0 * a0 + e0 + e2;
        l1 = l1 * a1 + e1 + e3;
        if (mn0 != m0 || mn1 != m1) {
#pragma unroll
            for (int i = 0; i < 8; ++i) { o[i][0] *= a0; o[i][1] *= a1; o[i][2] *= a0; o[i][3] *= a1; }
        }
        m0 = mn0; m1 = mn1;
        // P^T as the B operand: keys 2t, 2t+1 (and + 8) of head g
        const u32 pb0 = transpose8x8(pack_f16x2(e0, e1)), pb1 = transpose8x8(pack_f16x2(e2, e3));
        // V: this thread's keys 2t, 2t+1, 2t+8, 2t+9 (zero past the end: their bytes may be anything)
        if (last_chunk) {
            const u32x4 z = {0u, 0u, 0u, 0u};
            if (k0 + 2 * t >= end) cur.v[0] = z;
            if (k0 + 2 * t + 1 >= end) cur.v[1] = z;
            if (k0 + 2 * t + 8 >= end) cur.v[2] = z;
            if (k0 + 2 * t + 9 >= end) cur.v[3] = z;
        }
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const u32 A = w_of(cur.v[0], w), B = w_of(cur.v[1], w), C = w_of(cur.v[2], w), E = w_of(cur.v[3], w);
#if VBITS
            // byte k of (A, B) at byte 1 / 3 of a word -> fp16 pairs (key 2t, key 2t+1) of dim 4w + k
            mma16816(o[2 * w], bits_f16x2(prmt(A, B, 0x4000)), bits_f16x2(prmt(A, B, 0x5010)),
                     bits_f16x2(prmt(C, E, 0x4000)), bits_f16x2(prmt(C, E, 0x5010)), pb0, pb1);
            mma16816(o[2 * w + 1], bits_f16x2(prmt(A, B, 0x6020)), bits_f16x2(prmt(A, B, 0x7030)),
                     bits_f16x2(prmt(C, E, 0x6020)), bits_f16x2(prmt(C, E, 0x7030)), pb0, pb1);
#else
            const u32 ab_lo = prmt(A, B, 0x5140), ab_hi = prmt(A, B, 0x7362);
            const u32 ce_lo = prmt(C, E, 0x5140), ce_hi = prmt(C, E, 0x7362);
            u32 v0, v1, v2, v3, v4, v5, v6, v7;
            e4m3x4_to_f16x2(ab_lo, v0, v1);
            e4m3x4_to_f16x2(ce_lo, v2, v3);
            e4m3x4_to_f16x2(ab_hi, v4, v5);
            e4m3x4_to_f16x2(ce_hi, v6, v7);
            mma16816(o[2 * w], v0, v1, v2, v3, pb0, pb1);
            mma16816(o[2 * w + 1], v4, v5, v6, v7, pb0, pb1);
#endif
        }
#if PREFETCH
        cur = nxt;
#else
        if (k0 + CH < end) load_chunk(cur, kc, vc, indices, p0, k0 + CH, stride_kb, stride_kt, head_off, g, t);
#endif
    }
    // the warp's sums over its keys (rows g across the warp)
#pragma unroll
    for (int sh = 4; sh < 32; sh <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, sh);
        l1 += __shfl_xor_sync(0xffffffffu, l1, sh);
    }
    if (g == 0) {
        sm_m[warp][2 * t] = m0; sm_m[warp][2 * t + 1] = m1;
        sm_l[warp][2 * t] = l0; sm_l[warp][2 * t + 1] = l1;
    }
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) {
        const int d0 = 16 * g + 2 * mt;
        sm_o[warp][2 * t][d0] = o[mt][0];
        sm_o[warp][2 * t + 1][d0] = o[mt][1];
        sm_o[warp][2 * t][d0 + 1] = o[mt][2];
        sm_o[warp][2 * t + 1][d0 + 1] = o[mt][3];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < GROUP * D; idx += NW * 32) {
        const int i = idx / D, d = idx % D;
        float M = NEG_INF;
#pragma unroll
        for (int w = 0; w < NW; ++w) M = fmaxf(M, sm_m[w][i]);
        float lsum = 0.0f, acc = 0.0f;
        if (M != NEG_INF) {
#pragma unroll
            for (int w = 0; w < NW; ++w) {
                const float f = ex2(sm_m[w][i] - M);
                lsum += f * sm_l[w][i];
                acc += f * sm_o[w][i][d];
            }
        }
        const int head = h * GROUP + i;
        const bool seen = lsum > 0.0f;
        const float val = seen ? acc / lsum * out_scale : 0.0f;
        if (splits == 1) {
            out[(long long)r * stride_ot + (long long)head * stride_oh + d] = float_to_out(val);
        } else {
            const long long base = ((long long)r * H + head) * splits + s;
            part[base * D + d] = val;
            if (d == 0) lse_out[base] = seen ? M + __log2f(lsum) : NEG_INF;
        }
    }
}
"""


def fits(q: torch.Tensor, k_cache: torch.Tensor, window: int | None) -> bool:
    """What this kernel handles (else the Triton kernel): q [B, H, D] bf16 / fp16 with rows of contiguous dims,
    e4m3 caches [blocks, page, KVH, D] contiguous, head_dim 128, a GQA group of 1-8, pages of a multiple of
    16 tokens, no window, an sm89+ GPU, and the kernel built there (usable)."""
    if not (q.is_cuda and k_cache.dtype == torch.float8_e4m3fn and q.dtype in (torch.bfloat16, torch.float16)):
        return False
    _, page, kvh, d = k_cache.shape
    H = q.shape[1]
    return (d == D and q.shape[2] == D and H % kvh == 0 and 1 <= H // kvh <= 8 and page % 16 == 0 and not window
            and q.stride(2) == 1 and k_cache.is_contiguous() and torch.cuda.get_device_capability(q.device) >= (8, 9)
            and usable(H // kvh, page, q.dtype == torch.bfloat16, q.device.index))


@functools.lru_cache(maxsize=None)
def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def fills(pairs: int, sms: int) -> bool:
    """Whether `pairs` (request, KV head) pairs fill `sms` SMs with programs of 4 warps, 2 a SM, unsplit."""
    return pairs >= 2 * sms


def launch_warps(pairs: int, device: torch.device) -> int:
    """Warps a program for `pairs` (request, KV head) pairs: 4 where they fill the SMs (no split), else 8 (half
    the splits to merge for the same warps a SM: decode_attention.decode_splits(cuda=True))."""
    return NW if fills(pairs, _sms(device)) else 2 * NW


def _programs_per_sm(nw: int) -> int:
    """The default launch's register budget (__launch_bounds__' min blocks): 16 warps a SM, 128 registers each."""
    return max(1, 16 // nw)


@functools.lru_cache(maxsize=None)
def usable(group: int, page: int, bf16: bool, device: int) -> bool:
    """Whether the default launch builds here (torch.cuda._compile_kernel exists, NVRTC compiles it, the driver
    loads it), decided once; otherwise one warning and the Triton kernel takes these calls."""
    try:
        for nw in (NW, 2 * NW):
            for pdl in (False, True):
                _kernel(group, page, bf16, False, False, nw, _programs_per_sm(nw), pdl, device)
        return True
    except Exception as e:  # noqa: BLE001 (any failure to build: the Triton kernel instead, never a wrong result)
        from loguru import logger

        logger.warning(f"e4m3_decode_cuda: the CUDA decode kernel does not build on cuda:{device} ({e!r:.300}); "
                       "the Triton kernel takes e4m3 decode attention")
        return False


@functools.lru_cache(maxsize=None)
def _kernel(group: int, page: int, bf16: bool, vbits: bool, prefetch: bool, nw: int, minb: int, pdl: bool,
            device: int):
    with torch.cuda.device(device):
        opts = [f"-DGROUP={group}", f"-DPAGE={page}", f"-DNW={nw}", f"-DQBF16={int(bf16)}", f"-DVBITS={int(vbits)}",
                f"-DPREFETCH={int(prefetch)}", f"-DMINB={minb}", f"-DPDL={int(pdl)}"]
        return torch.cuda._compile_kernel(_SOURCE, "e4m3_decode", nvcc_options=opts)


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int), ("rest", ctypes.c_char * 60)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


def _launch(kern, grid, block, args, pdl: bool) -> None:
    """kern (torch.cuda._compile_kernel's) on the current stream; pdl: through cuLaunchKernelEx with programmatic
    stream serialization allowed (the launch Triton's launch_pdl makes), else its own cuLaunchKernel. args: tensors
    (their data pointers) and Python ints (C int)."""
    if not pdl:
        kern(grid=grid, block=block, args=args)
        return
    from torch.cuda._utils import _check_cuda, _get_gpu_runtime_library

    keep = [ctypes.c_void_p(a.data_ptr()) if isinstance(a, torch.Tensor) else ctypes.c_int(a) for a in args]
    params = (ctypes.c_void_p * len(keep))(*[ctypes.cast(ctypes.byref(k), ctypes.c_void_p) for k in keep])
    attr = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION, value=1)
    cfg = _LaunchConfig((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), 0,
                        ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), ctypes.pointer(attr), 1)
    _check_cuda(_get_gpu_runtime_library().cuLaunchKernelEx(ctypes.byref(cfg), kern.func, params, None))


@functools.lru_cache(maxsize=None)
def _scale_log2(scale: float, device: torch.device) -> torch.Tensor:
    """The softmax scale times log2(e) as the float32 device scalar the kernel reads (one per scale and device,
    kept for the process: graphs capture its address)."""
    return torch.tensor([scale * math.log2(math.e)], dtype=torch.float32, device=device)


def paged_decode_attention_e4m3(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_last_page_len: torch.Tensor,
                                scale: float, k_scale: torch.Tensor, v_scale: torch.Tensor, *, splits: int = 1,
                                vbits: bool = False, prefetch: bool = False, num_warps: int = NW,
                                minb: int | None = None, pdl: bool = False) -> torch.Tensor:
    """q [B, H, 128] -> [B, H, 128] in q's dtype: decode attention over e4m3 caches [blocks, page, KVH, 128]
    (fits), page metadata as decode_attention.paged_decode_attention's (int32), k_scale / v_scale float32
    one-element device tensors. splits: KV splits per (request, KV head) (decode_attention.decode_splits with
    cuda=True); vbits / prefetch / num_warps / minb: the launch variants of benchmarks/ab_e4m3_cuda_attention.py
    (V's bytes by bit moves; the next chunk's loads ahead; warps a program; programs a SM the registers allow).
    pdl (sm90+): both kernels launched as programmatic dependents (decode_attention.paged_decode_attention's pdl):
    each lets the next kernel launch at once; this one reads its page metadata and prefetches its first K / V
    lines into L2 before waiting for the kernel before it."""
    from model_wrapper.kernels.decode_attention import merge_splits, split_outputs

    B, H, _ = q.shape
    _, page, kvh, _ = k_cache.shape
    out, part, lse = split_outputs(q, splits)
    if B == 0:
        return out
    minb = _programs_per_sm(num_warps) if minb is None else minb
    kern = _kernel(H // kvh, page, q.dtype == torch.bfloat16, vbits, prefetch, num_warps, minb, pdl, q.device.index)
    _launch(kern, (B, kvh, splits), (num_warps * 32, 1, 1),
            [q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, out, part, lse, k_scale, v_scale,
             _scale_log2(float(scale), q.device), q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
             out.stride(0), out.stride(1), H, splits], pdl)
    if splits > 1:
        merge_splits(part, lse, out, splits, pdl)
    return out
