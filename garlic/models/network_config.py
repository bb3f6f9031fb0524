"""What a GARLIC network is built from: its architecture's settings alone, as nanoGPT's ``GPTConfig`` is to its
model, not the whole run configuration (data, optimisation, schedule, device).

    network = NetworkConfig.from_run(config)            # config: garlic.config.Config, checked as it was built
    model = build_model(num_variables, num_static, network)   # garlic.models.architectures

Each field means what the run config's key of the same name means and has its default; the run config checks the
values as it is built (``garlic.config.CHECKS``), one written out by hand (as tests do) is taken as it is. A saved
model folder keeps the run's config (``garlic.methods.model_files``), from which its network is built again by ``from_run``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from garlic.config import Config


@dataclass(frozen=True)
class NetworkConfig:
    architecture: str = Config.architecture  # compact | reference (garlic.models.architectures.ARCHITECTURES)
    hidden_dim: int = Config.hidden_dim  # H
    feature_dim: int = Config.feature_dim  # F
    window_size: int = Config.window_size  # W
    dropout: float = Config.dropout
    # the ablation switches (all on: the paper's model)
    use_missing_indicator: bool = Config.use_missing_indicator
    use_decay: bool = Config.use_decay
    per_variable_encoder: bool = Config.per_variable_encoder
    use_graph: bool = Config.use_graph
    use_gru: bool = Config.use_gru
    # the compact architecture's only (the reference refuses them set)
    use_static: bool = Config.use_static
    summary_branch: bool = Config.summary_branch
    hours_input: bool = Config.hours_input
    # the reference architecture's only
    signal_layout: str = Config.signal_layout

    @classmethod
    def from_run(cls, config: Config) -> "NetworkConfig":
        """The network settings of the run config ``config``."""
        return cls(**{item.name: getattr(config, item.name) for item in fields(cls)})
