"""GPU tests (`pytest -m cuda`) of FP8 (e4m3) KV caches: FlashInfer's decode, fa2 prefill and custom-
mask kernels and the Triton decode kernel (in the decode CUDA graphs) over e4m3 caches, against the
torch backend over the same e4m3 cache (the executable spec, itself checked against transformers
over e4m3-rounded K/V in test_fp8_kv_cache.py).

Bound: the reference is the torch backend in fp32 over an e4m3 cache; a bf16 run may be at most
twice as far from it as the torch backend's own bf16 run, plus a small floor (the kernels round
p and the output to bf16 where the torch backend computes in fp32). Two bf16 runs on different
kernels may then differ by what each may legitimately be from the reference, added (the triangle
inequality on the max norm): `pair_bound`. Scales: calibrated on the prompts by the fp32 model (so
they differ from 1 and from layer to layer), the same for every run.
"""

from __future__ import annotations

import pytest
import torch

from conftest import PagedHarness, make_checkpoint, rel_err

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("needs CUDA", allow_module_level=True)
flashinfer = pytest.importorskip("flashinfer")

from model_wrapper.attention.flashinfer_backend import PagedPlan, TritonDecode  # noqa: E402
from model_wrapper.kernels import KernelConfig  # noqa: E402
from test_forward_parity import _script  # noqa: E402
from test_masks import tree_rows  # noqa: E402
from text_generator import TextGenerator  # noqa: E402

FP8 = torch.float8_e4m3fn
GPU_TINY = dict(hidden_size=512, intermediate_size=512, num_attention_heads=8, num_key_value_heads=2,
                head_dim=64, vocab_size=96, max_position_embeddings=1024)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    made = {}

    def get(family, **extra):
        key = (family, repr(sorted(extra.items())))
        if key not in made:
            made[key] = make_checkpoint(tmp_path_factory.mktemp(family), family, **{**GPU_TINY, **extra})
        return made[key]

    return get


def _scales(path, prompts) -> torch.Tensor:
    gen = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.float32, attention_backend="torch")
    return gen.calibrate_kv_scales(prompts)


def _gen(path, dtype, scales, **kw):
    gen = TextGenerator.from_pretrained(path, device="cuda", dtype=dtype, **kw)
    gen.set_kv_scales(scales[0], scales[1])
    return gen


