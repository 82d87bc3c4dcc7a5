"""Tensor parallelism (model_wrapper/parallel.py) on the CPU: two gloo ranks against one rank.

One spawn of two worker processes (torch.multiprocessing, gloo over a FileStore, loopback only)
runs every job SPMD-style, exactly as a scheduler under torchrun would: both ranks make the same
forward_tensor calls with the same tensors. Each rank saves what it got; the tests then hold the
TP=2 logits to the TP=1 logits (rel err < 1e-5), to transformers (< 1e-4), and check that both
ranks returned the same full-vocabulary logits. Jobs: the scenario of test_forward_parity (batched
prefill, chunked prefill, mixed, decode with lm_head_indices, multi-token decode) for every
family, and a bf16 Qwen3; a Llama with biases on every projection; a spec_mask tree step; a
Qwen2 with one kv head (replicated over the ranks, tied embeddings); a vocabulary of 97 (the last
vocab shard padded); the reference engine, unchanged (continuous batching, greedy and seeded
sampling), on both ranks; a batch mixing two LoRA adapters (every projection adapted, A / B
sliced per rank) with base rows, against TP=1 and peft. And the CLI under torchrun
(--tensor-parallel) prints what it prints on one process.

On a machine with 2 GPUs (`pytest -m cuda`): two NCCL ranks replay decode CUDA graphs that
hold the collectives, against eager TP=2, TP=1 and an fp32 reference.
"""

from __future__ import annotations

import os
import random

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import FAMILIES, MOE_FAMILIES, PagedHarness, hf_model, rel_err
from kv_manager import BlockManager
from model_wrapper import ModelLoadError, TPGroup
from model_wrapper.config import ModelConfig
from model_wrapper.loader import load_model
from model_wrapper.parallel import TPShard
from test_forward_parity import _max_err, _reference, _script, run_scenario
from text_generator import TextGenerator

WORLD = 2


pytestmark = pytest.mark.usefixtures("one_thread")


def _load(path, tp=None, dtype=torch.float32):
    return TextGenerator.from_pretrained(path, device="cpu", dtype=dtype, attention_backend="torch", tp_group=tp)


# -- the jobs: each runs the same on one rank or on every rank of a group ----------------------

def _scenario_job(gen, seed):
    full, steps = _script(seed)
    return [(r, p, o) for r, p, o in run_scenario(gen, full, steps, block_size=4)]


def _tree_job(gen):
    """Prefill two prompts, then one multi-token decode of two draft trees (spec_mask)."""
    from test_speculative import prefill, random_prompt, random_tree, tree_step

    rng = random.Random(1)
    kv, bm = gen.allocate_kv_cache(32, 4), BlockManager(32, 4)
    prompts = [random_prompt(rng, 13), random_prompt(rng, 6)]
    roots = [prefill(gen, kv, bm, i, p) for i, p in enumerate(prompts)]
    trees = [random_tree(rng, roots[0], 9), random_tree(rng, roots[1], 4)]
    batch, _, logits = tree_step(gen, kv, bm, [0, 1], trees)
    assert batch.spec_mask is not None
    return dict(prompts=prompts, trees=trees, offsets=list(batch.offsets), logits=logits)


def _odd_vocab_job(gen):
    """A prompt using the last id of a 97-token vocabulary (in rank 1's padded shard), then decode."""
    h = PagedHarness(gen, num_blocks=16, block_size=4)
    seq = [96, 3, 50, 48, 49, 0, 95, 7, 96]
    out = h.step({0: seq[:8]}, is_prefill=True)
    return seq, torch.cat([out, h.step({0: seq[8:]}, is_prefill=False)])


LORA_REQUESTS = [("all", 5), (None, 4), ("some", 6), ("all", 3)]  # (adapter, prompt length)


