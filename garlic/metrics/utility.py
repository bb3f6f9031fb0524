"""The PhysioNet/Computing in Cardiology Challenge 2019's scores of hourly sepsis alarms, and its files.

The Challenge (Reyna et al., Crit Care Med 2020; its code: github.com/physionetchallenges/evaluation-2019,
``evaluate_sepsis_score.py``) scores a binary alarm at every hour of every stay. ``SepsisLabel`` is 1 from six hours
before onset, so a septic stay's onset is ``t_sepsis`` = its first labelled hour - ``DT_OPTIMAL`` (first + 6). An
hour t of a septic stay, ``r = t - t_sepsis`` hours from onset, is worth:

- alarmed: ``max(U_FP, MAX_U_TP * (r - DT_EARLY) / (DT_OPTIMAL - DT_EARLY))`` up to r = ``DT_OPTIMAL`` (0 at 12 h
  before onset, 1 at 6 h before, -0.05 earlier than 12 h); then falling linearly to 0 at r = ``DT_LATE`` (3 h after);
- silent: 0 up to r = ``DT_OPTIMAL``; then falling linearly to ``MIN_U_FN`` (-2) at r = ``DT_LATE``;
- either, later than ``DT_LATE`` (r > 3): 0.

An hour of a stay never labelled is worth ``U_FP`` (-0.05) alarmed and ``U_TN`` (0) silent. Only the first labelled
hour counts (a label that falls back to 0 changes nothing); a stay labelled from its first hour has its window
partly before the stay; a stay that ends before ``t_sepsis + DT_LATE`` loses the rest of its window. A stay's
utility is the sum over its hours; the normalised utility of a set of stays is
``(observed - inaction) / (best - inaction)`` over their sums, where inaction never alarms and the best alarms
exactly at the hours r in [``DT_EARLY``, ``DT_LATE``] of each septic stay (the Challenge's own "best"). Without a
septic stay both are 0, and the Challenge's ratio is NaN (no false alarm) or -inf, as here. There is no other
weighting.

Each hour's worth depends on its own alarm only, so every score here is a few array passes over the flat hours of
all stays (``lengths`` gives each stay's hours, in order), and the best threshold is one sort and a cumulative sum.

The files, as the Challenge's evaluation reads them: a label file ``pNNNNNN.psv`` is pipe-separated with a header row
naming a ``SepsisLabel`` column (the training data's 41 columns, or that one alone); its prediction file, of the same
name in another folder, has the header ``PredictedProbability|PredictedLabel`` and a row per hour. Where the
Challenge's code warns (a probability outside [0, 1]), skips (an empty cell) or pairs files by their sorted order,
reading here refuses the file with one line naming it, the line and the column (``ChallengeFileError``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import astuple, dataclass
from pathlib import Path

import numpy as np

from garlic.io.atomic import atomic_file

# The Challenge's parameters (evaluate_sepsis_score.py): hours from onset, and the utilities.
DT_EARLY, DT_OPTIMAL, DT_LATE = -12, -6, 3
MAX_U_TP, MIN_U_FN, U_FP, U_TN = 1.0, -2.0, -0.05, 0.0
# The three lines u = slope * r + intercept, with the Challenge's own slopes and intercepts (so the same rounding).
_RISE = MAX_U_TP / (DT_OPTIMAL - DT_EARLY)  # an alarm, up to DT_OPTIMAL
_FALL = -MAX_U_TP / (DT_LATE - DT_OPTIMAL)  # an alarm, after DT_OPTIMAL
_MISS = MIN_U_FN / (DT_LATE - DT_OPTIMAL)  # no alarm, after DT_OPTIMAL
_RISE_AT_0, _FALL_AT_0, _MISS_AT_0 = -_RISE * DT_EARLY, -_FALL * DT_LATE, -_MISS * DT_OPTIMAL

SEPSIS_UTILITY = "sepsis-utility"  # a task's ``score`` (the processed manifest's ``task``) scored here
LABEL_COLUMN = "SepsisLabel"
PROBABILITY_COLUMN, PREDICTION_COLUMN = "PredictedProbability", "PredictedLabel"
SUFFIX = ".psv"


class ChallengeFileError(ValueError):
    """A label or prediction file the Challenge's scores cannot be computed from; the message names the file, and
    the line and column where one is at fault."""


# ---------------------------------------------------------------------------------------------------------------
# Scores


@dataclass(frozen=True)
class HourWorth:
    """What each hour of a set of stays is worth, flat over the stays' hours in order."""

    alarmed: np.ndarray  # [hours] the utility of an alarm at this hour
    silent: np.ndarray  # [hours] the utility of no alarm
    best: np.ndarray  # [hours] bool: the hours the Challenge's best predictor alarms
    stay: np.ndarray  # [hours] the position of the hour's stay in ``lengths``

    def total(self, alarms: np.ndarray) -> np.float64:
        return np.where(alarms, self.alarmed, self.silent).sum()


