"""GPU tests (`pytest -m cuda`) of RoPE (+ q / k norms) + the K/V store inside the decode attention kernel
(KernelConfig.decode_rope_attention_max_batch) in whole models: decode CUDA graphs (and eager steps over
e4m3 caches, whose decode runs the Triton kernel) at batch 1 and 2, Llama (GQA 4) and Qwen3 (q / k norms),
bf16 and e4m3 caches, against the same model with the switch off (rope_store_kv, then attention) and
against the oracles: transformers' fp32 logits within the bf16 bound (bf16 caches), the torch backend's
fp32 logits over the same e4m3 cache within test_fp8_kv_cuda's bound (e4m3 caches). The kernel alone:
tests/kernels/test_rope_decode_attention.py.
"""

from __future__ import annotations

import pytest
import torch

from conftest import PagedHarness, make_checkpoint, rel_err

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("needs CUDA", allow_module_level=True)
flashinfer = pytest.importorskip("flashinfer")

import transformers  # noqa: E402

from model_wrapper.kernels import KernelConfig  # noqa: E402
from model_wrapper.kernels import decode_attention  # noqa: E402
from text_generator import TextGenerator  # noqa: E402

FP8 = torch.float8_e4m3fn
TINY = dict(hidden_size=512, intermediate_size=512, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
            vocab_size=96, max_position_embeddings=1024)
ON = KernelConfig(decode_rope_attention_max_batch=2, decode_attention_early_meta=True, decode_attention_prefetch=True,
                  decode_rope_attention_early_tile=True)
OFF = KernelConfig(decode_rope_attention_max_batch=0)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    made = {}

    def get(family):
        if family not in made:
            made[family] = make_checkpoint(tmp_path_factory.mktemp(family), family, **TINY)
        return made[family]

    return get


@pytest.fixture
def fused_calls(monkeypatch):
    """Counts the calls of rope_paged_decode_attention (a graph's capture calls it once a layer)."""
    calls = []
    fn = decode_attention.rope_paged_decode_attention
    monkeypatch.setattr(decode_attention, "rope_paged_decode_attention",
                        lambda *a, **kw: (calls.append(1), fn(*a, **kw))[1])
    return calls


def _greedy(gen, prompts, steps, kv_dtype=None, scales=None):
    """Prefill, then `steps` greedy decode steps; -> ([(tokens so far, logits)] per request and step, harness)."""
    if scales is not None:
        gen.set_kv_scales(scales[0], scales[1])
    h = PagedHarness(gen, 64, 16, seed=3)
    if kv_dtype is not None:
        h.kv_cache = gen.allocate_kv_cache(64, 16, dtype=kv_dtype)
    last = torch.cumsum(torch.tensor([len(p) for p in prompts]), 0) - 1
    logits = h.step(dict(enumerate(prompts)), is_prefill=True, lm_head_indices=last)
    seqs, out = [list(p) for p in prompts], []
    for _ in range(steps):
        for r, seq in enumerate(seqs):
            seq.append(int(logits[r].argmax()))
        logits = h.step({r: seq[-1:] for r, seq in enumerate(seqs)}, is_prefill=False)
        out += [(list(seq), logits[r]) for r, seq in enumerate(seqs)]
    return out, h


