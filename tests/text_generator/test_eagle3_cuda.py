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
    """Every state, every step kind (its q = 1 decode step replays a graph with the states)."""
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


def test_graphed_hidden_state_steps_match_eager(target):
    """Decode and verify steps that ask for hidden states replay graphs of their own (key with the
    layers); their logits and states match the same steps run eagerly (graphs off), bf16 bound."""
    path, gen = target
    mw = gen.model_wrapper
    layers = [2, 4, 5]
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 96, (n,), generator=g).tolist() for n in (9, 21, 14)]
    results = []
    for graphs in (mw.graphs, None):
        saved, mw.graphs = mw.graphs, graphs
        try:
            kv, bm = gen.allocate_kv_cache(32, 16), BlockManager(32, 16, enable_prefix_caching=False)
            ids = list(range(len(prompts)))
            for s, p in zip(ids, prompts):
                bm.admit(s, p)
            n = [len(p) for p in prompts]
            toks = torch.tensor(sum(prompts, []))
            pos = torch.cat([torch.arange(k) for k in n])
            slots = torch.cat([bm.slots(s, 0, k) for s, k in zip(ids, n)])
            gen.forward_tensor(toks, pos, True, kv, bm.block_tables(ids), slots, torch.tensor(n, dtype=torch.int32),
                               1024, torch.tensor(n).cumsum(0) - 1, q_lens=n)
            out = []
            for q in (1, 3):  # a decode step, then a verify step of 3 tokens per request
                for s, k in zip(ids, n):
                    bm.commit(s, k)
                    bm.append(s, [5 + j for j in range(q)])
                step_toks = torch.tensor([5 + j for _ in ids for j in range(q)])
                step_pos = torch.cat([torch.arange(k, k + q) for k in n])
                step_slots = torch.cat([bm.slots(s, k, k + q) for s, k in zip(ids, n)])
                n = [k + q for k in n]
                out.append(gen.forward_tensor(step_toks, step_pos, False, kv, bm.block_tables(ids), step_slots,
                                              torch.tensor(n, dtype=torch.int32), 1024, None, q_lens=[q] * len(ids),
                                              output_hidden_states=layers))
            results.append(out)
        finally:
            mw.graphs = saved
    assert any(len(key) == 3 and key[2] == tuple(layers) for key in mw.graphs._graphs)  # graphs with the states
    for (lg, hg), (le, he) in zip(*results):
        assert hg.shape == he.shape and lg.shape == le.shape
        assert rel_err(hg, he) < 2e-2 and rel_err(lg, le) < 2e-2


def test_graphed_eagle3_head_steps_match_eager(target, tmp_path):
    """The head's one-entry-per-lane steps replay decode graphs (the feature in a static buffer):
    the same steps with graphs off give the same pre-norm outputs (bf16 bound) and drafts."""
    path, gen = target
    make_head(tmp_path / "head", seed=1, hidden=256)
    on = Eagle3Drafter(gen, str(tmp_path / "head"), k=3, num_blocks=32, block_size=16)
    off = Eagle3Drafter(gen, str(tmp_path / "head"), k=3, num_blocks=32, block_size=16, cuda_graphs=False)
    assert on.runner.graphs is not None and off.runner.graphs is None
    g = torch.Generator().manual_seed(2)
    toks = [torch.randint(0, 96, (n,), generator=g).tolist() for n in (23, 7)]
    states = [torch.randn(len(t), 3, 256, generator=g) for t in toks]
    outs = []
    for d in (on, off):
        feat = d.head.fuse(torch.cat(states).cuda(), d.runner.kernels)
        _, out = d._forward(["a", "b"], toks, feat)  # step 0: several entries per request (eager)
        steps = []
        for j in range(3):  # one entry per request: decode-shaped (graphed in `on`)
            top, out = d._forward(["a", "b"], [[3 + j], [4 + j]], out)
            steps.append((top, out.float()))
        outs.append(steps)
    assert on.runner.graphs._graphs  # captured
    for (top_on, out_on), (top_off, out_off) in zip(*outs):
        assert rel_err(out_on, out_off) < 2e-2


