"""Sizing the KV cache: blocks for a byte budget, and profiling free CUDA memory."""

from __future__ import annotations

import pytest
import torch

from kv_manager import (
    KVArgumentError,
    KVCacheError,
    KVCacheSpec,
    KVErrorCode,
    allocate_kv_cache,
    num_blocks_for_budget,
    profile_num_blocks,
)

# 2 (K, V) * 2 layers * 2 heads * 8 dims * 2 bytes = 128 bytes a token, 2048 a 16-token block.
SPEC = KVCacheSpec(num_layers=2, num_kv_heads=2, head_dim=8, dtype=torch.float16)


def test_budget_is_divided_into_whole_blocks():
    assert SPEC.bytes_per_block(16) == 2048
    assert num_blocks_for_budget(SPEC, 16, 10_000) == 4
    assert num_blocks_for_budget(SPEC, 16, 2048) == 1
    assert num_blocks_for_budget(SPEC, 1, 10_000) == 78


def test_budget_must_fit_one_sequence_of_max_seq_len():
    assert num_blocks_for_budget(SPEC, 16, 10_000, max_seq_len=64) == 4  # exactly 4 blocks
    with pytest.raises(KVCacheError) as err:
        num_blocks_for_budget(SPEC, 16, 10_000, max_seq_len=65)
    assert isinstance(err.value, RuntimeError)
    assert err.value.code is KVErrorCode.INSUFFICIENT_MEMORY
    assert str(err.value) == (
        "[KV_INSUFFICIENT_MEMORY] num_blocks_for_budget: one sequence of 65 tokens needs 5 "
        "blocks of 2048 bytes (10240 bytes), got a budget of 10000 bytes (4 blocks)"
    )
    with pytest.raises(KVCacheError, match=r"one block needs 1 blocks .* got a budget of 2047"):
        num_blocks_for_budget(SPEC, 16, 2047)


@pytest.mark.parametrize(
    "args, text",
    [
        ((0, 100), "got block_size=0"),
        ((16, -1), "budget_bytes=-1"),
    ],
)
def test_budget_arguments_are_checked(args, text):
    with pytest.raises(KVArgumentError, match=text) as err:
        num_blocks_for_budget(SPEC, *args)
    assert err.value.code is KVErrorCode.INVALID_ARGUMENT
    with pytest.raises(KVArgumentError, match="expected max_seq_len >= 1 or None, got 0"):
        num_blocks_for_budget(SPEC, 16, 10_000, max_seq_len=0)


def test_profiling_on_cpu_asks_for_an_explicit_size():
    with pytest.raises(KVArgumentError) as err:
        profile_num_blocks(SPEC, 16, device="cpu")
    assert isinstance(err.value, ValueError)
    assert "expected a CUDA device to profile, got device='cpu'" in str(err.value)
    assert "explicit num_blocks" in str(err.value) and "num_blocks_for_budget" in str(err.value)


def test_profiling_takes_a_fraction_of_free_cuda_memory(monkeypatch):
    free, total = 1_000_000, 4_000_000
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, total))
    assert profile_num_blocks(SPEC, 16, device="cuda:0") == 900_000 // 2048
    assert profile_num_blocks(SPEC, 16, device="cuda", memory_fraction=0.5) == 500_000 // 2048
    assert calls[:2] == ["sync", "empty"]  # cached-but-unused allocator memory counts as free
    with pytest.raises(KVCacheError) as err:
        profile_num_blocks(SPEC, 16, device="cuda", max_seq_len=16 * 500)
    assert err.value.code is KVErrorCode.INSUFFICIENT_MEMORY
    with pytest.raises(KVArgumentError, match="expected 0 < memory_fraction <= 1, got 1.5"):
        profile_num_blocks(SPEC, 16, device="cuda", memory_fraction=1.5)


