"""Sampling: per-request SamplingParams and the batched Sampler that turns logits into tokens.

The engine (or any scheduler) runs forward_tensor, gets float32 logits [B, V] for the requests
that need a token this step, and calls `Sampler(logits, params, ...)` with one SamplingParams
per row plus each row's token history (for penalties) and seeded generator. Every parameter
becomes a [B] tensor, so one batch mixes greedy rows, hot rows, top-k / top-p / min-p rows and
penalised rows without a Python loop over tokens.

Processing order, per row (vLLM's definitions):

    logits --penalties--> --/ temperature--> --min-p--> --top-k--> --top-p--> processed
    greedy rows: token = argmax(processed)      (temperature 0: no scaling)
    other rows:  token ~ softmax(processed)     (exponential race: argmax(p / Exp(1)))
    logprobs:    log_softmax(processed), the distribution the token was drawn from

    repetition_penalty r: for tokens seen in prompt or output, logit / r if > 0 else logit * r
    frequency_penalty f:  logit -= f * (times the token occurs in the output)
    presence_penalty  p:  logit -= p * (1 if it occurs in the output)

On CUDA with flashinfer installed, rows that are not seeded are drawn with FlashInfer's fused
top-k / top-p rejection sampler when the batch needs no logprobs and no seeded row; greedy is
the same argmax on every path.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

from text_generator.errors import ErrorCode, ForwardArgumentError
from text_generator.structured import StructuredOutput

# A top_k that disables the filter: vLLM uses -1, transformers 0; both mean "whole vocabulary".
_TOP_K_OFF = (-1, 0)


def row_tensor(values: list, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A per-row parameter list -> [B] tensor on `device`, without waiting for the device.

    torch.tensor(values, device=cuda) copies from pageable memory with a stream synchronize: the
    host would wait there for the step's forward to finish, which defeats the engine's run-ahead
    (the host's next-step work would no longer overlap the device's). Built in pinned memory and
    copied with non_blocking=True, the copy is queued on the stream like the kernels around it
    (torch's host allocator keeps the pinned block until the copy is done)."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


@dataclass
class SamplingParams:
    """How one request picks its tokens and when it stops.

    temperature:        >= 0; 0 means greedy (argmax)
    top_k:              keep the k most likely tokens; -1 or 0 keeps all
    top_p:              in (0, 1]; keep the smallest most-likely set whose mass reaches top_p
    min_p:              in [0, 1]; keep tokens with probability >= min_p * the top probability
    repetition_penalty: > 0; 1 = off (see the module docstring for all three penalties)
    frequency_penalty:  in [-2, 2]; 0 = off
    presence_penalty:   in [-2, 2]; 0 = off
    seed:               int or None; a seeded request draws from its own torch.Generator, so
                        its output does not depend on what else is in the batch
    logprobs:           None, or n >= 0: return the sampled token's logprob and the top-n
    max_new_tokens:     >= 1 tokens to generate at most
    stop_token_ids:     tokens that end the request (kept in token_ids, left out of text)
    stop:               strings that end the request; the text is cut before them
    ignore_eos:         keep going past the EOS token
    structured:         None, or a StructuredOutput (text_generator.structured): the output must
                        match a JSON schema / JSON object / regex / grammar. The engine masks the
                        logits with the request's grammar before this sampler runs (a caller with
                        its own loop uses structured.mask_logits_); logprobs are then those of
                        the masked distribution
    """

    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    logprobs: int | None = None
    max_new_tokens: int = 16
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    structured: StructuredOutput | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop) if self.stop is not None else []
        self.stop_token_ids = list(self.stop_token_ids) if self.stop_token_ids is not None else []
        _check_real("temperature", self.temperature, "a finite float >= 0", lambda v: v >= 0)
        _check_int("top_k", self.top_k, "-1 / 0 (off) or an int >= 1", lambda v: v >= -1)
        _check_real("top_p", self.top_p, "a float in (0, 1]", lambda v: 0 < v <= 1)
        _check_real("min_p", self.min_p, "a float in [0, 1]", lambda v: 0 <= v <= 1)
        _check_real("repetition_penalty", self.repetition_penalty, "a finite float > 0", lambda v: v > 0)
        _check_real("frequency_penalty", self.frequency_penalty, "a float in [-2, 2]", lambda v: -2 <= v <= 2)
        _check_real("presence_penalty", self.presence_penalty, "a float in [-2, 2]", lambda v: -2 <= v <= 2)
        if self.seed is not None:
            _check_int("seed", self.seed, "None or an int in [0, 2**63)", lambda v: 0 <= v < 2**63)
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, "None or an int >= 0 (top-n)", lambda v: v >= 0)
        _check_int("max_new_tokens", self.max_new_tokens, "an int >= 1", lambda v: v >= 1)
        for i, t in enumerate(self.stop_token_ids):
            _check_int(f"stop_token_ids[{i}]", t, "a token id >= 0", lambda v: v >= 0)
        for i, s in enumerate(self.stop):
            if not isinstance(s, str) or not s:
                raise ValueError(f"SamplingParams.stop[{i}]: expected a non-empty str, got {s!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"SamplingParams.ignore_eos: expected a bool, got {self.ignore_eos!r}")
        if isinstance(self.structured, dict):  # e.g. SamplingParams(**json) from a config file
            self.structured = StructuredOutput.from_dict(self.structured)
        if self.structured is not None and not isinstance(self.structured, StructuredOutput):
            raise ForwardArgumentError(ErrorCode.INVALID_STRUCTURED_OUTPUT, "SamplingParams.structured",
                                       f"expected a StructuredOutput or None, got {type(self.structured).__name__}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0)

    def make_generator(self, device: torch.device | str) -> torch.Generator | None:
        """The request's own generator (seeded requests only), on the device sampling runs on."""
        if self.seed is None:
            return None
        g = torch.Generator(device=device)
        g.manual_seed(self.seed)
        return g


