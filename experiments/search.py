"""A search for a better GARLIC configuration, on validation only, with Optuna.

    python -m experiments.search --dataset physionet2012 --protocol raindrop --splits 0 1 \\
        --preset physionet2012-fast --trials 30 --write-preset physionet2012-searched

Each trial takes the preset (``--preset``, with ``--set`` applied) and draws the values of ``SPACE`` (or of the
names given to ``--space``); it is trained on each screening split (``--splits`` of ``--protocol``), its best epoch
selected on validation as every run's is, and scored at that epoch (``--objective``), averaged over the screening
splits: the study maximises that. **The test parts are never read**: a trial's splits are built without
theirs. Confirm the best configuration on every split with ``experiments.compare``, where each protocol's test parts
are read once per final configuration.

- **The starting point**: a new study's first trial is the preset's own values (where they lie in the space), so
  that the report can say how far the best trial is from where the search began, on the same splits.
- **The objective** (``--objective``): the validation AUROC of the selected epoch (the default), the mean of its
  validation AUROC and AUPRC (``auroc+auprc``: a model is compared with the others in both), or, on a task scored
  by the Sepsis Challenge's utility (``physionet2019-hourly``), the selected epoch's validation utility at the
  threshold best for it (``utility``: what the early-warning table reads from a run's validation stays; no trial is
  pruned, an epoch's record does not hold it). A study keeps its own.
- **Pruning**: after every epoch of the first screening split, a trial reports that epoch's score; Optuna's median
  pruner stops it when it falls below the median of earlier trials at that epoch (after
  ``PRUNE_AFTER_TRIALS`` trials and ``PRUNE_AFTER_EPOCHS`` epochs).
- **The study** lives in an Optuna storage: ``sqlite:///<--mlruns>/optuna.db`` by default, or any database URL
  (``--storage postgresql://...``; its password is shown as ``***`` in the report and in every message). Several
  processes, on one machine or many, can run this command on the same ``--study`` at once, starting together on a
  new storage too (``rdb_storage``): each adds its ``--trials``, and the sampler sees them all. A study remembers
  its preset, protocol and screening splits, and refuses a process that names others.
- **Tracking**: every trial is an MLflow run of the experiment ``search-<dataset>`` in ``--mlruns``, tagged with the
  study and trial number, its parameters the trial's values, its metric the objective (``validation_auroc`` or
  ``validation_auroc_auprc``); each screening split is a nested run with the per-epoch curves. A pruned trial's
  runs end KILLED and tagged ``pruned``; an interrupted one's (Ctrl-C, SIGTERM) FAILED. A trial run is claimed
  (``garlic.tracking.store.claim_run``) while it trains, so that the runs a killed process left RUNNING are marked
  FAILED when the next search starts.
- **The budget** is ``--trials`` per process (and ``--timeout`` minutes); what was tried (complete, pruned, failed)
  is printed, beside the best trial.

``--write-preset NAME`` writes the best trial's configuration as ``garlic/configs/NAME.json``: NAME is a plain
name (letters, digits, '-', '_'), and a preset that exists, a shipped one or an earlier search's, is refused before
anything is searched (choose another name, or delete it).
``--out DIR`` writes the study's report, ``DIR/<study>.md``: the command, what was searched, the budget spent, the
best trial, each parameter's importance (Optuna's fANOVA) and every trial (also as ``-trials.csv``), with a figure
of the history (``-history.png``); and the study itself, its settings and finished trials, as an Optuna journal
(``DIR/<study>.jsonl``, JSON lines), again after every trial, so that a search stopped half-way loses only the
trials it was running. A storage without the study takes it from that journal first, so a search kept in the
repository goes on from any machine. ``--trials 0`` only writes the report of the study as it stands. Each trial
that ends prints one line: complete (with its score) or pruned, and the best so far.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shlex
import signal
import sys
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import mlflow  # noqa: E402
import numpy as np  # noqa: E402
import optuna  # noqa: E402
import optuna.visualization.matplotlib as optuna_plots  # noqa: E402
import pandas as pd  # noqa: E402
import sqlalchemy  # noqa: E402

from garlic import studies  # noqa: E402
from garlic.config import CONFIG_DIR, Config  # noqa: E402
from garlic.data.batches import IrregularDataset  # noqa: E402
from garlic.data.splits import Split  # noqa: E402
from garlic.io.atomic import atomic_file  # noqa: E402
from garlic.io.locks import locked  # noqa: E402
from garlic.io.tensors import IrregularTensors  # noqa: E402
from garlic.methods.garlic import GarlicEstimator  # noqa: E402
from garlic.metrics.utility import choose_threshold, stay_lengths  # noqa: E402
from garlic.tracking.store import claim_run  # noqa: E402
from garlic.training.trainer import EpochRecord  # noqa: E402

# What a trial draws: (kind, low, high) for a float ('log': on a log scale) or ('choice', options).
SPACE = {
    "lr_cls": ("log", 1e-4, 1e-2),
    "lr_rec": ("log", 1e-4, 1e-2),
    "wd_cls": ("log", 1e-6, 1e-2),
    "lambda_cls": ("log", 0.1, 3.0),
    "lambda_graph": ("log", 1e-4, 1e-1),
    "dropout": ("float", 0.0, 0.5),
    "hidden_dim": ("choice", [32, 64, 128]),
    "feature_dim": ("choice", [4, 8, 16]),
    "window_size": ("choice", [2, 3, 4, 6]),
    "batch_size": ("choice", [64, 128, 256]),
    "stage_patience": ("choice", [0, 1, 3]),
    "balance_classes": ("choice", [False, True]),
    "max_epochs": ("choice", [10, 15, 20]),
    # the hourly task's own choices (physionet2019-hourly): what each hour learns, and whether the hour is read
    "hourly_target": ("choice", ["label", "utility"]),
    "hours_input": ("choice", [False, True]),
}
PRUNE_AFTER_TRIALS = 5
PRUNE_AFTER_EPOCHS = 3
# A running trial records a heartbeat this often; one silent for GRACE_SECONDS (its process was killed) is marked
# FAILED when a process opens the study, instead of staying "running" in the study for ever.
HEARTBEAT_SECONDS = 60
GRACE_SECONDS = 300
PRESET_NAME = re.compile(r"[A-Za-z0-9_-]+")  # what --write-preset takes: a file of CONFIG_DIR, never a path


class Objective(NamedTuple):
    """What a trial is scored by (``--objective``), at its selected epoch: each epoch's ``score`` (also what the
    pruner compares), or, where an epoch's record cannot say it, ``after_fit`` of the fitted estimator on the
    validation part (then nothing is pruned)."""

    metric: str  # the MLflow metric and the trials table's column
    wording: str  # how the report names it
    score: Callable[[EpochRecord], float] | None
    after_fit: Callable[[GarlicEstimator, IrregularDataset], float] | None = None


def validation_utility(estimator: GarlicEstimator, validation: IrregularDataset) -> float:
    """The Sepsis Challenge's normalised utility of the validation risks at the threshold best for them
    (``garlic.metrics.utility.choose_threshold``): what the hourly task's table reads from a run's validation
    stays."""
    times = validation.prediction_times
    risks = np.asarray(estimator.predict_proba(validation), dtype=np.float64)
    return choose_threshold(times.label, risks, stay_lengths(times.stay)).normalised_utility


OBJECTIVES = {
    "auroc": Objective("validation_auroc", "validation AUROC", lambda record: record.val_auroc),
    "auroc+auprc": Objective(
        "validation_auroc_auprc",
        "mean of validation AUROC and AUPRC",
        lambda record: (record.val_auroc + record.val_auprc) / 2,
    ),
    "utility": Objective(
        "validation_utility", "validation utility (the Challenge's, at its best threshold)", None, validation_utility
    ),
}
DEFAULT_OBJECTIVE = "auroc"  # also what every study made before ``--objective`` existed searched
log = logging.getLogger("experiments")


def draw(trial: optuna.Trial, names: list[str]) -> dict:
    """The trial's values of the ``SPACE`` entries ``names``."""
    values = {}
    for name in names:
        kind, *bounds = SPACE[name]
        if kind == "choice":
            values[name] = trial.suggest_categorical(name, bounds[0])
        else:
            values[name] = trial.suggest_float(name, bounds[0], bounds[1], log=kind == "log")
    return values


