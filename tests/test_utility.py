"""The PhysioNet 2019 Challenge's scores (garlic.metrics.utility) against its own evaluation code, a per-stay loop
written here from its definition, and a brute-force threshold search; its files and ``garlic score-utility``.

The expected numbers were computed by running the Challenge's evaluate_sepsis_score.py (github.com/
physionetchallenges/evaluation-2019, commit 467c49b514542be7a4a0bafe40fa2c3b064dda2e) on the cases below: its
``compute_prediction_utility`` on each stay, and the script itself on label and prediction folders written as
``write_case`` writes them.
"""

import math

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

from garlic.metrics.utility import (
    ChallengeFileError,
    challenge_auroc_auprc,
    choose_threshold,
    normalised_utility,
    read_folders,
    read_labels,
    read_predictions,
    stay_lengths,
    stay_utilities,
    warning_report,
    write_labels,
    write_predictions,
)
from helpers import garlic_main


def stay(length, first_label=None, alarms=(), back_to_0=None):
    labels = np.zeros(length, dtype=int)
    if first_label is not None:
        labels[first_label:] = 1
    if back_to_0 is not None:
        labels[back_to_0:] = 0
    predictions = np.zeros(length, dtype=int)
    predictions[list(alarms)] = 1
    return labels, predictions


# SepsisLabel is 1 from onset - 6 h: a stay first labelled at hour 15 has its onset at hour 21.
STAYS = {  # stay id: (labels, predictions)
    1: stay(10, alarms=[3, 4]),  # never septic, two false alarms
    2: stay(30, first_label=15, alarms=range(12, 30)),  # alarmed in time (from 9 h before onset)
    3: stay(30, first_label=15, alarms=range(0, 5)),  # alarmed too early only (more than 12 h before onset)
    4: stay(30, first_label=15, alarms=range(25, 30)),  # alarmed too late (from 4 h after onset)
    5: stay(30, first_label=15),  # never alarmed
    6: stay(5, first_label=2, alarms=[3, 4]),  # ends before its onset: shorter than the reward window
    7: stay(20, first_label=0, alarms=range(2, 20)),  # labelled from its first hour
    8: stay(20, first_label=5, alarms=[14]),  # one alarm at dt_late, 3 h after onset
    9: stay(20, first_label=5, alarms=[15]),  # one alarm 4 h after onset, past dt_late
    10: stay(25, first_label=8, back_to_0=12, alarms=range(6, 25)),  # a label that falls back to 0
}
# evaluate_sepsis_score.compute_prediction_utility(labels, predictions) of each stay (commit 467c49b).
STAY_UTILITY = {
    1: -0.1,
    2: 7.0,
    3: -10.25,
    4: -10.0,
    5: -10.0,
    6: 1.6666666666666665,
    7: 2.888888888888889,
    8: -8.0,
    9: -10.0,
    10: 6.5,
}
# `python evaluate_sepsis_score.py labels predictions` on write_case's folders of these stays (commit 467c49b):
# AUROC, AUPRC, accuracy, F-measure, normalised utility. "all" has hours at probability exactly 0 and 1, where the
# Challenge's AUROC (0.5701) is not scikit-learn's (0.5975); without a septic stay the Challenge divides by 0.
CHALLENGE_OUTPUT = {
    "all": (
        (1, 2, 3, 4, 5, 6, 7, 8, 9, 10),
        (0.5700771720189196, 0.5630952400267277, 0.5636363636363636, 0.48936170212765956, 0.3539032006245121),
    ),
    "labelled from the first hour": (
        (7, 6),
        (0.9347826086956522, 0.9547101449275363, 0.88, 0.9302325581395349, 0.7675070028011205),
    ),
    "no septic stay": ((1,), (0.0, 0.0, 0.8, 0.0, -math.inf)),
}


def probabilities_of(stay_id, predictions):
    """Probabilities that agree with the alarms (>= 0.55 alarmed, <= 0.45 not), exactly 0 and 1 included."""
    fraction = ((np.arange(len(predictions)) * 7 + stay_id * 3) % 11) / 10
    return np.where(predictions == 1, 0.55 + 0.45 * fraction, 0.45 * fraction)


def write_case(folder, stay_ids):
    for stay_id in stay_ids:
        labels, predictions = STAYS[stay_id]
        write_labels(folder / "labels", stay_id, labels)
        write_predictions(folder / "predictions", stay_id, probabilities_of(stay_id, predictions), predictions)
    return folder / "labels", folder / "predictions"