def _lora_job(gen, dirs):
    """Prefill, then a multi-token decode, of a batch mixing two adapters and the base model."""
    gen.enable_lora(max_loras=2, max_rank=8)
    for name, path in dirs.items():
        gen.load_adapter(name, path)
    g = torch.Generator().manual_seed(5)
    seqs = [torch.randint(0, 96, (n + 2,), generator=g).tolist() for _, n in LORA_REQUESTS]
    ids = [a for a, _ in LORA_REQUESTS]
    h = PagedHarness(gen, num_blocks=32, block_size=4)
    out = h.step({i: s[:-2] for i, s in enumerate(seqs)}, is_prefill=True, adapter_ids=ids)
    return seqs, torch.cat([out, h.step({i: s[-2:] for i, s in enumerate(seqs)}, is_prefill=False,
                                        adapter_ids=ids)])


def _engine_job(gen):
    """The reference engine, unchanged, on every rank (as under torchrun): chunked prefill, mixed
    steps, greedy and seeded sampling, in the plain order and running ahead of its tokens (the
    CUDA default); -> each request's output tokens, plain then run-ahead."""
    from text_generator.engine import LLMEngine
    from text_generator.sampling import SamplingParams

    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, 96, (n,), generator=g).tolist() for n in (7, 19, 3, 12)]
    params = [SamplingParams(temperature=0.0, max_new_tokens=8) if i % 2 else
              SamplingParams(temperature=1.0, top_p=0.9, seed=10 + i, max_new_tokens=8) for i in range(4)]
    outs = []
    for run_ahead in (False, True):
        engine = LLMEngine(gen, num_blocks=48, block_size=4, max_num_batched_tokens=16, async_scheduling=run_ahead)
        outs += [o.token_ids for o in engine.generate(prompts, params, use_tqdm=False)]
    return outs


def _run_job(gen, job):
    kind = job["kind"]
    if kind == "engine":
        return _engine_job(gen)
    if kind == "scenario":
        return _scenario_job(gen, job["seed"])
    if kind == "tree":
        return _tree_job(gen)
    if kind == "lora":
        return _lora_job(gen, job["adapters"])
    if kind == "hidden":
        from test_hidden_states import hidden_scenario

        return hidden_scenario(gen, [0, 1, 2], seed=2)
    return _odd_vocab_job(gen)


