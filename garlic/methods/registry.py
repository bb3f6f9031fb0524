"""The method registry: every model the project trains, by name, with how to build it, the settings that identify a
trained one, and whether it is a simple baseline (the reference of the comparison's paired differences).

``garlic train --method NAME``, ``python -m experiments.baselines --methods NAME`` and ``python -m
experiments.compare --methods NAME`` read it, so that a new model is one entry (``docs/adding-a-model.md``):

    register(MethodSpec("toy", "a toy", build=lambda context: Toy(context.config.seed),
                        settings=lambda context: {"method": "toy", "seed": context.config.seed}))

A method is anything with ``garlic.evaluation.fit_and_test``'s ``fit`` and ``predict_proba``; ``settings`` is what, hashed, tells
one trained unit from another (a run with other settings is never reused), so an entry's settings must not change
once its runs are archived. The published numbers of the field live in one table of their own,
``garlic.evaluation.published``.
"""
from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass, replace
from typing import Callable

import pandas as pd

from garlic.config import Config
from garlic.methods.contract import Method
from garlic.methods.field import FieldModel, FieldSettings
from garlic.methods.garlic import GarlicEstimator
from garlic.methods.hourly import AlarmAfterHour, HourlyModel
from garlic.methods.recurrent import RecurrentModel, RecurrentSettings
from garlic.methods.summary import InputHours, SeverityScore, SummaryModel


@dataclass(frozen=True)
class MethodContext:
    """What a method is built from: the run's config (dataset, seed, device, epochs), the dataset's label table
    (``garlic.io.tables.LABELS``, where the severity scores are) and the graph planted in a synthetic cohort (its
    manifest's ``ground_truth_graph``, which GARLIC's learned graph is scored against; None for real data)."""

    config: Config
    labels: pd.DataFrame
    planted: list[dict] | None = None

    def with_config(self, config: Config) -> "MethodContext":
        return replace(self, config=config)

    @property
    def recurrent(self) -> RecurrentSettings:
        config = self.config
        return RecurrentSettings(max_epochs=config.max_epochs, early_stopping=config.early_stopping,
                                 seed=config.seed, device=config.device)  # fmt: skip

    @property
    def field(self) -> FieldSettings:
        config = self.config
        return FieldSettings(max_epochs=config.max_epochs, patience=config.early_stopping, seed=config.seed,
                             device=config.device)  # fmt: skip


@dataclass(frozen=True)
class MethodSpec:
    """A registered method: ``build`` a fresh, unfitted one; ``settings`` of a unit (hashed into its identity);
    ``simple``: a simple baseline; ``seeded``: trained once per model seed that a protocol names (GARLIC), where the
    others train once per split; ``needs_column``: a label-table column it cannot run without; ``needs_package``:
    the optional extra it cannot run without (``pyproject.toml``). Build one with ``create``."""

    name: str
    description: str
    build: Callable[[MethodContext], Method]
    settings: Callable[[MethodContext], dict]
    simple: bool = False
    seeded: bool = False
    needs_column: str | None = None
    needs_package: str | None = None

    def available(self, labels: pd.DataFrame) -> bool:
        return self.needs_column is None or self.needs_column in labels

    def installed(self) -> bool:
        return self.needs_package is None or importlib.util.find_spec(self.needs_package) is not None

    def check_installed(self) -> None:
        """A clear error naming the extra to install when the method's package is missing."""
        if not self.installed():
            raise ValueError(f"method {self.name} needs {self.needs_package}, an optional extra: "
                             f"bin/setup {self.needs_package} (or pip install -e '.[{self.needs_package}]')")  # fmt: skip

    def create(self, context: MethodContext) -> Method:
        """A fresh, unfitted method (``check_installed`` first)."""
        self.check_installed()
        return self.build(context)


METHODS: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
    """Add ``spec`` to the registry; a name already taken is refused."""
    if spec.name in METHODS:
        raise ValueError(f"a method named {spec.name!r} is already registered")
    METHODS[spec.name] = spec
    return spec


def method(name: str) -> MethodSpec:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; registered: {', '.join(METHODS)}")
    return METHODS[name]


def core_methods() -> list[str]:
    """Every method that needs no optional extra: ``experiments.baselines``'s default (the field's models from PyPOTS
    take hours on a CPU, so they run when named)."""
    return [name for name, spec in METHODS.items() if spec.needs_package is None]


def simple_baselines() -> list[str]:
    return [name for name, spec in METHODS.items() if spec.simple]


def _score(name: str, column: str) -> MethodSpec:
    return MethodSpec(name, f"the {column} score of the outcomes file, mapped to a risk by a logistic fit",
                      build=lambda context: SeverityScore(context.labels.set_index("stay_id")[column]),
                      settings=lambda context: {"method": name, "seed": context.config.seed},
                      needs_column=column)  # fmt: skip


def _summary(name: str) -> MethodSpec:
    kind, static = name.removesuffix("_static"), name.endswith("_static")
    model = {"logreg": "logistic regression", "gbm": "gradient boosting"}[kind]
    return MethodSpec(name, f"{model} on per-stay summaries{' and the static features' if static else ''}",
                      build=lambda context: SummaryModel(kind, static, context.config.seed),
                      settings=lambda context: {"method": name, "seed": context.config.seed}, simple=True)  # fmt: skip


def _recurrent(name: str, description: str) -> MethodSpec:
    return MethodSpec(name, description, build=lambda context: RecurrentModel(name, context.recurrent),
                      settings=lambda context: asdict(context.recurrent))  # fmt: skip


def _field(name: str, description: str) -> MethodSpec:
    return MethodSpec(f"pypots_{name}", f"{description}, PyPOTS's, on an hourly grid",
                      build=lambda context: FieldModel(name, context.field),
                      settings=lambda context: {"method": f"pypots_{name}", **asdict(context.field)},
                      needs_package="pypots")  # fmt: skip


for _spec in (
    _score("saps", "SAPS-I"),
    _score("sofa", "SOFA"),
    *(_summary(name) for name in ("logreg", "logreg_static", "gbm", "gbm_static")),
    MethodSpec("input_hours", "logistic regression on the hours of input alone (a protocol's length leak)",
               build=lambda context: InputHours(context.config.seed),
               settings=lambda context: {"method": "input_hours", "seed": context.config.seed}),
    *(MethodSpec(f"hourly_{kind}", f"{model} on features of the record up to each prediction time (hourly tasks)",
                 build=lambda context, kind=kind: HourlyModel(kind, context.config.seed),
                 settings=lambda context, kind=kind: {"method": f"hourly_{kind}", "seed": context.config.seed})
      for kind, model in (("gbm", "gradient boosting"), ("logreg", "logistic regression"))),
    MethodSpec("alarm_after_hour", "alarm at every hour from an ICU hour chosen on training (the utility's floor)",
               build=lambda context: AlarmAfterHour(), settings=lambda context: {"method": "alarm_after_hour"}),
    _recurrent("grud", "GRU-D (Che et al. 2018)"),
    _recurrent("decay_gru", "decay imputation + GRU, without the graph"),
    _field("raindrop", "Raindrop (Zhang et al. 2022)"),
    _field("seft", "SeFT (Horn et al. 2020)"),
    _field("brits", "BRITS (Cao et al. 2018)"),
    MethodSpec("garlic", "GARLIC with the config's settings",
               build=lambda context: GarlicEstimator(context.config, context.planted),
               settings=lambda context: context.config.to_dict(), seeded=True),
):
    register(_spec)
