"""The alert policy and per-alert scores (``garlic.metrics.alert_policy``, ``garlic.metrics.alerts``) on cases
worked by hand: the definitions of ``docs/alerts.md``."""

import math

import numpy as np
import pytest

from garlic.metrics.alert_policy import AlertPolicy, AlertPolicyError, AlertState, choose_policy
from garlic.metrics.alerts import alert_parts, alert_scores, onsets


def stays(*pairs):
    """(labels, alarms, lengths) of stays each given as (labels, alarms) lists."""
    labels = np.concatenate([np.asarray(a, dtype=int) for a, _ in pairs])
    alarms = np.concatenate([np.asarray(b, dtype=int) for _, b in pairs])
    return labels, alarms, np.array([len(a) for a, _ in pairs])


def hours(length, on=(), labelled_from=None):
    """A stay of ``length`` hours, alarmed at the hour ranges ``on`` ([start, stop)), labelled from an hour."""
    alarms = np.zeros(length, dtype=int)
    for start, stop in on:
        alarms[start:stop] = 1
    labels = np.zeros(length, dtype=int)
    if labelled_from is not None:
        labels[labelled_from:] = 1
    return labels, alarms


def test_a_septic_stay_with_an_early_false_alert_a_true_one_starting_before_the_window_and_a_late_one():
    # Labelled from hour 16: onset 22, window [10, 25]. Alerts: 2-3 (ends before 10: false), 8-11 (starts before the
    # window and runs into it: true, lead 22 - 8 = 14), 26-28 (starts after 25: false).
    labels, alarms, lengths = stays(hours(30, [(2, 4), (8, 12), (26, 29)], labelled_from=16))
    parts = alert_parts(labels, alarms, lengths)
    assert parts["alerts"].tolist() == [3] and parts["true_alerts"].tolist() == [1]
    assert parts["lead_hours"].tolist() == [14.0] and parts["detected"].tolist() == [True]
    scores = alert_scores(parts)
    assert scores["ppv"] == pytest.approx(1 / 3) and scores["sensitivity"] == 1.0
    assert scores["alerts_per_100_days"] == pytest.approx(3 / (30 / 2400))


def test_the_window_ends_are_included_and_an_alert_after_onset_plus_3_is_false():
    # onset 22: an alert at exactly hour 25 is true (lead -3), one from 26 false; one ending at exactly 10 is true.
    at_end = alert_parts(*stays(hours(30, [(25, 27)], labelled_from=16)))
    after = alert_parts(*stays(hours(30, [(26, 30)], labelled_from=16)))
    at_start = alert_parts(*stays(hours(30, [(5, 11)], labelled_from=16)))
    assert at_end["true_alerts"].tolist() == [1] and at_end["lead_hours"].tolist() == [-3.0]
    assert after["true_alerts"].tolist() == [0] and math.isnan(after["lead_hours"][0])
    assert at_start["true_alerts"].tolist() == [1] and at_start["lead_hours"].tolist() == [17.0]
    too_early = alert_parts(*stays(hours(30, [(5, 10)], labelled_from=16)))  # ends at 9, before 10
    assert too_early["true_alerts"].tolist() == [0]


def test_onset_in_the_first_hours_and_a_short_stay():
    # Labelled from hour 0: onset 6, window [-6, 9]; an alert from the first hour is true with lead 6. A stay of 3
    # hours labelled from hour 2 (onset 8, window [-4, 11]) alerted at hour 1 is true, lead 7: its onset lies past
    # its end.
    labels, alarms, lengths = stays(hours(12, [(0, 2)], labelled_from=0), hours(3, [(1, 2)], labelled_from=2))
    parts = alert_parts(labels, alarms, lengths)
    assert onsets(labels, lengths).tolist() == [6.0, 8.0]
    assert parts["true_alerts"].tolist() == [1, 1] and parts["lead_hours"].tolist() == [6.0, 7.0]


