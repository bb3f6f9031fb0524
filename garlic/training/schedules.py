"""GARLIC's training schedules by the training settings' ``schedule`` name: ``compact`` (the alternating decoupled
optimisation, ``garlic.training.alternating``) and ``reference`` (the reference code's loop,
``garlic.training.reference_schedule``)."""

from __future__ import annotations

from garlic.config import ConfigError
from garlic.models.network_config import NetworkConfig
from garlic.training.alternating import AlternatingTrainer
from garlic.training.reference_schedule import ReferenceTrainer
from garlic.training.trainer import Trainer
from garlic.training.training_config import TrainingConfig

TRAINERS = {"compact": AlternatingTrainer, "reference": ReferenceTrainer}


def make_trainer(network: NetworkConfig, training: TrainingConfig, num_variables: int, num_static: int) -> Trainer:
    """The trainer of ``training.schedule``, fitting a fresh network of ``network``."""
    if training.schedule not in TRAINERS:
        raise ConfigError(f"schedule must be one of {', '.join(TRAINERS)}, got {training.schedule!r}")
    return TRAINERS[training.schedule](network, training, num_variables, num_static)
