"""BlockManager: unit specifications, then a random state machine checking its invariants."""

from __future__ import annotations

import re
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from kv_manager import BlockManager, KVArgumentError, KVCacheError, KVErrorCode


def snapshot(bm: BlockManager) -> tuple:
    """Everything observable about a manager, to check that a failed call changed nothing."""
    seqs = {
        s: (bm.block_table(s), bm.token_ids(s), bm.num_computed_tokens(s)) for s in bm._seqs
    }
    return bm.num_free_blocks, bm.num_cached_blocks, bm.num_used_blocks, seqs


def deep_snapshot(bm: BlockManager) -> tuple:
    """snapshot() plus the private state (cache dict, refcounts, keys, free list, LRU order,
    entry counter, per-sequence chains): a refused call must leave all of it as it was."""
    seqs = {s: (list(q.tokens), list(q.blocks), q.num_computed, q.extra_key, list(q.chain))
            for s, q in bm._seqs.items()}
    return (snapshot(bm), dict(bm._cache), list(bm._ref), list(bm._key), list(bm._entry), list(bm._free),
            list(bm._evictable), bm._next_entry, seqs)


def bad_calls(bm: BlockManager, sid) -> list:
    """Calls with a badly typed argument on a live sequence sid: each must raise
    KV_INVALID_ARGUMENT and change nothing."""
    return [
        lambda: bm.commit(sid, 8.0),
        lambda: bm.commit(sid, "3"),
        lambda: bm.commit(sid, True),
        lambda: bm.commit_many([sid], [1.0]),
        lambda: bm.admit("new", [1, 2, 3, 4, 5], extra_key=["unhashable"]),
        lambda: bm.admit("new", [1], extra_key={"a": 1}),
        lambda: bm.can_admit([1, 2], extra_key=[1]),
        lambda: bm.admit(["unhashable"], [1, 2]),
        lambda: bm.admit("new", [1.0, 2.0]),
        lambda: bm.admit("new", "abc"),
        lambda: bm.admit("new", [[1, 2], [3, 4]]),
        lambda: bm.admit("new", torch.tensor([[1, 2]])),
        lambda: bm.admit("new", torch.tensor([1.0, 2.0])),
        lambda: bm.admit("new", [1, -2]),
        lambda: bm.append(sid, [1.5]),
        lambda: bm.append(sid, ["a"]),
        lambda: bm.append(sid, torch.tensor([[1]])),
        lambda: bm.append_many([sid], [2.0]),
        lambda: bm.append_many([sid], torch.tensor([[2]])),
        lambda: bm.set_token(sid, bm.num_tokens(sid) - 1, 1.5),
        lambda: bm.set_token(sid, float(bm.num_tokens(sid) - 1), 1),
        lambda: bm.truncate(sid, float(bm.num_tokens(sid))),
        lambda: bm.can_append(sid, 1.0),
        lambda: bm.slots(sid, 0.0, 1),
        lambda: bm.block_tables([sid], width=2.5),
        lambda: bm.fork(sid, ["child"]),
        lambda: bm.free(["unhashable"]),
    ]


def run_prompt(bm: BlockManager, seq_id, prompt, extra_key=None) -> int:
    """Admit, compute and commit a whole prompt; returns the cached-token count."""
    cached = bm.admit(seq_id, prompt, extra_key=extra_key)
    bm.commit(seq_id, len(prompt))
    return cached


# prefix cache ----------------------------------------------------------------------------------


def test_hit_reuses_whole_blocks_and_leaves_the_last_token_to_compute():
    bm = BlockManager(16, 4)
    prompt = list(range(10))
    assert run_prompt(bm, "a", prompt) == 0
    table_a = bm.block_table("a")
    bm.free("a")

    assert bm.admit("b", prompt) == 8  # 2 full blocks; t8, t9 are computed again
    assert bm.block_table("b")[:2] == table_a[:2]
    assert bm.num_computed_tokens("b") == 8
    # A prompt made only of cached full blocks still leaves its last block to compute.
    assert bm.admit("c", prompt[:8]) == 4
    assert bm.admit("d", prompt[:9]) == 8
    assert bm.admit("e", prompt[:4]) == 0


