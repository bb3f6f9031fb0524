"""GARLIC and the project's baselines beyond the ICU: BasicMotions and JapaneseVowels of the UEA archive, made
irregular as Raindrop made PAM (``garlic.sources.uea``: 60% of each series' values removed at random), several
classes each.

    OMP_NUM_THREADS=1 python -m experiments.uea --seeds 0 1 2 3 4 --out docs/results

A loop of its own, because every method of ``garlic.methods.registry`` predicts the risk of a 0/1 outcome
(``garlic.methods.contract``: ``predict_proba`` gives one risk per stay, the fit loop selects on AUROC) and
``garlic train`` refuses these datasets. Here each method gives a probability per class, and the same parts of the
project do the rest (the source, the saved split and its training normalisation, the network, the features):

- ``garlic``: GARLIC's network (``garlic.models.compact.Garlic`` of the preset ``garlic/configs/uea.json``), its
  classifier ending in one logit per class (``ClassesGarlic``), trained on the schedule of
  ``garlic.training.alternating`` with the cross-entropy (CE) in place of the BCE: a reconstruction stage (MSE +
  lambda_cls CE + lambda_graph |A|, every parameter) and a prediction stage (CE, the prediction parameters), each
  group's rate halved after ``lr_patience`` epochs without progress on its objective, the stage switched after
  ``stage_patience`` epochs without a ``stage_tolerance`` drop of its validation objective (from the best epoch's
  weights); the best epoch is the lowest validation CE, and training stops after ``early_stopping`` epochs without
  a drop of ``early_stopping_tolerance``;
- ``logreg`` and ``gbm``: the summary baselines (``garlic.methods.summary``: first, last, lowest, highest and mean
  value and count of each variable, and their candidate settings), multinomial, the candidate of lowest
  validation CE kept;
- ``last_values``: the logistic regression of ``garlic/methods/template.py`` on each variable's last value,
  multinomial;
- ``raindrop``: PyPOTS's Raindrop (the ``pypots`` extra) with one output per class, at the sizes of
  ``garlic.methods.field.build``, trained by PyPOTS's own ``fit`` (lowest validation CE kept, ``patience`` 5), on
  the grid of the series' samples (``hourly_grid``: a sample a bin).

Seed s makes its own data and models: the source's irregularisation and validation draw with seed s (in
``--work``/seed_s/uea-COHORT, where the split is saved with its training normalisation) and every model with seed s.
The archive's test series are every seed's test part.

Scores: test accuracy and macro-F1 (the mean of the per-class F1 over the classes present), the mean over the seeds
with a 95% bootstrap interval over the test series (each resample draws the series once, for every seed and
method), and each method's paired difference with GARLIC on the same draws: a difference whose interval holds 0 is
a tie.

Imputation: on each seed's test series, ``garlic.evaluation.imputation.HIDDEN_SHARE`` of the values left are
hidden (seed s) and imputed from the rest, as ``experiments.imputation`` does on P12, by GARLIC's reconstruction head
(the seed's model: each value from what the variables sent over the graph from the previous ``window_size``
samples), the last value carried forward, linear interpolation between the neighbours left (the one that reads
later samples) and the training mean; normalised MAE (errors in training standard deviations), mean +/- std over the seeds and
GARLIC's paired difference per seed.

``--screen SEED ...`` first trains the variations of the preset (``SCREENED``) with those seeds and scores them on
their validation parts only, the test untouched: the screen that chose the preset's settings. ``--tables-only``
remakes the page from the tables at ``--out`` (``uea-predictions.csv.gz``, ``uea-imputation.csv``,
``uea-screen.csv``), training nothing.
"""

from __future__ import annotations

import argparse
import copy
import math
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss
from torch import nn