def test_a_stay_never_septic_has_only_false_alerts_and_alerts_do_not_run_across_stays():
    # Two stays back to back, both alarmed at the border hours: two alerts, not one.
    labels, alarms, lengths = stays(hours(5, [(3, 5)]), hours(4, [(0, 2)]))
    parts = alert_parts(labels, alarms, lengths)
    assert parts["alerts"].tolist() == [1, 1] and parts["true_alerts"].tolist() == [0, 0]
    assert not parts["septic"].any()
    scores = alert_scores(parts)
    assert scores["ppv"] == 0 and math.isnan(scores["sensitivity"]) and scores["share_alerted"] == 1.0


def test_lead_time_quartiles_and_share_alerted_over_stays():
    # Three septic stays (onset 22) first warned at 8, 12 and 20 (leads 14, 10, 2), a fourth never alerted.
    labels, alarms, lengths = stays(
        *(hours(30, [(start, 21)], labelled_from=16) for start in (8, 12, 20)), hours(30, [], labelled_from=16)
    )
    scores = alert_scores(alert_parts(labels, alarms, lengths))
    assert scores["lead_median"] == 10 and scores["lead_q1"] == 6 and scores["lead_q3"] == 12
    assert scores["sensitivity"] == 0.75 and scores["share_alerted"] == 0.75 and scores["ppv"] == 1.0


def test_bootstrap_weights_count_a_stay_as_often_as_drawn():
    labels, alarms, lengths = stays(hours(30, [(8, 12)], labelled_from=16), hours(10, [(0, 2), (5, 6)]))
    parts = alert_parts(labels, alarms, lengths)
    assert alert_scores(parts, np.array([2, 1]))["ppv"] == pytest.approx(2 / 4)
    assert alert_scores(parts, np.array([0, 3]))["ppv"] == 0


def test_several_alarm_sequences_score_as_each_alone():
    labels, first, lengths = stays(hours(30, [(8, 12), (26, 29)], labelled_from=16), hours(10, [(0, 2)]))
    _, second, _ = stays(hours(30, [(0, 30)], labelled_from=16), hours(10, []))
    both = alert_parts(labels, np.stack([first, second]), lengths)
    for k, alarms in enumerate((first, second)):
        alone = alert_parts(labels, alarms, lengths)
        for name in ("alerts", "true_alerts", "detected"):
            assert both[name][k].tolist() == alone[name].tolist()
        np.testing.assert_array_equal(both["lead_hours"][k], alone["lead_hours"])


def test_the_policy_raises_clears_with_hysteresis_and_keeps_quiet_after_an_alert():
    policy = AlertPolicy(0.5, band=0.2, quiet_hours=3, margin=0.5)  # on at 0.5, off below 0.4, rearm at 0.75
    risks = [0.1, 0.5, 0.45, 0.39, 0.6, 0.6, 0.6, 0.6, 0.8, 0.3, np.nan, 0.3]
    times = np.arange(1.0, 13.0)
    # hour 2: on; 3: 0.45 holds; 4: 0.39 clears (last on at 3); 5-6: 0.6 but quiet (5 - 3 = 2, 6 - 3 = 3 not > 3);
    # 7: 7 - 3 = 4 > 3, on again; 9: 0.8 holds; 10: off; 11: no risk, stays off.
    expected = [0, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0]
    assert policy.alarms(risks, times, [12]).astype(int).tolist() == expected
    state, walked = AlertState(), []
    for time, risk in zip(times, risks):
        state = policy.next(state, time, None if np.isnan(risk) else risk)
        walked.append(int(state.on))
    assert walked == expected
    # The margin: a risk of 0.8 two hours after clearing brings the alert back at once.
    assert policy.alarms([0.6, 0.1, 0.8], [1.0, 2.0, 3.0], [3]).astype(int).tolist() == [1, 0, 1]


def test_the_vectorised_policy_equals_the_step_by_step_one_on_random_stays():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 50, 300)
    risks = rng.random(lengths.sum())
    risks[rng.random(len(risks)) < 0.1] = np.nan
    times = np.concatenate([np.sort(rng.choice(200, n, replace=False)).astype(float) for n in lengths])
    for policy in (AlertPolicy(0.7, 0.2, 4, 0.2), AlertPolicy(0.3, 0, 0, 0), AlertPolicy(0.9, 0.5, 24, 0.05)):
        walked = []
        for stay in np.split(np.arange(len(risks)), np.cumsum(lengths)[:-1]):
            state = AlertState()
            for i in stay:
                state = policy.next(state, times[i], None if np.isnan(risks[i]) else risks[i])
                walked.append(state.on)
        np.testing.assert_array_equal(policy.alarms(risks, times, lengths), walked)