@contextmanager
def tracked_run(**start):
    """An MLflow run that ends FINISHED, KILLED (a pruned trial) or FAILED (an error, Ctrl-C or SIGTERM:
    ``sigterm_as_exit``)."""
    run = mlflow.start_run(**start)
    status = "FAILED"
    try:
        yield run
        status = "FINISHED"
    except optuna.TrialPruned:
        mlflow.set_tag("pruned", "true")
        status = "KILLED"
        raise
    finally:
        mlflow.end_run(status)


def validation_score(
    config: Config,
    tensors: IrregularTensors,
    split: Split,
    trial: optuna.Trial | None,
    objective: Objective,
) -> float:
    """Fit on the split's training part, select on its validation part (reporting each epoch's score to ``trial``
    for pruning, where the objective has one), and return the objective at the selected epoch. The test part is not
    built."""
    train, validation = (
        IrregularDataset(tensors.subset(split.positions(tensors, part)), split.normalisation)
        for part in ("train", "validation")
    )

    score = objective.score

    def report(record: EpochRecord) -> None:
        trial.report(score(record), record.epoch)
        if trial.should_prune():
            raise optuna.TrialPruned(f"score {score(record):.4f} at epoch {record.epoch}")

    estimator = GarlicEstimator.of_run(config, explain=False)
    estimator.set_training_hooks(on_epoch=None if trial is None or score is None else report)
    estimator.fit(train, validation)
    if objective.after_fit is not None:  # the estimator keeps its selected epoch's weights
        return objective.after_fit(estimator, validation)
    result = estimator.fit_result_
    return next(score(r) for r in result.history if r.epoch == result.best_epoch)