from garlic.config import Config
from garlic.data.batches import IrregularDataset, loader
from garlic.data.splits import load_splits
from garlic.evaluation.fit_and_test import split_parts
from garlic.evaluation.imputation import HIDDEN_SHARE, hide, reconstructed, simple_imputations
from garlic.evaluation.stats import BOOTSTRAP, mean_std
from garlic.io.atomic import atomic_file
from garlic.io.tables import MANIFEST, read_manifest
from garlic.io.tensors import load_tensors
from garlic.methods.field import hourly_grid, raindrop_on_pyg_scatter
from garlic.methods.summary import CANDIDATES, summary_features
from garlic.methods.template import LastValues
from garlic.models.compact import Garlic, graph_penalty
from garlic.models.network_config import NetworkConfig
from garlic.sources import uea
from garlic.studies import preset_config
from garlic.tracking.archive import GZIP
from garlic.training.alternating import GRADIENT_CLIP, AlternatingTrainer
from garlic.training.losses import PREDICTION, RECONSTRUCTION

COHORTS = tuple(uea.ARCHIVE_NAMES)
METHODS = ("garlic", "logreg", "gbm", "last_values", "raindrop")
IMPUTERS = ("garlic", "locf", "linear", "mean")
PRESET = "uea"
PROTOCOL = "subject-splits"
# The configurations screened on the validation parts (--screen), as overrides of uea.json, which is the one of
# lowest mean validation CE over both sets.
SCREEN_ROUNDS = (
    "in two rounds: the narrower network without the summary branch and five single changes of it, then three "
    "pairs of the changes that had lowered the validation CE"
)
NARROW = ["hidden_dim=32", "feature_dim=8"]
FASTER = ["lr_cls=3e-3", "lr_rec=3e-3"]
SCREENED = {
    "hidden 64, features 16, summary branch (uea.json)": [],
    "hidden 32, features 8": [*NARROW, "summary_branch=false"],
    "hidden 32, features 8, summary branch": NARROW,
    "hidden 64, features 16": ["summary_branch=false"],
    "hidden 32, features 8, lambda_cls 0.1": [*NARROW, "summary_branch=false", "lambda_cls=0.1"],
    "hidden 32, features 8, learning rates 3e-3": [*NARROW, "summary_branch=false", *FASTER],
    "hidden 32, features 8, joint training": [*NARROW, "summary_branch=false", "alternating=false"],
    "hidden 64, features 16, learning rates 3e-3": ["summary_branch=false", *FASTER],
    "hidden 32, features 8, summary branch, learning rates 3e-3": [*NARROW, *FASTER],
}
# Why a method gives one class to every series, where it is known (the page says it beside the table).
ONE_CLASS_WHY = {
    "gbm": (
        ": scikit-learn's histogram gradient boosting keeps at least 20 series in a leaf (its default "
        "min_samples_leaf), so on fewer than 40 training series its trees never split and it predicts from the class shares "
        "of the training part alone"
    )
}
# Raindrop's training as garlic.methods.field.FieldModel's defaults, its sizes as field.build's.
RAINDROP = {"hidden_dim": 64, "dropout": 0.2, "batch_size": 64, "epochs": 30, "patience": 5}


class ClassesGarlic(Garlic):
    """GARLIC's network with a logit per class: the classifier's last layer gives ``classes`` outputs behind a unit
    axis, so that ``Garlic.classifier_head``, which takes column 0 of its classifier's output (its one logit), gives
    all of them ([P, classes]); every other layer is GARLIC's, and ``prediction_parameters`` still holds the
    classifier."""

    def __init__(self, num_variables: int, num_static: int, config: NetworkConfig, classes: int):
        super().__init__(num_variables, num_static, config)
        hidden = self.classifier[-1].in_features
        self.classifier[-1] = nn.Sequential(nn.Linear(hidden, classes), nn.Unflatten(1, (1, classes)))


def stage_objectives(model: ClassesGarlic, output, batch, config: Config, reduction: str = "mean") -> dict:
    """The CE, the reconstruction error and both stages' objectives on a batch (``garlic.training.losses`` with the
    CE for the BCE)."""
    ce = F.cross_entropy(output.logits, batch.labels.long(), reduction=reduction)
    mse = model.reconstruction_loss(output, batch.values, batch.mask)
    return {
        "ce": ce,
        "mse": mse,
        RECONSTRUCTION: mse + config.lambda_cls * ce + config.lambda_graph * graph_penalty(model),
    }


