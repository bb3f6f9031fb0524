"""One flat, typed configuration for a training run; shipped presets live in ``garlic/configs/``.

Every value is checked when a config is built, for its type and against ``CHECKS`` (ranges, choices): a bad value
fails before any data is read, naming its key. A new key adds one line to ``CHECKS``.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable

CONFIG_DIR = Path(__file__).resolve().parent / "configs"


class ConfigError(ValueError):
    """A configuration key or value that does not exist or does not parse."""


@dataclass
class Config:
    # data
    dataset: str = "synthetic"
    split_protocol: str = "five-split"
    use_static: bool = False
    # model
    architecture: str = (
        "compact"  # compact (garlic.models.compact) | reference (garlic.models.reference, the authors' code)
    )
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
    # the hours since admission of the time a risk is asked at, into the classifier: an hourly task's risk depends on
    # how far into the stay it is asked (the Sepsis Challenge's winners fed ICULOS to their trees)
    hours_input: bool = False
    # what a network learns at each prediction time: its label, or (on a task scored by the Sepsis Challenge's
    # utility) where an alarm gains utility, weighted by the gain (IrregularDataset.with_utility_targets)
    hourly_target: str = "label"
    # optimisation
    batch_size: int = 64
    lr_cls: float = 1e-4
    lr_rec: float = 1e-3
    wd_cls: float = 1e-4
    wd_rec: float = 5e-4
    lambda_cls: float = 0.1
    lambda_graph: float = 1e-2
    balance_classes: bool = (
        False  # weight the training BCE so that both outcomes count equally (see garlic.training.alternating)
    )
    stage_patience: int = 3
    stage_tolerance: float = 0.01  # relative drop of a stage's validation objective that counts as progress
    lr_schedule: str = "plateau"  # plateau (halve a group's rate without progress) | cosine (over max_epochs)
    lr_patience: int = 2  # plateau: epochs without a lower validation objective before a group's learning rate halves
    early_stopping: int = 10
    early_stopping_tolerance: float = 1e-3  # validation AUROC gain that resets the early-stopping count
    max_epochs: int = 100
    schedule: str = "compact"  # compact (AlternatingTrainer) | reference (ReferenceTrainer, the authors' main.py)
    seed: int = 0
    device: str = "auto"

    def __post_init__(self) -> None:
        for item in fields(self):
            value = _typed(item.name, getattr(self, item.name), item.type)
            setattr(self, item.name, value)
            check = CHECKS.get(item.name)
            expected = check(value) if check is not None else None
            if expected is not None:
                raise ConfigError(f"config key {item.name!r} must be {expected}, got {value!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    def override(self, assignments: list[str] | dict) -> "Config":
        """A copy with ``key=value`` strings (or a dict) applied, each value parsed as its field's type."""
        items = assignments.items() if isinstance(assignments, dict) else (split_assignment(a) for a in assignments)
        types = {f.name: f.type for f in fields(self)}
        values = self.to_dict()
        for key, raw in items:
            if key not in types:
                raise ConfigError(f"unknown config key {key!r}; known keys: {', '.join(sorted(types))}")
            values[key] = _parse(key, raw, types[key])
        return Config(**values)

    @classmethod
    def load(cls, path: Path | str, **overrides) -> "Config":
        """The config in the JSON file ``path`` (or the shipped preset of that name: ``physionet2012-fast``), with
        ``overrides`` applied before the values are checked."""
        path = Path(path)
        shipped = CONFIG_DIR / f"{path}.json"
        if not path.is_file() and path.suffix != ".json" and path.name == str(path) and shipped.is_file():
            path = shipped
        if not path.is_file():
            presets = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.json")))
            raise ConfigError(f"config file {path} does not exist (a shipped preset is named by its stem: {presets})")
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); a config is a JSON file") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc})") from exc
        if not isinstance(payload, dict):
            raise ConfigError(f"{path}: expected a JSON object of config keys, got {type(payload).__name__}")
        try:
            return cls().override({**payload, **overrides})
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None

    @classmethod
    def for_dataset(cls, dataset: str) -> "Config":
        """The shipped preset for ``dataset`` (the paper's hyper-parameters where it gives them); a cohort's dataset
        (``physionet2019-early``) takes its source's preset (``physionet2019.json``)."""
        preset = cls.preset_path(dataset)
        return cls.load(preset, dataset=dataset) if preset is not None else cls(dataset=dataset)

    @staticmethod
    def preset_path(dataset: str) -> Path | None:
        """The shipped preset file for ``dataset`` (or for its source), None when there is none."""
        for name in (dataset, dataset.partition("-")[0]):
            preset = CONFIG_DIR / f"{name}.json"
            if preset.is_file():
                return preset
        return None


def split_assignment(assignment: str) -> tuple[str, str]:
    """A ``--set`` assignment, ``key=value``, as (key, value)."""
    key, sep, value = assignment.partition("=")
    if not sep:
        raise ConfigError(f"expected key=value, got {assignment!r}")
    return key.strip(), value.strip()


KINDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}


def _parse(key: str, raw, kind: str, owner: str = "config key"):
    if not isinstance(raw, str):
        return raw
    try:
        if kind == "bool":
            if raw.lower() not in {"true", "false", "1", "0", "yes", "no"}:
                raise ValueError(raw)
            return raw.lower() in {"true", "1", "yes"}
        return {"int": int, "float": float, "str": str}[kind](raw)
    except ValueError as exc:
        raise ConfigError(f"{owner} {key!r} expects {KINDS[kind]}, got {raw!r}") from exc


def _typed(key: str, value, kind: str, owner: str = "config key"):
    """``value`` as a ``kind`` (an int is a float too), or a ConfigError: JSON files bypass ``_parse``."""
    if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    python = {"int": int, "float": float, "bool": bool, "str": str}[kind]
    if not isinstance(value, python) or (kind == "int" and isinstance(value, bool)):
        raise ConfigError(f"{owner} {key!r} expects {KINDS[kind]}, got {value!r}")
    return value


def setting_value(key: str, raw, kind: str, owner: str):
    """``raw`` (a ``--set`` string or a JSON value) as a ``kind`` ('int', 'float', 'bool', 'str'), held to the check of
    the config key of the same name where there is one (``CHECKS``): a method's own ``hidden_dim`` or ``dropout``
    means what GARLIC's does. Errors name the setting as ``owner`` says ("grud's setting")."""
    value = _typed(key, _parse(key, raw, kind, owner), kind, owner)
    check = CHECKS.get(key)
    expected = check(value) if check is not None else None
    if expected is not None:
        raise ConfigError(f"{owner} {key!r} must be {expected}, got {value!r}")
    return value


# Value checks: each returns None for a valid value, else what was expected ("from 1 to 4096").
def _from_to(low: float, high: float) -> Callable[[float], str | None]:
    """A finite value in [low, high]. The upper bounds are far above any useful setting; they stop a typo from
    asking for hundreds of GB (``hidden_dim=200000``) or training on an infinite rate into NaN."""
    shown = [str(int(bound)) if float(bound).is_integer() else f"{bound:g}" for bound in (low, high)]
    return lambda value: None if low <= value <= high else f"from {shown[0]} to {shown[1]}"


def _fraction(value: float) -> str | None:
    return None if 0 <= value < 1 else "at least 0 and below 1"


def _one_of(options: Callable[[], object]) -> Callable[[str], str | None]:
    """A choice among ``options()`` (called at check time, so that the list is read from where it is owned)."""

    def check(value: str) -> str | None:
        choices = sorted(options())
        return None if value in choices else f"one of {', '.join(choices)}"

    return check


def _dataset(value: str) -> str | None:
    from garlic.data.datasets import dataset_names, is_dataset

    return None if is_dataset(value) else f"one of {dataset_names()}"


def _protocols():
    from garlic.data.splits import PROTOCOLS  # imported here: it pulls in scikit-learn, and most configs need not

    return PROTOCOLS


def _device(value: str) -> str | None:
    return None if value in ("auto", "cpu") or re.fullmatch(r"cuda(:\d+)?", value) else "auto, cpu, cuda or cuda:N"


CHECKS: dict[str, Callable] = {
    "dataset": _dataset,
    "split_protocol": _one_of(_protocols),
    "architecture": _one_of(lambda: ("compact", "reference")),  # garlic.models.architectures.ARCHITECTURES (torch)
    "signal_layout": _one_of(lambda: ("variables", "code")),  # garlic.models.reference.SIGNAL_LAYOUTS
    "schedule": _one_of(lambda: ("compact", "reference")),  # garlic.training.schedules.TRAINERS
    "lr_schedule": _one_of(lambda: ("plateau", "cosine")),  # garlic.training.alternating.AlternatingTrainer
    "hourly_target": _one_of(lambda: ("label", "utility")),
    "window_size": _from_to(1, 512),
    "hidden_dim": _from_to(1, 4096),
    "feature_dim": _from_to(1, 1024),
    "dropout": _fraction,
    "batch_size": _from_to(1, 65536),
    "lr_cls": _from_to(0, 10),  # 0 freezes the group (tests do)
    "lr_rec": _from_to(0, 10),
    "wd_cls": _from_to(0, 10),
    "wd_rec": _from_to(0, 10),
    "lambda_cls": _from_to(0, 1e6),
    "lambda_graph": _from_to(0, 1e6),
    "stage_patience": _from_to(0, 100_000),  # 0: a stage ends at its first epoch without progress
    "stage_tolerance": _fraction,
    "lr_patience": _from_to(0, 100_000),
    "early_stopping": _from_to(1, 100_000),
    "early_stopping_tolerance": _from_to(0, 1),
    "max_epochs": _from_to(1, 100_000),
    "seed": _from_to(0, 2**32 - 1),  # numpy's seeds
    "device": _device,
}
