"""One flat, typed configuration for a training run; shipped presets live in ``experiments/configs/``."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parents[1] / "experiments" / "configs"


class ConfigError(ValueError):
    """A configuration key or value that does not exist or does not parse."""


@dataclass
class Config:
    # data
    dataset: str = "synthetic"
    split_protocol: str = "five-split"
    use_static: bool = False
    # model
    architecture: str = "compact"  # compact (garlic.model) | reference (garlic.reference_model, the authors' code)
    signal_layout: str = "variables"  # reference only: variables (the paper) | code (the reference code's reshape)
    window_size: int = 3
    hidden_dim: int = 128
    feature_dim: int = 16
    dropout: float = 0.2
    # ablation switches (all on = the paper's model)
    use_missing_indicator: bool = True
    use_decay: bool = True
    per_variable_encoder: bool = True
    use_graph: bool = True
    use_gru: bool = True
    alternating: bool = True
    # a wide branch: running per-variable summaries (what the summary baselines see) into the classifier
    summary_branch: bool = False
    # optimisation
    batch_size: int = 64
    lr_cls: float = 1e-4
    lr_rec: float = 1e-3
    wd_cls: float = 1e-4
    wd_rec: float = 5e-4
    lambda_cls: float = 0.1
    lambda_graph: float = 1e-2
    balance_classes: bool = False  # weight the training BCE so that both outcomes count equally (see garlic.train)
    stage_patience: int = 3
    stage_tolerance: float = 0.01  # relative drop of a stage's validation objective that counts as progress
    lr_patience: int = 2  # epochs without a lower validation objective before a group's learning rate halves
    early_stopping: int = 10
    early_stopping_tolerance: float = 1e-3  # validation AUROC gain that resets the early-stopping count
    max_epochs: int = 100
    schedule: str = "compact"  # compact (AlternatingTrainer) | reference (ReferenceTrainer, the authors' main.py)
    seed: int = 0
    device: str = "auto"

    def to_dict(self) -> dict:
        return asdict(self)

    def override(self, assignments: list[str] | dict) -> "Config":
        """A copy with ``key=value`` strings (or a dict) applied, each value parsed as its field's type."""
        items = assignments.items() if isinstance(assignments, dict) else (_split(a) for a in assignments)
        types = {f.name: f.type for f in fields(self)}
        values = self.to_dict()
        for key, raw in items:
            if key not in types:
                raise ConfigError(f"unknown config key {key!r}; known keys: {', '.join(sorted(types))}")
            values[key] = _parse(key, raw, types[key])
        return Config(**values)

    @classmethod
    def load(cls, path: Path | str) -> "Config":
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            payload = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc})") from exc
        return cls().override(payload)

    @classmethod
    def for_dataset(cls, dataset: str) -> "Config":
        """The shipped preset for ``dataset`` (the paper's hyper-parameters where it gives them); a cohort's dataset
        (``physionet2019-early``) takes its source's preset (``physionet2019.json``)."""
        for name in (dataset, dataset.partition("-")[0]):
            preset = CONFIG_DIR / f"{name}.json"
            if preset.is_file():
                return cls.load(preset).override({"dataset": dataset})
        return cls(dataset=dataset)


def _split(assignment: str) -> tuple[str, str]:
    key, sep, value = assignment.partition("=")
    if not sep:
        raise ConfigError(f"expected key=value, got {assignment!r}")
    return key.strip(), value.strip()


def _parse(key: str, raw, kind: str):
    if not isinstance(raw, str):
        return raw
    try:
        if kind == "bool":
            if raw.lower() not in {"true", "false", "1", "0", "yes", "no"}:
                raise ValueError(raw)
            return raw.lower() in {"true", "1", "yes"}
        return {"int": int, "float": float, "str": str}[kind](raw)
    except ValueError as exc:
        raise ConfigError(f"config key {key!r} expects a {kind}, got {raw!r}") from exc