def _check_real(name, v, expected, ok) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not ok(v):
        raise ValueError(f"SamplingParams.{name}: expected {expected}, got {v!r}")


def _check_int(name, v, expected, ok) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or not ok(v):
        raise ValueError(f"SamplingParams.{name}: expected {expected}, got {v!r}")


@dataclass
class SamplerOutput:
    """token_ids:      [B] int64, on the logits' device
    logprobs:       [B] float32, logprob of each sampled token (None if no row asked)
    top_token_ids:  [B, n] int64, the n = max requested most likely tokens (None if no row asked)
    top_logprobs:   [B, n] float32, their logprobs; a row that asked for fewer reads a prefix
    """

    token_ids: torch.Tensor
    logprobs: torch.Tensor | None = None
    top_token_ids: torch.Tensor | None = None
    top_logprobs: torch.Tensor | None = None


def _flashinfer_sampling():
    try:
        import flashinfer.sampling as fs
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return None
    return fs


class Sampler:
    """Stateless apart from its fallback generator (for unseeded rows) and the FlashInfer switch.

    use_flashinfer: "auto" (CUDA logits and flashinfer importable), True or False.
    """

    def __init__(self, *, use_flashinfer: bool | str = "auto", generator: torch.Generator | None = None):
        self.use_flashinfer = use_flashinfer
        self.generator = generator
        self._fi = None
        self._fi_checked = False

    def _flashinfer(self, device: torch.device):
        if self.use_flashinfer is False or device.type != "cuda":
            return None
        if not self._fi_checked:
            self._fi, self._fi_checked = _flashinfer_sampling(), True
            if self._fi is None and self.use_flashinfer is True:
                raise RuntimeError("Sampler: use_flashinfer=True but flashinfer.sampling does not import")
        return self._fi

    @torch.inference_mode()
    def __call__(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        *,
        prompt_ids: Sequence[Sequence[int]] | None = None,
        output_ids: Sequence[Sequence[int]] | None = None,
        generators: Sequence[torch.Generator | None] | None = None,
    ) -> SamplerOutput:
        """logits [B, V] float32; params, prompt_ids, output_ids, generators: one entry per row.

        prompt_ids / output_ids are needed only by rows with penalties; generators only by
        seeded rows (None entries fall back to self.generator / torch's default)."""
        B, V = logits.shape
        if len(params) != B:
            raise ValueError(f"Sampler: expected {B} SamplingParams (one per logits row), got {len(params)}")
        dev = logits.device
        logits = logits.float()
        if any(p.has_penalties for p in params):
            logits = apply_penalties(logits, params, prompt_ids, output_ids)

        greedy = [p.greedy for p in params]
        want_logprobs = any(p.logprobs is not None for p in params)
        if all(greedy) and not want_logprobs:
            return SamplerOutput(token_ids=logits.argmax(dim=-1))

        temp = row_tensor([1.0 if g else p.temperature for g, p in zip(greedy, params)], dev)
        logits = logits / temp[:, None]
        seeded = generators is not None and any(g is not None for g in generators)
        fi = self._flashinfer(dev)
        if fi is not None and not seeded and not want_logprobs:
            return SamplerOutput(token_ids=self._flashinfer_sample(fi, logits, params, greedy))

        processed = apply_filters(logits, params)
        greedy_t = row_tensor(greedy, dev)
        tokens = processed.argmax(dim=-1)
        if not all(greedy):
            sampled = _exponential_race(torch.softmax(processed, dim=-1), generators, self.generator)
            tokens = torch.where(greedy_t, tokens, sampled)
        if not want_logprobs:
            return SamplerOutput(token_ids=tokens)
        logp = torch.log_softmax(processed, dim=-1)
        n = max(p.logprobs or 0 for p in params)
        top = torch.topk(logp, min(n, V), dim=-1) if n > 0 else None
        return SamplerOutput(
            token_ids=tokens,
            logprobs=logp.gather(1, tokens[:, None])[:, 0],
            top_token_ids=None if top is None else top.indices,
            top_logprobs=None if top is None else top.values,
        )

    def _flashinfer_sample(self, fi, logits, params, greedy) -> torch.Tensor:
        """Temperature-scaled logits -> tokens with FlashInfer's fused kernels (no seeds, no logprobs)."""
        dev, V = logits.device, logits.shape[-1]
        greedy_t = row_tensor(greedy, dev)
        argmax = logits.argmax(dim=-1)
        if any(p.min_p > 0 for p in params):
            logits = _min_p_mask(logits, row_tensor([p.min_p for p in params], dev))
        top_k = row_tensor([V if p.top_k in _TOP_K_OFF else min(p.top_k, V) for p in params], dev,
                           torch.int32)
        top_p = row_tensor([p.top_p for p in params], dev, torch.float32)
        sampled = fi.top_k_top_p_sampling_from_logits(
            logits, top_k, top_p, filter_apply_order="top_k_first", deterministic=True,
            generator=self.generator)
        return torch.where(greedy_t, argmax, sampled.to(torch.int64))