def test_eagle3_in_the_engine_on_cuda_is_plain_greedy(target, tmp_path):
    """LLMEngine with an EAGLE-3 drafter = the engine without one, float32 (torch attention on the
    GPU; bf16 near-ties of a random tiny model would flip either way), both scheduling orders."""
    from text_generator.engine import LLMEngine
    from text_generator.sampling import SamplingParams

    path, _ = target
    gen = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.float32, attention_backend="torch")
    make_head(tmp_path / "head", seed=3, hidden=256)
    rng = random.Random(5)
    prompts = [[rng.randrange(96) for _ in range(rng.randint(3, 40))] for _ in range(5)]
    params = SamplingParams(temperature=0.0, max_new_tokens=16)
    plain = LLMEngine(gen, num_blocks=64, block_size=16, async_scheduling=True).generate(prompts, params, use_tqdm=False)
    for run_ahead in (False, True):
        drafter = Eagle3Drafter(gen, str(tmp_path / "head"), k=3, num_blocks=64, block_size=16)
        engine = LLMEngine(gen, num_blocks=64, block_size=16, speculative=drafter, adaptive_speculation=False,
                           async_scheduling=run_ahead)
        got = engine.generate(prompts, params, use_tqdm=False)
        assert [o.token_ids for o in got] == [o.token_ids for o in plain]
        assert engine.num_draft_tokens > 0 and drafter.bm.num_used_blocks == 0


def _sync_counts(gen, drafter, prompts, n) -> dict[int, int]:
    """Serve prompts (greedy, n tokens, run-ahead on) -> {engine step: synchronizing CUDA calls
    in it (torch's sync debug mode: a blocking copy, .item(), a stream synchronize)} for the
    steps in which no request drafts, nor did in the step before (a normal run-ahead step)."""
    import warnings

    from text_generator.engine import LLMEngine
    from text_generator.sampling import SamplingParams

    engine = LLMEngine(gen, num_blocks=64, block_size=16, speculative=drafter, async_scheduling=True,
                       enable_prefix_caching=False)
    for p in prompts:
        engine.add_request(p, SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True))
    counts, quiet_before = {}, False
    while engine.has_unfinished():
        s = engine.num_steps + 1  # the step about to run
        live = [r for r in engine.requests if not engine.requests[r].finished]
        quiet = s > 2 and (drafter is None or not engine.draft_lengths.any_wanted(live, s))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                engine.step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        if quiet and quiet_before:
            counts[s] = sum("synchroniz" in str(w.message) for w in caught)
        quiet_before = quiet
    return counts


def test_backed_off_eagle3_steps_wait_on_the_device_no_more_than_plain_ones(target, tmp_path):
    """A random head's drafting backs off (adaptive speculation). In the steps in which nothing
    drafts, the engine with EAGLE-3 requests (the target's states handed to the drafter, the
    head idle) makes no more synchronizing calls than the plain engine in the same steps: the
    host still runs ahead of the device."""
    path, gen = target
    make_head(tmp_path / "head", seed=3, hidden=256)
    rng = random.Random(6)
    prompts = [[rng.randrange(96) for _ in range(24)] for _ in range(8)]
    plain = _sync_counts(gen, None, prompts, 60)
    eagle = _sync_counts(gen, Eagle3Drafter(gen, str(tmp_path / "head"), k=4, num_blocks=64, block_size=16),
                         prompts, 60)
    steps = sorted(set(plain) & set(eagle))
    assert len(steps) >= 20, (sorted(plain), sorted(eagle))
    assert all(eagle[s] <= plain[s] for s in steps), {s: (plain[s], eagle[s]) for s in steps}


def test_graphed_proposal_feeds_its_drafts_on_the_device(target, tmp_path):
    """propose() keeps each step's drafts on the device as the next step's input ids
    (prev_token_ids into the head's decode graphs) and reads them back once: its chains equal
    the same graphed steps driven with the drafts read back and passed as host ids."""
    path, gen = target
    make_head(tmp_path / "head", seed=2, hidden=256)
    g = torch.Generator().manual_seed(3)
    prompts = {s: torch.randint(0, 96, (n,), generator=g).tolist() for s, n in (("a", 19), ("b", 6))}
    states = {s: torch.randn(len(p), 3, 256, generator=g) for s, p in prompts.items()}
    lazy = Eagle3Drafter(gen, str(tmp_path / "head"), k=4, num_blocks=32, block_size=16)
    host = Eagle3Drafter(gen, str(tmp_path / "head"), k=4, num_blocks=32, block_size=16)
    for s, p in prompts.items():
        lazy.start(s, p, hidden=states[s].cuda())
        lazy.update(s, [5])
    trees = lazy.propose(["a", "b"], [5, 5])
    assert lazy.runner.graphs._graphs  # the one-entry steps replayed graphs
    ids = ["a", "b"]
    toks = [prompts[s][1:] + [5] for s in ids]
    feat = host.head.fuse(torch.cat([states[s] for s in ids]).cuda(), host.runner.kernels)  # (aux = 2, 4, 5: in order)
    top, out = host._forward(ids, toks, feat)
    chains = [[d] for d in top[:, 0].tolist()]
    for _ in range(3):
        top, out = host._forward(ids, [[c[-1]] for c in chains], out)
        for c, d in zip(chains, top[:, 0].tolist()):
            c.append(d)
    assert [t.tokens for t in trees] == [[5] + c for c in chains]