def objective(base: Config, cohort: studies.Cohort, names: list[str], study_name: str, goal: str, store: Path):
    """A trial: its runs in the MLflow ``store``, the trial's run claimed while it trains, so that a search started
    after this process was killed marks them FAILED (``garlic.tracking.store.mark_dead_runs_failed``)."""
    metric = OBJECTIVES[goal].metric

    def run_trial(trial: optuna.Trial) -> float:
        values = draw(trial, names)
        config = base.override(values)
        tags = {"study": "search", "optuna_study": study_name, "trial": str(trial.number)}
        with tracked_run(run_name=f"trial_{trial.number}", tags=tags) as run, claim_run(store, run.info.run_id):
            mlflow.log_params(values)
            scores = []
            for position, split in enumerate(cohort.splits):
                with tracked_run(run_name=split.name, nested=True, tags=tags):
                    mlflow.log_param("split", split.name)
                    scored = validation_score(
                        config, cohort.tensors, split, trial if position == 0 else None, OBJECTIVES[goal]
                    )
                    mlflow.log_metric(metric, scored)
                scores.append(scored)
            value = sum(scores) / len(scores)
            mlflow.log_metric(metric, value)
        return value

    return run_trial


def in_space(name: str, value) -> bool:
    kind, *bounds = SPACE[name]
    return value in bounds[0] if kind == "choice" else bounds[0] <= value <= bounds[1]


def goal_of(searched: optuna.Study) -> str:
    """The study's ``OBJECTIVES`` key: studies made before it was a choice searched AUROC."""
    return searched.user_attrs.get("identity", {}).get("objective", DEFAULT_OBJECTIVE)


def without_password(text: str) -> str:
    """``text`` (a database URL, or ``--option=URL``) with the URL's password shown as ``***``: no report, message
    or log line holds one."""
    option, equals, url = text.partition("=") if text.startswith("-") else ("", "", text)
    try:
        parsed = sqlalchemy.engine.make_url(url)
    except sqlalchemy.exc.ArgumentError:  # not a URL
        return text
    return text if parsed.password is None else option + equals + parsed.render_as_string(hide_password=True)


@contextmanager
def one_at_a_time(url: str):
    """Hold the lock of the SQLite file at ``url`` (``.NAME.lock`` beside it) for the ``with`` block, so that
    processes starting together on it open it one at a time; nothing for a database server, which processes on other
    machines open too (``rdb_storage``)."""
    database = sqlalchemy.engine.make_url(url)
    if database.get_backend_name() != "sqlite" or database.database in (None, "", ":memory:"):
        yield
        return
    path = Path(database.database)
    with locked(path.with_name(f".{path.name}.lock")):
        yield


