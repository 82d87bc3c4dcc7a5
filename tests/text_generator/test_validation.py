"""Every validation rule of forward_tensor: the bad input, its error code, its message, and a cache
left bit-for-bit unchanged. Plus a hypothesis test that throws random malformed argument
combinations at the call: it must raise a coded ValueError/RuntimeError or succeed, never crash,
and never write when it raises.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from text_generator import ErrorCode, ForwardArgumentError, TextGenerator

BS = 4  # block size


@pytest.fixture(scope="module")
def gen(checkpoint_dir):
    return TextGenerator.from_pretrained(checkpoint_dir("llama"), device="cpu")


def valid_call(gen, kv=None):
    """Two requests: r0 has 3 cached tokens and 2 new (multi-token decode), r1 has 1 cached + 1 new."""
    kv = kv if kv is not None else gen.allocate_kv_cache(16, BS)
    for k, v in kv:  # recognisable contents
        k.normal_(generator=torch.Generator().manual_seed(0))
        v.normal_(generator=torch.Generator().manual_seed(1))
    return dict(
        input_ids=torch.tensor([1, 2, 3]),
        position_ids=torch.tensor([3, 4, 1]),
        is_prefill=False,
        kv_cache=kv,
        block_tables=torch.tensor([[5, 9], [2, -1]], dtype=torch.int32),
        slots=torch.tensor([5 * BS + 3, 9 * BS + 0, 2 * BS + 1]),
        input_lengths=torch.tensor([5, 2], dtype=torch.int32),
        max_seq_len=64,
        lm_head_indices=None,
        q_lens=[2, 1],
    )


def snapshot(kv):
    return [(k.clone(), v.clone()) for k, v in kv]


def unchanged(kv, snap) -> bool:
    return all(torch.equal(k, k0) and torch.equal(v, v0) for (k, v), (k0, v0) in zip(kv, snap))


def call(gen, args):
    args = dict(args)
    pos = [args.pop(n) for n in ("input_ids", "position_ids", "is_prefill", "kv_cache", "block_tables",
                                  "slots", "input_lengths", "max_seq_len")]
    return gen.forward_tensor(*pos, **args)


def test_valid_call_runs(gen):
    args = valid_call(gen)
    out = call(gen, args)
    assert out.shape == (3, gen.vocab_size) and out.dtype == torch.float32


def _kv_wrong_layers(gen, a):
    a["kv_cache"] = a["kv_cache"][:1]


def _kv_wrong_dtype(gen, a):
    a["kv_cache"] = [(k.to(torch.float16), v.to(torch.float16)) for k, v in a["kv_cache"]]


def _kv_wrong_heads(gen, a):
    a["kv_cache"] = [(k[:, :, :1], v[:, :, :1]) for k, v in a["kv_cache"]]


# (name, mutate(args), code, message fragment)
CASES = [
    ("ids not tensor", lambda g, a: a.update(input_ids=[1, 2, 3]), ErrorCode.INVALID_TYPE, "input_ids: expected a torch.Tensor"),
    ("ids float", lambda g, a: a.update(input_ids=torch.tensor([1.0, 2.0, 3.0])), ErrorCode.INVALID_DTYPE, "input_ids: expected an integer dtype"),
    ("ids 2-D", lambda g, a: a.update(input_ids=torch.tensor([[1, 2, 3]])), ErrorCode.INVALID_SHAPE, "input_ids: expected a 1-D tensor"),
    ("ids empty", lambda g, a: a.update(input_ids=torch.tensor([], dtype=torch.int64)), ErrorCode.INVALID_SHAPE, "input_ids"),
    ("ids out of vocab", lambda g, a: a.update(input_ids=torch.tensor([1, 96, 3])), ErrorCode.TOKEN_OUT_OF_RANGE, "got 96 at index 1"),
    ("ids negative", lambda g, a: a.update(input_ids=torch.tensor([1, -2, 3])), ErrorCode.TOKEN_OUT_OF_RANGE, "input_ids"),
    ("positions length", lambda g, a: a.update(position_ids=torch.tensor([3, 4])), ErrorCode.INVALID_SHAPE, "position_ids: expected shape [num_tokens=3]"),
    ("positions wrong", lambda g, a: a.update(position_ids=torch.tensor([3, 5, 1])), ErrorCode.POSITION_MISMATCH, "token 1"),
    ("is_prefill not bool", lambda g, a: a.update(is_prefill="no"), ErrorCode.INVALID_TYPE, "is_prefill"),
    ("kv not list", lambda g, a: a.update(kv_cache=a["kv_cache"][0][0]), ErrorCode.INVALID_TYPE, "kv_cache"),
    ("kv layers", _kv_wrong_layers, ErrorCode.KV_CACHE_MISMATCH, "expected 2 layers, got 1"),
    ("kv dtype", _kv_wrong_dtype, ErrorCode.INVALID_DTYPE, "expected the model dtype"),
    ("kv heads", _kv_wrong_heads, ErrorCode.KV_CACHE_MISMATCH, "kv_cache[0].k_cache"),
    ("block_tables 1-D", lambda g, a: a.update(block_tables=torch.tensor([5, 9])), ErrorCode.INVALID_SHAPE, "block_tables"),
    ("block_tables rows", lambda g, a: a.update(block_tables=torch.tensor([[5, 9]])), ErrorCode.INVALID_SHAPE, "expected 2 rows"),
    ("block_tables short", lambda g, a: a.update(block_tables=torch.tensor([[5], [2]])), ErrorCode.BLOCK_TABLE_TOO_SHORT, "at least 2 columns"),
    ("block id too big", lambda g, a: a.update(block_tables=torch.tensor([[5, 16], [2, -1]])), ErrorCode.BLOCK_OUT_OF_RANGE, "got 16 at [0, 1]"),
    ("block id negative in use", lambda g, a: a.update(block_tables=torch.tensor([[5, -1], [2, -1]])), ErrorCode.BLOCK_OUT_OF_RANGE, "got -1 at [0, 1]"),
    ("block repeated", lambda g, a: a.update(block_tables=torch.tensor([[5, 5], [2, -1]]), slots=torch.tensor([5 * BS + 3, 5 * BS, 2 * BS + 1])), ErrorCode.BLOCK_REPEATED, "listed twice"),
    ("slots length", lambda g, a: a.update(slots=torch.tensor([23, 36])), ErrorCode.INVALID_SHAPE, "slots"),
    ("slot elsewhere", lambda g, a: a.update(slots=torch.tensor([5 * BS + 3, 9 * BS + 1, 2 * BS + 1])), ErrorCode.SLOT_MISMATCH, "got 37 at token 1"),
    ("slot in other request", lambda g, a: a.update(slots=torch.tensor([5 * BS + 3, 9 * BS, 5 * BS + 1])), ErrorCode.SLOT_MISMATCH, "at token 2"),
    ("write into shared block", lambda g, a: a.update(block_tables=torch.tensor([[5, 9], [9, -1]]), slots=torch.tensor([5 * BS + 3, 9 * BS, 9 * BS + 1])), ErrorCode.SLOT_CONFLICT, "block 9"),
    ("input_lengths 2-D", lambda g, a: a.update(input_lengths=torch.tensor([[5, 2]])), ErrorCode.INVALID_SHAPE, "input_lengths"),
    ("input_lengths zero", lambda g, a: a.update(input_lengths=torch.tensor([5, 0])), ErrorCode.INVALID_LENGTH, "got 0 for request 1"),
    ("input_lengths > max_seq_len", lambda g, a: a.update(max_seq_len=4), ErrorCode.INVALID_LENGTH, "max_seq_len=4"),
    ("max_seq_len > model", lambda g, a: a.update(max_seq_len=10**6), ErrorCode.MAX_SEQ_LEN_EXCEEDED, "model's limit 1024"),
    ("max_seq_len float", lambda g, a: a.update(max_seq_len=64.0), ErrorCode.INVALID_TYPE, "max_seq_len"),
    ("q_lens sum", lambda g, a: a.update(q_lens=[1, 1]), ErrorCode.INVALID_Q_LENS, "sum to num_tokens=3"),
    ("q_lens length", lambda g, a: a.update(q_lens=[3]), ErrorCode.INVALID_Q_LENS, "expected 2 entries"),
    ("q_lens > input_length", lambda g, a: a.update(q_lens=[0, 3]), ErrorCode.INVALID_Q_LENS, "request 0"),
    ("q_lens type", lambda g, a: a.update(q_lens="2,1"), ErrorCode.INVALID_TYPE, "q_lens"),
    ("default q_lens in decode", lambda g, a: a.pop("q_lens"), ErrorCode.INVALID_Q_LENS, "default"),
    ("lm_head out of range", lambda g, a: a.update(lm_head_indices=torch.tensor([0, 3])), ErrorCode.LM_HEAD_INDEX_OUT_OF_RANGE, "got 3"),
    ("lm_head float", lambda g, a: a.update(lm_head_indices=torch.tensor([0.0])), ErrorCode.INVALID_DTYPE, "lm_head_indices"),
    ("spec_mask shape", lambda g, a: a.update(spec_mask=torch.ones(3, 3, dtype=torch.bool)), ErrorCode.INVALID_SHAPE, "expected shape [3, 2]"),
    ("spec_mask soft values", lambda g, a: a.update(spec_mask=torch.full((3, 2), -0.5)), ErrorCode.INVALID_MASK, "got -0.5"),
    ("spec_mask int", lambda g, a: a.update(spec_mask=torch.ones(3, 2, dtype=torch.int64)), ErrorCode.INVALID_DTYPE, "spec_mask"),
    ("both masks", lambda g, a: a.update(spec_mask=torch.ones(3, 2, dtype=torch.bool), atten_mask=torch.ones(3, 5, dtype=torch.bool)), ErrorCode.INVALID_MASK, "got both"),
    ("atten_mask shape", lambda g, a: a.update(atten_mask=torch.ones(3, 4, dtype=torch.bool)), ErrorCode.INVALID_SHAPE, "expected shape [3, 5]"),
    ("adapter_ids too long", lambda g, a: a.update(adapter_ids=["base"] * 3), ErrorCode.ADAPTER_IDS_TOO_LONG, "at most batch size 2"),
    ("adapter_ids not loaded", lambda g, a: a.update(adapter_ids=["base", "sql"]), ErrorCode.ADAPTER_NOT_LOADED, "'sql'"),
    ("adapter_ids str", lambda g, a: a.update(adapter_ids="sql"), ErrorCode.INVALID_TYPE, "adapter_ids"),
    ("max_out_len zero", lambda g, a: a.update(max_out_len=0), ErrorCode.INVALID_MAX_OUT_LEN, "got 0"),
    ("unknown kwarg", lambda g, a: a.update(q_len=[2, 1]), ErrorCode.UNKNOWN_ARGUMENT, "q_len"),
]


@pytest.mark.parametrize("name,mutate,code,fragment", CASES, ids=[c[0] for c in CASES])
def test_rule(gen, name, mutate, code, fragment):
    args = valid_call(gen)
    kv = args["kv_cache"]
    snap = snapshot(kv)
    mutate(gen, args)
    with pytest.raises(ForwardArgumentError) as info:
        call(gen, args)
    assert isinstance(info.value, ValueError)
    assert info.value.code == code
    msg = str(info.value)
    assert msg.startswith(f"[{code.value}]") and fragment in msg, msg
    assert unchanged(kv, snap), "a rejected call wrote to the cache"


def test_adapter_ids_length_between_one_and_batch(gen):
    args = valid_call(gen)
    args.update(input_ids=torch.tensor([1, 2, 3, 4]), position_ids=torch.tensor([3, 4, 1, 0]),
                block_tables=torch.tensor([[5, 9], [2, -1], [7, -1]], dtype=torch.int32),
                slots=torch.tensor([23, 36, 9, 28]), input_lengths=torch.tensor([5, 2, 1]),
                q_lens=[2, 1, 1], adapter_ids=["base", "base"])
    snap = snapshot(args["kv_cache"])
    with pytest.raises(ValueError) as info:
        call(gen, args)
    assert info.value.code == ErrorCode.ADAPTER_IDS_LENGTH and "1 entry (whole batch) or 3" in str(info.value)
    assert unchanged(args["kv_cache"], snap)
    args["adapter_ids"] = ["base"]  # one entry for the whole batch, all base: fine
    assert call(gen, args).shape == (4, gen.vocab_size)


def test_kv_cache_wrong_layout_rejected(gen):
    args = valid_call(gen)
    args["kv_cache"] = [(k.transpose(0, 1), v) for k, v in args["kv_cache"]]
    with pytest.raises(ValueError) as info:
        call(gen, args)
    assert info.value.code == ErrorCode.KV_CACHE_MISMATCH


def alias(kv, how: str):
    """A kv_cache over the same memory as kv in which two tensors share memory."""
    k0, v0 = kv[0]
    if how == "one pair for two layers":
        return [kv[0], kv[0]] + list(kv[2:])
    if how == "k is v":
        return [(k0, k0)] + list(kv[1:])
    if how == "overlapping views":  # v0 starts one block into k0's memory
        flat = k0.view(-1)
        n = k0[1:].numel()
        return [(k0[:-1], flat[k0[0].numel():k0[0].numel() + n].view(k0[:-1].shape))] + \
            [(k[:-1], v[:-1]) for k, v in kv[1:]]
    raise AssertionError(how)


ALIASES = ["one pair for two layers", "k is v", "overlapping views"]


@pytest.mark.parametrize("how", ALIASES)
def test_kv_cache_tensors_sharing_memory_are_refused(gen, how):
    args = valid_call(gen)
    kv = args["kv_cache"]
    snap = snapshot(kv)
    args["kv_cache"] = alias(kv, how)
    with pytest.raises(ForwardArgumentError) as info:
        call(gen, args)
    assert info.value.code == ErrorCode.KV_CACHE_ALIASED and "shared with kv_cache[" in str(info.value)
    assert unchanged(kv, snap)


def test_kv_cache_as_disjoint_views_of_one_buffer_gives_the_same_logits(gen):
    """One allocation cut into 2 * num_layers disjoint tensors is a valid cache (no false alarm)."""
    kv = gen.allocate_kv_cache(16, BS)
    shape = kv[0][0].shape
    buf = torch.zeros(2 * len(kv), *shape, dtype=kv[0][0].dtype)
    views = [(buf[2 * i], buf[2 * i + 1]) for i in range(len(kv))]
    want = call(gen, valid_call(gen, kv))
    got = call(gen, valid_call(gen, views))
    assert torch.equal(got, want)


# ---- fuzz ---------------------------------------------------------------------------------
_GARBAGE = st.one_of(
    st.none(), st.integers(-5, 200), st.floats(allow_nan=True), st.text(max_size=3), st.booleans(),
    st.lists(st.integers(-3, 100), max_size=5),
    st.builds(lambda n, lo, hi, dt: torch.randint(lo, max(hi, lo + 1), (n,)).to(dt),
              st.integers(0, 6), st.integers(-3, 50), st.integers(-3, 100),
              st.sampled_from([torch.int64, torch.int32, torch.int16, torch.float32, torch.bool, torch.uint8])),
    st.builds(lambda r, c, lo, hi: torch.randint(lo, max(hi, lo + 1), (r, c)),
              st.integers(0, 4), st.integers(0, 4), st.integers(-3, 20), st.integers(-3, 40)),
)
_ARGS = ["input_ids", "position_ids", "is_prefill", "kv_cache", "block_tables", "slots", "input_lengths",
         "max_seq_len", "lm_head_indices", "q_lens", "spec_mask", "atten_mask", "adapter_ids", "max_out_len"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(_ARGS), _GARBAGE, min_size=0, max_size=4),
       st.sampled_from([None] + ALIASES))
def test_fuzz_malformed_arguments(gen, replacements, aliased):
    args = valid_call(gen)
    kv = args["kv_cache"]
    snap = snapshot(kv)
    if aliased is not None:
        args["kv_cache"] = alias(kv, aliased)
    args.update(replacements)
    try:
        out = call(gen, args)
    except (ValueError, RuntimeError) as e:
        assert hasattr(e, "code") and isinstance(e.code, ErrorCode), repr(e)
        assert str(e).startswith(f"[{e.code.value}]")
        assert unchanged(kv, snap), f"rejected call wrote to the cache: {e}"
    else:
        assert aliased is None, "an aliased kv_cache was accepted"
        assert out.dtype == torch.float32 and out.dim() == 2 and out.shape[1] == gen.vocab_size


@pytest.mark.parametrize("change", ["dtype", "alias", "layout", "shape"])
def test_a_cache_changed_after_a_valid_call_is_checked_again(gen, change):
    """forward_tensor remembers the cache it validated last (KVCacheMemo) and skips re-checking that
    same cache; the same list changed in place between calls (a pair replaced by a wrong-dtype one, by
    one tensor twice, a transposed view, a tensor resized in place) is checked again and refused,
    and the cache stays untouched."""
    args = valid_call(gen)
    call(gen, args)
    kv = args["kv_cache"]
    k, v = kv[1]
    if change == "dtype":
        kv[1] = (k.to(torch.float16), v)
    elif change == "alias":
        kv[1] = (k, k)
    elif change == "layout":
        kv[1] = (k.transpose(0, 1), v)
    else:
        v.resize_(v.shape[0] - 1, *v.shape[1:])  # same tensor object, same memory, fewer blocks
    snap = snapshot(kv)
    with pytest.raises(ForwardArgumentError) as info:
        call(gen, args)
    assert info.value.code in (ErrorCode.INVALID_DTYPE, ErrorCode.KV_CACHE_ALIASED, ErrorCode.KV_CACHE_MISMATCH)
    assert "kv_cache[1]" in str(info.value)
    assert unchanged(kv, snap)
