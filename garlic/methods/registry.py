"""The method registry: every model the project trains, by name, with the class that builds it, how the run's config
and the dataset feed its constructor, and whether it is a simple baseline (the reference of the comparison's paired
differences).

``garlic train --method NAME``, ``python -m experiments.baselines --methods NAME`` and ``python -m
experiments.compare --methods NAME`` read it, so that a new model is one entry (``docs/adding-a-model.md``):

    register(MethodSpec("last_values", "logistic regression on each variable's last value", LastValues))

A method's settings are its constructor's arguments (scikit-learn's ``get_params`` convention): an entry says which
of them it fixes (``fixed``: what its name implies), which it takes from the run's config (``from_run``: the seed,
the epoch budget, the device; GARLIC's network and training settings, from the preset's keys) and which it reads
from the dataset (``from_data``); the others keep their defaults
unless ``garlic train --set KEY=VALUE`` gives them (``MethodContext.settings``). ``MethodSpec.settings``, hashed,
tells one trained unit from another (a run with other settings is never reused), so an entry's settings must not
change once its runs are archived (``tests/test_methods.py`` pins them). The published numbers of the field live in
one table of their own, ``garlic.evaluation.published``.

An entry names its class by where it is (``"garlic.methods.summary:SummaryModel"``), imported when the method is
first built or asked about: reading a saved GARLIC back to score one stay builds it here without importing the other
methods (scikit-learn, MLflow, plotting). A class given as itself (``docs/adding-a-model.md``) is as good.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from dataclasses import dataclass, field, fields, replace
from typing import Callable

import pandas as pd

from garlic.config import Config, ConfigError, setting_value, split_assignment
from garlic.methods.contract import Method
from garlic.models.network_config import NetworkConfig
from garlic.training.training_config import TrainingConfig

CONFIG_KEYS = frozenset(item.name for item in fields(Config))
EPOCHS = {"max_epochs": "max_epochs", "early_stopping": "early_stopping", "seed": "seed", "device": "device"}
# GARLIC's settings, its network's and its training's, as a run config (a preset) gives them
GARLIC_SETTINGS = {"network": NetworkConfig.from_run, "training": TrainingConfig.from_run}


@dataclass(frozen=True)
class MethodContext:
    """What a method is built from: the run's config (dataset, seed, device, epochs), the dataset's label table
    (``garlic.io.tables.LABELS``, where the severity scores are), the graph planted in a synthetic cohort (its
    manifest's ``ground_truth_graph``, which GARLIC's learned graph is scored against; None for real data) and the
    method's own settings that ``--set`` gave (``MethodSpec.own_settings``; the others keep their defaults)."""

    config: Config
    labels: pd.DataFrame
    planted: list[dict] | None = None
    settings: dict = field(default_factory=dict)

    def with_config(self, config: Config) -> "MethodContext":
        return replace(self, config=config)