def rdb_storage(url: str) -> optuna.storages.RDBStorage:
    """The Optuna storage at ``url``, its trials sending heartbeats (``HEARTBEAT_SECONDS``).

    Optuna makes a new storage's schema in steps that two processes starting together both take, and the second
    then dies on a duplicate (an ``IntegrityError`` on ``alembic_version``): a SQLite file is opened
    ``one_at_a_time``; a database server is opened again after that error, the schema being there by then."""

    def opened() -> optuna.storages.RDBStorage:
        with warnings.catch_warnings():  # heartbeats are "experimental" in Optuna since 2.9; we rely on no detail
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(url, heartbeat_interval=HEARTBEAT_SECONDS, grace_period=GRACE_SECONDS)

    try:
        return opened()
    except sqlalchemy.exc.IntegrityError:
        return opened()


def open_study(
    name: str, url: str, identity: dict, sampler_seed: int | None, start: dict | None = None
) -> optuna.Study:
    """The study ``name`` in the storage at ``url`` (made when new), after checking that it searches what
    ``identity`` says (preset, dataset, protocol, screening splits, objective, searched names, fixed settings);
    trials whose process died are marked FAILED (``GRACE_SECONDS``). A new study's first trial is ``start`` (the
    preset's own values) when it lies in the space: every later trial is then compared with the starting point on
    the same splits."""
    with one_at_a_time(url):  # a new storage's schema, and a new study's identity and starting point, made once
        searched = optuna.create_study(
            study_name=name,
            storage=rdb_storage(url),
            direction="maximize",
            load_if_exists=True,
            sampler=optuna.samplers.TPESampler(seed=sampler_seed),
            pruner=optuna.pruners.MedianPruner(PRUNE_AFTER_TRIALS, PRUNE_AFTER_EPOCHS),
        )
        known = searched.user_attrs.get("identity")
        if known is None:
            searched.set_user_attr("identity", identity)
            if start and all(in_space(key, value) for key, value in start.items()):
                searched.enqueue_trial(start, user_attrs={"starting_point": True})
    if known is not None:  # a study made before the objective was a choice searched AUROC (``goal_of``)
        known, identity = ({"objective": DEFAULT_OBJECTIVE, **settings} for settings in (known, identity))
        if known != identity:
            changed = sorted(key for key in identity.keys() | known.keys() if identity.get(key) != known.get(key))
            raise SystemExit(
                f"study {name!r} in {without_password(url)} searches other settings "
                f"({', '.join(changed)}): name another --study, or repeat the first process's "
                "arguments"
            )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(searched)
    return searched


def preset_refusal(name: str) -> str | None:
    """Why ``--write-preset NAME`` is refused (a path, or a preset that exists: a shipped one is never overwritten),
    or None."""
    if not PRESET_NAME.fullmatch(name):
        return f"--write-preset {name}: a preset's name is letters, digits, '-' and '_'"
    path = CONFIG_DIR / f"{name}.json"
    return f"--write-preset {name}: {path} exists; choose another name, or delete it" if path.exists() else None


def write_preset(target: str, preset: str, fixed: dict, best: dict) -> Path:
    """The preset's file with the settings fixed for the search (``--set``) and the best trial's values:
    ``garlic/configs/<target>.json``, made new (``preset_refusal``: another process of the study may have
    written it since this one started)."""
    settings = json.loads((CONFIG_DIR / f"{preset}.json").read_text()) | fixed | best
    with locked(CONFIG_DIR):
        refusal = preset_refusal(target)
        if refusal is not None:
            raise SystemExit(refusal)
        with atomic_file(CONFIG_DIR / f"{target}.json", "w") as file:
            file.write(json.dumps(settings, indent=2) + "\n")
    return CONFIG_DIR / f"{target}.json"


def summary(searched: optuna.Study) -> str:
    states = [trial.state for trial in searched.trials]
    counts = {state.name.lower(): states.count(state) for state in optuna.trial.TrialState if states.count(state)}
    lines = [f"study {searched.study_name}: {len(states)} trials ({', '.join(f'{n} {s}' for s, n in counts.items())})"]
    if counts.get("complete"):
        best = searched.best_trial
        metric = OBJECTIVES[goal_of(searched)].metric
        lines.append(f"best: trial {best.number}, {metric} {best.value:.4f}, {json.dumps(best.params)}")
    return "\n".join(lines)


