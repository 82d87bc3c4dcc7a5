"""Attention backends: plan once per step from a ForwardBatch, run once per layer."""

from model_wrapper.attention.backend import AttentionBackend
from model_wrapper.attention.torch_backend import TorchAttentionBackend

__all__ = ["AttentionBackend", "TorchAttentionBackend"]