def flat(stay_ids):
    labels, predictions = zip(*(STAYS[i] for i in stay_ids))
    return np.concatenate(labels), np.concatenate(predictions), np.array([len(x) for x in labels])


def test_each_stays_utility_is_the_challenges_alone_and_among_the_others():
    for stay_id, (labels, predictions) in STAYS.items():
        assert stay_utilities(labels, predictions, [len(labels)]) == pytest.approx([STAY_UTILITY[stay_id]], abs=1e-9)
    together = stay_utilities(*flat(STAYS))
    np.testing.assert_allclose(together, list(STAY_UTILITY.values()), atol=1e-9)


@pytest.mark.parametrize("case", CHALLENGE_OUTPUT)
def test_the_challenges_five_scores_of_its_files(tmp_path, case):
    stay_ids, expected = CHALLENGE_OUTPUT[case]
    files = read_folders(*write_case(tmp_path, stay_ids))
    assert files.names == [f"p{stay_id:06d}.psv" for stay_id in sorted(stay_ids)]
    scores = files.scores()
    np.testing.assert_allclose(
        [scores.auroc, scores.auprc, scores.accuracy, scores.f_measure, scores.utility], expected, atol=1e-6
    )


def test_score_utility_prints_the_challenges_two_lines(tmp_path, capsys):
    labels, predictions = write_case(tmp_path, CHALLENGE_OUTPUT["all"][0])
    # A label file as the training data has it: 41 columns in the release (here four), NaN where none was measured.
    rows = [f"{'NaN' if hour % 3 else 80}|NaN|{hour + 1}|{label}" for hour, label in enumerate(STAYS[2][0])]
    (labels / "p000002.psv").write_text("\n".join(["HR|O2Sat|ICULOS|SepsisLabel", *rows]) + "\n")
    garlic_main(["score-utility", "--labels", str(labels), "--predictions", str(predictions)])
    names, values = capsys.readouterr().out.strip().splitlines()
    assert names == "AUROC|AUPRC|Accuracy|F-measure|Utility"
    np.testing.assert_allclose([float(v) for v in values.split("|")], CHALLENGE_OUTPUT["all"][1], atol=1e-6)


def _set_line(path, line, text):
    lines = path.read_text().splitlines()
    lines[line - 1] = text
    path.write_text("\n".join(lines) + "\n")


