"""The public face: TextGenerator.forward_tensor, its error codes, and the tools around it."""

from text_generator.engine import LLMEngine
from text_generator.errors import ErrorCode, ForwardArgumentError, GeneratorStateError
from text_generator.generator import TextGenerator
from text_generator.llm import LLM
from text_generator.sampling import Sampler, SamplingParams
from text_generator.structured import StructuredOutput

__all__ = ["ErrorCode", "ForwardArgumentError", "GeneratorStateError", "LLM", "LLMEngine", "Sampler",
           "SamplingParams", "StructuredOutput", "TextGenerator"]
