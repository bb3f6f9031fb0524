"""GARLIC's training schedules by the config's ``schedule`` name: ``compact`` (the alternating decoupled
optimisation, ``garlic.training.alternating``) and ``reference`` (the reference code's loop,
``garlic.training.reference_schedule``)."""

from __future__ import annotations

from garlic.config import Config, ConfigError
from garlic.training.alternating import AlternatingTrainer
from garlic.training.reference_schedule import ReferenceTrainer
from garlic.training.trainer import Trainer

TRAINERS = {"compact": AlternatingTrainer, "reference": ReferenceTrainer}


def make_trainer(config: Config, num_variables: int, num_static: int) -> Trainer:
    """The trainer of ``config.schedule``."""
    if config.schedule not in TRAINERS:
        raise ConfigError(f"schedule must be one of {', '.join(TRAINERS)}, got {config.schedule!r}")
    return TRAINERS[config.schedule](config, num_variables, num_static)