def apply_penalties(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    prompt_ids: Sequence[Sequence[int]] | None,
    output_ids: Sequence[Sequence[int]] | None,
) -> torch.Tensor:
    """Repetition / frequency / presence penalties (vLLM's definitions) on logits [B, V].

    Token counts are built with one scatter_add over the concatenated histories of the rows
    that have penalties; the other rows are untouched."""
    B, V = logits.shape
    dev = logits.device
    rows = [i for i, p in enumerate(params) if p.has_penalties]
    if prompt_ids is None or output_ids is None:
        raise ValueError("Sampler: penalties need prompt_ids and output_ids for every row")
    prompt_counts = token_counts([prompt_ids[i] for i in rows], V, dev)
    out_counts = token_counts([output_ids[i] for i in rows], V, dev)
    logits = logits.clone()
    idx = row_tensor(rows, dev, torch.int64)  # (a list index would be copied to the device with a synchronize)
    logits[idx] = penalize(logits[idx], prompt_counts, out_counts, [params[i] for i in rows])
    return logits


def token_counts(histories: Sequence[Sequence[int]], vocab_size: int, device) -> torch.Tensor:
    """-> float32 [len(histories), vocab_size]: how often each token occurs in each history (one
    scatter_add over their concatenation)."""
    c = torch.zeros(len(histories), vocab_size, dtype=torch.float32, device=device)
    lens = torch.tensor([len(h) for h in histories], dtype=torch.int64)
    if int(lens.sum()):
        flat = torch.tensor(list(itertools.chain.from_iterable(histories)), dtype=torch.int64)
        owner = torch.repeat_interleave(torch.arange(len(histories)), lens)
        c.view(-1).scatter_add_(0, (owner * vocab_size + flat).to(device, non_blocking=True), torch.ones(flat.numel(), device=device))
    return c