def starting_point(searched: optuna.Study) -> optuna.trial.FrozenTrial | None:
    return next((t for t in searched.trials if t.user_attrs.get("starting_point")), None)


def trials_table(searched: optuna.Study) -> pd.DataFrame:
    """One row per trial: its state, objective (a pruned trial: its last reported score and epoch) and drawn
    values."""
    rows = []
    for trial in searched.trials:
        last_epoch = max(trial.intermediate_values, default=None)
        rows.append(
            {
                "trial": trial.number,
                "state": trial.state.name.lower(),
                OBJECTIVES[goal_of(searched)].metric: trial.value,
                "last_reported_epoch": last_epoch,
                "last_reported": None if last_epoch is None else trial.intermediate_values[last_epoch],
                "minutes": None if trial.duration is None else round(trial.duration.total_seconds() / 60, 1),
                **trial.params,
            }
        )
    return pd.DataFrame(rows)


def importances(searched: optuna.Study) -> dict[str, float] | str:
    """Each searched parameter's share of the objective's variance over the complete trials (Optuna's fANOVA), or
    why there is none yet."""
    complete = [t for t in searched.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if len(complete) < 2:
        return f"not computed: {len(complete)} complete trial(s), fANOVA needs two or more"
    return optuna.importance.get_param_importances(searched)


def report(command: str, searched: optuna.Study, trials: pd.DataFrame, name: str) -> str:
    identity = searched.user_attrs.get("identity", {})
    wording = OBJECTIVES[goal_of(searched)].wording
    weights = importances(searched)
    lines = [
        f"# Search: {identity.get('preset')} on {identity.get('dataset')} {identity.get('protocol')}",
        "",
        "Made by (the study lives in its Optuna storage; `--trials 0` remakes this page from it):",
        "",
        "```bash",
        command,
        "```",
        "",
        f"Study `{searched.study_name}`: each trial trains the preset with the drawn values on the screening "
        f"splits {identity.get('splits')} of `{identity.get('protocol')}`, selects its epoch on validation and "
        f"is scored by its {wording} at that epoch, averaged over the splits. No test part was read. Searched: "
        f"{', '.join(f'`{n}`' for n in identity.get('space', []))}.",
        "",
        f"**Budget:** {summary(searched)}.",
        "",
    ]
    complete = trials[trials.state == "complete"]
    if len(complete):
        best = searched.best_trial
        lines += [
            f"**Best:** trial {best.number}, {wording} {best.value:.4f}, "
            + ", ".join(
                f"`{key}={value:.4g}`" if isinstance(value, float) else f"`{key}={value}`"
                for key, value in best.params.items()
            )
            + ".",
            "",
        ]
        start = starting_point(searched)
        if start is not None and start.value is not None:
            lines += [
                f"**Starting point** (the preset's own values): trial {start.number}, {wording} "
                f"{start.value:.4f}; the best is {best.value - start.value:+.4f} from it, on the same splits.",
                "",
            ]
    lines += ["## Importance of each parameter", ""]
    if isinstance(weights, str):
        lines += [weights, ""]
    else:
        table = pd.DataFrame({"parameter": list(weights), "importance": [f"{v:.3f}" for v in weights.values()]})
        lines += [studies.markdown(table), ""]
    shown = trials.copy()
    for column in shown.columns:
        if shown[column].dtype.kind == "f":
            shown[column] = shown[column].map(lambda v: "" if pd.isna(v) else f"{v:.4g}")
    lines += [
        "## History",
        "",
        f"![history]({name}-history.png)",
        "",
        "## Every trial",
        "",
        studies.markdown(shown),
        "",
    ]
    return "\n".join(lines)


def archive_study(searched: optuna.Study, path: Path) -> None:
    """The study's settings and finished trials as an Optuna journal (JSON lines) at ``path``, written whole: kept
    beside its report, it outlives the machine and its storage (``restore_study``)."""
    partial = path.with_name(f".{path.name}.partial")
    partial.unlink(missing_ok=True)
    journal = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(partial)))
    kept = optuna.create_study(study_name=searched.study_name, storage=journal, direction="maximize")
    for key, value in searched.user_attrs.items():
        kept.set_user_attr(key, value)
    kept.add_trials([trial for trial in searched.trials if trial.state.is_finished()])
    partial.replace(path)