def _worker(rank, store, jobs, out_dir):
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        tp = TPGroup.from_default_group()
        for name, job in jobs.items():
            gen = _load(job["path"], tp, job.get("dtype", torch.float32))
            result = {"out": _run_job(gen, job), "kv_heads": gen.kv_cache_spec.num_kv_heads}
            torch.save(result, os.path.join(out_dir, f"{name}.rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
    from conftest import end_gloo_worker

    end_gloo_worker()  # only after a worker that raised nothing (the exception skips it)


@pytest.fixture(scope="module")
def tp2(checkpoint_dir, tmp_path_factory):
    """name -> (job, [result of rank 0, result of rank 1]), from one spawn of WORLD ranks."""
    jobs = {f: dict(kind="scenario", seed=hash(f) % 1000, path=checkpoint_dir(f)) for f in FAMILIES}
    jobs["tree_llama"] = dict(kind="tree", path=checkpoint_dir("llama"))
    jobs["qwen2_one_kv_head"] = dict(kind="scenario", seed=4, path=checkpoint_dir("qwen2", num_key_value_heads=1))
    jobs["engine_qwen3"] = dict(kind="engine", path=checkpoint_dir("qwen3"))
    jobs["qwen3_bf16"] = dict(kind="scenario", seed=7, path=checkpoint_dir("qwen3"), dtype=torch.bfloat16)
    jobs["llama_biases"] = dict(kind="scenario", seed=6,
                                path=checkpoint_dir("llama", attention_bias=True, mlp_bias=True))
    jobs["llama_vocab97"] = dict(kind="odd_vocab", path=checkpoint_dir("llama", vocab_size=97))
    jobs["hidden_llama"] = dict(kind="hidden", path=checkpoint_dir("llama"))
    for f in MOE_FAMILIES:  # experts' widths sliced per rank, the shared expert's too
        jobs[f] = dict(kind="scenario", seed=hash(f) % 1000, path=checkpoint_dir(f))
    out = tmp_path_factory.mktemp("tp2")
    jobs["lora_qwen3"] = dict(kind="lora", path=checkpoint_dir("qwen3"), adapters=_make_adapters(
        checkpoint_dir("qwen3"), out))
    mp.spawn(_worker, args=(str(out / "store"), jobs, str(out)), nprocs=WORLD, join=True)
    return {n: (j, [torch.load(out / f"{n}.rank{r}.pt", weights_only=False) for r in range(WORLD)])
            for n, j in jobs.items()}


def _make_adapters(base, root):
    """name -> PEFT folder: "all" adapts all seven projections (rslora, a rank pattern), "some" a few."""
    from test_lora import make_adapter

    cfgs = {"all": dict(r=4, lora_alpha=6, target_modules="all-linear", use_rslora=True, rank_pattern={"o_proj": 8}),
            "some": dict(r=2, lora_alpha=4, target_modules=["k_proj", "o_proj", "up_proj", "down_proj"])}
    dirs = {}
    for seed, (name, cfg) in enumerate(cfgs.items()):
        dirs[name] = str(root / f"adapter_{name}")
        make_adapter(base, dirs[name], seed + 1, **cfg)
    return dirs


def _logits(outputs):
    return torch.stack([o for _, _, o in outputs])


def _check_scenario(job, results, want_kv_heads):
    single = _scenario_job(_load(job["path"]), job["seed"])
    for res in results:
        assert [(r, p) for r, p, _ in res["out"]] == [(r, p) for r, p, _ in single]
        assert rel_err(_logits(res["out"]), _logits(single)) < 1e-5
        assert res["kv_heads"] == want_kv_heads
    assert torch.equal(_logits(results[0]["out"]), _logits(results[1]["out"]))  # ranks in lockstep
    full, _ = _script(job["seed"])
    assert _max_err(results[0]["out"], _reference(job["path"], torch.float32, full)) < 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_tp2_matches_tp1_and_transformers(tp2, family):
    job, results = tp2[family]
    _check_scenario(job, results, want_kv_heads=1)  # TINY: 2 kv heads, one per rank


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_tp2_moe_matches_tp1_and_transformers(tp2, family):
    job, results = tp2[family]
    _check_scenario(job, results, want_kv_heads=1)


def test_tp2_replicated_kv_head(tp2):
    """Qwen2 with 1 kv head on 2 ranks: both keep it (and the tied embedding is vocab-split)."""
    job, results = tp2["qwen2_one_kv_head"]
    _check_scenario(job, results, want_kv_heads=1)


def test_tp2_bf16_no_worse_than_transformers_bf16(tp2):
    """bf16 (partial sums reduced in bf16): error against transformers' fp32 at most twice
    transformers' own bf16 error (the bound of test_forward_parity.test_bf16_parity)."""
    job, results = tp2["qwen3_bf16"]
    assert torch.equal(_logits(results[0]["out"]), _logits(results[1]["out"]))
    full, _ = _script(job["seed"])
    ref32 = _reference(job["path"], torch.float32, full)
    ref16 = _reference(job["path"], torch.bfloat16, full)
    outputs = results[0]["out"]
    oracle = _max_err([(r, p, ref16[r][p]) for r, p, _ in outputs], ref32)
    ours = _max_err(outputs, ref32)
    assert ours <= 2 * oracle + 1e-3, (ours, oracle)


def test_tp2_row_parallel_biases(tp2):
    """o_proj / down_proj biases (attention_bias, mlp_bias) are added once, after the all_reduce."""
    job, results = tp2["llama_biases"]
    _check_scenario(job, results, want_kv_heads=1)


def test_tp2_engine_in_lockstep(tp2):
    """Every rank's engine produces the same tokens (sampling included); greedy ones = TP=1's."""
    job, results = tp2["engine_qwen3"]
    assert results[0]["out"] == results[1]["out"]
    single = _engine_job(_load(job["path"]))
    assert len(results[0]["out"]) == len(single) == 8
    for i, (got, want) in enumerate(zip(results[0]["out"], single)):
        assert len(got) == 8
        if i % 2:
            assert got == want, i
    assert results[0]["out"][:4] == results[0]["out"][4:]  # running ahead changes nothing


def test_tp2_spec_mask_tree(tp2):
    job, results = tp2["tree_llama"]
    gen = _load(job["path"])
    single = _tree_job(gen)
    hf = hf_model(job["path"])
    for res in results:
        got = res["out"]
        assert [t.tokens for t in got["trees"]] == [t.tokens for t in single["trees"]]
        assert rel_err(got["logits"], single["logits"]) < 1e-5
    got = results[0]["out"]
    with torch.no_grad():
        for b, (p, t) in enumerate(zip(got["prompts"], got["trees"])):
            for i in range(t.size):
                ref = hf(torch.tensor([p + [t.tokens[j] for j in t.path(i)]])).logits[0, -1]
                assert rel_err(got["logits"][got["offsets"][b] + i], ref) < 1e-4, (b, i)


def test_tp2_hidden_states_replicated_and_match_transformers(tp2):
    """output_hidden_states under TP=2: every rank returns the same full states, = transformers'."""
    from test_hidden_states import _script, check_states, reference_states

    job, results = tp2["hidden_llama"]
    got = [res["out"] for res in results]
    assert all(torch.equal(a[3], b[3]) for a, b in zip(got[0], got[1]))
    check_states(got[0], reference_states(hf_model(job["path"]), _script(2)[0]), [0, 1, 2])


def test_tp2_vocab_not_divisible_by_world(tp2):
    job, results = tp2["llama_vocab97"]
    seq, single = _odd_vocab_job(_load(job["path"]))
    ref = hf_model(job["path"])(torch.tensor([seq])).logits[0].float()
    for res in results:
        _, got = res["out"]
        assert got.shape == (len(seq), 97)
        assert rel_err(got, single) < 1e-5
        assert rel_err(got, ref) < 1e-4


def test_tp2_lora_mixed_batch(tp2):
    """Qwen3 (q_size != hidden): LoRA on every projection, sliced per rank, = TP=1 = peft."""
    from peft import PeftModel

    job, results = tp2["lora_qwen3"]
    seqs, single = _lora_job(_load(job["path"]), job["adapters"])
    want = []
    with torch.no_grad():
        for (name, n), seq in zip(LORA_REQUESTS, seqs):
            model = hf_model(job["path"])
            if name is not None:
                model = PeftModel.from_pretrained(model, job["adapters"][name]).eval()
            logits = model(torch.tensor([seq])).logits[0].float()
            want.append((logits[:n], logits[n:]))
    ref = torch.cat([p for p, _ in want] + [d for _, d in want])
    for res in results:
        got_seqs, got = res["out"]
        assert got_seqs == seqs
        assert rel_err(got, single) < 1e-5
        assert rel_err(got, ref) < 1e-4


def test_cli_under_torchrun(checkpoint_dir):
    """`torchrun --standalone --nproc-per-node 2 -m text_generator generate --tensor-parallel`
    (rendezvous on localhost): rank 0 prints exactly what the one-process CLI prints."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONPATH=root)
    args = ["-m", "text_generator", "generate", "--model", checkpoint_dir("llama"), "--device", "cpu",
            "--token-ids", "1,2,3", "5,6,7,8,9", "--temperature", "0", "--max-new-tokens", "6"]
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD)]
    tp = subprocess.run(run + args + ["--tensor-parallel"], cwd=root, env=env, capture_output=True, text=True,
                        timeout=120)
    if tp.returncode != 0:  # once more: a rendezvous port taken by a concurrent run is not ours to test
        first = tp.stderr[-2000:]
        tp = subprocess.run(run + args + ["--tensor-parallel"], cwd=root, env=env, capture_output=True,
                            text=True, timeout=120)
        tp.stderr = first + "\n--- retry ---\n" + tp.stderr
    one = subprocess.run([sys.executable] + args, cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert tp.returncode == 0 and one.returncode == 0, tp.stderr[-4000:] + one.stderr[-2000:]
    assert tp.stdout == one.stdout and tp.stdout.count("=== [") == 2, (tp.stdout, one.stdout, tp.stderr[-3000:])


# -- decode CUDA graphs under TP=2: two NCCL ranks on two GPUs (pytest -m cuda) -----------------

def _graph_job(gen, check_sync: bool):
    """Prefill 5 requests, 3 decode steps (batch 5: bucket 8), prefill 12 more (eager collectives
    between replays), 3 decode steps of all 17 (bucket 24), 2 more of the first 5 (bucket 8
    again, replayed with no host-device sync when check_sync). Decode tokens are fixed (teacher
    forcing), so every run sees the same inputs. -> the logits of every step, on the CPU."""
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 97, (int(n),), generator=g).tolist() for n in torch.randint(3, 60, (17,), generator=g)]
    h = PagedHarness(gen, 128, 16, seed=2)
    out = []

    def prefill(rids):
        last = torch.cumsum(torch.tensor([len(prompts[r]) for r in rids]), 0) - 1
        out.append(h.step({r: prompts[r] for r in rids}, is_prefill=True, lm_head_indices=last))

    def decode(rids, t):
        out.append(h.step({r: [(7 * r + t) % 97] for r in rids}, is_prefill=False))

    prefill(range(5))
    for t in range(3):
        decode(range(5), t)
    prefill(range(5, 17))
    for t in range(3, 6):
        decode(range(17), t)
    decode(range(5), 6)
    torch.cuda.synchronize()
    if check_sync:
        torch.cuda.set_sync_debug_mode("error")
    try:
        decode(range(5), 7)
        decode(range(5), 8)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return [x.cpu() for x in out]


GRAPH_MODEL = dict(hidden_size=512, intermediate_size=512, num_attention_heads=8, num_key_value_heads=2,
                   head_dim=64, vocab_size=97, max_position_embeddings=1024)  # TP=2: 4 q heads / 1 kv head


def _graph_worker(rank, store, path, out_dir):
    from datetime import timedelta

    try:
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                                device_id=torch.device("cuda", rank), timeout=timedelta(seconds=120))
        tp = TPGroup.from_default_group()
        res = {}
        for graphs in (True, False):
            gen = TextGenerator.from_pretrained(path, device=f"cuda:{rank}", dtype=torch.bfloat16,
                                                cuda_graphs=graphs, tp_group=tp)
            res[graphs] = _graph_job(gen, check_sync=graphs)
            if graphs:
                res["buckets"] = sorted(gen.model_wrapper.graphs._graphs)
            del gen  # its graphs with it: NCCL's teardown waits for every graph holding its work
        torch.save(res, os.path.join(out_dir, f"graphs.rank{rank}.pt"))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - the traceback keeps the graphs alive: report, exit now
        import traceback

        with open(os.path.join(out_dir, f"graphs.rank{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        os._exit(1)
    os._exit(0)  # results saved: no interpreter teardown of the symmetric all-reduce buffer (TPGroup's default)


@pytest.mark.cuda
def test_cuda_graphs_under_tp2_nccl(tmp_path):
    """Decode graphs capture the NCCL collectives: under TP=2 each rank captures buckets 8 and 24
    and replays them, interleaved with eager prefills, with no host-device sync; replays equal
    eager TP=2 steps (bf16 rounding), both ranks return identical logits, and TP=2's error
    against an fp32 TP=1 reference is at most twice TP=1 bf16's (plus a small floor)."""
    import time

    from conftest import make_checkpoint

    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    pytest.importorskip("flashinfer")
    path = make_checkpoint(tmp_path / "llama31", "llama31", **GRAPH_MODEL)
    ctx = mp.spawn(_graph_worker, args=(str(tmp_path / "store"), path, str(tmp_path)), nprocs=WORLD, join=False)
    deadline = time.monotonic() + 300  # a rank stuck in a replay waits forever: fail instead
    try:
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                pytest.fail("TP=2 CUDA-graph workers did not finish in 300 s (a collective mismatch hangs)")
    except mp.ProcessExitedException:
        pytest.fail("a TP=2 rank failed:\n" + "\n".join(p.read_text() for p in tmp_path.glob("graphs.rank*.err")))
    ranks = [torch.load(tmp_path / f"graphs.rank{r}.pt") for r in range(WORLD)]
    one = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=True)
    tp1 = _graph_job(one, check_sync=True)
    ref = _graph_job(TextGenerator.from_pretrained(path, device="cuda", dtype=torch.float32,
                                                   attention_backend="torch"), check_sync=False)
    assert sorted(one.model_wrapper.graphs._graphs) == [(8, 1), (24, 1)]  # (batch bucket, tokens per request)
    for r, res in enumerate(ranks):
        assert res["buckets"] == [(8, 1), (24, 1)], r
        for i, (graph, eager) in enumerate(zip(res[True], res[False])):
            assert rel_err(graph, eager) < 2e-2, (r, i)
            assert torch.equal(graph, ranks[0][True][i]), f"rank {r} step {i}: ranks differ"
    for i, (got, single, want) in enumerate(zip(ranks[0][True], tp1, ref)):
        assert rel_err(got, want) <= 2 * rel_err(single, want) + 2e-3, i


# -- sharding rules and sliced loading, without a process group --------------------------------

def _cfg(**kw):
    base = dict(architectures=["LlamaForCausalLM"], vocab_size=97, hidden_size=64, intermediate_size=112,
                num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=2)
    return ModelConfig.from_dict({**base, **kw})


def test_shard_rules():
    s = TPShard.of(_cfg(), TPGroup(1, 2))
    assert (s.num_heads, s.q_start, s.num_kv_heads, s.kv_start) == (4, 4, 1, 1)
    assert (s.intermediate_size, s.inter_start, s.vocab_shard, s.vocab_start, s.vocab_rows) == (56, 56, 49, 49, 48)
    # 2 kv heads over 4 ranks: ranks 0, 1 read kv head 0 and ranks 2, 3 kv head 1 (q heads 2r, 2r + 1)
    assert [TPShard.of(_cfg(), TPGroup(r, 4)).kv_start for r in range(4)] == [0, 0, 1, 1]
    assert all(TPShard.of(_cfg(), TPGroup(r, 4)).num_kv_heads == 1 for r in range(4))
    assert TPShard.of(_cfg(), TPGroup.single()).vocab_shard == 97
    with pytest.raises(ModelLoadError, match="num_attention_heads"):
        TPShard.of(_cfg(num_attention_heads=6, num_key_value_heads=6), TPGroup(0, 4))
    with pytest.raises(ModelLoadError, match="num_key_value_heads"):
        TPShard.of(_cfg(num_attention_heads=12, num_key_value_heads=3, head_dim=8), TPGroup(0, 2))
    with pytest.raises(ModelLoadError, match="intermediate_size"):
        TPShard.of(_cfg(intermediate_size=111), TPGroup(0, 2))
    if not dist.is_initialized():
        with pytest.raises(ModelLoadError, match="init_process_group"):
            TPGroup.from_default_group()


@pytest.mark.parametrize("rank", [0, 1])
def test_rank_loads_only_its_slices(checkpoint_dir, rank):
    """Loading needs no collective: rank r's parameters are exactly its slices of the full model."""
    path = checkpoint_dir("qwen2")  # q/k/v biases, tied embeddings
    cfg = ModelConfig.from_pretrained(path)
    full = dict(load_model(path, cfg, dtype=torch.float32, device=torch.device("cpu")).named_parameters())
    part = load_model(path, cfg, dtype=torch.float32, device=torch.device("cpu"), tp=TPGroup(rank, 2))
    s, d = part.shard, cfg.head_dim
    q, kv = cfg.num_heads * d, cfg.num_kv_heads * d
    qs, ks = slice(s.q_start * d, (s.q_start + s.num_heads) * d), slice(s.kv_start * d, (s.kv_start + s.num_kv_heads) * d)
    i = slice(s.inter_start, s.inter_start + s.intermediate_size)
    for name, p in part.named_parameters():
        w = full[name]
        if "qkv_proj" in name:
            want = torch.cat([w[:q][qs], w[q:q + kv][ks], w[q + kv:][ks]])
        elif "gate_up_proj" in name:
            n = cfg.intermediate_size
            want = torch.cat([w[:n][i], w[n:][i]])
        elif "o_proj.weight" in name:
            want = w[:, qs]
        elif "down_proj.weight" in name:
            want = w[:, i]
        elif "embed_tokens" in name:
            want = w[s.vocab_start: s.vocab_start + s.vocab_shard]
        else:
            want = w
        assert torch.equal(p, want), name
    assert part.lm_head.weight is part.model.embed_tokens.weight