@dataclass(frozen=True)
class MethodSpec:
    """A registered method: ``make``, its class (or where it is, ``"module:Class"``), called with its constructor's
    arguments: ``fixed`` ones (what the entry's name implies: the kind of summary model), ``from_run`` ones (argument
    -> the run config's key it takes, or what builds it from the run config: GARLIC's ``NetworkConfig.from_run``),
    ``from_data`` ones (argument -> what reads it from the context: a severity score column), and the others at their
    defaults or as ``--set`` gave them. ``named``: whether its settings begin with its name (grud's and decay_gru's
    were archived without it); ``keyed_by_run``: whether its units are told apart by the run's whole config rather
    than by its name and arguments (GARLIC's were archived so, ``queries.identifying_config``: a preset is what
    names them). ``simple``: a simple baseline; ``seeded``:
    trained once per model seed that a protocol names (GARLIC), where the others train once per split;
    ``needs_column``: a label-table column it cannot run without; ``needs_package``: the optional extra it cannot run
    without (``pyproject.toml``). Build one with ``create``."""

    name: str
    description: str
    make: Callable[..., Method] | str
    fixed: dict = field(default_factory=dict)
    from_run: dict[str, str | Callable[[Config], object]] = field(default_factory=lambda: {"seed": "seed"})
    from_data: dict[str, Callable[[MethodContext], object]] = field(default_factory=dict)
    named: bool = True
    keyed_by_run: bool = False
    simple: bool = False
    seeded: bool = False
    needs_column: str | None = None
    needs_package: str | None = None

    def __post_init__(self) -> None:
        """An entry whose class is given as itself is checked as it is written (``check``); one that names where its
        class is, when the class is first imported (``tests/test_methods.py`` imports every entry's)."""
        if not isinstance(self.make, str):
            self.check(self.make)

    @property
    def method_class(self) -> Callable[..., Method]:
        """The method's class, imported (and checked) on first use where the entry names where it is."""
        if not isinstance(self.make, str):
            return self.make
        module, _, name = self.make.partition(":")
        found = getattr(importlib.import_module(module), name)
        self.check(found)
        return found

    def check(self, method_class: Callable[..., Method]) -> None:
        """Refuse an entry that names an argument its class does not take, or leaves one without a default unset."""
        parameters = dict(inspect.signature(method_class).parameters)
        given = [*self.fixed, *self.from_run, *self.from_data]
        unknown = [name for name in given if name not in parameters]
        unset = [
            name
            for name, parameter in parameters.items()
            if parameter.default is inspect.Parameter.empty and name not in given
        ]
        if unknown:
            raise ValueError(f"method {self.name}: {method_class.__name__} takes no argument {', '.join(unknown)}")
        if unset:
            raise ValueError(
                f"method {self.name}: nothing gives {', '.join(unset)}, which {method_class.__name__} "
                "takes without a default"
            )

    def parameters(self) -> dict[str, inspect.Parameter]:
        """The constructor's arguments, in order."""
        return dict(inspect.signature(self.method_class).parameters)

    def own_settings(self) -> list[str]:
        """The settings ``--set`` gives the method itself: its constructor's arguments that the entry neither fixes,
        nor takes from the run's config, nor reads from the dataset. GARLIC has none: its network's and its
        training's settings are built from the run's config (``GARLIC_SETTINGS``), which ``--set`` sets."""
        taken = {*self.fixed, *self.from_run, *self.from_data}
        return [name for name in self.parameters() if name not in taken]

    def checked_settings(self, settings: dict) -> dict:
        """``settings`` (``--set`` strings, or the values a saved method or a run recorded) as the method's own
        settings, each of its default's type and held to the config's check of that name (``setting_value``)."""
        own, parameters = self.own_settings(), self.parameters()
        checked = {}
        for key, raw in settings.items():
            if key not in own:
                raise ConfigError(
                    f"{key!r} is not a setting of method {self.name} "
                    f"(its settings: {', '.join(own) or 'none of its own'})"
                )
            kind = type(parameters[key].default).__name__
            if kind not in ("int", "float", "bool", "str"):
                raise ConfigError(f"{self.name}'s setting {key!r} cannot be set from the command line")
            checked[key] = setting_value(key, raw, kind, f"{self.name}'s setting")
        return checked

    def parse_settings(self, assignments: list[str]) -> tuple[list[str], dict]:
        """``--set KEY=VALUE`` assignments parted between the method and the run's config: a key of the method's own
        settings sets it; one it takes from the config under another name (PyPOTS's ``patience``, the config's
        ``early_stopping``) sets that config key; any other key of the config sets the config. A key that is neither
        is refused, naming both. Returns the config's assignments and the method's checked settings."""
        renamed = {argument: key for argument, key in self.from_run.items() if key in CONFIG_KEYS}
        own, to_config = {}, []
        for key, value in map(split_assignment, assignments):
            if key in self.own_settings():
                own[key] = value
            elif key in CONFIG_KEYS or key in renamed:
                to_config.append(f"{renamed.get(key, key)}={value}")
            else:
                own_keys = ", ".join(self.own_settings())
                method_keys = f", nor a setting of method {self.name} ({own_keys})" if own_keys else ""
                raise ConfigError(
                    f"unknown config key {key!r}{method_keys}; known config keys: {', '.join(sorted(CONFIG_KEYS))}"
                )
        return to_config, self.checked_settings(own)

    def arguments(self, context: MethodContext) -> dict:
        """The constructor's arguments for a unit of ``context``, less the fixed ones and those read from the data:
        the defaults, over them what the run gives (``from_run``), over that the method's own settings."""
        config = context.config
        arguments = {
            name: parameter.default
            for name, parameter in self.parameters().items()
            if name not in self.fixed and name not in self.from_data
        }
        arguments |= {
            argument: key(config) if callable(key) else getattr(config, key) for argument, key in self.from_run.items()
        }
        return arguments | self.checked_settings(context.settings)

    def settings(self, context: MethodContext) -> dict:
        """What tells a trained unit from another (hashed: ``garlic.studies.settings_digest``): the method's name and
        its arguments (``arguments``), which ``get_params`` of the method built gives back; a method ``keyed_by_run``
        (GARLIC), the run's config, as its units are archived (``queries.identifying_config``)."""
        if self.keyed_by_run:
            from garlic.tracking.queries import identifying_config  # MLflow: a saved method read back never asks

            return identifying_config(context.config)
        return ({"method": self.name} if self.named else {}) | self.arguments(context)

    def available(self, labels: pd.DataFrame) -> bool:
        return self.needs_column is None or self.needs_column in labels

    def installed(self) -> bool:
        return self.needs_package is None or importlib.util.find_spec(self.needs_package) is not None

    def check_installed(self) -> None:
        """A clear error naming the extra to install when the method's package is missing."""
        if not self.installed():
            raise ValueError(
                f"method {self.name} needs {self.needs_package}, an optional extra: "
                f"bin/setup {self.needs_package} (or pip install -e '.[{self.needs_package}]')"
            )

    def create(self, context: MethodContext) -> Method:
        """A fresh, unfitted method (``check_installed`` first)."""
        self.check_installed()
        data = {argument: read(context) for argument, read in self.from_data.items()}
        return self.method_class(**self.fixed, **data, **self.arguments(context))


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


