"""GPU tests (`pytest -m cuda`): output_hidden_states and the EAGLE-3 drafter on the FlashInfer
backend (bf16, decode CUDA graphs on), against transformers and the plain-torch head oracle of
test_eagle3. bf16 bound as test_cuda_model: our error against the fp32 oracle at most twice the
oracle's own bf16 error, plus a small floor.
"""

from __future__ import annotations

import random

import pytest
import torch

from conftest import make_checkpoint, rel_err

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("flashinfer")

import transformers  # noqa: E402

from kv_manager import BlockManager  # noqa: E402
from test_eagle3 import make_head, oracle_head  # noqa: E402
from test_hidden_states import _script, hidden_scenario  # noqa: E402
from text_generator import TextGenerator  # noqa: E402
from text_generator.speculative import SpeculativeDecoder  # noqa: E402
from text_generator.speculative.eagle3 import Eagle3Drafter  # noqa: E402

GPU_TINY = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                head_dim=64, vocab_size=96, max_position_embeddings=1024, num_hidden_layers=8)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = make_checkpoint(tmp_path_factory.mktemp("llama8"), "llama", **GPU_TINY)
    gen = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16)  # FlashInfer, graphs on
    assert gen.model_wrapper.backend.name == "flashinfer" and gen.model_wrapper.graphs is not None
    return path, gen


def _hf(path, dtype):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager").cuda().eval()


def test_hidden_states_on_flashinfer_match_transformers(target):
    """Every state, every step kind (its q = 1 decode step, which would replay a graph, runs eagerly)."""
    path, gen = target
    layers = list(range(9))
    out = hidden_scenario(gen, layers)
    full, _ = _script(0)
    ref = {}
    for dtype in (torch.float32, torch.bfloat16):
        hf = _hf(path, dtype)
        with torch.no_grad():
            ref[dtype] = {r: torch.stack([s[0].float() for s in hf(torch.tensor([t], device="cuda"),
                                                                   output_hidden_states=True).hidden_states])
                          for r, t in full.items()}
    for j, layer in enumerate(layers):
        got = torch.stack([h[j] for _, _, _, h in out])
        w32 = torch.stack([ref[torch.float32][r][layer, p] for r, p, _, _ in out])
        w16 = torch.stack([ref[torch.bfloat16][r][layer, p] for r, p, _, _ in out])
        assert rel_err(got, w32) <= 2 * rel_err(w16, w32) + 2e-3, (layer, rel_err(got, w32))


def test_eagle3_head_on_flashinfer_matches_the_oracle(target, tmp_path):
    path, gen = target
    t = make_head(tmp_path / "head", seed=1, hidden=256)
    drafter = Eagle3Drafter(gen, str(tmp_path / "head"), k=3, num_blocks=32, block_size=16)
    g = torch.Generator().manual_seed(2)
    toks = torch.randint(0, 96, (23,), generator=g).tolist()
    states = torch.randn(23, 3, 256, generator=g)
    embed = gen.model_wrapper.model.model.embed_tokens.weight.float().cpu()
    want16, _ = oracle_head({k: v.bfloat16().float() for k, v in t.items()}, embed,
                            toks, (states.reshape(23, -1) @ t["fc.weight"].T))
    want32, _ = oracle_head(t, embed, toks, states.reshape(23, -1) @ t["fc.weight"].T)
    _, out = drafter._forward(["a"], [toks], drafter.head.fuse(states.cuda(), drafter.runner.kernels))
    assert rel_err(out[0].float().cpu(), want32[-1]) <= 2 * rel_err(want16[-1], want32[-1]) + 2e-2


def test_greedy_speculation_with_eagle3_on_cuda_is_lossless(target, tmp_path):
    """= plain decoding through the same driver on the same GPU model, in float32 (torch attention on
    the GPU): in bf16 a verify step's logits round differently from a decode step's (other kernels,
    other GEMM shapes), and a random tiny model's near-ties then flip whichever drafter runs."""
    path, _ = target
    gen = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.float32, attention_backend="torch")
    make_head(tmp_path / "head", seed=3, hidden=256)
    drafter = Eagle3Drafter(gen, str(tmp_path / "head"), k=3, num_blocks=64, block_size=16)
    rng = random.Random(4)
    prompts = [[rng.randrange(96) for _ in range(rng.randint(3, 40))] for _ in range(4)]
    kv = gen.allocate_kv_cache(64, 16)
    plain = SpeculativeDecoder(gen, kv, BlockManager(64, 16, enable_prefix_caching=False), None).generate(prompts, 16)
    dec = SpeculativeDecoder(gen, kv, BlockManager(64, 16, enable_prefix_caching=False), drafter)
    assert dec.generate(prompts, 16) == plain
    assert dec.stats.drafted > 0 and drafter.bm.num_used_blocks == 0
