"""Where `generate`'s prompts come from: its arguments, then the lines of --file, read lazily.

A file is read one line at a time, each line capped in characters, and the count of prompts is
capped by --max-prompts, so an endless file (a pipe, /dev/zero) is refused instead of filling
memory. Each prompt then becomes token ids: comma-separated ids (--token-ids), the tokenizer's
encoding, or its chat template around a user message (--chat); one that does not leave room
for an output token within the length limit is refused, naming where it came from.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterable, Iterator, TextIO


class PromptError(Exception):
    """A prompt the CLI refuses; the message names the prompt's source (argument or file line)."""


@dataclass
class Prompt:
    source: str  # "argument 1", "line 7 of prompts.txt"
    text: str


def open_prompt_file(path: str) -> TextIO:
    try:
        return open(path, encoding="utf-8")
    except OSError as e:
        raise PromptError(f"--file: cannot read {path!r}: {e.strerror or e}") from None


def read_prompts(arguments: list[str], file: TextIO | None, name: str, *, max_prompts: int,
                 max_line_chars: int) -> Iterator[Prompt]:
    """Arguments first, then the file's non-empty lines (without their newline), one at a time:
    the caller tokenizes each before the next line is read."""
    n = 0
    sources = (Prompt(f"argument {i + 1}", p) for i, p in enumerate(arguments))
    lines = () if file is None else (Prompt(f"line {k} of {name}", t) for k, t in _lines(file, name, max_line_chars)
                                     if t.strip())
    for prompt in itertools.chain(sources, lines):
        n += 1
        if n > max_prompts:
            raise PromptError(f"--max-prompts: expected at most {max_prompts} prompts (arguments and --file "
                              f"lines), got more; raise --max-prompts or split the file")
        yield prompt


def _lines(f: TextIO, name: str, max_chars: int) -> Iterator[tuple[int, str]]:
    lineno = 0
    while True:
        lineno += 1
        try:
            line = f.readline(max_chars + 1)
        except UnicodeDecodeError as e:
            raise PromptError(f"--file: expected UTF-8 text, got bytes that are not near line {lineno} of "
                              f"{name} ({e.reason})") from None
        if not line:
            return
        text = line[:-1] if line.endswith("\n") else line
        if len(text) > max_chars:
            raise PromptError(f"--file: line {lineno} of {name} is longer than {max_chars} characters, more than "
                              f"any prompt within --max-model-len can be")
        yield lineno, text


def to_token_ids(prompts: Iterable[Prompt], tokenizer, *, token_ids: bool, chat: bool, max_len: int
                 ) -> tuple[list[Prompt], list[list[int]]]:
    """-> (the prompts, each one's ids); refuses one of max_len tokens or more (no room for an
    output token)."""
    from text_generator.llm import render_chat

    seen, out = [], []
    for p in prompts:
        if token_ids:
            try:
                ids = [int(t) for t in p.text.replace(",", " ").split()]
            except ValueError:
                raise PromptError(f"--token-ids: {p.source}: expected comma-separated integers, "
                                  f"got {_short(p.text)!r}") from None
        elif chat:
            try:
                ids = render_chat(tokenizer, [{"role": "user", "content": p.text}])
            except ValueError as e:
                raise PromptError(f"--chat: {e}") from None
        else:
            ids = list(tokenizer.encode(p.text))
        if not ids:
            raise PromptError(f"{p.source}: expected at least one token, got none")
        if len(ids) >= max_len:
            raise PromptError(f"{p.source}: expected at most {max_len - 1} tokens (--max-model-len {max_len} "
                              f"leaves room for one output token), got {len(ids)}")
        seen.append(p)
        out.append(ids)
    return seen, out


def _short(text: str, n: int = 40) -> str:
    return text if len(text) <= n else text[:n] + "..."
