"""Everything that turns a step's tensors into logits: loading, models, the forward batch, attention."""

from model_wrapper.config import ModelConfig
from model_wrapper.errors import ModelErrorCode, ModelLoadError
from model_wrapper.forward_batch import ForwardBatch, ForwardMode
from model_wrapper.kernels import KernelConfig
from model_wrapper.model_wrapper import ModelWrapper
from model_wrapper.parallel import TPGroup

__all__ = ["ForwardBatch", "ForwardMode", "KernelConfig", "ModelConfig", "ModelErrorCode", "ModelLoadError",
           "ModelWrapper", "TPGroup"]
