"""How `generate` prints: each prompt's completion in prompt order while the engine runs them all
at once, either as it grows (streaming) or whole when done, as text blocks or JSON lines.

The engine's outputs arrive for any request in any order. The printer keeps a cursor on the
first prompt not yet fully printed: that prompt's text goes straight to the terminal, the later
ones' is buffered until the cursor reaches them, so the printed page is the same with and
without streaming:

    === [0] 'first prompt'
    <completion text>
    --- 6 tokens, finish_reason=length
    === [1] ...

JSON lines (--json): one object per prompt, in prompt order, once it finishes:
    {"index", "prompt", "prompt_token_ids", "text", "token_ids", "finish_reason"[, "error"]
     [, "logprobs", "top_logprobs" (with --logprobs)]}
"""

from __future__ import annotations

import json
from typing import TextIO

from text_generator.engine import RequestOutput


class OrderedPrinter:
    """Owns the cursor and, per prompt, the text received but not yet printed and the final output."""

    def __init__(self, prompts: list, out: TextIO, *, stream: bool, json_lines: bool):
        self.prompts, self.out = prompts, out
        self.stream, self.json_lines = stream and not json_lines, json_lines
        self.pending = [""] * len(prompts)  # streamed text waiting for its turn
        self.final: list[RequestOutput | None] = [None] * len(prompts)
        self.cursor = 0
        self.header_done = False
        self.streamed = False  # text of the cursor's prompt is on the page already

    def add(self, index: int, o: RequestOutput) -> None:
        """One engine output of prompt `index` (a step's delta, or its final output)."""
        if self.stream and o.delta_text:
            self.pending[index] += o.delta_text
        if o.finished:
            self.final[index] = o
        self._advance()

    def _advance(self) -> None:
        while self.cursor < len(self.prompts):
            i = self.cursor
            if self.stream:
                if not self.header_done:
                    self._header(i)
                if self.pending[i]:
                    self.out.write(self.pending[i])
                    self.pending[i] = ""
                    self.streamed = True
            o = self.final[i]
            if o is None:
                break
            if self.json_lines:
                self.out.write(json.dumps(_record(i, self.prompts[i], o), ensure_ascii=False) + "\n")
            else:
                if not self.stream:
                    self._header(i)
                self._body(o)
            self.cursor += 1
            self.header_done = self.streamed = False
        self.out.flush()

    def _header(self, i: int) -> None:
        self.out.write(f"=== [{i}] {self.prompts[i]!r}\n")
        self.header_done = True

    def _body(self, o: RequestOutput) -> None:
        if o.finish_reason == "error":
            if self.streamed:
                self.out.write("\n")
            self.out.write(f"error: {o.error}\n")
            return
        if o.text is None:  # no tokenizer: token ids
            self.out.write(f"{o.token_ids}\n")
        elif self.stream:
            self.out.write("\n")  # the text itself is out already
        else:
            self.out.write(o.text + "\n")
        self.out.write(f"--- {len(o.token_ids)} tokens, finish_reason={o.finish_reason}\n")
        if o.logprobs is not None:
            self.out.write(f"--- logprobs: {[round(x, 4) for x in o.logprobs]}\n")


def _record(i: int, prompt, o: RequestOutput) -> dict:
    rec = {"index": i, "prompt": prompt, "prompt_token_ids": o.prompt_token_ids, "text": o.text,
           "token_ids": o.token_ids, "finish_reason": o.finish_reason}
    if o.error is not None:
        rec["error"] = o.error
    if o.logprobs is not None:
        rec["logprobs"] = o.logprobs
        rec["top_logprobs"] = [{str(t): lp for t, lp in d.items()} for d in o.top_logprobs]
    return rec