@pytest.mark.cuda
def test_profiled_cache_fits_on_the_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    spec = KVCacheSpec(num_layers=4, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16)
    torch.zeros(1, device="cuda")  # the context and first kernels take memory: load them first
    torch.cuda.empty_cache()  # as profile_num_blocks does: memory earlier tests left cached counts as free
    free_before, _ = torch.cuda.mem_get_info()
    num_blocks = profile_num_blocks(spec, 16, device="cuda", memory_fraction=0.5)
    assert abs(num_blocks * spec.bytes_per_block(16) - 0.5 * free_before) <= 0.01 * free_before
    cache = allocate_kv_cache(spec, num_blocks, 16, device="cuda")  # what was profiled fits
    assert cache[0][0].shape == (num_blocks, 16, 8, 128)
    del cache


def test_allocate_kv_cache_refuses_bad_or_oversized_requests_before_allocating():
    spec = KVCacheSpec(num_layers=2, num_kv_heads=2, head_dim=16, dtype=torch.float32)
    for bad in [(0, 16), (4.0, 16), (4, True), ("4", 16)]:
        with pytest.raises(KVArgumentError) as err:
            allocate_kv_cache(spec, *bad)
        assert err.value.code is KVErrorCode.INVALID_ARGUMENT and isinstance(err.value, ValueError)
    with pytest.raises(KVCacheError) as err:  # 2**40 blocks: exabytes, refused at once
        allocate_kv_cache(spec, 2**40, 16)
    assert err.value.code is KVErrorCode.INSUFFICIENT_MEMORY and "GiB" in str(err.value)
    cache = allocate_kv_cache(spec, 4, 16)
    assert len(cache) == 2 and cache[0][0].shape == (4, 16, 2, 16)
# default_num_blocks, and the engine that sizes its own cache with it ------------------------------


def test_default_on_cpu_holds_max_num_seqs_full_sequences_within_the_budget():
    from kv_manager import default_num_blocks

    # 64-token sequences are 4 blocks of 16; 3 of them + 1 spare = 13 blocks = 26,624 bytes
    assert default_num_blocks(SPEC, 16, device="cpu", max_seq_len=64, max_num_seqs=3) == 13
    assert default_num_blocks(SPEC, 16, device="cpu", max_seq_len=64, max_num_seqs=3,
                              cpu_budget_bytes=10 * 2048 + 5) == 10  # capped by the budget
    with pytest.raises(KVCacheError) as err:  # not even one sequence fits
        default_num_blocks(SPEC, 16, device="cpu", max_seq_len=64, max_num_seqs=3, cpu_budget_bytes=3 * 2048)
    assert err.value.code is KVErrorCode.INSUFFICIENT_MEMORY
    with pytest.raises(KVArgumentError, match="max_num_seqs=0"):
        default_num_blocks(SPEC, 16, device="cpu", max_seq_len=64, max_num_seqs=0)


def test_engine_sizes_its_cache_when_num_blocks_is_not_given(checkpoint_dir):
    from text_generator import TextGenerator
    from text_generator.engine import LLMEngine

    gen = TextGenerator.from_pretrained(checkpoint_dir("llama"), device="cpu", dtype=torch.float32)
    cfg = gen.config
    engine = LLMEngine(gen, block_size=4, max_seq_len=40, max_num_seqs=3, freeze_gc=False)
    assert engine.block_manager.num_blocks == 10 * 3 + 1
    k, v = engine.kv_cache[0]
    assert len(engine.kv_cache) == cfg.num_layers and tuple(k.shape) == (31, 4, cfg.num_kv_heads, cfg.head_dim)
    per_block = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4 * 4  # K and V, fp32, 4 tokens
    small = LLMEngine(gen, block_size=4, max_seq_len=40, max_num_seqs=3, kv_cpu_budget_bytes=12 * per_block,
                      freeze_gc=False)
    assert small.block_manager.num_blocks == 12
    out = small.generate([[1, 2, 3]] * 3, dict(temperature=0, max_new_tokens=30, ignore_eos=True), use_tqdm=False)
    assert all(len(o.token_ids) == 30 for o in out)  # fewer blocks than the load: preemption copes
    for bad in (dict(num_blocks=0), dict(block_size=0), dict(num_blocks=2.5)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            LLMEngine(gen, freeze_gc=False, **bad)