def network_baselines() -> list[str]:
    """The baselines trained epoch by epoch, as GARLIC is (GRU-D, decay-GRU, PyPOTS's models)."""
    return [
        name for name, spec in METHODS.items() if hasattr(spec.method_class, "set_training_hooks") and not spec.seeded
    ]


def _score(name: str, column: str) -> MethodSpec:
    return MethodSpec(
        name,
        f"the {column} score of the outcomes file, mapped to a risk by a logistic fit",
        "garlic.methods.summary:SeverityScore",
        from_data={"scores": lambda context: context.labels.set_index("stay_id")[column]},
        needs_column=column,
    )


def _summary(name: str) -> MethodSpec:
    kind, static = name.removesuffix("_static"), name.endswith("_static")
    model = {"logreg": "logistic regression", "gbm": "gradient boosting"}[kind]
    return MethodSpec(
        name,
        f"{model} on per-stay summaries{' and the static features' if static else ''}",
        "garlic.methods.summary:SummaryModel",
        fixed={"kind": kind, "with_static": static},
        simple=True,
    )


def _recurrent(name: str, description: str) -> MethodSpec:
    return MethodSpec(
        name, description, "garlic.methods.recurrent:RecurrentModel", fixed={"name": name}, from_run=EPOCHS, named=False
    )


def _field(name: str, description: str) -> MethodSpec:
    return MethodSpec(
        f"pypots_{name}",
        f"{description}, PyPOTS's, on an hourly grid",
        "garlic.methods.field:FieldModel",
        fixed={"name": name},
        from_run={"max_epochs": "max_epochs", "patience": "early_stopping", "seed": "seed", "device": "device"},
        needs_package="pypots",
    )


for _spec in (
    _score("saps", "SAPS-I"),
    _score("sofa", "SOFA"),
    *(_summary(name) for name in ("logreg", "logreg_static", "gbm", "gbm_static")),
    MethodSpec(
        "input_hours",
        "logistic regression on the hours of input alone (a protocol's length leak)",
        "garlic.methods.summary:InputHours",
    ),
    *(
        MethodSpec(
            f"hourly_{kind}",
            f"{model} on features of the record up to each prediction time (hourly tasks)",
            "garlic.methods.hourly:HourlyModel",
            fixed={"kind": kind, "target": "label"},
        )
        for kind, model in (("gbm", "gradient boosting"), ("logreg", "logistic regression"))
    ),
    MethodSpec(
        "hourly_gbm_utility",
        "gradient boosting of whether an alarm gains the Sepsis Challenge's utility, each "
        "hour weighted by its gain (hourly tasks)",
        "garlic.methods.hourly:HourlyModel",
        fixed={"kind": "gbm", "target": "utility"},
    ),
    MethodSpec(
        "alarm_after_hour",
        "alarm at every hour from an ICU hour chosen on training (the utility's floor)",
        "garlic.methods.hourly:AlarmAfterHour",
        from_run={},
    ),
    _recurrent("grud", "GRU-D (Che et al. 2018)"),
    _recurrent("decay_gru", "decay imputation + GRU, without the graph"),
    _field("raindrop", "Raindrop (Zhang et al. 2022)"),
    _field("seft", "SeFT (Horn et al. 2020)"),
    _field("brits", "BRITS (Cao et al. 2018)"),
    MethodSpec(
        "garlic",
        "GARLIC with the config's settings",
        "garlic.methods.garlic:GarlicEstimator",
        fixed={"explain": True},
        from_run=GARLIC_SETTINGS,
        from_data={"planted": lambda context: context.planted},
        keyed_by_run=True,
        seeded=True,
    ),
    MethodSpec(
        "hourly_stacked",
        "hourly_gbm_utility on its features plus GARLIC's risk at each prediction time, GARLIC with the config's "
        "settings fitted first (a stacked model, hourly tasks)",
        "garlic.methods.stacked:HourlyStacked",
        fixed={"target": "utility"},
        from_run={**GARLIC_SETTINGS, "seed": "seed"},
        keyed_by_run=True,
        seeded=True,
    ),
    MethodSpec(
        "garlic_whole_stays",
        "GARLIC trained on whole stays, asked at each prediction time on the record "
        "up to it (the replay of a per-stay model)",
        "garlic.methods.garlic:WholeStaysGarlic",
        fixed={"explain": True},
        from_run=GARLIC_SETTINGS,
        from_data={"planted": lambda context: context.planted},
        keyed_by_run=True,
        seeded=True,
    ),
    MethodSpec(
        "last_values",
        "logistic regression on each variable's last value (garlic/methods/template.py)",
        "garlic.methods.template:LastValues",
    ),
):
    register(_spec)
