"""The reference engine: continuous batching over TextGenerator.forward_tensor.

engine.py    LLMEngine: add_request / step / generate, sampling, stop rules, run-ahead
scheduler.py which requests run this step (chunked prefill, token budget, preemption)
request.py   a request's state (tokens, blocks, status) and the RequestOutput it emits
"""

from text_generator.engine.engine import LLMEngine
from text_generator.engine.request import Request, RequestOutput, RequestStatus
from text_generator.engine.scheduler import ScheduledChunk, Scheduler
from text_generator.sampling import SamplingParams

__all__ = ["LLMEngine", "Request", "RequestOutput", "RequestStatus", "SamplingParams", "ScheduledChunk",
           "Scheduler"]