@torch.no_grad()
def evaluate(model: ClassesGarlic, dataset: IrregularDataset, config: Config) -> dict:
    """Class probabilities [N, K] in dataset order and the mean CE, reconstruction error and stage objectives."""
    model.eval()
    probabilities, ce, mse = [], 0.0, 0.0
    for batch in loader(dataset, 128):
        output = model(batch.values, batch.mask, batch.times, batch.lengths, batch.static)
        probabilities.append(torch.softmax(output.logits, dim=-1))
        parts = stage_objectives(model, output, batch, config, reduction="sum")
        ce, mse = ce + float(parts["ce"]), mse + float(parts["mse"]) * len(batch)
    ce, mse = ce / len(dataset), mse / len(dataset)
    objectives = {RECONSTRUCTION: mse + config.lambda_cls * ce + config.lambda_graph * float(graph_penalty(model))}
    return {"probabilities": torch.cat(probabilities).numpy(), "ce": ce, "mse": mse, PREDICTION: ce, **objectives}


def fit_garlic(config: Config, parts: dict[str, IrregularDataset], classes: int) -> tuple[ClassesGarlic, dict]:
    """GARLIC of ``config`` fitted on ``parts["train"]``, its best epoch chosen on ``parts["validation"]`` (see the
    module's docstring); returns the model at its best epoch and what the fit did."""
    if config.lr_schedule != "plateau":
        raise ValueError(f"experiments.uea trains lr_schedule=plateau, not {config.lr_schedule!r}")
    train, validation = parts["train"], parts["validation"]
    torch.manual_seed(config.seed)
    tensors = train.tensors
    network = NetworkConfig.from_run(config)
    model = ClassesGarlic(len(tensors.variables), len(tensors.static_features), network, classes)
    optimisers = {
        RECONSTRUCTION: torch.optim.Adam(
            model.reconstruction_parameters(), lr=config.lr_rec, weight_decay=config.wd_rec
        ),
        PREDICTION: torch.optim.Adam(model.prediction_parameters(), lr=config.lr_cls, weight_decay=config.wd_cls),
    }
    schedulers = {
        name: torch.optim.lr_scheduler.ReduceLROnPlateau(optimiser, factor=0.5, patience=config.lr_patience)
        for name, optimiser in optimisers.items()
    }
    batches = loader(train, config.batch_size, shuffle=True, seed=config.seed)
    stage, best, best_epoch, improved, stale = RECONSTRUCTION, math.inf, 0, math.inf, 0
    stage_best, stage_stale, best_state, epoch = math.inf, 0, copy.deepcopy(model.state_dict()), 0
    while epoch < config.max_epochs:
        epoch += 1
        trained = AlternatingTrainer.trained_groups(stage)
        model.train()
        for parameter in model.reconstruction_parameters():
            parameter.requires_grad_(stage == RECONSTRUCTION)
        for batch in batches:
            output = model(batch.values, batch.mask, batch.times, batch.lengths, batch.static)
            objectives = stage_objectives(model, output, batch, config)
            for optimiser in optimisers.values():
                optimiser.zero_grad(set_to_none=True)
            objectives[stage if stage == RECONSTRUCTION else "ce"].backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRADIENT_CLIP)
            for name in trained:
                optimisers[name].step()
        for parameter in model.parameters():
            parameter.requires_grad_(True)
        checked = evaluate(model, validation, config)
        for name in trained:
            schedulers[name].step(checked[name])
        if checked["ce"] < best:
            best, best_epoch, best_state = checked["ce"], epoch, copy.deepcopy(model.state_dict())
        if checked["ce"] < improved - config.early_stopping_tolerance:
            improved, stale = checked["ce"], 0
        else:
            stale += 1
        if checked[stage] < stage_best * (1 - config.stage_tolerance):
            stage_best, stage_stale = checked[stage], 0
        else:
            stage_stale += 1
        if stale >= config.early_stopping:
            break
        if config.alternating and stage_stale >= config.stage_patience:
            stage = PREDICTION if stage == RECONSTRUCTION else RECONSTRUCTION
            stage_best, stage_stale = math.inf, 0
            model.load_state_dict(best_state)
    model.load_state_dict(best_state)
    model.eval()
    return model, {"epochs": epoch, "best_epoch": best_epoch, "validation_ce": best}


