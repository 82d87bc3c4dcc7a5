"""The reference engine: continuous batching over TextGenerator.forward_tensor.

engine.py      LLMEngine: add_request / step / generate, sampling and emission of tokens
forward.py     one step's forward: the chunks' flat tensors -> forward_tensor -> logits
drafting.py    the engine's side of a drafter: when a step drafts, starting / updating / dropping
kv_sizing.py   how many KV blocks the engine allocates when given none
admission.py   a new request's checks (sampling parameters, prompt, adapter, grammar compiler)
output.py      new tokens into a request: stop rules, detokenization, logprobs
runahead.py    async scheduling: launch a step, read its tokens back one step later
scheduler.py   which requests run this step (chunked prefill, token budget, preemption)
request.py     a request's state (tokens, blocks, status) and the RequestOutput it emits
detokenizer.py incremental detokenization of one request's output
"""

from text_generator.engine.engine import LLMEngine
from text_generator.engine.request import Request, RequestOutput, RequestStatus
from text_generator.engine.scheduler import ScheduledChunk, Scheduler
from text_generator.sampling import SamplingParams

__all__ = ["LLMEngine", "Request", "RequestOutput", "RequestStatus", "SamplingParams", "ScheduledChunk",
           "Scheduler"]