def penalize(logits: torch.Tensor, prompt_counts: torch.Tensor, out_counts: torch.Tensor,
             params: Sequence[SamplingParams]) -> torch.Tensor:
    """The three penalties on logits [R, V], given token counts [R, V] of each row's prompt and
    output (token_counts) and each row's params -> penalised logits [R, V]."""
    dev = logits.device
    seen = (prompt_counts > 0) | (out_counts > 0)
    rep = row_tensor([p.repetition_penalty for p in params], dev)[:, None]
    freq = row_tensor([p.frequency_penalty for p in params], dev)[:, None]
    pres = row_tensor([p.presence_penalty for p in params], dev)[:, None]
    penalised = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(seen, penalised, logits)
    return logits - freq * out_counts - pres * (out_counts > 0).float()


def apply_filters(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """min-p, then top-k, then top-p on temperature-scaled logits [B, V]; removed tokens -> -inf.

    The most likely token always survives. One descending sort serves top-k and top-p:

        sorted position j:   0    1    2    3   ...
        top-k keeps:         j < k
        top-p keeps:         (mass of positions < j, renormalised over the top-k set) < top_p
    """
    dev, V = logits.device, logits.shape[-1]
    if any(p.min_p > 0 for p in params):
        logits = _min_p_mask(logits, row_tensor([p.min_p for p in params], dev))
    use_k = any(p.top_k not in _TOP_K_OFF and p.top_k < V for p in params)
    use_p = any(p.top_p < 1.0 for p in params)
    if not (use_k or use_p):
        return logits
    k = row_tensor([V if p.top_k in _TOP_K_OFF else min(p.top_k, V) for p in params], dev)
    top_p = row_tensor([p.top_p for p in params], dev)
    values, order = torch.sort(logits, dim=-1, descending=True)
    keep = torch.arange(V, device=dev)[None, :] < k[:, None]  # [B, V] in sorted order
    if use_p:
        probs = torch.softmax(values.masked_fill(~keep, float("-inf")), dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        keep &= (mass_before < top_p[:, None]) | (top_p[:, None] >= 1.0)
    keep[:, 0] = True
    mask = torch.empty_like(keep).scatter_(1, order, keep)
    return logits.masked_fill(~mask, float("-inf"))


def _min_p_mask(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Remove tokens whose probability is below min_p * top probability, per row ([B] min_p).
    In log space: logit < max_logit + log(min_p)."""
    top = logits.max(dim=-1, keepdim=True).values
    threshold = top + torch.log(min_p.clamp_min(1e-30))[:, None]
    drop = (logits < threshold) & (min_p[:, None] > 0)
    return logits.masked_fill(drop, float("-inf"))


def _exponential_race(
    probs: torch.Tensor,
    generators: Sequence[torch.Generator | None] | None,
    default: torch.Generator | None,
) -> torch.Tensor:
    """One multinomial draw per row: argmax(p / E), E ~ Exp(1) i.i.d. (the exponential race).

    Unseeded rows share one draw from `default`; each seeded row draws its own noise row from
    its own generator. That loop over seeded requests is the one per-request Python loop in
    sampling: torch has no per-row generator, and a request's draws must not depend on its
    batch neighbours for seeded runs to be reproducible."""
    q = torch.empty_like(probs)
    q.exponential_(generator=default)
    if generators is not None:
        for i, g in enumerate(generators):
            if g is not None:
                q[i].exponential_(generator=g)
    return (probs / q.clamp_min(1e-20)).argmax(dim=-1)
