"""GPU tests (`pytest -m cuda`, sm90 only) of the fa3 all-e4m3 prefill over FP8 caches
(KernelConfig.fp8_kv_prefill = "fa3": attention/fa3_fp8.py, FlashInferAttentionBackend's Fa3Fp8Prefill).

1. Attention alone: the FlashInfer backend's prefill rows against the torch backend (the executable spec)
   over the same e4m3 cache, the torch backend given q rounded to e4m3 as the kernel reads it (exact in
   float32). What is left is the kernel's own rounding of P, derived bound per output element:
   P = exp(s - max) in [0, 1] is scaled by 448 and rounded to e4m3 (3 mantissa bits: relative error at most
   2^-4; below e4m3's smallest normal 2^-6 an absolute error of at most 2^-10, i.e. 2^-10 / 448 in P), so the
   numerator sum_j p_j v_j moves by at most 2^-4 sum_j p_j |v_j| + 2^-10 / 448 sum_j |v_j|; over the row sum
   l >= 1 (rounded or not: at most another 2^-4 |o|), plus the bf16 output's rounding 2^-8 |o|:
       |o - ref| <= 2^-4 (W|V|) + (2^-4 + 2^-8) |ref| + 2^-10 / 448 * L * max|v| + 1e-5
   with W|V| the torch backend's attention over |V| (the e4m3 cache's sign bits cleared: exact). A missing
   or misapplied K or V scale (1 / 20 and 1 / 50 here) moves the output far past it.
2. The model (tiny Llama, head_dim 128): the forward-parity scenario
   (prefill, chunked prefill, mixed, decode, multi-token decode) over an e4m3 cache against the fp32 torch
   backend over the same cache. test_fp8_kv_cuda.py's bf16_bound covers bf16 rounding; the kernel adds two
   e4m3 roundings (q beside k in every score, P beside v in every product) of the same relative size as the
   cache's own two (k and v), whose whole effect on the logits is measured on the fp32 model: e_cache =
   rel_err(fp32 over an fp32 cache, fp32 over the e4m3 cache). Allowed: bf16_bound + 2 * e_cache.
"""

from __future__ import annotations

import pytest
import torch

from conftest import rel_err

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("needs CUDA", allow_module_level=True)
if torch.cuda.get_device_capability() != (9, 0):  # pragma: no cover
    pytest.skip("fa3's FP8 prefill is sm90 only", allow_module_level=True)
flashinfer = pytest.importorskip("flashinfer")

from model_wrapper.attention.fa3_fp8 import quantize_q  # noqa: E402
from model_wrapper.attention.flashinfer_backend import (Fa3Fp8Prefill, FlashInferAttentionBackend,  # noqa: E402
                                                        PagedPlan, SplitPlan)
from model_wrapper.attention.kv_store import KVStore  # noqa: E402
from model_wrapper.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from model_wrapper.forward_batch import ForwardBatch  # noqa: E402
from model_wrapper.kernels import KernelConfig  # noqa: E402
from test_forward_parity import _script  # noqa: E402
from test_fp8_kv_cuda import _gen, _run, bf16_bound, ckpt  # noqa: E402,F401 (ckpt: the fixture)
from text_generator import TextGenerator  # noqa: E402

FP8 = torch.float8_e4m3fn
H, KVH, D, PAGE, LAYERS = 8, 2, 128, 16, 2
K_SCALES, V_SCALES = [0.05, 0.08], [0.02, 0.03]