def test_the_bare_policy_is_the_challenges_threshold():
    rng = np.random.default_rng(1)
    risks = rng.random(500)
    bare = AlertPolicy(0.6, band=0, quiet_hours=0, margin=0)
    np.testing.assert_array_equal(bare.alarms(risks, np.arange(500.0), [500]), risks >= 0.6)


@pytest.mark.parametrize(
    "settings, named",
    [
        ({"threshold": 0}, "threshold"),
        ({"threshold": 1.5}, "threshold"),
        ({"band": 1}, "band"),
        ({"band": -0.1}, "band"),
        ({"quiet_hours": -1}, "quiet_hours"),
        ({"quiet_hours": 1e9}, "quiet_hours"),
        ({"margin": float("nan")}, "margin"),
        ({"margin": 11}, "margin"),
    ],
)
def test_a_setting_out_of_its_range_is_refused_naming_it(settings, named):
    with pytest.raises(AlertPolicyError, match=f"alert policy: {named} must be"):
        AlertPolicy(**({"threshold": 0.5} | settings))


def synthetic_hours(seed=0, stays=400):
    """Stays with a risk that rises before a septic stay's onset: labels, risks, times, lengths."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(10, 80, stays)
    labels, risks = [], []
    for n in lengths:
        septic = rng.random() < 0.2
        first = rng.integers(0, n) if septic else n
        label = (np.arange(n) >= first).astype(int)
        risk = np.clip(0.1 + 0.5 * (np.arange(n) >= first - 8) * septic + rng.normal(0, 0.1, n), 0, 1)
        labels.append(label)
        risks.append(risk)
    times = np.concatenate([np.arange(n) + 1.0 for n in lengths])
    return np.concatenate(labels), np.concatenate(risks), times, lengths


def test_choosing_for_a_burden_needs_no_labels_and_meets_it():
    labels, risks, times, lengths = synthetic_hours()
    choice = choose_policy(risks, times, lengths, alerts_per_day=0.2)
    scored = alert_scores(alert_parts(labels, choice.policy.alarms(risks, times, lengths), lengths))
    assert scored["alerts_per_100_days"] <= 20 + 1e-9
    assert choice.scores["alerts_per_100_days"] == pytest.approx(scored["alerts_per_100_days"])
    lower = choose_policy(risks, times, lengths, alerts_per_day=2.0)
    assert lower.policy.threshold < choice.policy.threshold


def test_choosing_by_utility_and_by_sensitivity():
    labels, risks, times, lengths = synthetic_hours()
    by_utility = choose_policy(risks, times, lengths, labels)
    assert 0.2 < by_utility.policy.threshold < 0.9 and by_utility.scores["utility"] > 0.3
    by_sensitivity = choose_policy(risks, times, lengths, labels, sensitivity=0.9)
    scored = alert_scores(alert_parts(labels, by_sensitivity.policy.alarms(risks, times, lengths), lengths))
    assert scored["sensitivity"] >= 0.9


def test_targets_no_threshold_meets_are_refused_naming_the_value():
    labels, risks, times, lengths = synthetic_hours()
    flat = np.ones_like(risks)  # every hour at risk 1: an alert per stay whatever the threshold
    with pytest.raises(AlertPolicyError, match="no threshold in \\(0, 1\\] gives at most 0.01 alerts per patient-day"):
        choose_policy(flat, times, lengths, alerts_per_day=0.01)
    for wrong in (0, -1, 30, float("nan")):
        with pytest.raises(AlertPolicyError, match="alerts per patient-day must be a number in \\(0, 24\\)"):
            choose_policy(risks, times, lengths, alerts_per_day=wrong)
    with pytest.raises(AlertPolicyError, match="without labels a threshold can only be set for a burden"):
        choose_policy(risks, times, lengths)
    with pytest.raises(AlertPolicyError, match="the utility cannot choose"):
        choose_policy(risks, times, lengths, np.zeros_like(labels))