def in_class_order(model, features: np.ndarray, classes: int) -> np.ndarray:
    """A scikit-learn classifier's probabilities [N, classes], a column per class index (a class its training part
    lacked: 0)."""
    probabilities = np.zeros((len(features), classes))
    probabilities[:, model.classes_.astype(int)] = model.predict_proba(features)
    return probabilities


def fit_summary(kind: str, parts: dict[str, IrregularDataset], classes: int, seed: int) -> np.ndarray:
    """The summary baseline ``kind`` (its candidate of lowest validation CE): test probabilities [N, classes]."""
    features = {part: summary_features(dataset.tensors)[0] for part, dataset in parts.items()}
    kept = ~np.isnan(features["train"]).all(axis=0)
    labels = {part: dataset.labels.numpy().astype(int) for part, dataset in parts.items()}
    best, chosen = math.inf, None
    for _, model in CANDIDATES[kind](seed):
        model.fit(features["train"][:, kept], labels["train"])
        held_out = in_class_order(model, features["validation"][:, kept], classes)
        ce = log_loss(labels["validation"], np.clip(held_out, 1e-15, 1), labels=np.arange(classes))
        if ce < best:
            best, chosen = ce, model
    return in_class_order(chosen, features["test"][:, kept], classes)


def fit_last_values(parts: dict[str, IrregularDataset], classes: int, seed: int) -> np.ndarray:
    """``garlic/methods/template.py``'s logistic regression on the last values, multinomial: test probabilities."""
    model = LogisticRegression(C=LastValues().C, max_iter=1000, random_state=seed)
    model.fit(LastValues.features(parts["train"]), parts["train"].labels.numpy().astype(int))
    return in_class_order(model, LastValues.features(parts["test"]), classes)


def fit_raindrop(parts: dict[str, IrregularDataset], classes: int, seed: int) -> np.ndarray:
    """PyPOTS's Raindrop with ``classes`` outputs (``RAINDROP``), its own fit: test probabilities [N, classes]."""
    from pypots.classification import Raindrop  # the optional extra
    from pypots.utils.random import set_random_seed

    raindrop_on_pyg_scatter()
    train = parts["train"]
    samples = int(train.times.numpy().max()) + 1  # one bin a sample: times are the sample indices
    grids = {part: hourly_grid(dataset, samples) for part, dataset in parts.items()}
    variables = grids["train"].shape[-1]
    set_random_seed(seed)
    model = Raindrop(
        n_steps=samples,
        n_features=variables,
        n_classes=classes,
        n_layers=2,
        d_model=4 * variables,
        n_heads=2,
        d_ffn=RAINDROP["hidden_dim"],
        dropout=RAINDROP["dropout"],
        batch_size=RAINDROP["batch_size"],
        epochs=RAINDROP["epochs"],
        patience=RAINDROP["patience"],
        device="cpu",
        saving_path=None,
        verbose=False,
    )
    sets = {part: {"X": grids[part], "y": parts[part].labels.numpy().astype(np.int64)} for part in parts}
    model.fit(sets["train"], sets["validation"])
    return model.predict_proba({"X": grids["test"]})


def seed_data(work: Path, cohort: str, seed: int) -> tuple[dict[str, IrregularDataset], list[str]]:
    """Seed ``seed``'s dataset of ``cohort`` (made in ``work`` unless there with this seed and the default share),
    its split's three parts, normalised on the training part, and the class names."""
    folder = work / f"seed_{seed}" / f"uea-{cohort}"
    wanted = {"seed": seed, "drop_share": uea.DROP_SHARE, "drop_sensors": 0}
    made = (folder / MANIFEST).is_file() and {key: read_manifest(folder)["irregular"][key] for key in wanted} == wanted
    if not made:
        uea.preprocess(folder, cohort, seed=seed)
    tensors = load_tensors(folder)
    split = load_splits(folder, tensors, PROTOCOL, f"uea-{cohort}")[0]
    return split_parts(tensors, split), read_manifest(folder)["classes"]


