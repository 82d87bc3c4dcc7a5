"""The HTTP process's stream side of one token, alone: CPU microseconds per streamed token.

    python3 benchmarks/bench_stream_side.py            # completions, logprobs=1 (bench_serve's request)
    python3 benchmarks/bench_stream_side.py --chat

As at saturation, every step brings one token to each of --streams streams: the event loop puts each
stream's RequestOutput into its RequestGroup (as EngineClient._dispatch does), then every stream's task
wakes, takes it, merges it and formats its SSE chunk (app._stream). No sockets, no uvicorn, no engine:
what this measures is only the part of the HTTP process's per-token cost that text_generator/serve owns
after the out pipe, and process CPU time (best of --repeats) keeps it steady on a shared host, where the
end-to-end profile_serve.py numbers move by +-15% from run to run. To compare two trees, run each with
PYTHONPATH=TREE (a script's own folder, not the working directory, comes first on sys.path).
"""

from __future__ import annotations

import argparse
import asyncio
import time

from text_generator.engine import RequestOutput
from text_generator.serve import app as A
from text_generator.serve.engine_client import RequestGroup


class _Owner:
    """What a RequestGroup needs of its EngineClient here: somewhere to send an abort."""

    def _send(self, cmd) -> None:
        pass


class _State:
    def token_str(self, token_id: int) -> str:
        return f"tok{token_id}"


def _put(group: RequestGroup, out: RequestOutput) -> None:
    if hasattr(group, "put"):
        group.put(out)
    else:  # (trees before RequestGroup.put: an asyncio.Queue)
        group.queue.put_nowait(out)


async def one_pass(streams: int, tokens: int, chat: bool) -> int:
    """tokens steps over `streams` one-choice streams -> the bytes they sent."""
    groups = [RequestGroup(_Owner(), [f"r{s}-0"]) for s in range(streams)]
    sent = [0]

    async def consume(group: RequestGroup) -> None:
        async for chunk in A._stream(_State(), group, "cmpl-bench", "m", chat, True, True, 32):
            sent[0] += len(chunk)

    tasks = [asyncio.ensure_future(consume(g)) for g in groups]
    await asyncio.sleep(0)
    for k in range(tokens):
        last = k == tokens - 1
        n = tokens if last else 1  # a final output carries the whole request, as the engine client's does
        for s, g in enumerate(groups):
            _put(g, RequestOutput(
                request_id=f"r{s}-0", prompt_token_ids=[], new_token_ids=[k], token_ids=list(range(n)) if last else [k],
                finished=last, finish_reason="length" if last else None, text=" w" * tokens if last else None,
                delta_text=" w", logprobs=[-0.5] * n, top_logprobs=[{k: -0.5}] * n))
        for _ in range(3):  # every stream's task runs its chunk before the next step
            await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    return sent[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=128)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--chat", action="store_true")
    a = p.parse_args()
    best, sent = float("inf"), 0
    for _ in range(a.repeats):
        c0 = time.process_time()
        sent = asyncio.run(one_pass(a.streams, a.tokens, a.chat))
        best = min(best, (time.process_time() - c0) / (a.streams * a.tokens))
    print(f"{'chat' if a.chat else 'completions'}: {1e6 * best:.2f} us CPU per streamed token "
          f"(best of {a.repeats}; {a.streams} streams x {a.tokens} tokens, {sent} bytes)")


if __name__ == "__main__":
    main()