def _checked_hours(labels, lengths) -> tuple[np.ndarray, np.ndarray]:
    labels, lengths = np.asarray(labels), np.asarray(lengths)
    if labels.ndim != 1 or lengths.ndim != 1 or not np.issubdtype(lengths.dtype, np.integer) or (lengths < 0).any():
        raise ValueError("expected labels as one flat array over every hour and lengths as non-negative integers")
    if lengths.sum() != len(labels):
        raise ValueError(f"the stays' lengths add up to {lengths.sum()} hours, but there are {len(labels)} labels")
    if not np.isin(labels, (0, 1)).all():
        raise ValueError("expected labels 0 or 1")
    return labels.astype(bool), lengths.astype(np.int64)


def _checked_alarms(alarms, hours: int) -> np.ndarray:
    alarms = np.asarray(alarms)
    if alarms.shape != (hours,) or not np.isin(alarms, (0, 1)).all():
        raise ValueError(f"expected a prediction 0 or 1 for each of the {hours} hours")
    return alarms.astype(bool)


def hour_worth(labels, lengths) -> HourWorth:
    """The Challenge's utility of an alarm and of silence at every hour of stays of ``lengths`` hours, whose
    ``SepsisLabel`` at each hour, flat over the stays, is ``labels``."""
    labels, lengths = _checked_hours(labels, lengths)
    stay = np.repeat(np.arange(len(lengths)), lengths)
    hour = np.arange(len(labels)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    labelled = np.flatnonzero(labels)  # in order, so a stay's first is its first labelled hour
    septic_stays, first = np.unique(stay[labelled], return_index=True)
    onset = np.zeros(len(lengths), dtype=np.int64)
    onset[septic_stays] = hour[labelled[first]] - DT_OPTIMAL
    is_septic = np.zeros(len(lengths), dtype=bool)
    is_septic[septic_stays] = True
    septic = is_septic[stay]
    r = (hour - onset[stay]).astype(np.float64)
    before, window = r <= DT_OPTIMAL, (DT_OPTIMAL < r) & (r <= DT_LATE)
    alarmed = np.where(before, np.maximum(_RISE * r + _RISE_AT_0, U_FP), np.where(window, _FALL * r + _FALL_AT_0, 0.0))
    silent = np.where(window, _MISS * r + _MISS_AT_0, 0.0)
    return HourWorth(
        alarmed=np.where(septic, alarmed, U_FP),
        silent=np.where(septic, silent, U_TN),
        best=septic & (DT_EARLY <= r) & (r <= DT_LATE),
        stay=stay,
    )


def utility_targets(labels, lengths) -> tuple[np.ndarray, np.ndarray]:
    """What the utility rewards at each hour, as a weighted classification: (whether an alarm there gains over
    silence, by how much it gains or loses). The gain (``hour_worth``: alarmed - silent) is positive from 12 h before
    onset to 3 h after, -0.05 at the other hours of a stay, 0 more than 3 h after onset and at 12 h before. A
    predictor that alarms exactly where the expected gain is positive maximises the expected utility, hour by hour,
    and a classifier weighted by the gain's size learns that decision (cost-sensitive learning)."""
    worth = hour_worth(labels, lengths)
    gain = worth.alarmed - worth.silent
    return gain > 0, np.abs(gain)


def stay_utilities(labels, predictions, lengths) -> np.ndarray:
    """The Challenge's utility of each stay (its ``compute_prediction_utility``): the sum over its hours."""
    worth = hour_worth(labels, lengths)
    predictions = _checked_alarms(predictions, len(worth.stay))
    utility = np.where(predictions, worth.alarmed, worth.silent)
    return np.bincount(worth.stay, weights=utility, minlength=len(np.asarray(lengths)))


def _normalised(worth: HourWorth, alarms: np.ndarray) -> float:
    inaction, best = worth.silent.sum(), worth.total(worth.best)
    with np.errstate(divide="ignore", invalid="ignore"):  # no septic stay: divided by 0, as the Challenge does
        return float((worth.total(alarms) - inaction) / (best - inaction))


def normalised_utility(labels, predictions, lengths) -> float:
    """The Challenge's normalised utility of binary ``predictions`` over all stays: (observed - inaction) /
    (best - inaction); 1 for the best alarms, 0 for none. Without a septic stay the Challenge divides by 0: NaN
    without a false alarm, -inf with one."""
    worth = hour_worth(labels, lengths)
    return _normalised(worth, _checked_alarms(predictions, len(worth.stay)))


@dataclass(frozen=True)
class ThresholdChoice:
    threshold: float  # alarm when the probability >= threshold
    normalised_utility: float  # on the stays it was chosen on
    alarms: int  # hours alarmed there


def choose_threshold(labels, probabilities, lengths) -> ThresholdChoice:
    """The alarm threshold (alarm when probability >= threshold) of highest normalised utility on these stays.

    Every distinct probability is a candidate, and so is alarming never (a threshold just above the highest
    probability): hours sorted by falling probability, the utility gained by alarming the first k of them is a
    cumulative sum. Of thresholds that tie, the highest (the fewest alarms) is chosen.
    """
    worth = hour_worth(labels, lengths)
    probabilities = np.asarray(probabilities, dtype=np.float64)
    if probabilities.shape != worth.stay.shape or not ((0 <= probabilities) & (probabilities <= 1)).all():
        raise ValueError(f"expected a probability from 0 to 1 for each of the {len(worth.stay)} hours")
    if not worth.best.any():
        raise ValueError("no septic stay: every threshold's normalised utility is undefined (0 / 0)")
    order = np.argsort(-probabilities, kind="stable")
    falling = probabilities[order]
    gained = np.cumsum((worth.alarmed - worth.silent)[order])
    last_of_each = np.flatnonzero(np.r_[falling[1:] != falling[:-1], True])  # alarming down to each distinct value
    gains = np.r_[0.0, gained[last_of_each]]
    chosen = int(np.argmax(gains))  # the first maximum: the highest threshold
    threshold = falling[last_of_each[chosen - 1]] if chosen else np.nextafter(falling[0], np.inf)
    alarms = probabilities >= threshold
    return ThresholdChoice(float(threshold), _normalised(worth, alarms), int(alarms.sum()))


def challenge_auroc_auprc(labels, probabilities) -> tuple[float, float]:
    """AUROC and AUPRC as the Challenge computes them (its ``compute_auc``), over all hours together.

    Its thresholds are 1 and every distinct probability below it, down to the lowest one above 0; at each, the hours
    with probability >= threshold are alarmed. AUROC is the trapezoid area under specificity against sensitivity;
    AUPRC sums each step in recall times the precision after it. With every probability strictly between 0 and 1
    these are scikit-learn's ``roc_auc_score`` and ``average_precision_score``; hours at exactly 1 or 0 differ:
    the curve starts at the threshold 1 (already past the hours at 1) and stops before 0 (never reaching them).
    """
    labels = np.asarray(labels).astype(bool)
    probabilities = np.asarray(probabilities, dtype=np.float64)
    thresholds = np.unique(probabilities)[::-1]
    if thresholds[0] != 1:
        thresholds = np.r_[1.0, thresholds]
    if thresholds[-1] == 0:
        thresholds = thresholds[:-1]
    order = np.argsort(probabilities, kind="stable")
    below = np.searchsorted(probabilities[order], thresholds, side="left")  # hours under each threshold
    positives_below = np.r_[0, np.cumsum(labels[order])][below]
    positives, negatives = int(labels.sum()), int((~labels).sum())
    tp, fp = positives - positives_below, negatives - (below - positives_below)
    tpr = tp / positives if positives else np.ones(len(thresholds))
    tnr = (negatives - fp) / negatives if negatives else np.ones(len(thresholds))
    ppv = np.divide(tp, tp + fp, out=np.ones(len(thresholds)), where=(tp + fp) > 0)
    auroc = float(np.sum(0.5 * np.diff(tpr) * (tnr[1:] + tnr[:-1])))
    auprc = float(np.sum(np.diff(tpr) * ppv[1:]))
    return auroc, auprc


@dataclass(frozen=True)
class ChallengeScores:
    """The Challenge's five scores, in the order and with the names its evaluation prints."""

    auroc: float
    auprc: float
    accuracy: float
    f_measure: float
    utility: float  # normalised

    NAMES = ("AUROC", "AUPRC", "Accuracy", "F-measure", "Utility")

    def table(self) -> str:
        """The two lines the Challenge's ``evaluate_sepsis_score.py`` prints: the names, then the values."""
        return "|".join(self.NAMES) + "\n" + "|".join(str(value) for value in astuple(self))


def challenge_scores(labels, probabilities, predictions, lengths) -> ChallengeScores:
    """AUROC and AUPRC of ``probabilities``, accuracy, F-measure and normalised utility of ``predictions``, over all
    hours of all stays, as the Challenge computes them (accuracy and F-measure are 1 where they would be 0 / 0)."""
    worth = hour_worth(labels, lengths)
    labels = np.asarray(labels).astype(bool)
    probabilities = np.asarray(probabilities, dtype=np.float64)
    predictions = _checked_alarms(predictions, len(labels))
    if probabilities.shape != labels.shape or not len(labels):
        raise ValueError(f"expected a probability for each of the {len(labels)} hours, and at least one hour")
    auroc, auprc = challenge_auroc_auprc(labels, probabilities)
    tp, fp = int((labels & predictions).sum()), int((~labels & predictions).sum())
    fn, tn = int((labels & ~predictions).sum()), int((~labels & ~predictions).sum())
    accuracy = (tp + tn) / (tp + fp + fn + tn)
    f_measure = 2 * tp / (2 * tp + fp + fn) if 2 * tp + fp + fn else 1.0
    return ChallengeScores(auroc, auprc, accuracy, f_measure, _normalised(worth, predictions))


def stay_lengths(stay: np.ndarray) -> np.ndarray:
    """The number of hours of each stay, from the stay of every hour (hours grouped by stay, in order)."""
    stay = np.asarray(stay)
    starts = np.flatnonzero(np.r_[True, stay[1:] != stay[:-1]]) if len(stay) else np.zeros(0, np.int64)
    return np.diff(np.r_[starts, len(stay)]).astype(np.int64)


# Per stay, what every ward-level score below is summed from (``stay_parts``), so that a table keeps these and not
# every hour, and a bootstrap over stays redraws rows.
STAY_PARTS = ("hours", "observed", "inaction", "best", "septic", "warned", "warning_hours", "false_alarms")


def stay_parts(labels, alarms, lengths) -> dict[str, np.ndarray]:
    """Per stay (``STAY_PARTS``): its hours; its utility with ``alarms``, with none and with the best alarms; whether
    it is septic, and alarmed in time (at an hour the utility rewards, from 12 h before onset to 3 h after); the
    hours from the first such alarm to onset (negative: after onset; NaN: not warned); and its false alarms (alarmed
    hours of a stay never septic, or more than 12 h before onset)."""
    worth = hour_worth(labels, lengths)
    alarms = _checked_alarms(alarms, len(worth.stay))
    lengths = np.asarray(lengths, dtype=np.int64)
    stays = len(lengths)
    hour = np.arange(len(alarms)) - np.repeat(np.cumsum(lengths) - lengths, lengths)

    def per_stay(values: np.ndarray) -> np.ndarray:
        return np.bincount(worth.stay, weights=values, minlength=stays)

    rewarded = alarms & worth.best  # the best predictor's hours are exactly the utility's window of each onset
    warned_stay, first = np.unique(worth.stay[rewarded], return_index=True)
    onset = np.full(stays, np.nan)
    labelled = np.flatnonzero(np.asarray(labels).astype(bool))
    septic_stay, first_label = np.unique(worth.stay[labelled], return_index=True)
    onset[septic_stay] = hour[labelled[first_label]] - DT_OPTIMAL
    warning_hours = np.full(stays, np.nan)
    warning_hours[warned_stay] = onset[warned_stay] - hour[np.flatnonzero(rewarded)[first]]
    false_alarm = alarms & ~worth.best & (worth.alarmed == U_FP)
    return {
        "hours": lengths.astype(np.float64),
        "observed": per_stay(np.where(alarms, worth.alarmed, worth.silent)),
        "inaction": per_stay(worth.silent),
        "best": per_stay(np.where(worth.best, worth.alarmed, worth.silent)),
        "septic": per_stay(worth.best.astype(float)) > 0,
        "warned": ~np.isnan(warning_hours),
        "warning_hours": warning_hours,
        "false_alarms": per_stay(false_alarm.astype(float)),
    }


def ward_scores(parts: dict[str, np.ndarray], weights: np.ndarray | None = None) -> dict[str, float]:
    """The scores of stays whose ``stay_parts`` are ``parts`` (each stay counted ``weights`` times, as a bootstrap
    resample counts it): the normalised utility, the share of septic stays warned in time (``warned_in_time``),
    the median hours of warning before onset over those (``median_warning_hours``) and the false alarms per 100
    patient-days (``false_alarms_per_100_days``)."""
    weights = np.ones(len(parts["hours"])) if weights is None else np.asarray(weights, dtype=np.float64)

    def total(name: str) -> np.float64:
        return np.float64(weights @ parts[name])

    with np.errstate(divide="ignore", invalid="ignore"):  # no septic stay: as ``normalised_utility``
        utility = (total("observed") - total("inaction")) / (total("best") - total("inaction"))
    septic = weights @ parts["septic"]
    warned = parts["warned"] & (weights > 0)
    leads = np.repeat(parts["warning_hours"][warned], weights[warned].astype(np.int64))
    days = total("hours") / 24
    return {
        "utility": float(utility),  # NaN or -inf without a septic stay, as the Challenge's
        "warned_in_time": float(weights @ parts["warned"] / septic) if septic else float("nan"),
        "median_warning_hours": float(np.median(leads)) if len(leads) else float("nan"),
        "false_alarms_per_100_days": 100 * total("false_alarms") / days if days else float("nan"),
    }


def warning_report(labels, alarms, lengths) -> dict[str, float]:
    """``ward_scores`` of ``alarms`` (one 0/1 per hour, flat over stays of ``lengths`` hours)."""
    return ward_scores(stay_parts(labels, alarms, lengths))


# ---------------------------------------------------------------------------------------------------------------
# Files


def stay_file_name(stay_id: int) -> str:
    """``p000017.psv`` for stay 17: the Challenge's file name of a stay."""
    return f"p{int(stay_id):06d}{SUFFIX}"


def _binary(values: np.ndarray) -> np.ndarray:
    return np.isin(values, (0, 1))


def _probability(values: np.ndarray) -> np.ndarray:
    return (0 <= values) & (values <= 1)  # NaN is not


# What each column may hold: the test of its values, and what the refusal says it expected.
Column = tuple[str, Callable[[np.ndarray], np.ndarray], str]
LABEL = (LABEL_COLUMN, _binary, "a label 0 or 1")
PROBABILITY = (PROBABILITY_COLUMN, _probability, "a probability from 0 to 1")
PREDICTION = (PREDICTION_COLUMN, _binary, "a prediction 0 or 1")


def _read_columns(path: Path, columns: tuple[Column, ...]) -> list[np.ndarray]:
    """``columns`` of a pipe-separated file with a header row, as floats, one value a row; the first cell that is
    not a number or fails its column's test is refused, naming its line and column."""
    path = Path(path)
    try:
        text = path.read_text()
    except UnicodeDecodeError as exc:
        raise ChallengeFileError(f"{path}: not a text file ({exc.reason} at byte {exc.start})") from None
    lines = text.splitlines()
    while lines and not lines[-1].strip():  # a blank line at the end is no hour
        lines.pop()
    names = [name for name, _, _ in columns]
    if not lines:
        raise ChallengeFileError(f"{path}: empty, expected a header row naming {' and '.join(names)}")
    header = lines[0].strip().split("|")
    for name in names:
        if name not in header:
            raise ChallengeFileError(f"{path} line 1: no column {name} in the header {lines[0].strip()[:120]!r}")
    rows = [line.strip().split("|") for line in lines[1:]]
    for number, row in enumerate(rows, start=2):
        if len(row) != len(header):
            raise ChallengeFileError(f"{path} line {number}: {len(row)} cells, but the header names {len(header)}")
    values = []
    for name, allowed, expected in columns:
        cells = [row[header.index(name)] for row in rows]
        try:
            column = np.array(cells, dtype=np.float64)
        except ValueError:
            row = next(i for i, cell in enumerate(cells) if not _is_number(cell))
            raise ChallengeFileError(
                f"{path} line {row + 2}, column {name}: expected a number, got {cells[row]!r}"
            ) from None
        faults = np.flatnonzero(~allowed(column))
        if len(faults):
            row = int(faults[0])
            raise ChallengeFileError(f"{path} line {row + 2}, column {name}: expected {expected}, got {cells[row]!r}")
        values.append(column)
    return values


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def read_labels(path: Path) -> np.ndarray:
    """The ``SepsisLabel`` of each hour of a label file, as 0/1 integers."""
    (labels,) = _read_columns(path, (LABEL,))
    return labels.astype(np.int8)


def read_predictions(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The probability and the binary prediction of each hour of a prediction file."""
    probabilities, predictions = _read_columns(path, (PROBABILITY, PREDICTION))
    return probabilities, predictions.astype(np.int8)


@dataclass(frozen=True)
class ChallengeFiles:
    """A folder of label files and the prediction files beside them, flat over the stays' hours (in file order)."""

    names: list[str]  # the files, by name, sorted
    lengths: np.ndarray  # [stays] hours of each
    labels: np.ndarray  # [hours]
    probabilities: np.ndarray  # [hours]
    predictions: np.ndarray  # [hours]

    def scores(self) -> ChallengeScores:
        return challenge_scores(self.labels, self.probabilities, self.predictions, self.lengths)


def _psv_files(folder: Path, what: str) -> dict[str, Path]:
    if not folder.is_dir():
        raise ChallengeFileError(f"{folder}: no such folder (expected the {what} files, pNNNNNN{SUFFIX})")
    return {
        path.name: path
        for path in sorted(folder.iterdir())
        if path.is_file() and path.suffix.lower() == SUFFIX and not path.name.startswith(".")
    }


def read_folders(labels: Path, predictions: Path) -> ChallengeFiles:
    """Every label file of the folder ``labels`` with the prediction file of the same name in ``predictions``.

    Refused, naming the file (and the line and column): a label file without its prediction file or the reverse, a
    prediction file with more or fewer rows than its labels, and any cell as ``read_labels`` and
    ``read_predictions`` refuse it.
    """
    labels, predictions = Path(labels), Path(predictions)
    label_files, prediction_files = _psv_files(labels, "label"), _psv_files(predictions, "prediction")
    if not label_files:
        raise ChallengeFileError(f"{labels}: no label file (pNNNNNN{SUFFIX}) in the folder")
    for name in label_files:
        if name not in prediction_files:
            raise ChallengeFileError(f"{predictions / name}: missing (the predictions for {labels / name})")
    for name in prediction_files:
        if name not in label_files:
            raise ChallengeFileError(f"{prediction_files[name]}: no label file {labels / name} for these predictions")
    stay_labels, stay_probabilities, stay_predictions = [], [], []
    for name, label_file in label_files.items():
        hours = read_labels(label_file)
        probabilities, alarms = read_predictions(prediction_files[name])
        if len(alarms) != len(hours):
            raise ChallengeFileError(
                f"{prediction_files[name]}: {len(alarms)} rows of predictions for the "
                f"{len(hours)} hours of {label_file}"
            )
        stay_labels.append(hours)
        stay_probabilities.append(probabilities)
        stay_predictions.append(alarms)
    return ChallengeFiles(
        list(label_files),
        np.array([len(h) for h in stay_labels], dtype=np.int64),
        np.concatenate(stay_labels),
        np.concatenate(stay_probabilities),
        np.concatenate(stay_predictions),
    )


def _write_psv(path: Path, header: str, rows: list[str]) -> Path:
    with atomic_file(path, "w") as out:
        out.write(header + "\n")
        out.writelines(row + "\n" for row in rows)
    return path


def write_predictions(folder: Path, stay_id: int, probabilities, labels) -> Path:
    """Write the Challenge's prediction file of a stay, ``folder/pNNNNNN.psv`` (atomically): its header, then the
    probability (full precision) and the 0/1 prediction of each hour. Values the reader would refuse are refused."""
    probabilities = np.asarray(probabilities, dtype=np.float64)
    labels = np.asarray(labels)
    if probabilities.ndim != 1 or not ((0 <= probabilities) & (probabilities <= 1)).all():
        raise ValueError(f"stay {stay_id}: expected one probability from 0 to 1 per hour")
    if labels.shape != probabilities.shape or not np.isin(labels, (0, 1)).all():
        raise ValueError(f"stay {stay_id}: expected a prediction 0 or 1 for each of its {len(probabilities)} hours")
    rows = [f"{p!r}|{int(y)}" for p, y in zip(probabilities.tolist(), labels.tolist())]
    return _write_psv(Path(folder) / stay_file_name(stay_id), f"{PROBABILITY_COLUMN}|{PREDICTION_COLUMN}", rows)


def write_labels(folder: Path, stay_id: int, labels) -> Path:
    """Write a stay's label file, ``folder/pNNNNNN.psv`` with the one column ``SepsisLabel`` (atomically)."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.isin(labels, (0, 1)).all():
        raise ValueError(f"stay {stay_id}: expected a label 0 or 1 per hour")
    return _write_psv(Path(folder) / stay_file_name(stay_id), LABEL_COLUMN, [str(int(y)) for y in labels.tolist()])