def imputation_errors(model: ClassesGarlic, test: IrregularDataset, seed: int) -> dict[str, float]:
    """Normalised MAE of each of ``IMPUTERS`` on ``HIDDEN_SHARE`` of the test values left, hidden with ``seed``."""
    hidden = hide(test.mask.numpy() > 0, HIDDEN_SHARE, seed)
    left = test.mask * torch.from_numpy(~hidden)
    values = test.values * left
    guesses = simple_imputations(values, left, test.times)
    guesses["garlic"] = reconstructed(model, values, left, test.times, test.lengths, test.static)
    truth = test.values.numpy()[hidden]
    return {method: float(np.abs(guesses[method].numpy()[hidden] - truth).mean()) for method in IMPUTERS}


def run_seed(cohort: str, seed: int, work: Path, config: Config, methods: tuple[str, ...]) -> tuple[list, list]:
    """Every method of ``methods`` on seed ``seed`` of ``cohort``: predictions of the test series and imputation
    errors (GARLIC's model), as rows."""
    parts, classes = seed_data(work, cohort, seed)
    labels = parts["test"].labels.numpy().astype(int)
    predictions, imputation = [], []
    for method in methods:
        started = time.process_time()
        if method == "garlic":
            model, fit = fit_garlic(config.override({"seed": seed}), parts, len(classes))
            probabilities = evaluate(model, parts["test"], config)["probabilities"]
            errors = imputation_errors(model, parts["test"], seed)
            imputation += [
                {"dataset": cohort, "seed": seed, "method": m, "normalised_mae": e} for m, e in errors.items()
            ]
        elif method in ("logreg", "gbm"):
            probabilities, fit = fit_summary(method, parts, len(classes), seed), {}
        elif method == "last_values":
            probabilities, fit = fit_last_values(parts, len(classes), seed), {}
        else:
            probabilities, fit = fit_raindrop(parts, len(classes), seed), {}
        seconds = time.process_time() - started
        print(f"{cohort} seed {seed} {method}: {seconds:.1f} CPU s {fit}", flush=True)
        predictions.append(
            pd.DataFrame(
                {
                    "dataset": cohort,
                    "seed": seed,
                    "method": method,
                    "stay_id": parts["test"].stay_ids,
                    "label": labels,
                    "predicted": probabilities.argmax(axis=1),
                    "cpu_seconds": round(seconds, 1),
                }
            )
        )
    return predictions, imputation