def test_different_extra_key_never_hits():
    bm = BlockManager(16, 4)
    prompt = list(range(9))
    run_prompt(bm, "base", prompt)
    assert bm.admit("lora", prompt, extra_key="adapter-1") == 0
    bm.commit("lora", 9)
    assert bm.admit("lora-2", prompt, extra_key="adapter-1") == 8
    assert bm.admit("base-2", prompt) == 8
    assert bm.block_table("lora-2")[:2] != bm.block_table("base-2")[:2]


def test_hits_only_along_an_unbroken_chain_from_the_start():
    bm = BlockManager(16, 2)
    run_prompt(bm, "a", [1, 2, 3, 4, 5, 6, 7])
    assert bm.admit("b", [9, 2, 3, 4, 5, 6, 7]) == 0  # same later blocks, different first
    assert bm.admit("c", [1, 2, 3, 9, 5, 6, 7]) == 2  # broken at the second block


def test_only_committed_full_blocks_enter_the_cache():
    bm = BlockManager(16, 4)
    prompt = list(range(10))
    bm.admit("a", prompt)
    assert bm.admit("b", prompt) == 0  # nothing committed yet
    bm.commit("a", 5)  # one full block computed
    assert bm.admit("c", prompt) == 4


def test_speculative_tokens_are_cached_only_once_accepted_and_committed():
    bm = BlockManager(16, 2)
    run_prompt(bm, "a", [1, 2, 3])
    drafts = [4, 5, 6, 7]
    bm.append("a", drafts)  # forward pass computes all four, verifier accepts 4 and 5
    bm.truncate("a", 5)
    bm.commit("a", 5)
    assert bm.token_ids("a") == [1, 2, 3, 4, 5]
    assert bm.admit("x", [1, 2, 3, 4, 5, 6, 7, 8]) == 4  # [1,2] [3,4]; [5,6] never committed


def test_content_computed_twice_concurrently_is_cached_once_and_both_stay_valid():
    bm = BlockManager(16, 2)
    prompt = [1, 2, 3, 4, 5]
    bm.admit("a", prompt)
    bm.admit("b", prompt)
    bm.commit("a", 5)
    bm.commit("b", 5)  # b's copies stay private; its chain continues through a's blocks
    assert bm.num_used_blocks == 6
    bm.free("a")
    bm.free("b")
    assert (bm.num_cached_blocks, bm.num_free_blocks) == (2, 14)
    assert bm.admit("c", prompt) == 4


def test_lru_evicts_the_least_recently_used_cached_block():
    bm = BlockManager(4, 2)
    run_prompt(bm, "a", [1, 1, 0])
    bm.free("a")
    run_prompt(bm, "b", [2, 2, 0])
    bm.free("b")
    assert bm.admit("a2", [1, 1, 0]) == 2  # touches a's block: b's is now least recent
    bm.free("a2")
    assert (bm.num_free_blocks, bm.num_cached_blocks) == (2, 2)
    bm.admit("big", [7, 7, 7, 7, 7])  # 3 blocks: both free ones, then evicts one cached
    bm.free("big")
    assert bm.admit("b2", [2, 2, 0]) == 0
    bm.free("b2")
    assert bm.admit("a3", [1, 1, 0]) == 2


def test_eviction_takes_a_chains_tail_before_its_head():
    bm = BlockManager(4, 2)
    run_prompt(bm, "a", [1, 2, 3, 4, 5])  # [1,2] [3,4] cached, [5] not
    bm.free("a")
    bm.admit("x", [9, 9, 9, 9, 9])  # 3 blocks: the 2 free ones and one evicted
    bm.free("x")
    assert bm.admit("a2", [1, 2, 3, 4, 5]) == 2  # the head survived; a tail alone is useless


def test_reset_prefix_cache_evicts_unreferenced_blocks_only():
    bm = BlockManager(8, 2)
    run_prompt(bm, "a", [1, 2, 3])
    run_prompt(bm, "b", [4, 5, 6])
    bm.free("a")
    bm.reset_prefix_cache()
    assert (bm.num_free_blocks, bm.num_cached_blocks, bm.num_used_blocks) == (6, 0, 2)
    assert bm.admit("a2", [1, 2, 3]) == 0
    assert bm.admit("b2", [4, 5, 6]) == 2  # still held by b, so still cached