def _replayed(gen, prompts, seqs_logits, kv_dtype=None, scales=None):
    """The same token sequences fed to gen (one decode step per token after the prompts) -> logits, in order."""
    if scales is not None:
        gen.set_kv_scales(scales[0], scales[1])
    h = PagedHarness(gen, 64, 16, seed=3)
    if kv_dtype is not None:
        h.kv_cache = gen.allocate_kv_cache(64, 16, dtype=kv_dtype)
    B = len(prompts)
    last = torch.cumsum(torch.tensor([len(p) for p in prompts]), 0) - 1
    h.step(dict(enumerate(prompts)), is_prefill=True, lm_head_indices=last)
    out = []
    for s in range(len(seqs_logits) // B):
        rows = seqs_logits[s * B:(s + 1) * B]
        out.append(h.step({r: rows[r][0][-1:] for r in range(B)}, is_prefill=False))
    return torch.cat(out), h


def _prompts(batch):
    g = torch.Generator().manual_seed(batch)
    return [torch.randint(0, 96, (n,), generator=g).tolist() for n in (37, 12)[:batch]]


@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3_moe", "mistral"])
@pytest.mark.parametrize("batch", [1, 2])
def test_graphs_with_rope_in_attention_match_transformers_and_the_unfused_step(ckpt, fused_calls, family, batch):
    """Graph replays with the fused kernel (every switch of its launch on) at batch 1 / 2: Llama, Qwen3 (q / k
    norms), Qwen3-MoE (the bench_moe shape's family) and Mistral (a sliding window of 6)."""
    path = ckpt(family)
    prompts = _prompts(batch)
    gen = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=True,
                                        kernel_config=ON)
    fused, hf = _greedy(gen, prompts, 5)
    assert gen.model_wrapper.graphs._graphs and fused_calls, "the fused kernel did not run in the graphs"
    off = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=True,
                                        kernel_config=OFF)
    n = len(fused_calls)
    unfused, hu = _replayed(off, prompts, fused)
    assert len(fused_calls) == n  # off: not called
    got = torch.stack([x for _, x in fused])
    print(f"{family} batch {batch}: fused-unfused rel {rel_err(got, unfused):.2e}, equal {torch.equal(got, unfused)}")
    assert rel_err(got, unfused) < 1e-2
    for (kf, vf), (ku, vu) in zip(hf.kv_cache, hu.kv_cache):  # the same K/V written at the same slots
        torch.testing.assert_close(kf.float(), ku.float(), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(vf.float(), vu.float(), atol=0, rtol=0)
    ref32 = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").cuda().eval()
    ref16 = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation="eager").cuda().eval()
    with torch.no_grad():
        for toks, x in fused:
            ids = torch.tensor([toks], device="cuda")
            w32, w16 = ref32(ids).logits[0, -1].float(), ref16(ids).logits[0, -1].float()
            assert rel_err(x, w32) <= 2 * rel_err(w16, w32) + 2e-3, (len(toks), rel_err(x, w32))


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
def test_e4m3_cache_with_rope_in_attention_matches_the_torch_backend(ckpt, fused_calls, family, batch, graphs):
    """Over an e4m3 cache with calibrated per-layer scales: within bf16_bound of the torch backend's fp32 logits
    over the same e4m3 cache, and close to the unfused step; the e4m3 caches equal byte for byte but where the
    k norm's sum rounds apart."""
    from test_fp8_kv_cuda import bf16_bound

    path = ckpt(family)
    prompts = _prompts(batch)
    scales = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.float32,
                                           attention_backend="torch").calibrate_kv_scales(prompts)
    cfg = dict(mixed_graphs=False)  # the prefill eager in every run: its e4m3 K/V the same
    gen = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=graphs,
                                        kernel_config=KernelConfig(decode_rope_attention_max_batch=2, **cfg))
    fused, hf = _greedy(gen, prompts, 5, FP8, scales)
    assert fused_calls, "the fused kernel did not run"
    got = torch.stack([x for _, x in fused])
    off = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=graphs,
                                        kernel_config=KernelConfig(decode_rope_attention_max_batch=0, **cfg))
    unfused, hu = _replayed(off, prompts, fused, FP8, scales)
    ref = _replayed(TextGenerator.from_pretrained(path, device="cuda", dtype=torch.float32, attention_backend="torch"),
                    prompts, fused, FP8, scales)[0]
    tb = _replayed(TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, attention_backend="torch"),
                   prompts, fused, FP8, scales)[0]
    e_tb = rel_err(tb, ref)
    print(f"{family} batch {batch} graphs {graphs}: fused-ref {rel_err(got, ref):.4f} unfused-ref "
          f"{rel_err(unfused, ref):.4f} fused-unfused {rel_err(got, unfused):.2e} torch bf16-ref {e_tb:.4f}")
    assert rel_err(got, ref) <= bf16_bound(e_tb)
    assert rel_err(got, unfused) < 1e-2
    for (kf, vf), (ku, vu) in zip(hf.kv_cache, hu.kv_cache):
        diff = (kf.view(torch.uint8) != ku.view(torch.uint8)).float().mean()
        assert diff < 1e-3, float(diff)  # (rounding of k apart: the norm's sum, or a fused multiply-add)
        assert torch.equal(vf.view(torch.uint8), vu.view(torch.uint8))