def _batch(q_lens, seq_lens, tables, is_prefill=True):
    q, L = torch.tensor(q_lens, dtype=torch.int32), torch.tensor(seq_lens, dtype=torch.int32)
    T = int(q.sum())
    pos = torch.cat([torch.arange(l - n, l) for n, l in zip(q_lens, seq_lens)])
    slots = torch.cat([torch.tensor([tables[r][p // PAGE] * PAGE + p % PAGE for p in range(l - n, l)])
                       for r, (n, l) in enumerate(zip(q_lens, seq_lens))])
    width = max(len(t) for t in tables)
    bt = torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.int32)
    ids = torch.zeros(T, dtype=torch.int64)
    return ForwardBatch.build(input_ids=ids.cuda(), input_ids_cpu=ids, positions=pos, slots=slots,
                              is_prefill=is_prefill, block_size=PAGE, q_lens_cpu=q, seq_lens_cpu=L,
                              block_tables_cpu=bt, lm_head_indices=None, spec_mask=None, atten_mask=None,
                              device=torch.device("cuda"))


def _backends(window=None):
    """The FlashInfer backend (fp8_kv_prefill "fa3") and the torch backend over one K/V store (scales set)."""
    store = KVStore(config=KernelConfig(fp8_kv_prefill="fa3"), num_layers=LAYERS, device="cuda")
    store.set_scales(K_SCALES, V_SCALES)
    fi = FlashInferAttentionBackend(H, KVH, D, device="cuda", dtype=torch.bfloat16,
                                    layer_windows=[window] if window else [])
    tb = TorchAttentionBackend(H, KVH, D)
    for b in (fi, tb):
        b.kv_store, b.kv_cache_dtype = store, FP8
    return fi, tb


# (q_lens, seq_lens): fresh prompts; a chunk after a cached prefix beside a fresh prompt; mixed (a decode row)
STEPS = {"fresh": ([37, 70], [37, 70]), "chunked": ([30, 20], [80, 20]), "mixed": ([1, 45], [40, 60])}


@pytest.mark.parametrize("step", list(STEPS))
def test_fa3_fp8_prefill_rows_match_the_torch_backend(step):
    window = None
    g = torch.Generator(device="cuda").manual_seed(1)
    q_lens, seq_lens = STEPS[step]
    pages = [-(-n // PAGE) for n in seq_lens]
    blocks = torch.randperm(sum(pages) + 3, generator=torch.Generator().manual_seed(0)).tolist()
    tables = [blocks[sum(pages[:r]):sum(pages[:r + 1])] for r in range(len(pages))]
    n_blocks = sum(pages) + 3
    caches = [tuple((torch.randn(n_blocks, PAGE, KVH, D, generator=g, device="cuda") * 100).clamp(-448, 448).to(FP8)
                    for _ in range(2)) for _ in range(LAYERS)]
    batch = _batch(q_lens, seq_lens, tables)
    q = torch.randn(batch.num_tokens, H, D, generator=g, device="cuda").to(torch.bfloat16)
    q8 = quantize_q(q).float()
    fi, tb = _backends(window)
    fi.plan(batch)
    tb.plan(batch)
    plan = fi._plan
    pre_wrappers = plan.prefill.values() if isinstance(plan, SplitPlan) else plan.wrappers.values()
    assert isinstance(plan, SplitPlan) == (step == "mixed") and isinstance(plan, (PagedPlan, SplitPlan))
    assert all(isinstance(w, Fa3Fp8Prefill) for w in pre_wrappers)
    rows = torch.cat([torch.full((n,), n > 1) for n in q_lens]).cuda()  # the prefill rows (not decode)
    for layer, (kc, vc) in enumerate(caches):
        out = fi.run(layer, q, kc, vc, window, batch).float()
        ref = tb.run(layer, q8, kc, vc, window, batch)
        v_abs = (vc.view(torch.uint8) & 0x7F).view(FP8)
        wv = tb.run(layer, q8, kc, v_abs, window, batch)
        max_v = float(vc.float().abs().max()) * V_SCALES[layer]
        bound = (2 ** -4 * wv + (2 ** -4 + 2 ** -8) * ref.abs()
                 + 2 ** -10 / 448 * max(seq_lens) * max_v + 1e-5)
        err = (out - ref).abs()
        over = (err > bound)[rows]
        print(f"{step} window {window} layer {layer}: max err {float(err[rows].max()):.4f}, "
              f"max err / bound {float((err / bound)[rows].max()):.3f}, rel {rel_err(out[rows], ref[rows]):.4f}")
        assert not bool(over.any()), (step, layer, float((err / bound)[rows].max()))


@pytest.mark.parametrize("family", ["llama"])
def test_model_over_fp8_cache_with_fa3_fp8_prefill(ckpt, family):
    path = ckpt(family, head_dim=128)  # the prebuilt fa3 all-e4m3 module's head_dim
    full, steps = _script(seed=4)
    calib = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.float32, attention_backend="torch")
    scales = calib.calibrate_kv_scales(list(full.values()))
    ref_gen = _gen(path, torch.float32, scales, attention_backend="torch")
    ref = _run(ref_gen, full, steps)
    e_cache = rel_err(_run(ref_gen, full, steps, kv_dtype=torch.float32), ref)
    e_tb = rel_err(_run(_gen(path, torch.bfloat16, scales, attention_backend="torch"), full, steps), ref)
    errs = {}
    for kind in ("fa2", "fa3"):
        gen = _gen(path, torch.bfloat16, scales, cuda_graphs=False, kernel_config=KernelConfig(fp8_kv_prefill=kind))
        assert gen.model_wrapper.backend.name == "flashinfer"
        errs[kind] = rel_err(_run(gen, full, steps), ref)
        if kind == "fa3":  # the last step (multi-token decode) ran the fa3 all-e4m3 wrapper
            plan = gen.model_wrapper.backend._plan
            assert isinstance(plan, PagedPlan) and all(isinstance(w, Fa3Fp8Prefill) for w in plan.wrappers.values())
    print(f"{family}: fa3 {errs['fa3']:.4f} fa2 {errs['fa2']:.4f} torch bf16 {e_tb:.4f} e_cache {e_cache:.4f} "
          f"bound fa3 {bf16_bound(e_tb) + 2 * e_cache:.4f} bound fa2 {bf16_bound(e_tb):.4f}")
    assert errs["fa2"] <= bf16_bound(e_tb), errs
    assert errs["fa3"] <= bf16_bound(e_tb) + 2 * e_cache, (errs, e_tb, e_cache)