def test_drop_cached_frees_one_extra_keys_blocks_and_keeps_the_others():
    bm = BlockManager(16, 4)
    prompt = list(range(9))
    run_prompt(bm, "old", prompt, extra_key=("sql", 0))
    run_prompt(bm, "base", prompt)
    bm.free("old")
    run_prompt(bm, "held", prompt, extra_key=("sql", 0))  # hits the two cached blocks and holds them
    bm.free("base")
    assert bm.num_cached_blocks == 2  # base's (the sql ones are held)
    assert bm.drop_cached(("sql", 0)) == 2
    assert bm.admit("probe", prompt, extra_key=("sql", 0)) == 0  # no hit any more
    bm.free("probe")
    before_free = bm.num_free_blocks
    bm.free("held")  # its blocks left the cache: freed, not evictable
    assert bm.num_free_blocks == before_free + 3 and bm.num_cached_blocks == 2
    assert run_prompt(bm, "base2", prompt) == 8  # other keys untouched
    with pytest.raises(KVArgumentError):
        bm.drop_cached(["unhashable"])


def test_disabled_prefix_caching_never_hits_and_frees_everything():
    bm = BlockManager(8, 2, enable_prefix_caching=False)
    run_prompt(bm, "a", [1, 2, 3, 4, 5])
    bm.free("a")
    assert (bm.num_free_blocks, bm.num_cached_blocks) == (8, 0)
    assert bm.admit("b", [1, 2, 3, 4, 5]) == 0


def test_token_ids_may_be_a_tensor():
    bm = BlockManager(8, 2)
    run_prompt(bm, "a", torch.tensor([1, 2, 3]))
    assert bm.admit("b", torch.tensor([1, 2, 3])) == 2
    assert bm.token_ids("b") == [1, 2, 3]


# admission, growth, rollback -------------------------------------------------------------------


