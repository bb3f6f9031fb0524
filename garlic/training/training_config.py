"""How a GARLIC network is trained: its schedule's settings alone, beside the network's own (``NetworkConfig``), not the
whole run configuration (dataset, split protocol, the network's shape).

    training = TrainingConfig.from_run(config)          # config: garlic.config.Config, checked as it was built
    trainer = make_trainer(network, training, num_variables, num_static)   # garlic.training.schedules

Each field means what the run config's key of the same name means and has its default; the run config checks the
values as it is built (``garlic.config.CHECKS``), one written out by hand (as tests do) is taken as it is. Together
with ``NetworkConfig`` they are every key of a run config but its data (``dataset``, ``split_protocol``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from garlic.config import Config


@dataclass(frozen=True)
class TrainingConfig:
    schedule: str = Config.schedule  # compact (AlternatingTrainer) | reference (ReferenceTrainer)
    alternating: bool = Config.alternating  # the stages take turns (off: the ablation that trains jointly)
    hourly_target: str = Config.hourly_target  # label | utility: what the network learns at each prediction time
    batch_size: int = Config.batch_size
    lr_cls: float = Config.lr_cls
    lr_rec: float = Config.lr_rec
    wd_cls: float = Config.wd_cls
    wd_rec: float = Config.wd_rec
    lambda_cls: float = Config.lambda_cls
    lambda_graph: float = Config.lambda_graph
    balance_classes: bool = Config.balance_classes
    stage_patience: int = Config.stage_patience
    stage_tolerance: float = Config.stage_tolerance
    lr_schedule: str = Config.lr_schedule
    lr_patience: int = Config.lr_patience
    early_stopping: int = Config.early_stopping
    early_stopping_tolerance: float = Config.early_stopping_tolerance
    max_epochs: int = Config.max_epochs
    seed: int = Config.seed
    device: str = Config.device

    @classmethod
    def from_run(cls, config: Config) -> "TrainingConfig":
        """The training settings of the run config ``config``."""
        return cls(**{item.name: getattr(config, item.name) for item in fields(cls)})
