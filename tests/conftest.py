"""Fixtures: tiny random checkpoints saved with transformers' save_pretrained, and a paged harness.

The oracle for every numeric test is transformers' own model class loaded from the same folder
(`hf_model`); the library under test loads the folder through TextGenerator.from_pretrained.
"""

from __future__ import annotations

import random

import pytest
import os

import torch
import transformers

TINY = dict(
    vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
    initializer_range=0.08, rms_norm_eps=1e-5, tie_word_embeddings=False,
)

# family name -> (config class, model class, extra config)
FAMILY_SPECS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(rope_theta=10000.0)),
    "llama31": ("LlamaConfig", "LlamaForCausalLM", dict(
        rope_theta=500000.0,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=64))),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=6)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32)),
}
FAMILIES = list(FAMILY_SPECS)

# mixture-of-experts families (tests/model_wrapper/test_moe.py): 3 layers, the middle one dense where the family
# allows it; 8 experts of 32, top 2 (Qwen3: top 3)
MOE_SPECS = {
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        num_hidden_layers=3, head_dim=32, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1])),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(
        num_hidden_layers=3, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, norm_topk_prob=False, mlp_only_layers=[1])),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(
        num_local_experts=8, num_experts_per_tok=2, intermediate_size=32, sliding_window=6)),
}
FAMILY_SPECS.update(MOE_SPECS)
MOE_FAMILIES = list(MOE_SPECS)


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of tiny matmuls: on the 2 shared CI cores, threads
    spinning on ops this small make them ~100x slower. Use with
    `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_checkpoint(path, family: str, dtype=torch.float32, seed: int = 0, **overrides) -> str:
    cfg_cls, model_cls, extra = FAMILY_SPECS[family]
    kw = {**TINY, **extra, **overrides}
    cfg = getattr(transformers, cfg_cls)(**kw)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(cfg).to(dtype)
    with torch.no_grad():  # nonzero norms and biases so that every parameter matters
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(str(path))
    return str(path)


def hf_model(path: str, dtype=torch.float32):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager")
    return model.eval()


def hf_generate(model, ids: list[int], n: int, eos: int | None = None) -> list[int]:
    """transformers' own greedy generate from prompt ids: exactly n new tokens (eos None), or at
    most n, ending at eos if it comes."""
    stop = dict(min_new_tokens=n, eos_token_id=None, pad_token_id=0) if eos is None else \
        dict(eos_token_id=eos, pad_token_id=eos)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=n, do_sample=False, **stop)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="session")
def checkpoint_dir(tmp_path_factory):
    """family -> fp32 checkpoint folder (made once per session)."""
    cache = {}

    def get(family: str, dtype=torch.float32, **overrides):
        key = (family, dtype, repr(sorted(overrides.items())))
        if key not in cache:
            path = tmp_path_factory.mktemp(f"{family}_{str(dtype).split('.')[-1]}")
            cache[key] = make_checkpoint(path, family, dtype, **overrides)
        return cache[key]

    return get


class PagedHarness:
    """A minimal test-side scheduler: shuffled non-contiguous blocks per request, flat tensors.

    It is not the library's block manager (kv_manager has its own tests); it only lays out
    block_tables / slots the way any scheduler would, so forward_tensor can be driven step by step.
    """

    def __init__(self, gen, num_blocks: int, block_size: int, seed: int = 0):
        self.gen, self.block_size = gen, block_size
        self.kv_cache = gen.allocate_kv_cache(num_blocks, block_size)
        free = list(range(num_blocks))
        random.Random(seed).shuffle(free)
        self.free = free
        self.tables: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}

    def ensure(self, rid: int, length: int) -> None:
        table = self.tables.setdefault(rid, [])
        while len(table) * self.block_size < length:
            table.append(self.free.pop())

    def slot(self, rid: int, pos: int) -> int:
        return self.tables[rid][pos // self.block_size] * self.block_size + pos % self.block_size

    def step(self, chunks: dict[int, list[int]], *, is_prefill: bool, lm_head_indices=None,
             max_seq_len: int = 512, **kwargs) -> torch.Tensor:
        """chunks: request id -> new token ids (appended after what the request already has)."""
        ids, pos, slots, lens, q_lens = [], [], [], [], []
        for rid, toks in chunks.items():
            start = self.lens.get(rid, 0)
            self.ensure(rid, start + len(toks))
            for i, t in enumerate(toks):
                ids.append(t)
                pos.append(start + i)
                slots.append(self.slot(rid, start + i))
            lens.append(start + len(toks))
            q_lens.append(len(toks))
        width = max(len(self.tables[r]) for r in chunks)
        bt = torch.full((len(chunks), width), -1, dtype=torch.int32)
        for row, rid in enumerate(chunks):
            bt[row, : len(self.tables[rid])] = torch.tensor(self.tables[rid], dtype=torch.int32)
        kwargs.setdefault("q_lens", q_lens)
        out = self.gen.forward_tensor(
            torch.tensor(ids), torch.tensor(pos), is_prefill, self.kv_cache, bt,
            torch.tensor(slots), torch.tensor(lens, dtype=torch.int32), max_seq_len,
            lm_head_indices, **kwargs)
        for rid, toks in chunks.items():
            self.lens[rid] = self.lens.get(rid, 0) + len(toks)
        return out


def quantize_fp8_blockwise(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., rows, cols] -> (e4m3 [..., rows, cols], float32 scales [..., rows, ceil(cols / 128)]): absmax
    of each row's 128-column groups over e4m3's largest value, the layout of block-wise FP8 checkpoints."""
    C = w.shape[-1]
    G = -(-C // 128)
    padded = torch.nn.functional.pad(w.float(), (0, G * 128 - C)).unflatten(-1, (G, 128))
    scale = padded.abs().amax(-1).clamp(min=1e-8) / 448.0
    q = (padded / scale[..., None]).flatten(-2)[..., :C].to(torch.float8_e4m3fn)
    return q, scale


def dequantize_fp8_blockwise(q: torch.Tensor, scale: torch.Tensor, dtype) -> torch.Tensor:
    """The inverse, written out group by group: each 128-column group times its row's scale, then dtype."""
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for gi in range(scale.shape[-1]):
        cols = slice(gi * 128, min((gi + 1) * 128, q.shape[-1]))
        out[..., cols] = q[..., cols].float() * scale[..., gi, None]
    return out.to(dtype)


def end_gloo_worker() -> None:
    """End a spawned gloo test worker whose results are saved and whose process group is destroyed:
    exit at once with status 0. A normal interpreter exit after destroy_process_group aborts now
    and then on the shared 2-core machines ("terminate called without an active exception" from a
    gloo thread at teardown, SIGABRT), which fails a whole spawn of finished jobs."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (float32)."""
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


BPE_CORPUS = [
    "Hello world, héllo wörld! Grüße aus Köln.",
    "日本語のテキストと中文文本。", "emoji ✓ 🙂 🚀 and symbols € £ ¥",
    "the quick brown fox jumps over the lazy dog", "naïve café façade coöperate",
    "Привет мир, как дела?", "def f(x):\n    return x * 2\n",
] * 20


def make_bpe_tokenizer(vocab_size: int = 320):
    """A byte-level BPE tokenizer trained here on a small multilingual corpus (multi-byte
    characters split over several tokens), as a transformers fast tokenizer; EOS is "<eos>"."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    raw.train_from_iterator(BPE_CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>", clean_up_tokenization_spaces=False)


@pytest.fixture(scope="session")
def bpe_tokenizer():
    return make_bpe_tokenizer()


@pytest.fixture(scope="session")
def bpe_checkpoint(tmp_path_factory, bpe_tokenizer):
    """A tiny random Llama whose vocabulary is bpe_tokenizer's, with the tokenizer saved beside it."""
    path = make_checkpoint(tmp_path_factory.mktemp("bpe_llama"), "llama", vocab_size=len(bpe_tokenizer))
    bpe_tokenizer.save_pretrained(path)
    return path
