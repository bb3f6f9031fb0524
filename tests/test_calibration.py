import numpy as np
import pytest
from sklearn.metrics import average_precision_score, log_loss, roc_auc_score

from garlic.evaluation.calibration import (
    fit_temperature,
    logits_from_probabilities,
    negative_log_likelihood,
    scale,
    temperature_report,
)
from garlic.metrics import binary_metrics, expected_calibration_error


def test_ece_against_hand_computed_values():
    # One stay per bin: (0.1 + 0.3 + 0.4 + 0.1) / 4.
    assert expected_calibration_error([0, 0, 1, 1], [0.1, 0.3, 0.6, 0.9]) == pytest.approx(0.225)
    # Both in bin [0.1, 0.2): |1 - (0.12 + 0.18)| / 2 = 0.35.
    assert expected_calibration_error([0, 1], [0.12, 0.18]) == pytest.approx(0.35)
    # Probability 1.0 falls in the last bin, not past it.
    assert expected_calibration_error([1, 1], [1.0, 0.95]) == pytest.approx(0.025)
    assert expected_calibration_error([0, 1, 0, 1], [0.5, 0.5, 0.5, 0.5]) == pytest.approx(0.0)


def test_brier_against_hand_computed_values():
    scores = binary_metrics([0, 1, 1, 0], [0.2, 0.7, 1.0, 0.5])
    assert scores["brier"] == pytest.approx((0.04 + 0.09 + 0.0 + 0.25) / 4)


def test_a_perfect_ranking_scores_an_auprc_of_exactly_1_where_scikit_learns_sum_passes_it():
    # the run archive refuses a metric outside [0, 1]: a tiny cohort's perfect split must not damage it
    labels, risks = np.array([1] * 9 + [0] * 2), np.arange(11, 0, -1) / 12
    assert average_precision_score(labels, risks) > 1  # the rounding this guards against
    assert binary_metrics(labels, risks)["auprc"] == 1.0


def test_logits_stay_finite_at_saturated_probabilities():
    logits = logits_from_probabilities(np.array([0.0, 0.5, 1.0]))
    assert np.isfinite(logits).all() and logits[1] == 0.0 and logits[0] == pytest.approx(-logits[2])


def test_negative_log_likelihood_matches_scikit_learn():
    labels = np.array([0, 1, 1, 0, 1])
    logits = np.array([-2.0, 0.3, 4.0, 1.0, -0.5])
    expected = log_loss(labels, 1 / (1 + np.exp(-logits)))
    assert negative_log_likelihood(logits, labels) == pytest.approx(expected)


def test_temperature_recovers_a_known_overconfidence_and_keeps_the_ranking():
    rng = np.random.default_rng(0)
    true_logits = rng.normal(0, 2, 20_000)
    labels = (rng.random(20_000) < 1 / (1 + np.exp(-true_logits))).astype(float)
    temperature = fit_temperature(2.5 * true_logits, labels)  # a model 2.5 times too confident
    assert temperature == pytest.approx(2.5, rel=0.05)
    probabilities = 1 / (1 + np.exp(-2.5 * true_logits))
    scaled = scale(2.5 * true_logits, temperature)
    assert roc_auc_score(labels, scaled) == pytest.approx(roc_auc_score(labels, probabilities))


def test_report_gives_before_and_after_on_test_with_temperature_from_validation():
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 2, 8_000)
    labels = (rng.random(8_000) < 1 / (1 + np.exp(-logits))).astype(float)
    overconfident = 1 / (1 + np.exp(-3 * logits))
    report = temperature_report(overconfident[:4000], labels[:4000], overconfident[4000:], labels[4000:])
    assert set(report) == {"temperature", "brier", "ece", "brier_scaled", "ece_scaled"}
    assert report["temperature"] == pytest.approx(3.0, rel=0.1)
    assert report["ece_scaled"] < report["ece"] and report["brier_scaled"] < report["brier"]
    assert report["ece"] == pytest.approx(expected_calibration_error(labels[4000:], overconfident[4000:]))