def test_can_admit_counts_hits_and_evictable_blocks_and_keeps_the_watermark():
    bm = BlockManager(6, 2, watermark_blocks=1)
    run_prompt(bm, "a", [1, 2, 3, 4, 5])  # 3 blocks, 2 of them cached
    bm.free("a")
    assert (bm.num_free_blocks, bm.num_cached_blocks) == (4, 2)
    # 5 blocks for 9 tokens, 2 hits: needs 3 new of 6 - 2 available, leaving 1 = watermark.
    assert bm.can_admit([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert not bm.can_admit([1, 2, 3, 4, 5, 6, 7, 8, 9], reserve_tokens=2)
    assert not bm.can_admit([9] * 11)  # 6 blocks, no hit: would leave 0 < watermark
    assert bm.admit("b", [9] * 11) == 0  # admit itself only needs the blocks to exist
    assert bm.num_free_blocks == 0


def test_append_returns_slots_in_the_sequences_own_blocks():
    bm = BlockManager(8, 4)
    bm.admit("a", [1, 2, 3])
    bm.admit("b", [1, 2, 3])
    bm.commit("a", 3)
    slots = bm.append("a", [4, 5, 6])  # fills a's block, then one new block
    table = bm.block_table("a")
    assert slots.dtype == torch.int64 and slots.shape == (3,)
    assert slots.tolist() == [table[0] * 4 + 3, table[1] * 4 + 0, table[1] * 4 + 1]
    assert torch.equal(bm.slots("a", 3, 6), slots)
    assert bm.slots("a", 0, 0).shape == (0,)
    assert not set(table) & set(bm.block_table("b"))


def test_truncate_frees_emptied_blocks_and_refuses_committed_tokens():
    bm = BlockManager(8, 4)
    bm.admit("a", [1, 2])
    bm.commit("a", 2)
    bm.append("a", [3, 4, 5, 6, 7, 8, 9])  # 9 tokens: 3 blocks
    assert bm.num_free_blocks == 5
    bm.truncate("a", 3)
    assert len(bm.block_table("a")) == 1 and bm.num_free_blocks == 7
    assert bm.token_ids("a") == [1, 2, 3]
    with pytest.raises(KVArgumentError) as err:
        bm.truncate("a", 1)
    assert err.value.code is KVErrorCode.INVALID_ARGUMENT
    assert "got 1" in str(err.value) and "[2, 3]" in str(err.value)


def test_fork_shares_computed_blocks_and_copies_the_partial_last_one():
    bm = BlockManager(8, 4)
    bm.admit("p", [1, 2, 3, 4, 5, 6])
    bm.commit("p", 6)
    parent = bm.block_table("p")
    copies = bm.fork("p", "c")
    child = bm.block_table("c")
    assert child[0] == parent[0] and child[1] != parent[1]
    assert copies == [(parent[1], child[1])]
    assert bm.token_ids("c") == bm.token_ids("p") and bm.num_computed_tokens("c") == 6
    assert bm.append("c", [7]).item() // 4 == child[1]
    assert bm.append("p", [8]).item() // 4 == parent[1]
    bm.free("p")
    assert bm.num_used_blocks == 2  # the shared block lives on in the child


def test_fork_without_partial_block_copies_nothing_and_uncomputed_blocks_are_fresh():
    bm = BlockManager(8, 2)
    bm.admit("p", [1, 2, 3, 4])
    bm.commit("p", 4)
    assert bm.fork("p", "full") == []
    assert bm.block_table("full") == bm.block_table("p")
    bm.append("p", [5, 6, 7])  # uncomputed: the child must not share the blocks they go to
    assert bm.fork("p", "spec") == []
    assert bm.block_table("spec")[:2] == bm.block_table("p")[:2]
    assert not set(bm.block_table("spec")[2:]) & set(bm.block_table("p"))


def test_block_tables_pads_to_the_longest_or_a_given_width():
    bm = BlockManager(8, 2)
    bm.admit(0, [1, 2, 3])
    bm.admit(1, [4])
    tables = bm.block_tables([0, 1])
    assert tables.dtype == torch.int32
    assert tables.tolist() == [bm.block_table(0), bm.block_table(1) + [-1]]
    assert bm.block_tables([1], pad=0, width=4).tolist() == [bm.block_table(1) + [0, 0, 0]]
    assert bm.block_tables([]).shape == (0, 0)
    with pytest.raises(KVArgumentError, match=r"expected width >= 2 .* got 1"):
        bm.block_tables([0, 1], width=1)


# errors ----------------------------------------------------------------------------------------


def test_out_of_blocks_is_a_runtime_error_and_changes_nothing():
    bm = BlockManager(4, 4)
    bm.admit("a", list(range(6)))
    bm.commit("a", 6)
    before = snapshot(bm)
    with pytest.raises(KVCacheError) as err:
        bm.admit("b", list(range(20)))  # 5 blocks, the first one a hit
    assert isinstance(err.value, RuntimeError) and err.value.code is KVErrorCode.OUT_OF_BLOCKS
    assert str(err.value) == (
        "[KV_OUT_OF_BLOCKS] admit: need 4 new blocks for 20 tokens (1 cached), 2 free"
    )
    with pytest.raises(KVCacheError, match=re.escape("[KV_OUT_OF_BLOCKS] append: need 3 blocks")):
        bm.append("a", list(range(11)))
    assert snapshot(bm) == before and "b" not in bm

    bm.admit("c", [9] * 8)  # takes the last 2 blocks
    before = snapshot(bm)
    with pytest.raises(KVCacheError, match=re.escape("[KV_OUT_OF_BLOCKS] fork: need 1 blocks")):
        bm.fork("a", "a2")  # a's partial last block needs a private copy
    assert snapshot(bm) == before and "a2" not in bm
    assert not bm.can_append("a", 3) and bm.can_append("a", 2)


def test_argument_errors_are_value_errors_with_codes():
    bm = BlockManager(8, 2)
    bm.admit("a", [1, 2, 3])
    U, D, I = (
        KVErrorCode.UNKNOWN_SEQUENCE,
        KVErrorCode.DUPLICATE_SEQUENCE,
        KVErrorCode.INVALID_ARGUMENT,
    )
    cases = [
        (lambda: bm.append("zz", [1]), U, "append: expected an admitted seq_id, got 'zz'"),
        (lambda: bm.admit("a", [1]), D, "admit: seq_id='a' is already admitted"),
        (lambda: bm.fork("a", "a"), D, "fork: child_id='a'"),
        (lambda: bm.admit("b", []), I, "admit: expected a non-empty prompt, got 0"),
        (lambda: bm.commit("a", 4), I, "commit: expected num_computed_tokens in [0, 3]"),
        (lambda: bm.slots("a", 2, 5), I, "slots: expected 0 <= start <= end <= num_tokens=3"),
        (lambda: bm.can_admit([1], reserve_tokens=-1), I, "got -1"),
        (lambda: bm.append_many(["a", "zz"], [1, 2]), U, "append_many: expected an admitted seq_id, got 'zz'"),
        (lambda: bm.append_many(["a", "a"], [1, 2]), I, "append_many: expected distinct seq_ids"),
        (lambda: bm.append_many(["a"], [1, 2]), I, "got 1 seq_ids and 2 token_ids"),
        (lambda: bm.commit_many(["a"], [4]), I, "commit_many: expected num_computed_tokens in [0, 3]"),
        (lambda: bm.commit_many(["a", "a"], [1, 2]), I, "commit_many: expected distinct seq_ids"),
        (lambda: BlockManager(0, 2), I, "got num_blocks=0"),
        (lambda: BlockManager(4, 2, watermark_blocks=4), I, "watermark_blocks=4"),
    ]
    before = snapshot(bm)
    for call, code, text in cases:
        with pytest.raises(KVArgumentError) as err:
            call()
        assert isinstance(err.value, ValueError) and err.value.code is code
        assert str(err.value).startswith(f"[{code.value}] ") and text in str(err.value)
    assert snapshot(bm) == before


def test_badly_typed_arguments_are_refused_before_any_state_changes():
    bm = BlockManager(8, 2)
    bm.admit("a", [1, 2, 3, 4, 5])
    bm.commit("a", 4)
    bm.append("a", [6])
    before = deep_snapshot(bm)
    for i, call in enumerate(bad_calls(bm, "a")):
        with pytest.raises(KVArgumentError) as err:
            call()
        assert err.value.code is KVErrorCode.INVALID_ARGUMENT, i
        assert deep_snapshot(bm) == before, i
    # numpy-style ints and 0-d integer tensors are ints
    bm.commit("a", torch.tensor(5))
    assert bm.num_computed_tokens("a") == 5


# random state machine --------------------------------------------------------------------------

TOKENS = st.lists(st.integers(0, 2), min_size=1, max_size=3)  # 3 tokens: blocks repeat
# Prompts mostly start with one of a few shared prefixes, so that cache hits are common.
PREFIXES = [(), (0, 1, 2, 0), (0, 1, 2, 0, 1, 1, 2, 0), (2, 2)]
PROMPTS = st.builds(
    lambda prefix, rest: list(prefix) + rest,
    st.sampled_from(PREFIXES),
    st.lists(st.integers(0, 2), max_size=5),
).filter(bool)


class BlockManagerMachine(RuleBasedStateMachine):
    """Drives a BlockManager the way a scheduler does and plays the model itself.

    The shadow `kv` maps each slot to what the forward pass wrote there: (extra_key, the token
    prefix ending at that position), which is exactly what the K/V at a slot depends on. So
    "every computed position of every live sequence still holds its own prefix" checks at once
    that cache hits hold the prompt's tokens, that fork copies were right, and that no write
    ever landed in a block someone else reads. White-box reads of `_ref`, `_key`, `_evictable`
    check refcounts and cache state, which the public API only shows as totals.
    """

    @initialize(
        num_blocks=st.integers(8, 24),
        block_size=st.integers(1, 4),
        caching=st.booleans(),
        watermark=st.integers(0, 2),
    )
    def setup(self, num_blocks, block_size, caching, watermark):
        self.bm = BlockManager(
            num_blocks, block_size, enable_prefix_caching=caching, watermark_blocks=watermark
        )
        self.bs = block_size
        self.seqs: dict[int, dict] = {}  # seq_id -> tokens, extra, computed, written
        self.kv: dict[int, tuple] = {}
        self.next_id = 0

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def live(self, data) -> int:
        return data.draw(st.sampled_from(sorted(self.seqs)))

    def slot_of(self, seq_id, p) -> int:
        return self.bm.block_table(seq_id)[p // self.bs] * self.bs + p % self.bs

    def holders(self) -> Counter:
        return Counter(b for s in self.seqs for b in self.bm.block_table(s))

    @rule(prompt=PROMPTS, extra=st.sampled_from([None, "lora"]), prefill=st.booleans())
    def admit(self, prompt, extra, prefill):
        fits = self.bm.can_admit(prompt, extra_key=extra)
        before, sid = snapshot(self.bm), self.new_id()
        try:
            cached = self.bm.admit(sid, prompt, extra_key=extra)
        except KVCacheError as err:
            assert err.code is KVErrorCode.OUT_OF_BLOCKS and not fits
            assert snapshot(self.bm) == before
            return
        if fits:
            assert self.bm.num_free_blocks + self.bm.num_cached_blocks >= self.bm.watermark_blocks
        assert cached % self.bs == 0 and cached <= (len(prompt) - 1) // self.bs * self.bs
        if not self.bm.enable_prefix_caching:
            assert cached == 0
        # The hit blocks' contents are checked against this prompt by the kv invariant.
        self.seqs[sid] = dict(tokens=list(prompt), extra=extra, computed=cached, written=cached)
        if prefill:  # the usual path: the next forward step computes the prompt at once
            self.run_forward(sid)
            self.bm.commit(sid, len(prompt))
            self.seqs[sid]["computed"] = len(prompt)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), new=TOKENS)
    def append(self, data, new):
        self.append_to(self.live(data), new)

    def append_to(self, sid, new) -> bool:
        fits, before = self.bm.can_append(sid, len(new)), snapshot(self.bm)
        try:
            slots = self.bm.append(sid, new)
        except KVCacheError as err:
            assert err.code is KVErrorCode.OUT_OF_BLOCKS and not fits
            assert snapshot(self.bm) == before
            return False
        assert fits
        seq = self.seqs[sid]
        start = len(seq["tokens"])
        seq["tokens"] += new
        others = {b for s in self.seqs if s != sid for b in self.bm.block_table(s)}
        for i, slot in enumerate(slots.tolist()):
            assert slot == self.slot_of(sid, start + i)
            assert slot // self.bs not in others
        return True

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def forward(self, data):
        self.run_forward(self.live(data))

    def run_forward(self, sid):
        """The model writes K/V of every uncomputed token, at the slots the manager gives."""
        seq = self.seqs[sid]
        n = len(seq["tokens"])
        holders = self.holders()
        slots = self.bm.slots(sid, seq["computed"], n).tolist()
        for p, slot in zip(range(seq["computed"], n), slots):
            b = slot // self.bs
            assert holders[b] == 1 and self.bm._key[b] is None  # writable: private, uncached
            self.kv[slot] = (seq["extra"], tuple(seq["tokens"][: p + 1]))
        seq["written"] = n

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def commit(self, data):
        sid = self.live(data)
        seq = self.seqs[sid]
        n = data.draw(st.integers(seq["computed"], seq["written"]))
        self.bm.commit(sid, n)
        seq["computed"] = n

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), tokens=st.lists(st.integers(0, 2), min_size=8, max_size=8))
    def batched_decode_step(self, data, tokens):
        """A scheduler's batched decode: append_many (one token each, all or nothing), the
        forward, commit_many. The slots must be those per-sequence appends would give."""
        sids = data.draw(st.lists(st.sampled_from(sorted(self.seqs)), min_size=1, max_size=8, unique=True))
        toks = tokens[: len(sids)]
        # all or nothing: the blocks needed are those whose next position starts a new block
        need = sum(1 for s in sids if len(self.seqs[s]["tokens"]) == len(self.bm.block_table(s)) * self.bs)
        fits = need <= self.bm.num_free_blocks + self.bm.num_cached_blocks
        before = snapshot(self.bm)
        try:
            slots = self.bm.append_many(sids, toks).tolist()
        except KVCacheError as err:
            assert err.code is KVErrorCode.OUT_OF_BLOCKS and not fits
            assert snapshot(self.bm) == before
            return
        assert fits and len(slots) == len(sids) and len(set(slots)) == len(slots)
        for sid, tok, slot in zip(sids, toks, slots):
            seq = self.seqs[sid]
            seq["tokens"].append(tok)
            assert slot == self.slot_of(sid, len(seq["tokens"]) - 1)
        for sid in sids:
            self.run_forward(sid)
        self.bm.commit_many(sids, [len(self.seqs[s]["tokens"]) for s in sids])
        for sid in sids:
            self.seqs[sid]["computed"] = len(self.seqs[sid]["tokens"])

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), drafts=TOKENS, accepted=st.integers(0, 3))
    def decode_step(self, data, drafts, accepted):
        """One decode step with speculative drafts: the sampled token plus drafts are appended
        and computed, rejected drafts truncated, the rest committed."""
        sid = self.live(data)
        seq = self.seqs[sid]
        start = len(seq["tokens"])
        if not self.append_to(sid, drafts):
            return
        self.run_forward(sid)
        keep = start + min(accepted, len(drafts))
        self.bm.truncate(sid, keep)
        self.bm.commit(sid, keep)
        seq["tokens"] = seq["tokens"][:keep]
        seq["computed"] = seq["written"] = keep

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def truncate(self, data):
        sid = self.live(data)
        seq = self.seqs[sid]
        if seq["computed"] > 0:
            before = snapshot(self.bm)
            with pytest.raises(KVArgumentError):
                self.bm.truncate(sid, data.draw(st.integers(0, seq["computed"] - 1)))
            assert snapshot(self.bm) == before
        n = data.draw(st.integers(seq["computed"], len(seq["tokens"])))
        free_before, dropped = self.bm.num_free_blocks, self.bm.block_table(sid)[-(-n // self.bs) :]
        self.bm.truncate(sid, n)
        assert self.bm.num_free_blocks == free_before + len(dropped)  # all private
        seq["tokens"] = seq["tokens"][:n]
        seq["written"] = min(seq["written"], n)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def fork(self, data):
        parent, child = self.live(data), self.new_id()
        before = snapshot(self.bm)
        try:
            copies = self.bm.fork(parent, child)
        except KVCacheError as err:
            assert err.code is KVErrorCode.OUT_OF_BLOCKS
            assert snapshot(self.bm) == before
            return
        assert len(copies) <= 1
        for src, dst in copies:  # the caller's job: copy K/V of the whole block
            for off in range(self.bs):
                if src * self.bs + off in self.kv:
                    self.kv[dst * self.bs + off] = self.kv[src * self.bs + off]
        seq = self.seqs[parent]
        self.seqs[child] = dict(seq, tokens=list(seq["tokens"]), written=seq["computed"])

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data):
        sid = self.live(data)
        self.bm.free(sid)
        del self.seqs[sid]

    @precondition(lambda self: self.bm.num_cached_blocks)
    @rule(data=st.data())
    def refused_call(self, data):
        """A badly typed call on a live sequence raises KV_INVALID_ARGUMENT and changes nothing."""
        if not self.seqs:
            return
        sid = self.live(data)
        calls = bad_calls(self.bm, sid)
        call = calls[data.draw(st.integers(0, len(calls) - 1))]
        before = deep_snapshot(self.bm)
        with pytest.raises(KVArgumentError) as err:
            call()
        assert err.value.code is KVErrorCode.INVALID_ARGUMENT
        assert deep_snapshot(self.bm) == before

    @rule()
    def reset_prefix_cache(self):
        self.bm.reset_prefix_cache()
        assert self.bm.num_cached_blocks == 0

    @precondition(lambda self: len(self.seqs) > 1)
    @rule()
    def free_all(self):
        for sid in list(self.seqs):
            self.bm.free(sid)
        self.seqs.clear()
        assert self.bm.num_used_blocks == 0
        assert self.bm.num_free_blocks + self.bm.num_cached_blocks == self.bm.num_blocks

    @invariant()
    def block_accounting(self):
        bm = self.bm
        assert bm.num_free_blocks + bm.num_cached_blocks + bm.num_used_blocks == bm.num_blocks
        holders = self.holders()
        assert all(bm._ref[b] == holders[b] for b in range(bm.num_blocks))
        assert bm.num_used_blocks == len(holders)
        assert all(bm._key[b] is not None for b in bm._evictable)

    @invariant()
    def sequences_match_the_shadow(self):
        for sid, seq in self.seqs.items():
            table = self.bm.block_table(sid)
            assert self.bm.token_ids(sid) == seq["tokens"]
            assert self.bm.num_computed_tokens(sid) == seq["computed"]
            assert len(table) == -(-len(seq["tokens"]) // self.bs)
            for b in table[seq["computed"] // self.bs :]:  # blocks it will still write
                assert self.bm._ref[b] == 1 and self.bm._key[b] is None
            for p in range(seq["computed"]):
                expected = (seq["extra"], tuple(seq["tokens"][: p + 1]))
                assert self.kv.get(self.slot_of(sid, p)) == expected

    @invariant()
    def cached_blocks_hold_their_tokens(self):
        for b, key in enumerate(self.bm._key):
            if key is not None:
                _, tokens, extra = key
                for off, token in enumerate(tokens):
                    held_extra, prefix = self.kv[b * self.bs + off]
                    assert (held_extra, prefix[-1]) == (extra, token)

    def teardown(self):
        if hasattr(self, "bm"):
            self.free_all()


BlockManagerMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_block_manager_state_machine = BlockManagerMachine.TestCase