FAULTS = {  # what is done to the files of stays 1 and 2 (30 hours: lines 2-31), and what the refusal says
    "missing prediction file": (
        lambda p: (p / "predictions" / "p000002.psv").unlink(),
        "predictions/p000002.psv: missing (the predictions for {labels}/p000002.psv)",
    ),
    "prediction file without labels": (
        lambda p: write_predictions(p / "predictions", 11, [0.5], [1]),
        "predictions/p000011.psv: no label file",
    ),
    "fewer rows": (
        lambda p: write_predictions(p / "predictions", 2, [0.5] * 29, [1] * 29),
        "predictions/p000002.psv: 29 rows of predictions for the 30 hours of {labels}/p000002.psv",
    ),
    "probability above 1": (
        lambda p: _set_line(p / "predictions" / "p000002.psv", 5, "1.5|1"),
        "predictions/p000002.psv line 5, column PredictedProbability: expected a probability from 0 to 1, got '1.5'",
    ),
    "probability NaN": (
        lambda p: _set_line(p / "predictions" / "p000002.psv", 6, "nan|0"),
        "predictions/p000002.psv line 6, column PredictedProbability: expected a probability from 0 to 1, got 'nan'",
    ),
    "prediction not 0 or 1": (
        lambda p: _set_line(p / "predictions" / "p000002.psv", 7, "0.2|0.5"),
        "predictions/p000002.psv line 7, column PredictedLabel: expected a prediction 0 or 1, got '0.5'",
    ),
    "non-numeric cell": (
        lambda p: _set_line(p / "predictions" / "p000001.psv", 3, "0.2|no"),
        "predictions/p000001.psv line 3, column PredictedLabel: expected a number, got 'no'",
    ),
    "a cell missing": (
        lambda p: _set_line(p / "predictions" / "p000002.psv", 31, "0.5"),
        "predictions/p000002.psv line 31: 1 cells, but the header names 2",
    ),
    "a cell too many": (
        lambda p: _set_line(p / "predictions" / "p000001.psv", 4, "0.5|0|1"),
        "predictions/p000001.psv line 4: 3 cells, but the header names 2",
    ),
    "label not 0 or 1": (
        lambda p: _set_line(p / "labels" / "p000002.psv", 4, "2"),
        "labels/p000002.psv line 4, column SepsisLabel: expected a label 0 or 1, got '2'",
    ),
    "empty label": (
        lambda p: _set_line(p / "labels" / "p000002.psv", 20, ""),
        "labels/p000002.psv line 20, column SepsisLabel: expected a number, got ''",
    ),
    "no label column": (
        lambda p: _set_line(p / "labels" / "p000001.psv", 1, "Label"),
        "labels/p000001.psv line 1: no column SepsisLabel in the header 'Label'",
    ),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_bad_files_are_one_line_naming_file_line_and_column_and_no_score(tmp_path, capsys, fault):
    damage, message = FAULTS[fault]
    labels, predictions = write_case(tmp_path, (1, 2))
    damage(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        garlic_main(["score-utility", "--labels", str(labels), "--predictions", str(predictions)])
    assert stopped.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and message.format(labels=labels) in captured.err, captured.err
    with pytest.raises(ChallengeFileError):  # the library's own error class, a ValueError
        read_folders(labels, predictions)


def test_written_predictions_read_back_exactly_and_bad_values_are_refused(tmp_path):
    probabilities = np.array([1 / 3, 0.0, 1.0, 1e-17, 0.1 + 0.2])
    path = write_predictions(tmp_path, 42, probabilities, [0, 0, 1, 0, 0])
    assert path == tmp_path / "p000042.psv"
    read, predicted = read_predictions(path)
    assert read.tolist() == probabilities.tolist() and predicted.tolist() == [0, 0, 1, 0, 0]
    assert read_labels(write_labels(tmp_path / "labels", 42, [0, 1])).tolist() == [0, 1]
    for bad in ([0.5, 1.2], [0.5, math.nan]):
        with pytest.raises(ValueError, match="stay 7: expected one probability from 0 to 1"):
            write_predictions(tmp_path, 7, bad, [0, 1])
    with pytest.raises(ValueError, match="stay 7: expected a prediction 0 or 1"):
        write_predictions(tmp_path, 7, [0.5, 0.5], [0, 2])
    assert not (tmp_path / "p000007.psv").exists()


def test_the_challenges_auc_is_scikit_learns_without_probabilities_at_0_or_1():
    rng = np.random.default_rng(0)
    labels = rng.random(500) < 0.2
    probabilities = np.clip(np.round(rng.random(500) * 0.6 + labels * 0.3, 2), 0.01, 0.99)  # with ties
    auroc, auprc = challenge_auroc_auprc(labels, probabilities)
    assert auroc == pytest.approx(roc_auc_score(labels, probabilities), abs=1e-12)
    assert auprc == pytest.approx(average_precision_score(labels, probabilities), abs=1e-12)


# The definition, hour by hour and stay by stay: the oracle of the vectorised scores.
def utility_by_hour(labels, alarms):
    if not any(labels):
        return sum(-0.05 if alarm else 0.0 for alarm in alarms)
    onset = list(labels).index(1) + 6
    total = 0.0
    for hour, alarm in enumerate(alarms):
        r = hour - onset
        if r > 3:
            continue
        if alarm:
            total += max((r + 12) / 6, -0.05) if r <= -6 else (3 - r) / 9
        elif r > -6:
            total += -2 * (r + 6) / 9
    return total


def normalised_by_stay(stays, alarms):
    observed = best = inaction = 0.0
    for labels, stay_alarms in zip(stays, alarms):
        onset = list(labels).index(1) + 6 if any(labels) else None
        best_alarms = [onset is not None and -12 <= hour - onset <= 3 for hour in range(len(labels))]
        observed += utility_by_hour(labels, stay_alarms)
        best += utility_by_hour(labels, best_alarms)
        inaction += utility_by_hour(labels, [0] * len(labels))
    return (observed - inaction) / (best - inaction)


def random_stays(count, seed):
    rng = np.random.default_rng(seed)
    stays, probabilities = [], []
    for _ in range(count):
        length = int(rng.integers(1, 60))
        labels = np.zeros(length, dtype=int)
        if rng.random() < 0.3:
            labels[rng.integers(0, length) :] = 1  # from any hour, the first included
            if rng.random() < 0.1:
                labels[rng.integers(0, length) :] = 0
        stays.append(labels)
        probabilities.append(np.round(rng.random(length) * 0.5 + labels * rng.random() * 0.5, 2))
    return stays, probabilities


def test_the_vectorised_scores_are_the_per_stay_loop_of_the_definition():
    stays, probabilities = random_stays(200, seed=1)
    alarms = [p >= 0.4 for p in probabilities]
    lengths = [len(labels) for labels in stays]
    flat_labels, flat_alarms = np.concatenate(stays), np.concatenate(alarms)
    expected = [utility_by_hour(labels, stay_alarms) for labels, stay_alarms in zip(stays, alarms)]
    np.testing.assert_allclose(stay_utilities(flat_labels, flat_alarms, lengths), expected, atol=1e-9)
    assert normalised_utility(flat_labels, flat_alarms, lengths) == pytest.approx(
        normalised_by_stay(stays, alarms), abs=1e-12
    )


def test_the_chosen_threshold_is_the_best_of_every_threshold_by_brute_force():
    stays, probabilities = random_stays(40, seed=2)
    lengths, flat_probabilities = [len(s) for s in stays], np.concatenate(probabilities)
    choice = choose_threshold(np.concatenate(stays), flat_probabilities, lengths)
    candidates = [*np.unique(flat_probabilities), 1.5]  # and never alarming
    utilities = [normalised_by_stay(stays, [p >= t for p in probabilities]) for t in candidates]
    best = max(utilities)
    assert choice.normalised_utility == pytest.approx(best, abs=1e-12) and best > 0
    assert normalised_by_stay(stays, [p >= choice.threshold for p in probabilities]) == pytest.approx(best, abs=1e-12)
    highest = max(t for t, value in zip(candidates, utilities) if value >= best - 1e-12)  # ties: the fewest alarms
    assert choice.threshold == highest and choice.alarms == int((flat_probabilities >= highest).sum())


def test_of_thresholds_that_tie_the_highest_is_chosen_never_alarming_included():
    # A stay labelled from its first hour: its hour 10 is 4 h after onset, worth 0 alarmed or not.
    choice = choose_threshold(np.ones(11, dtype=int), np.r_[np.full(10, 0.9), 0.2], [11])
    assert choice.threshold == 0.9 and choice.alarms == 10 and choice.normalised_utility == pytest.approx(1)
    # A one-hour septic stay (an alarm there is worth 1) ranked below 40 hours of a stay never septic (-0.05 each).
    labels, lengths = np.r_[np.zeros(40, dtype=int), 1], [40, 1]
    choice = choose_threshold(labels, np.r_[np.linspace(0.5, 0.9, 40), 0.1], lengths)
    assert choice.threshold > 0.9 and choice.alarms == 0 and choice.normalised_utility == 0
    with pytest.raises(ValueError, match="no septic stay"):
        choose_threshold([0, 0, 0], [0.1, 0.2, 0.3], [3])


def test_warning_report_counts_what_a_ward_sees():
    # A: never septic, 10 h, alarmed at hours 3 and 4 (two false alarms). B: labelled from hour 20 (onset 26), 30 h,
    # alarmed at hour 5 (21 h before onset: a false alarm) and 18 (8 h before: in time). C: labelled from hour 10
    # (onset 16), 20 h, never alarmed.
    labels = np.r_[np.zeros(10), np.zeros(20), np.ones(10), np.zeros(10), np.ones(10)].astype(int)
    alarms = np.zeros(60, dtype=int)
    alarms[[3, 4, 10 + 5, 10 + 18]] = 1
    report = warning_report(labels, alarms, np.array([10, 30, 20]))
    assert report["warned_in_time"] == 0.5
    assert report["median_warning_hours"] == 8
    assert report["false_alarms_per_100_days"] == pytest.approx(100 * 3 / (60 / 24))
    assert report["utility"] == normalised_utility(labels, alarms, np.array([10, 30, 20]))


def test_stay_lengths_are_the_runs_of_each_stay():
    assert stay_lengths(np.array([0, 0, 0, 2, 2, 5])).tolist() == [3, 2, 1]
    assert stay_lengths(np.array([], dtype=int)).tolist() == []
