"""Incremental detokenization: one request's output text, grown token by token.

The engine feeds every output token that belongs in the text (not EOS or a stop token) to the
request's detokenizer and gets back the text that became final with it; at the end of the
request `flush()` returns what was still held back. The pieces concatenate to
`decode(output ids)`: the text a request reports never changes once reported, and each step
costs a few tokens' decoding instead of the whole output's.

    ByteDetokenizer    the ByteTokenizer (ids 0..255 are UTF-8 bytes): a codecs incremental
                       UTF-8 decoder, exact by construction
    WindowDetokenizer  any tokenizer with decode(ids): decodes a short window of the newest
                       tokens twice and emits the difference

WindowDetokenizer's window (the offsets move forward each time text is emitted):

    ids:  o0 o1 o2 o3 o4 o5 o6
                |prefix |read |
                         ^ new tokens since the last emission
    prefix = decode(ids[prefix_offset:read_offset])   (already emitted)
    full   = decode(ids[prefix_offset:])
    emit full[len(prefix):] unless full ends with U+FFFD (a character whose bytes are still
    coming); then prefix_offset <- read_offset, read_offset <- len(ids)

Both strings start at the same token, so whatever a decoder does to a first token (SentencePiece
drops its leading space) cancels out. Emission points are where the decoded bytes end on a
whole character, so decoding from there reads the bytes the way decoding everything would.
Decoders whose output depends on tokens far apart (byte-fallback runs, clean-up of spaces
before punctuation) can differ from the full decode at a window boundary; byte-level BPE
(GPT-2, Llama 3, Qwen) and SentencePiece without fallback bytes do not.
"""

from __future__ import annotations

import codecs

from text_generator.tokenizer import ByteTokenizer, decode_tokens

_INCOMPLETE = "\ufffd"


class ByteDetokenizer:
    """Bytes in, text out: ids >= 256 (BOS, EOS, padding) carry no text, as in ByteTokenizer.decode."""

    def __init__(self):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def step(self, token_id: int) -> str:
        if not 0 <= token_id < 256:
            return ""
        return self._decoder.decode(bytes((token_id,)))

    def flush(self) -> str:
        """The rest at the end: an unfinished character becomes U+FFFD, as decode would make it."""
        return self._decoder.decode(b"", final=True)


class WindowDetokenizer:
    """Owns the output ids seen so far and the two window offsets (see the module docstring)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self._prefix = ""  # decode(ids[prefix_offset:read_offset])

    def step(self, token_id: int) -> str:
        self.ids.append(token_id)
        full = decode_tokens(self.tokenizer, self.ids[self.prefix_offset:])
        if len(full) <= len(self._prefix) or full.endswith(_INCOMPLETE):
            return ""
        delta = full[len(self._prefix):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        self._prefix = decode_tokens(self.tokenizer, self.ids[self.prefix_offset:self.read_offset])
        return delta

    def flush(self) -> str:
        """Whatever the window still holds back (an unfinished character decodes as U+FFFD)."""
        if self.read_offset == len(self.ids):
            return ""
        full = decode_tokens(self.tokenizer, self.ids[self.prefix_offset:])
        delta = full[len(self._prefix):]
        self.prefix_offset = self.read_offset = len(self.ids)
        self._prefix = ""
        return delta


def make_detokenizer(tokenizer):
    """The incremental detokenizer for a tokenizer: exact bytes for the ByteTokenizer, the window otherwise."""
    return ByteDetokenizer() if isinstance(tokenizer, ByteTokenizer) else WindowDetokenizer(tokenizer)