def restore_study(name: str, url: str, path: Path) -> int:
    """Copy study ``name`` from its journal at ``path`` into the storage at ``url`` where that has no such study;
    returns the number of trials copied (0: nothing to restore)."""
    if not path.is_file():
        return 0
    with one_at_a_time(url):  # copied once, by the first of the processes starting together
        storage = rdb_storage(url)
        if name in optuna.get_all_study_names(storage):
            return 0
        journal = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))
        optuna.copy_study(from_study_name=name, from_storage=journal, to_storage=storage)
        return len(optuna.load_study(study_name=name, storage=storage).trials)


def write_report(folder: Path, command: str, searched: optuna.Study) -> Path:
    """``folder/<study>.md``, ``-trials.csv`` and ``-history.png``, and the study itself as ``<study>.jsonl``
    (``archive_study``); returns the page's path."""
    name = searched.study_name
    folder.mkdir(parents=True, exist_ok=True)
    # The processes of a study each write after their own trials: one at a time, each from the study as it is then,
    # so that the files written last hold every finished trial (and the journal's temporary is one writer's).
    with locked(folder):
        trials = trials_table(searched)
        with atomic_file(folder / f"{name}-trials.csv", "w") as file:
            trials.to_csv(file, index=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            axes = optuna_plots.plot_optimization_history(searched, target_name=OBJECTIVES[goal_of(searched)].metric)
        with atomic_file(folder / f"{name}-history.png") as file:
            axes.figure.savefig(file, format="png", dpi=120, bbox_inches="tight")
        plt.close(axes.figure)
        with atomic_file(folder / f"{name}.md", "w") as file:
            file.write(report(command, searched, trials, name))
        archive_study(searched, folder / f"{name}.jsonl")
    return folder / f"{name}.md"


def after_each_trial(out: Path | None, command: str) -> Callable[[optuna.Study, optuna.trial.FrozenTrial], None]:
    """Optuna's callback after every trial of this process: a line saying how it ended and where the study stands,
    and, with ``out``, the report and journal written again (``write_report``), so that a search stopped half-way (a
    lost machine, Ctrl-C) has every finished trial in the repository already."""

    def report_trial(searched: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        metric = OBJECTIVES[goal_of(searched)].metric
        ended = trial.state.name.lower()
        if trial.state == optuna.trial.TrialState.COMPLETE:
            ended += f", {metric} {trial.value:.4f}"
        elif trial.intermediate_values:
            epoch = max(trial.intermediate_values)
            ended += f" at epoch {epoch} ({trial.intermediate_values[epoch]:.4f})"
        finished = any(t.state == optuna.trial.TrialState.COMPLETE for t in searched.trials)
        best = searched.best_trial if finished else None  # Optuna's best_trial raises before a trial completes
        standing = f"; best so far trial {best.number}, {best.value:.4f}" if best else ""
        print(f"trial {trial.number}: {ended}{standing}", flush=True)
        if out is not None:
            write_report(out, command, searched)

    return report_trial


def storage_url(text: str) -> str:
    """An argparse type: an Optuna storage URL that can be opened here: one SQLAlchemy parses, of a database it knows,
    with its driver installed and, for a SQLite file, its folder present (else the error came after the cohort had
    loaded, as a traceback)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        url = make_url(text)
    except ArgumentError:
        raise argparse.ArgumentTypeError(
            f"is not a database URL: {text!r} (expected DATABASE://..., such as "
            "sqlite:///PATH/optuna.db or postgresql://USER@HOST/NAME)"
        ) from None
    try:
        url.get_dialect().import_dbapi()
    except NoSuchModuleError:
        raise argparse.ArgumentTypeError(
            f"SQLAlchemy knows no database {url.get_backend_name()!r} in {url.render_as_string()!r}"
        ) from None
    except ImportError as exc:
        raise argparse.ArgumentTypeError(
            f"the driver of {url.drivername} is not installed ({exc.name}); install it or use sqlite:///PATH"
        ) from None
    folder = Path(url.database).parent if url.get_backend_name() == "sqlite" and url.database else None
    if folder is not None and not folder.is_dir():
        raise argparse.ArgumentTypeError(f"the folder {folder} of the SQLite file does not exist")
    return text


@contextmanager
def sigterm_as_exit():
    """SIGTERM raises ``SystemExit(143)`` in the ``with`` block, as Ctrl-C raises ``KeyboardInterrupt``: the runs of
    the trial under way end FAILED (``tracked_run``) instead of staying RUNNING."""

    def stop(number: int, frame) -> None:
        raise SystemExit(128 + number)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.search", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    studies.add_common_arguments(parser)
    parser.add_argument("--protocol", help="the screening splits' protocol (default: the preset's)")
    parser.add_argument("--space", nargs="+", choices=sorted(SPACE), help="search these names only (default: all)")
    parser.add_argument(
        "--trials", type=int, default=20, help="trials this process adds (default 20; 0: only report the study)"
    )
    parser.add_argument("--timeout", type=float, metavar="MINUTES", help="stop starting trials after this long")
    parser.add_argument("--study", help="the study's name (default: search-<preset>-<protocol>)")
    parser.add_argument(
        "--storage", type=storage_url, help="an Optuna storage URL (default: sqlite:///<--mlruns>/optuna.db)"
    )
    parser.add_argument("--sampler-seed", type=int, help="seed of the TPE sampler (default: none)")
    parser.add_argument(
        "--objective",
        choices=list(OBJECTIVES),
        default=DEFAULT_OBJECTIVE,
        help="what a trial is scored by at its selected epoch: validation AUROC (default), the mean "
        "of validation AUROC and AUPRC, or (a task scored by the Challenge's utility) the validation utility",
    )
    parser.add_argument("--write-preset", metavar="NAME", help="write the best trial's configuration as a preset")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    optuna.logging.set_verbosity(optuna.logging.INFO if args.verbose else optuna.logging.WARNING)
    if args.trials < 0:
        parser.error("--trials must be 0 (only report) or more")
    if not args.preset:
        parser.error("--preset is required: the configuration the search starts from")
    if args.write_preset is not None and preset_refusal(args.write_preset):
        parser.error(preset_refusal(args.write_preset))
    fixed = [*args.set, *([f"max_epochs={args.max_epochs}"] if args.max_epochs else [])]
    base = studies.study_config(args)
    protocol = args.protocol or base.split_protocol
    base = base.override({"split_protocol": protocol})
    indices = args.splits or [0]
    # only a search reads the data: the report of a study (--trials 0) is made from its storage or journal alone
    cohort = studies.load_cohort(args.dataset, args.data_root, protocol, indices) if args.trials else None
    names = args.space or list(SPACE)
    name = args.study or f"search-{args.preset}-{protocol}"
    args.mlruns.mkdir(parents=True, exist_ok=True)
    storage = args.storage or f"sqlite:///{(args.mlruns / 'optuna.db').resolve()}"
    unsearched = base.override({name: getattr(Config, name) for name in names}).to_dict() | {"device": None}
    identity = {
        "preset": args.preset,
        "dataset": args.dataset,
        "protocol": protocol,
        "objective": args.objective,
        "splits": indices,
        "space": sorted(names),
        "settings": unsearched,
    }
    restored = 0 if args.out is None else restore_study(name, storage, args.out / f"{name}.jsonl")
    if restored:
        print(f"study {name} restored from {args.out / f'{name}.jsonl'}: {restored} trials")
    searched = open_study(name, storage, identity, args.sampler_seed, {key: getattr(base, key) for key in names})
    studies.open_experiment(f"search-{args.dataset}", args.mlruns)
    given = argv if argv is not None else sys.argv[1:]
    command = "python -m experiments.search " + shlex.join(map(without_password, given))
    if args.trials:
        with sigterm_as_exit():
            searched.optimize(
                objective(base, cohort, names, name, goal_of(searched), args.mlruns),
                n_trials=args.trials,
                timeout=None if args.timeout is None else 60 * args.timeout,
                catch=(),
                callbacks=[after_each_trial(args.out, command)],
            )
    print(summary(searched))
    if args.out is not None:
        print(f"report written to {write_report(args.out, command, searched)}")
    if args.write_preset and any(t.state == optuna.trial.TrialState.COMPLETE for t in searched.trials):
        kept = {key: base.to_dict()[key] for key in (assignment.partition("=")[0] for assignment in fixed)}
        path = write_preset(args.write_preset, args.preset, kept, searched.best_params)
        print(f"best configuration written to {path}")


if __name__ == "__main__":
    main()