def _run(gen, full, steps, block_size=16, kv_dtype=FP8):
    """The forward-parity scenario (prefill, chunked prefill, mixed, decode, multi-token decode) over
    a cache of kv_dtype (e4m3 unless said); -> all returned logits rows, in order."""
    h = PagedHarness(gen, 256 // block_size + 8, block_size)
    h.kv_cache = gen.allocate_kv_cache(256 // block_size + 8, block_size, dtype=kv_dtype)
    out = []
    for is_prefill, spans, use_lm in steps:
        chunks = {r: full[r][a:b] for r, (a, b) in spans.items()}
        n = sum(b - a for a, b in spans.values())
        out.append(h.step(chunks, is_prefill=is_prefill, lm_head_indices=torch.arange(n) if use_lm else None))
    return torch.cat(out)


def bf16_bound(e_torch_bf16: float) -> float:
    """How far from the fp32 reference a bf16 run over the same e4m3 cache may be, given the torch
    backend's own bf16 run's distance e_torch_bf16."""
    return 2 * e_torch_bf16 + 2e-3


def pair_bound(e_torch_bf16: float, ref: torch.Tensor, x: torch.Tensor) -> float:
    """The largest rel_err(y, x) two bf16 runs x, y within bf16_bound of the reference can have:
    max|y - x| <= max|y - ref| + max|x - ref| <= 2 * bf16_bound * max|ref|, over max|x|."""
    return 2 * bf16_bound(e_torch_bf16) * float(ref.float().abs().max() / x.float().abs().max())


def _kernel_config(kernel: str, **kw) -> KernelConfig:
    """The decode kernel over an e4m3 cache: "triton" (kernels/decode_attention.py), "cuda" (kernels/
    e4m3_decode_cuda.py where it fits: head_dim 128, pages of a multiple of 16, no window; at every batch, so
    the graphs' batches 1-2 run it under PDL) or "flashinfer"."""
    if kernel == "flashinfer":
        return KernelConfig(fp8_kv_decode="flashinfer", **kw)
    return KernelConfig(fp8_kv_decode="triton", fp8_kv_decode_cuda=kernel == "cuda", fp8_kv_decode_cuda_min_batch=1,
                        **kw)


def _cuda_calls() -> int:
    from model_wrapper.kernels import e4m3_decode_cuda

    info = e4m3_decode_cuda._kernel.cache_info()
    return info.hits + info.misses


@pytest.mark.parametrize("fp8_kv_decode", ["triton", "flashinfer", "cuda"])
@pytest.mark.parametrize("family", ["llama", "qwen3", "mistral"])
def test_flashinfer_over_fp8_cache_matches_the_torch_backend(ckpt, family, fp8_kv_decode):
    """Eager steps of every kind; single-token decode rows on the kernel fp8_kv_decode names ("cuda": a model of
    head_dim 128, which that kernel takes; its windowed layers (mistral) go to the Triton kernel)."""
    extra = {"sliding_window": 6} if family == "mistral" else {}
    path = ckpt(family, **extra, **({"head_dim": 128} if fp8_kv_decode == "cuda" else {}))
    full, steps = _script(seed=4)
    scales = _scales(path, list(full.values()))
    ref = _run(_gen(path, torch.float32, scales, attention_backend="torch"), full, steps, 16)
    tb = _run(_gen(path, torch.bfloat16, scales, attention_backend="torch"), full, steps, 16)
    fi_gen = _gen(path, torch.bfloat16, scales, cuda_graphs=False, kernel_config=_kernel_config(fp8_kv_decode))
    assert fi_gen.model_wrapper.backend.name == "flashinfer"
    assert not torch.equal(fi_gen.kv_scales, torch.ones_like(fi_gen.kv_scales))
    for block_size in (16, 1):
        calls = _cuda_calls()
        fi = _run(fi_gen, full, steps, block_size)
        assert rel_err(fi, ref) <= bf16_bound(rel_err(tb, ref)), (block_size, rel_err(fi, ref), rel_err(tb, ref))
        # the CUDA kernel ran where it fits (pages of 16, no window), and only there
        assert (_cuda_calls() > calls) == (fp8_kv_decode == "cuda" and block_size == 16 and family != "mistral")


@pytest.mark.parametrize("kind", ["spec", "atten"])
def test_flashinfer_custom_masks_over_fp8_cache(ckpt, kind):
    path = ckpt("llama")
    parents = [-1, 0, 0, 1, 1, 2, 5]
    ctx = list(range(3, 40))
    toks = [50, 51, 52, 53, 54, 55, 56]
    m, depth = tree_rows(parents)
    outs = []
    scales = _scales(path, [ctx + toks])
    for dtype, backend in ((torch.float32, "torch"), (torch.bfloat16, "torch"), (torch.bfloat16, "flashinfer")):
        gen = _gen(path, dtype, scales, attention_backend=backend, cuda_graphs=False)
        h = PagedHarness(gen, 16, 16)
        h.kv_cache = gen.allocate_kv_cache(16, 16, dtype=FP8)
        h.step({0: ctx}, is_prefill=True)
        h.ensure(0, len(ctx) + len(toks))
        kw = {"spec_mask": m} if kind == "spec" else {
            "atten_mask": torch.cat((torch.ones(len(toks), len(ctx), dtype=torch.bool), m), 1)}
        outs.append(gen.forward_tensor(
            torch.tensor(toks), torch.tensor([len(ctx) + d for d in depth]), False, h.kv_cache,
            torch.tensor([h.tables[0]], dtype=torch.int32),
            torch.tensor([h.slot(0, len(ctx) + i) for i in range(len(toks))]),
            torch.tensor([len(ctx) + len(toks)]), 256, q_lens=[len(toks)], **kw))
        if backend == "flashinfer":
            assert isinstance(gen.model_wrapper.backend._plan, PagedPlan)
    ref, tb, fi = outs
    assert rel_err(fi, ref) <= bf16_bound(rel_err(tb, ref))


def _decode(gen, prompts, tokens):
    h = PagedHarness(gen, 64, 16, seed=3)
    h.kv_cache = gen.allocate_kv_cache(64, 16, dtype=FP8)
    last = torch.cumsum(torch.tensor([len(p) for p in prompts]), 0) - 1
    h.step(dict(enumerate(prompts)), is_prefill=True, lm_head_indices=last)
    return [h.step({r: [t] for r, t in enumerate(ts)}, is_prefill=False) for ts in tokens], h


@pytest.mark.parametrize("kernel", ["triton", "flashinfer", "cuda"])
@pytest.mark.parametrize("batch", [3, 17])
def test_graph_replay_over_fp8_cache_equals_eager(ckpt, batch, kernel):
    """Decode graphs on `kernel` (KernelConfig.fp8_kv_decode: the Triton kernel reading e4m3, or
    FlashInfer's graph wrappers) against eager steps on the other one, both against the torch
    backend over the same e4m3 cache (fp32: the reference; bf16: the yardstick): each within
    bf16_bound of the reference, and the two within pair_bound of each other. Then new scales: the
    graphs follow them (the Triton kernel reads them through pointers; FlashInfer's graphs are
    captured again)."""
    path = ckpt("llama", **({"head_dim": 128} if kernel == "cuda" else {}))
    other = "flashinfer" if kernel != "flashinfer" else "triton"
    g = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(0, 96, (int(n),), generator=g).tolist() for n in torch.randint(3, 40, (batch,), generator=g)]
    tokens = torch.randint(0, 96, (6, batch), generator=g).tolist()
    scales = _scales(path, prompts)
    ref_gen = _gen(path, torch.float32, scales, attention_backend="torch")
    tb_gen = _gen(path, torch.bfloat16, scales, attention_backend="torch")
    eager = _gen(path, torch.bfloat16, scales, cuda_graphs=False, kernel_config=_kernel_config(other))
    # the prefill stays eager in the graphed run too (mixed_graphs off): its K/V rounded to e4m3 apart would
    # differ in the cache by whole e4m3 steps here and there (the mixed graphs over e4m3: test_mixed_graph.py)
    calls = _cuda_calls()
    graph = _gen(path, torch.bfloat16, scales, cuda_graphs=True,
                 kernel_config=_kernel_config(kernel, mixed_graphs=False))
    assert torch.equal(eager.kv_scales, graph.kv_scales)
    for rescale in (False, True):
        if rescale:
            new = scales * 1.7
            for gen in (ref_gen, tb_gen, eager, graph):
                gen.set_kv_scales(new[0], new[1])
        ref, tb = (torch.cat(_decode(gen, prompts, tokens)[0]) for gen in (ref_gen, tb_gen))
        a, _ = _decode(eager, prompts, tokens)
        plan = eager.model_wrapper.backend._plan  # the last eager decode step's
        assert isinstance(plan, PagedPlan) and all(isinstance(w, TritonDecode) == (other == "triton")
                                                   for w in plan.wrappers.values())
        b, hb = _decode(graph, prompts, tokens)
        buckets = graph.model_wrapper.graphs._graphs
        assert buckets and all(bk.attn_state.triton == (kernel != "flashinfer") and bk.attn_state.kv_dtype == FP8
                               for bk in buckets.values())
        assert (_cuda_calls() > calls) == (kernel == "cuda")  # the graphs' captures ran it (or not)
        a, b = torch.cat(a), torch.cat(b)
        e_tb = rel_err(tb, ref)
        errs = (rel_err(b, ref), rel_err(a, ref), rel_err(b, a), e_tb)
        print(f"batch {batch} graphs {kernel} eager {other} rescale {rescale}: graph-ref {errs[0]:.4f} eager-ref "
              f"{errs[1]:.4f} graph-eager {errs[2]:.4f} (pair bound {pair_bound(e_tb, ref, a):.4f}) torch bf16-ref {e_tb:.4f}")
        assert rel_err(b, ref) <= bf16_bound(e_tb), errs
        assert rel_err(a, ref) <= bf16_bound(e_tb), errs
        assert rel_err(b, a) <= pair_bound(e_tb, ref, a), errs
        used = {blk for t in hb.tables.values() for blk in t}
        for k, _ in hb.kv_cache:
            untouched = [i for i in range(k.shape[0]) if i not in used]
            assert torch.count_nonzero(k.view(torch.uint8)[untouched]) == 0

