"""Block manager: which KV blocks each sequence holds, with a prefix cache over full blocks.

A serving scheduler (or the reference engine) drives it once per step: `admit` a prompt,
`append` new tokens, fill forward_tensor's `block_tables` and `slots` from `block_tables()` and
the slots it returns, run the forward pass, then `commit` what was computed. It owns block ids
only; the K/V tensors are the caller's (`allocate_kv_cache`), and the (src, dst) block copies
that `fork` returns are the caller's to perform on them.

    tokens       t0 t1 t2 t3 | t4 t5 t6 t7 | t8 t9        block_size = 4
    block table  [    7      ,     2       ,  5  ]
    slot(t9)   = 5 * 4 + 9 % 4 = 21

Prefix cache: once a FULL block's K/V is committed it is registered under the key
(parent entry id, its tokens, extra_key), so a later prompt with the same leading blocks (a
system prompt, few-shot examples, a retried request) walks the chain from its first block and
reuses every block found instead of recomputing it.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from kv_manager.arguments import (admitted, arg_error, as_int, check_commit, check_hashable, distinct_admitted,
                                  prompt_list, token_list)
from kv_manager.errors import KVArgumentError, KVCacheError, KVErrorCode

# Parent entry id of a sequence's first block; real entry ids count up from 0.
_ROOT = -1


@dataclass(eq=False)
class _Seq:
    tokens: list[int]
    blocks: list[int]
    num_computed: int
    extra_key: Hashable
    # Cache entry id of the content of each leading committed full block; the next block's key
    # continues from chain[-1]. len(chain) == num_computed // block_size when caching is on.
    chain: list[int]


class BlockManager:
    """Owns the state of `num_blocks` KV blocks and the block table of every live sequence.

    Each block is in exactly one state, kept in O(1) structures so that every call costs
    O(blocks it touches), never a scan of the pool:
        free    unused and not in the prefix cache        `_free` (a stack)
        cached  in the prefix cache, refcount 0           `_evictable` (OrderedDict, LRU first)
        used    refcount > 0 (may also be in the cache)
    Invariants:
        - `_ref[b]` is the number of live sequences whose table holds b.
        - The blocks a sequence will still write into (table index >= num_computed // block_size:
          the block of its first uncomputed position and all after it) are held by that
          sequence alone and are not in the cache, so no write ever changes K/V that another
          sequence or the cache reads.
        - Only full blocks of committed tokens enter the cache. The cache dict is keyed by the
          tuple (parent entry id, block tokens, extra_key) itself, so a hash collision is
          resolved by comparing the stored tokens: a hit never returns a block whose tokens,
          prefix or extra_key differ. Entry ids are never reused, so a chain broken by eviction
          stays broken rather than reaching a stale child.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = True,
        watermark_blocks: int = 0,
    ) -> None:
        """num_blocks: blocks in the caller's kv_cache; block_size: tokens per block;
        watermark_blocks: blocks `can_admit` keeps free for the growth of running sequences."""
        num_blocks = as_int(num_blocks, "BlockManager: num_blocks")
        block_size = as_int(block_size, "BlockManager: block_size")
        watermark_blocks = as_int(watermark_blocks, "BlockManager: watermark_blocks")
        if not isinstance(enable_prefix_caching, bool):
            raise arg_error(f"BlockManager: expected enable_prefix_caching as a bool, "
                             f"got {type(enable_prefix_caching).__name__}")
        if num_blocks < 1 or block_size < 1:
            raise arg_error(
                f"BlockManager: expected num_blocks >= 1 and block_size >= 1, "
                f"got num_blocks={num_blocks}, block_size={block_size}"
            )
        if not 0 <= watermark_blocks < num_blocks:
            raise arg_error(
                f"BlockManager: expected 0 <= watermark_blocks < num_blocks={num_blocks}, "
                f"got watermark_blocks={watermark_blocks}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.watermark_blocks = watermark_blocks
        self._seqs: dict[Hashable, _Seq] = {}
        self._ref = [0] * num_blocks
        self._key: list[tuple | None] = [None] * num_blocks  # cache key while b is cached
        self._entry = [0] * num_blocks  # cache entry id while b is cached
        self._cache: dict[tuple, int] = {}
        self._next_entry = 0
        self._free = list(range(num_blocks - 1, -1, -1))  # popped from the end: 0, 1, 2, ...
        self._evictable: OrderedDict[int, None] = OrderedDict()

    # admission --------------------------------------------------------------------------------

    def can_admit(
        self, token_ids: Sequence[int], *, extra_key: Hashable = None, reserve_tokens: int = 0
    ) -> bool:
        """Whether `admit(token_ids)` plus `reserve_tokens` more tokens (e.g. the first decode
        token) would fit with >= watermark_blocks blocks still available afterwards. Cache hits
        and evictable cached blocks count as available."""
        tokens = prompt_list(token_ids, "can_admit")
        check_hashable(extra_key, "can_admit: extra_key")
        reserve_tokens = as_int(reserve_tokens, "can_admit: reserve_tokens")
        if reserve_tokens < 0:
            raise arg_error(f"can_admit: expected reserve_tokens >= 0, got {reserve_tokens}")
        hits = self._match(tokens, extra_key)
        need = self._blocks_for(len(tokens) + reserve_tokens) - len(hits)
        return self._available(hits) - need >= self.watermark_blocks

    def admit(
        self, seq_id: Hashable, token_ids: Sequence[int], *, extra_key: Hashable = None
    ) -> int:
        """Register a new sequence whose prompt is token_ids (ints, or a 1-D int tensor).

        Reuses the cached full blocks of its longest cached prefix and allocates the rest.
        extra_key (e.g. the LoRA adapter name) is part of every cache key, so sequences with
        different extra_keys never share K/V. Returns num_cached_tokens: how many leading tokens
        already have K/V, a multiple of block_size and < len(token_ids), since the last prompt
        token is always left to compute so that the caller gets its logits. The watermark is
        `can_admit`'s policy; admit only needs the blocks to exist.
        """
        check_hashable(seq_id, "admit: seq_id")
        if seq_id in self._seqs:
            raise KVArgumentError(
                KVErrorCode.DUPLICATE_SEQUENCE, f"admit: seq_id={seq_id!r} is already admitted"
            )
        tokens = prompt_list(token_ids, "admit")
        check_hashable(extra_key, "admit: extra_key")  # checked before any state changes: the cache
        # keys (and so a later commit) hash it
        hits = self._match(tokens, extra_key)
        need = self._blocks_for(len(tokens)) - len(hits)
        available = self._available(hits)
        if need > available:
            raise KVCacheError(
                KVErrorCode.OUT_OF_BLOCKS,
                f"admit: need {need} new blocks for {len(tokens)} tokens "
                f"({len(hits)} cached), {available} free",
            )
        for b in hits:
            if self._ref[b] == 0:
                del self._evictable[b]
            self._ref[b] += 1
        num_cached = len(hits) * self.block_size
        chain = [self._entry[b] for b in hits]
        self._seqs[seq_id] = _Seq(tokens, hits + self._allocate(need), num_cached, extra_key, chain)
        return num_cached

    # growth and rollback ----------------------------------------------------------------------

    def can_append(self, seq_id: Hashable, num_tokens: int = 1) -> bool:
        """Whether `append` of num_tokens tokens would find its blocks (ignores the watermark,
        which exists precisely so that running sequences can keep growing)."""
        seq = self._get(seq_id, "can_append")
        num_tokens = as_int(num_tokens, "can_append: num_tokens")
        if num_tokens < 0:
            raise arg_error(f"can_append: expected num_tokens >= 0, got {num_tokens}")
        need = self._blocks_for(len(seq.tokens) + num_tokens) - len(seq.blocks)
        return need <= self._available()

    def append(self, seq_id: Hashable, token_ids: Sequence[int]) -> torch.Tensor:
        """Add tokens (a decode token, speculative drafts) and return their slots, int64
        `[len(token_ids)]`, slot = block_id * block_size + offset. They are not computed until
        `commit`; the block they go into is always this sequence's own (see the invariants)."""
        seq = self._get(seq_id, "append")
        new = token_list(token_ids, "append")
        start, end = len(seq.tokens), len(seq.tokens) + len(new)
        need = self._blocks_for(end) - len(seq.blocks)
        seq.blocks += self._allocate_or_refuse(need, f"append: need {need} blocks for {len(new)} tokens of "
                                                     f"seq_id={seq_id!r}")
        seq.tokens += new
        return self._slots(seq, start, end)

    def append_many(self, seq_ids: Sequence[Hashable], token_ids: Sequence[int]) -> torch.Tensor:
        """One token for each of many sequences (a decode step): the same as `append(seq_ids[i],
        [token_ids[i]])` for every i, in one call, all or nothing: if the pool cannot give every
        sequence its block, OUT_OF_BLOCKS is raised and nothing changes. Returns the slots, int64
        `[len(seq_ids)]`."""
        token_ids = token_list(token_ids, "append_many")
        seqs = self._distinct(seq_ids, len(token_ids), "token_ids", "append_many")
        bs = self.block_size
        # a sequence needs a new block exactly when its next position starts one
        need = sum(1 for seq in seqs if len(seq.tokens) == len(seq.blocks) * bs)
        fresh = iter(self._allocate_or_refuse(
            need, f"append_many: need {need} blocks for one token of each of {len(seqs)} sequences"))
        out: list[int] = []
        for seq, tok in zip(seqs, token_ids):
            pos = len(seq.tokens)
            if pos == len(seq.blocks) * bs:
                seq.blocks.append(next(fresh))
            seq.tokens.append(tok)
            out.append(seq.blocks[pos // bs] * bs + pos % bs)
        return _tensor(out, "q", torch.int64)

    def commit(self, seq_id: Hashable, num_computed_tokens: int) -> None:
        """Declare that K/V of the first num_computed_tokens tokens is written (after a forward
        step). Only now do the full blocks among them enter the prefix cache: speculative tokens
        are truncated before their commit, so only finalized tokens are ever cached."""
        seq = self._get(seq_id, "commit")
        num_computed_tokens = as_int(num_computed_tokens, "commit: num_computed_tokens")
        check_commit(seq.num_computed, len(seq.tokens), seq_id, num_computed_tokens, "commit")
        seq.num_computed = num_computed_tokens
        if self.enable_prefix_caching:
            self._register(seq)

    def set_token(self, seq_id: Hashable, position: int, token_id: int) -> None:
        """Replace the token at an uncommitted position (position >= num_computed_tokens): an
        engine that appended a placeholder for a token still on the device writes the real one
        before the commit that may enter it into the prefix cache."""
        seq = self._get(seq_id, "set_token")
        position = as_int(position, "set_token: position")
        token_id = token_list([token_id], "set_token")[0]
        if not seq.num_computed <= position < len(seq.tokens):
            raise arg_error(
                f"set_token: expected position in [{seq.num_computed}, {len(seq.tokens)}) (uncommitted "
                f"tokens) for seq_id={seq_id!r}, got {position}"
            )
        seq.tokens[position] = token_id

    def commit_many(self, seq_ids: Sequence[Hashable], num_computed_tokens: Sequence[int]) -> None:
        """`commit(seq_ids[i], num_computed_tokens[i])` for every i, all checked before any is
        applied (a bad entry raises and commits nothing)."""
        num_computed_tokens = [as_int(n, "commit_many: num_computed_tokens") for n in num_computed_tokens]
        seqs = self._distinct(seq_ids, len(num_computed_tokens), "num_computed_tokens", "commit_many")
        for seq_id, seq, n in zip(seq_ids, seqs, num_computed_tokens):
            check_commit(seq.num_computed, len(seq.tokens), seq_id, n, "commit_many")
        bs = self.block_size
        for seq, n in zip(seqs, num_computed_tokens):
            seq.num_computed = n
            if self.enable_prefix_caching and n // bs > len(seq.chain):  # a block filled up
                self._register(seq)

    def truncate(self, seq_id: Hashable, num_tokens: int) -> None:
        """Keep only the first num_tokens tokens (drop rejected speculative tokens) and free the
        blocks that become empty.

        num_tokens must be >= num_computed_tokens: committed K/V may already be shared through
        the prefix cache or a fork, and rolling it back would need copy-on-write of a shared
        block. Uncommitted tokens live only in blocks this sequence alone holds, so cutting them
        never touches another sequence's K/V.
        """
        seq = self._get(seq_id, "truncate")
        num_tokens = as_int(num_tokens, "truncate: num_tokens")
        if not seq.num_computed <= num_tokens <= len(seq.tokens):
            raise arg_error(
                f"truncate: expected num_tokens in [{seq.num_computed}, {len(seq.tokens)}] "
                f"(num_computed_tokens .. num_tokens; committed tokens are never rolled back) "
                f"for seq_id={seq_id!r}, got {num_tokens}"
            )
        keep = self._blocks_for(num_tokens)
        self._release(seq.blocks[keep:])
        del seq.blocks[keep:]
        del seq.tokens[num_tokens:]

    def fork(self, parent_id: Hashable, child_id: Hashable) -> list[tuple[int, int]]:
        """Start child_id as a copy of parent_id (parallel sampling, beam search).

        The child shares the parent's fully computed blocks (refcount + 1) and gets private
        blocks for the rest. If the parent's first uncomputed position is inside a block (a
        partial last block), that block's computed K/V must be copied: returns the
        [(src_block, dst_block)] copies the caller performs on every layer's K and V before the
        child's next forward step ([] if none).
        """
        parent = self._get(parent_id, "fork")
        check_hashable(child_id, "fork: child_id")
        if child_id in self._seqs:
            raise KVArgumentError(
                KVErrorCode.DUPLICATE_SEQUENCE, f"fork: child_id={child_id!r} is already admitted"
            )
        shared = parent.num_computed // self.block_size
        need = len(parent.blocks) - shared
        own = self._allocate_or_refuse(need, f"fork: need {need} blocks for the unshared tail of "
                                             f"seq_id={parent_id!r}")
        for b in parent.blocks[:shared]:
            self._ref[b] += 1  # held by the parent, so never evictable (nor taken by the allocation above)
        copies = [(parent.blocks[shared], own[0])] if parent.num_computed % self.block_size else []
        self._seqs[child_id] = _Seq(
            list(parent.tokens),
            parent.blocks[:shared] + own,
            parent.num_computed,
            parent.extra_key,
            list(parent.chain),
        )
        return copies

    def free(self, seq_id: Hashable) -> None:
        """Drop the sequence. Its cached blocks no one else holds stay in the cache as
        evictable (LRU); the others return to the free list."""
        self._release(self._get(seq_id, "free").blocks)
        del self._seqs[seq_id]

    def reset_prefix_cache(self) -> None:
        """Evict every cached block no live sequence holds (e.g. after the weights changed)."""
        for b in self._evictable:
            del self._cache[self._key[b]]
            self._key[b] = None
            self._free.append(b)
        self._evictable.clear()

    def drop_cached(self, extra_key: Hashable) -> int:
        """Take every block cached under extra_key out of the prefix cache (e.g. the K/V of an
        adapter that was unloaded: no later key can reach them). Blocks no sequence holds
        become free; held ones stay with their sequences and are freed when released. Returns
        how many blocks left the cache. Costs a pass over the cache: for rare events only."""
        check_hashable(extra_key, "drop_cached: extra_key")
        dropped = [(key, b) for key, b in self._cache.items() if key[2] == extra_key]
        for key, b in dropped:
            del self._cache[key]
            self._key[b] = None
            if b in self._evictable:
                del self._evictable[b]
                self._free.append(b)
        return len(dropped)

    # views ------------------------------------------------------------------------------------

    def block_table(self, seq_id: Hashable) -> list[int]:
        """Block ids of the sequence, in token order (a copy)."""
        return list(self._get(seq_id, "block_table").blocks)

    def block_tables(
        self, seq_ids: Sequence[Hashable], *, pad: int = -1, width: int | None = None
    ) -> torch.Tensor:
        """forward_tensor's block_tables: int32 `[len(seq_ids), width]`, row i the table of
        seq_ids[i] padded with `pad`; width defaults to the longest table (a fixed width keeps
        shapes static, e.g. for CUDA graphs)."""
        tables = [self._get(s, "block_tables").blocks for s in seq_ids]
        pad = as_int(pad, "block_tables: pad")
        longest = max(map(len, tables), default=0)
        if width is None:
            width = longest
        elif as_int(width, "block_tables: width") < longest:
            raise arg_error(
                f"block_tables: expected width >= {longest} (the longest table), got {width}"
            )
        flat: list[int] = []
        for t in tables:
            flat += t
            flat += [pad] * (width - len(t))
        return _tensor(flat, "i", torch.int32).view(len(tables), width)

    def slots(self, seq_id: Hashable, start: int, end: int) -> torch.Tensor:
        """Slots of tokens [start, end) of the sequence, int64 `[end - start]` (e.g. a prompt's
        uncached part after admit: `slots(s, num_cached, len(prompt))`)."""
        seq = self._get(seq_id, "slots")
        start, end = as_int(start, "slots: start"), as_int(end, "slots: end")
        if not 0 <= start <= end <= len(seq.tokens):
            raise arg_error(
                f"slots: expected 0 <= start <= end <= num_tokens={len(seq.tokens)} "
                f"for seq_id={seq_id!r}, got start={start}, end={end}"
            )
        return self._slots(seq, start, end)

    def num_tokens(self, seq_id: Hashable) -> int:
        return len(self._get(seq_id, "num_tokens").tokens)

    def num_computed_tokens(self, seq_id: Hashable) -> int:
        return self._get(seq_id, "num_computed_tokens").num_computed

    def token_ids(self, seq_id: Hashable) -> list[int]:
        return list(self._get(seq_id, "token_ids").tokens)

    @property
    def num_free_blocks(self) -> int:
        """Blocks neither held nor cached."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks in the prefix cache that no sequence holds (evictable on demand)."""
        return len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by at least one live sequence."""
        return self.num_blocks - len(self._free) - len(self._evictable)

    def __contains__(self, seq_id: Hashable) -> bool:
        return seq_id in self._seqs

    # internals --------------------------------------------------------------------------------

    def _get(self, seq_id: Hashable, where: str) -> _Seq:
        return admitted(self._seqs, seq_id, where)

    def _distinct(self, seq_ids: Sequence[Hashable], n_values: int, values: str, where: str) -> list[_Seq]:
        return distinct_admitted(self._seqs, seq_ids, n_values, values, where)

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _match(self, tokens: list[int], extra_key: Hashable) -> list[int]:
        """Blocks of the longest cached chain of full blocks from the start of tokens, stopping
        one token short of the end so that the last token is always computed."""
        hits: list[int] = []
        if not self.enable_prefix_caching:
            return hits
        bs, parent = self.block_size, _ROOT
        for start in range(0, (len(tokens) - 1) // bs * bs, bs):
            b = self._cache.get((parent, tuple(tokens[start : start + bs]), extra_key))
            if b is None:
                break
            hits.append(b)
            parent = self._entry[b]
        return hits

    def _available(self, hits: Sequence[int] = ()) -> int:
        """Blocks an allocation could take: free plus evictable, minus the evictable cache hits
        the same call reuses (they are taken out of the LRU, not evicted)."""
        available = len(self._free) + len(self._evictable)
        if hits:  # (a generator per call would dominate the per-step decode checks)
            available -= sum(1 for b in hits if self._ref[b] == 0)
        return available

    def _allocate_or_refuse(self, n: int, what: str) -> list[int]:
        """n blocks (see _allocate), or OUT_OF_BLOCKS with nothing changed: "{what}, {free} free"."""
        available = self._available()
        if n > available:
            raise KVCacheError(KVErrorCode.OUT_OF_BLOCKS, f"{what}, {available} free")
        return self._allocate(n)

    def _allocate(self, n: int) -> list[int]:
        """n blocks at refcount 1: free ones first, then least recently used cached ones. The
        caller has checked that n are available."""
        out = []
        for _ in range(n):
            if self._free:
                b = self._free.pop()
            else:
                b, _ = self._evictable.popitem(last=False)
                del self._cache[self._key[b]]
                self._key[b] = None
            self._ref[b] = 1
            out.append(b)
        return out

    def _release(self, blocks: list[int]) -> None:
        # Last block first: a chain's head then becomes the most recently used, so eviction
        # takes tails before heads (a tail is unreachable once its head is gone).
        for b in reversed(blocks):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                if self._key[b] is None:
                    self._free.append(b)
                else:
                    self._evictable[b] = None

    def _register(self, seq: _Seq) -> None:
        """Enter the sequence's newly committed full blocks into the prefix cache."""
        bs = self.block_size
        parent = seq.chain[-1] if seq.chain else _ROOT
        for i in range(len(seq.chain), seq.num_computed // bs):
            key = (parent, tuple(seq.tokens[i * bs : (i + 1) * bs]), seq.extra_key)
            b = self._cache.get(key)
            if b is None:
                b = seq.blocks[i]
                self._cache[key] = b
                self._key[b] = key
                self._entry[b] = self._next_entry
                self._next_entry += 1
            # else another sequence computed the same content concurrently and cached it first:
            # ours stays private (swapping it would change a table the caller may still hold)
            # and the chain continues through the cached copy.
            parent = self._entry[b]
            seq.chain.append(parent)

    def _slots(self, seq: _Seq, start: int, end: int) -> torch.Tensor:
        # Position p lies in table entry i = p // bs at offset p - i*bs, so the positions of
        # [start, end) inside entry i map to one contiguous slot range:
        #     base + max(start, i*bs)  ..  base + min(end, (i+1)*bs),  base = (blocks[i] - i) * bs
        bs = self.block_size
        out: list[int] = []
        for i in range(start // bs, self._blocks_for(end)):
            base = (seq.blocks[i] - i) * bs
            out.extend(range(base + max(start, i * bs), base + min(end, (i + 1) * bs)))
        return _tensor(out, "q", torch.int64)


def _tensor(values: list[int], typecode: str, dtype: torch.dtype) -> torch.Tensor:
    # Through array: the list converts at C speed, ~3x faster than torch.tensor(list), which
    # matters for the tables and slots built every step. The tensor keeps the array alive.
    if not values:
        return torch.empty(0, dtype=dtype)  # frombuffer refuses an empty buffer
    return torch.frombuffer(array(typecode, values), dtype=dtype)

