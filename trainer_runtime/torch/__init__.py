"""PyTorch support: ``TorchTrainer``, ``prepare_model``, ``prepare_data_loader``, ``get_device``.

Mirrors ``ray.train.torch``: ``from ray.train.torch import TorchTrainer`` becomes
``from trainer_runtime.torch import TorchTrainer``.
"""

from trainer_runtime.torch.backend import TorchBackend, TorchConfig
from trainer_runtime.torch.train_loop_utils import get_device, prepare_data_loader, prepare_model
from trainer_runtime.torch.trainer import TorchTrainer

__all__ = [
    "TorchBackend",
    "TorchConfig",
    "TorchTrainer",
    "get_device",
    "prepare_data_loader",
    "prepare_model",
]