def accuracy(predicted: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Accuracy under each row of ``weights`` [R, N] (counts of a resample; a row of ones: the plain one). -> [R]"""
    return (weights * (predicted == labels)).sum(axis=1) / weights.sum(axis=1)


def macro_f1(predicted: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The mean F1 over the classes present (true or predicted) under each row of ``weights`` [R, N], as
    scikit-learn's ``f1_score(average="macro")`` of the weighted series. -> [R]"""
    scores = []
    for k in np.union1d(predicted, labels):
        tp = (weights * ((predicted == k) & (labels == k))).sum(axis=1)
        wrong = (weights * ((predicted == k) != (labels == k))).sum(axis=1)  # false positives and negatives
        present = 2 * tp + wrong > 0
        scores.append(np.where(present, 2 * tp / np.where(present, 2 * tp + wrong, 1), np.nan))
    return np.nanmean(np.array(scores), axis=0)


SCORES = {"accuracy": accuracy, "macro_f1": macro_f1}


def scored(predictions: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per dataset and method: each score's mean over the seeds with its bootstrap interval; and each method's
    paired difference with GARLIC (see the module's docstring)."""
    rows, paired = [], []
    for cohort, on_set in predictions.groupby("dataset", sort=False):
        series = np.sort(on_set["stay_id"].unique())
        draws = np.random.default_rng(0).multinomial(len(series), np.full(len(series), 1 / len(series)), BOOTSTRAP)
        everyone = np.ones((1, len(series)))
        by_method = {}
        for method, units in on_set.groupby("method", sort=False):
            by_method[method] = {}
            for name, score in SCORES.items():
                observed, resampled = [], np.zeros(BOOTSTRAP)
                for _, unit in units.groupby("seed"):
                    unit = unit.set_index("stay_id").loc[series]
                    predicted, labels = unit["predicted"].to_numpy(), unit["label"].to_numpy()
                    observed.append(score(predicted, labels, everyone)[0])
                    resampled += score(predicted, labels, draws)
                by_method[method][name] = (np.array(observed), resampled / units["seed"].nunique())
            row = {"dataset": cohort, "method": method, "seeds": units["seed"].nunique()}
            for name, (observed, resampled) in by_method[method].items():
                low, high = np.percentile(resampled, [2.5, 97.5])
                row |= {name: observed.mean(), f"{name}_std": observed.std(), f"{name}_low": low, f"{name}_high": high}
            row["cpu_seconds_per_seed"] = units.groupby("seed")["cpu_seconds"].first().mean()
            rows.append(row)
        for method in by_method:
            if method == "garlic" or "garlic" not in by_method:
                continue
            row = {"dataset": cohort, "method": method}
            for name in SCORES:
                ours, theirs = by_method["garlic"][name], by_method[method][name]
                if len(ours[0]) != len(theirs[0]):
                    raise ValueError(f"{cohort}: garlic and {method} were not run on the same seeds")
                difference = ours[1] - theirs[1]
                low, high = np.percentile(difference, [2.5, 97.5])
                verdict = "win" if low > 0 else "loss" if high < 0 else "tie"
                row |= {
                    f"{name}_difference": (ours[0] - theirs[0]).mean(),
                    f"{name}_low": low,
                    f"{name}_high": high,
                    f"{name}_verdict": verdict,
                }
            paired.append(row)
    return pd.DataFrame(rows), pd.DataFrame(paired)


def interval(row: pd.Series, name: str) -> str:
    return f"{row[name]:.3f} [{row[f'{name}_low']:.3f}, {row[f'{name}_high']:.3f}]"


def one_class_notes(predictions: pd.DataFrame) -> list[str]:
    """A line for each method that gave one class to every test series of every seed of a set, with why where it
    is known (``ONE_CLASS_WHY``)."""
    notes = []
    for (cohort, method), units in predictions.groupby(["dataset", "method"], sort=False):
        if units.groupby("seed")["predicted"].nunique().max() == 1:
            why = ONE_CLASS_WHY.get(method, "")
            notes.append(f"{method} gives one class to every test series of {cohort}, in every seed{why}.")
    return notes


def report(
    command: str,
    table: pd.DataFrame,
    paired: pd.DataFrame,
    imputation: pd.DataFrame,
    screen: str,
    predictions: pd.DataFrame,
) -> str:
    """The page: the classification table, the paired differences, the imputation table, the screen."""
    seeds = int(table["seeds"].max())
    lines = [
        "# Beyond the ICU: two UEA sets made irregular",
        "",
        "Made by:",
        "",
        "```bash",
        command,
        "```",
        "",
        "BasicMotions (6 motion channels, 100 samples, 4 activities, 40 training and 40 test series) and "
        "JapaneseVowels (12 coefficients, 7-29 samples, 9 speakers, 270 and 370) of the UEA archive, made "
        f"irregular as Raindrop made PAM: {uea.DROP_SHARE:.0%} of each series' values removed at random "
        "(`garlic.sources.uea`). The archive's split, its training series less a stratified fifth for validation; "
        f"{seeds} seeds, each drawing its own removed values, validation fifth and model seed. GARLIC is its "
        "network with one logit per class, trained on its alternating schedule with cross-entropy "
        f"(preset `garlic/configs/{PRESET}.json`); the baselines are the project's, multinomial. The project's "
        "methods predict the risk of a 0/1 outcome, so `garlic train` refuses these sets and "
        "`experiments/uea.py` fits them (its docstring says how).",
        "",
        "Test accuracy and macro-F1: mean over the seeds [95% bootstrap interval over the test series]; CPU seconds "
        "of one seed's fit and test on one thread.",
        "",
        "| dataset | method | accuracy | macro-F1 | CPU s / seed |",
        "|---|---|---|---|---|",
    ]
    for _, row in table.iterrows():
        lines.append(
            f"| {row['dataset']} | {row['method']} | {interval(row, 'accuracy')} | {interval(row, 'macro_f1')} | "
            f"{row['cpu_seconds_per_seed']:.0f} |"
        )
    lines += [f"\n{note}" for note in one_class_notes(predictions)]
    lines += [
        "",
        "GARLIC minus each baseline, paired on the same seeds and test series (a tie: the interval holds 0):",
        "",
        "| dataset | baseline | accuracy | macro-F1 |",
        "|---|---|---|---|",
    ]
    for _, row in paired.iterrows():
        cells = [
            f"{row[f'{name}_difference']:+.3f} [{row[f'{name}_low']:+.3f}, {row[f'{name}_high']:+.3f}] "
            f"{row[f'{name}_verdict']}"
            for name in SCORES
        ]
        lines.append(f"| {row['dataset']} | {row['method']} | {' | '.join(cells)} |")
    lines += [
        "",
        "## Imputation",
        "",
        f"{HIDDEN_SHARE:.0%} of the test series' values left hidden (drawn with the seed) and imputed from the rest "
        "(`garlic.evaluation.imputation`, as `experiments.imputation` on P12): GARLIC's reconstruction head of the seed's model reads the previous "
        "samples only, as last-value carry-forward does; linear interpolation also reads the next value left. "
        "Normalised MAE (in training standard deviations), mean ± std over the seeds.",
        "",
        "| dataset | " + " | ".join(IMPUTERS) + " | GARLIC - locf per seed | GARLIC - linear per seed |",
        "|---|" + "---|" * (len(IMPUTERS) + 2),
    ]
    for cohort, on_set in imputation.groupby("dataset", sort=False):
        by_seed = on_set.pivot(index="seed", columns="method", values="normalised_mae")
        differences = [
            ", ".join(f"{d:+.3f}" for d in by_seed["garlic"] - by_seed[other]) for other in ("locf", "linear")
        ]
        cells = [mean_std(by_seed[method]) for method in IMPUTERS]
        lines.append(f"| {cohort} | {' | '.join(cells)} | {' | '.join(differences)} |")
    if screen:
        lines += ["", "## Configurations screened", "", screen]
    return "\n".join(lines) + "\n"


def run_screen(work: Path, seeds: list[int]) -> pd.DataFrame:
    """Every variation of ``SCREENED`` on each cohort with each of ``seeds``, scored on the validation part."""
    rows = []
    for cohort in COHORTS:
        for seed in seeds:
            parts, classes = seed_data(work, cohort, seed)
            for name, overrides in SCREENED.items():
                config = preset_config(PRESET, f"uea-{cohort}", [*overrides, f"seed={seed}"])
                started = time.process_time()
                model, fit = fit_garlic(config, parts, len(classes))
                checked = evaluate(model, parts["validation"], config)
                correct = checked["probabilities"].argmax(axis=1) == parts["validation"].labels.numpy()
                rows.append(
                    {
                        "dataset": cohort,
                        "seed": seed,
                        "configuration": name,
                        "overrides": " ".join(overrides),
                        "validation_ce": fit["validation_ce"],
                        "validation_accuracy": float(correct.mean()),
                        "epochs": fit["epochs"],
                        "best_epoch": fit["best_epoch"],
                        "cpu_seconds": round(time.process_time() - started, 1),
                    }
                )
                print(rows[-1], flush=True)
    return pd.DataFrame(rows)


def screen_text(screen: pd.DataFrame) -> str:
    """The screen's table: each configuration's validation CE and accuracy per set (mean over the screening
    seeds), the mean CE over both sets that chooses, and its CPU time."""
    per_set = screen.groupby(["configuration", "dataset"], sort=False).mean(numeric_only=True).reset_index()
    choosing = per_set.groupby("configuration", sort=False)["validation_ce"].mean()
    seeds = ", ".join(map(str, sorted(screen["seed"].unique())))
    lines = [
        f"{screen['configuration'].nunique()} configurations of GARLIC, screened {SCREEN_ROUNDS}; here each is "
        f"trained again with seeds {seeds} and scored on their validation parts only, the test unread. The lowest "
        f"validation cross-entropy (CE), averaged over both sets, chooses: {choosing.idxmin()}.",
        "",
        "| configuration | overrides of uea.json | set | validation CE | validation accuracy | epochs | CPU s |",
        "|---|---|---|---|---|---|---|",
    ]
    overrides = screen.groupby("configuration", sort=False)["overrides"].first().fillna("")
    for _, row in per_set.iterrows():
        lines.append(
            f"| {row['configuration']} | {overrides[row['configuration']] or '-'} | {row['dataset']} | "
            f"{row['validation_ce']:.4f} | {row['validation_accuracy']:.3f} | {row['epochs']:.0f} | "
            f"{row['cpu_seconds']:.0f} |"
        )
    lines += [
        "",
        "Mean validation CE over both sets: " + "; ".join(f"{n} {v:.4f}" for n, v in choosing.items()) + ".",
        "",
        "Before the screen, the first configuration (hidden 32, features 8, without the summary branch, at most 60 "
        "epochs) was run once on seed 0 with every method, its test series scored, to time the methods.",
    ]
    return "\n".join(lines)


def made_by(page: Path) -> str:
    """The command in the ``Made by`` block of a page this module wrote (``--tables-only`` keeps it)."""
    text = page.read_text() if page.is_file() else ""
    if "```bash\n" not in text:
        raise ValueError(f"{page}: no page with its command to remake; run without --tables-only")
    return text.split("```bash\n", 1)[1].split("\n```", 1)[0]


def write_table(path: Path, table: pd.DataFrame) -> None:
    """``table`` as CSV at ``path``, atomically; gzipped (the same rows, the same bytes) where it ends in .gz."""
    if path.suffix == ".gz":
        with atomic_file(path, "wb") as file:
            table.to_csv(file, index=False, float_format="%.6g", compression=GZIP)
        return
    with atomic_file(path, "w") as file:
        table.to_csv(file, index=False, float_format="%.6g")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.uea", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--datasets", nargs="+", choices=COHORTS, default=list(COHORTS))
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--work", type=Path, default=Path("data/uea"), help="where each seed's datasets are made")
    parser.add_argument("--out", type=Path, required=True, help="the folder of uea.md and its tables")
    parser.add_argument(
        "--screen", type=int, nargs="*", metavar="SEED", help="first screen SCREENED on these seeds' validation parts"
    )
    parser.add_argument(
        "--tables-only", action="store_true", help="remake the page from the tables at --out, training nothing"
    )
    args = parser.parse_args(argv)
    stem = args.out / "uea"
    paths = {kind: Path(f"{stem}-{kind}.csv") for kind in ("imputation", "screen")}
    paths["predictions"] = Path(f"{stem}-predictions.csv.gz")
    command = "OMP_NUM_THREADS=1 python -m experiments.uea " + shlex.join(argv if argv is not None else sys.argv[1:])
    if args.tables_only:
        predictions, imputation = pd.read_csv(paths["predictions"]), pd.read_csv(paths["imputation"])
        screen = pd.read_csv(paths["screen"]) if paths["screen"].is_file() else None
        command = made_by(Path(f"{stem}.md"))
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        screen = run_screen(args.work, args.screen) if args.screen else None
        if screen is not None:
            write_table(paths["screen"], screen)
        predictions, imputation = [], []
        for cohort in args.datasets:
            config = preset_config(PRESET, f"uea-{cohort}", [])
            for seed in args.seeds:
                made, errors = run_seed(cohort, seed, args.work, config, tuple(args.methods))
                predictions += made
                imputation += errors
        predictions, imputation = pd.concat(predictions, ignore_index=True), pd.DataFrame(imputation)
        write_table(paths["predictions"], predictions)
        write_table(paths["imputation"], imputation)
    table, paired = scored(predictions)
    write_table(Path(f"{stem}.csv"), table)
    write_table(Path(f"{stem}-paired.csv"), paired)
    text = report(command, table, paired, imputation, "" if screen is None else screen_text(screen), predictions)
    with atomic_file(Path(f"{stem}.md"), "w") as file:
        file.write(text)
    print(text)


if __name__ == "__main__":
    main()
