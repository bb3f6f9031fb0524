"""The early-warning table: the P19 hourly task (a risk and an alarm at every ICU hour), scored as the Sepsis
Challenge scored it, within and across hospitals.

    python -m experiments.early_warning --mlruns STORE --out docs/results

Every method of ``--methods`` (registry names: the hourly baselines and the floor by default) and GARLIC with each
preset of ``--presets`` (files of ``garlic/configs/``, trained on every hour at once; a row named by the preset),
and the stacked model (``hourly_stacked``: the boosting with GARLIC's risk as one more column) with GARLIC of each
preset of ``--stacked`` (a row ``hourly_stacked+PRESET``), is trained on every split of every protocol of ``--protocols`` through the one fit-select-test-log path
(``garlic.studies.Baselines``, resumable: a finished run is reused), on ``physionet2019-hourly`` (``garlic
preprocess physionet2019 --cohort hourly``). Each run chooses its alarm threshold on validation, by utility, and is
tested once.

With ``--out``, each unit is kept in ``OUT/physionet2019-hourly-runs/``: ``runs.csv`` (the unit's run, settings,
threshold, validation utility at it, hourly test AUROC and AUPRC) and, per unit, its test stays'
``garlic.metrics.utility.stay_parts`` at that threshold (``<method>/<protocol>-split_<k>.csv.gz``): what every ward score of the table is summed from, so
the table is made again from the repository alone, and a bootstrap over stays redraws rows. Then
``early-warning.md`` and ``early-warning.csv``: per method and protocol the utility, hourly AUROC and AUPRC (mean
+/- std over splits), the share of septic stays warned in time, the median hours of warning before onset and the
false alarms per 100 patient-days (over the protocol's test stays pooled); and ``early-warning-paired.csv``: each
learned method against the floor and against gradient boosting, and each GARLIC preset and stacked model against
``hourly_gbm_utility``, in utility: the mean difference over splits with a 95% bootstrap interval over test stays
(each resample redraws every split's test stays; an interval holding 0 is a tie).

``early-warning-goal.csv`` and its section say where each method stands against the bedside goal (``GOALS``):
within hospitals at the policy chosen on validation, across them at the site's own threshold, with what each
misses and the best PPV any threshold reaches at the goal's sensitivity on the test stays' burden curve.

``--no-train`` only gathers what the stores and the archive hold.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from garlic import studies
from garlic.config import Config
from garlic.data.datasets import DEFAULT_DATA_ROOT, processed_folder
from garlic.data.splits import Split, load_splits
from garlic.evaluation import alerting
from garlic.evaluation.stats import BOOTSTRAP
from garlic.metrics.alert_policy import AlertPolicy, AlertPolicyError
from garlic.tracking import plots
from garlic.io.atomic import atomic_file
from garlic.io.tables import read_manifest
from garlic.metrics.utility import STAY_PARTS, choose_threshold, stay_lengths, stay_parts, ward_scores
from garlic.tracking import queries, run_contract
from garlic.tracking.archive import GZIP

log = logging.getLogger("experiments")

DATASET = "physionet2019-hourly"
METHODS = ("hourly_gbm", "hourly_gbm_utility", "hourly_logreg", "alarm_after_hour")
FLOOR = "alarm_after_hour"
BEST = "hourly_gbm_utility"  # the best alarm of the baselines: what a GARLIC preset or a stacked model must beat
STACKED = "hourly_stacked"
PROTOCOLS = ("five-split", "cross-hospital", "in-hospital")
TABLE = "early-warning"
FAITHFULNESS = "alert-faithfulness.csv"  # experiments.alert_faithfulness --out alert-faithfulness.md writes it
POLICY_COLUMNS = ["alert_threshold", "alert_band", "alert_quiet_hours", "alert_margin"]
RUN_COLUMNS = [
    "method",
    "protocol",
    "split",
    "run_id",
    "settings",
    "data_digest",
    "threshold",
    "validation_utility",
    "auroc",
    "auprc",
    *POLICY_COLUMNS,
]
SITE_COLUMNS = ["method", "split", "policy", "alert_threshold", "alerts_per_100_days_asked", "refused"]
ALERT_SCORES = ("utility", "sensitivity", "ppv", "alerts_per_100_days")  # paired between methods
WARD = ("utility", "warned_in_time", "median_warning_hours", "false_alarms_per_100_days")


def archive_folder(out: Path) -> Path:
    return Path(out) / f"{DATASET}-runs"


def parts_path(out: Path, method: str, protocol: str, split: int, kind: str = "") -> Path:
    """A unit's file: its stays' utility parts at the bare threshold (``kind`` ""), its stays' scores under the
    alert policy ("alerts"), its burden curve ("curve") or its stays under a new hospital's policy ("site-...")."""
    return archive_folder(out) / method / f"{protocol}-split_{split}{'-' + kind if kind else ''}.csv.gz"


def write_frame(path: Path, frame: pd.DataFrame) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, suffix=".csv.gz") as handle:
        frame.to_csv(handle, index=False, compression=GZIP, float_format="%.6g")


def unit_parts(store: Path, run_id: str, threshold: float) -> pd.DataFrame:
    """The test stays of a run, each with its ``stay_parts`` at ``threshold``, from the run's test predictions."""
    predictions = queries.test_predictions(store, run_id)
    alarms = predictions["risk"].to_numpy() >= threshold
    stay_ids = predictions["stay_id"].to_numpy()
    lengths = stay_lengths(stay_ids)
    parts = stay_parts(predictions["label"].to_numpy().astype(int), alarms, lengths)
    first_rows = np.r_[0, np.cumsum(lengths)[:-1]]
    return pd.DataFrame({"stay_id": stay_ids[first_rows], **parts})


def validation_utility(store: Path, run_id: str) -> float:
    """The utility of a run's validation predictions at the threshold it chose on them (their best): what a search
    of configurations compares, the test unread."""
    predictions = queries.test_predictions(store, run_id, "validation")
    lengths = stay_lengths(predictions["stay_id"].to_numpy())
    return choose_threshold(predictions["label"].to_numpy(), predictions["risk"].to_numpy(), lengths).normalised_utility


def train_and_keep(
    methods: list[str],
    presets: list[str],
    stacked: list[str],
    protocols: list[str],
    store: Path,
    data_root: Path,
    out: Path | None,
    train: bool,
) -> pd.DataFrame:
    """Every unit's run (trained where missing, with ``train``), and with ``out`` its stays' parts kept there."""
    digest = run_contract.manifest_digest(read_manifest(processed_folder(DATASET, data_root)))
    rows, sites = [], []
    for protocol_name in protocols:
        cohort = studies.load_cohort(DATASET, data_root, protocol_name, None)
        # (the row's name, None: each method's own; the methods; the run config they are built from)
        groups = [(None, methods, Config.for_dataset(DATASET))]
        groups += [(preset, ["garlic"], studies.preset_config(preset, DATASET, [])) for preset in presets]
        groups += [(f"{STACKED}+{p}", [STACKED], studies.preset_config(p, DATASET, [])) for p in stacked]
        records = []
        for row_name, chosen, config in groups:
            runner = studies.Baselines(config.override({"split_protocol": protocol_name}), cohort, data_root, store)
            records += [
                (row_name or record["method"], runner.settings(record["method"]), record)
                for record in runner.run(chosen, train).to_dict("records")
            ]
        for name, settings, record in records:
            row = {
                "method": name,
                "protocol": protocol_name,
                "split": record["split"],
                "run_id": record["run_id"],
                "settings": queries.settings_digest(settings),
                "data_digest": digest,
                "threshold": record["threshold"],
                "validation_utility": validation_utility(store, record["run_id"]),
                "auroc": record["test_auroc"],
                "auprc": record["test_auprc"],
            }
            validation = queries.test_predictions(store, record["run_id"], "validation")
            policy = alerting.choose(validation).policy
            row |= dict(zip(POLICY_COLUMNS, policy.settings().values()))
            rows.append(row)
            if out is not None:
                name, split = row["method"], row["split"]
                test = queries.test_predictions(store, row["run_id"])
                write_frame(
                    parts_path(out, name, protocol_name, split), unit_parts(store, row["run_id"], row["threshold"])
                )
                write_frame(parts_path(out, name, protocol_name, split, "alerts"), alerting.stay_alerts(policy, test))
                write_frame(parts_path(out, name, protocol_name, split, "curve"), alerting.burden_curve(policy, test))
                if protocol_name == "cross-hospital":
                    target = load_splits(processed_folder(DATASET, data_root), cohort.tensors, "in-hospital")[1 - split]
                    sites += site_thresholds(out, name, split, policy, validation, test, target)
            log.info("%s %s/split_%d: utility and alerts kept", row["method"], protocol_name, row["split"])
        del cohort
    return pd.DataFrame(rows, columns=RUN_COLUMNS), pd.DataFrame(sites, columns=SITE_COLUMNS)


def site_thresholds(
    out: Path, method: str, split: int, policy: AlertPolicy, validation: pd.DataFrame, test: pd.DataFrame, target: Split
) -> list[dict]:
    """A cross-hospital unit's policy for the hospital it is tested on, three ways, each scored on the same stays
    of that hospital, its held-out tenth (``target``: ``in-hospital`` split ``1 - split``, whose test part that
    is), and kept per stay:
    ``carried``, the source hospital's policy as it is; ``site-burden``, the threshold set on the target's own
    training stays, unlabelled, for the alerts per patient-day the source's policy raised on the source's validation
    stays; ``site-labelled``, the threshold of highest utility on the target's validation stays (a tenth of it,
    labelled). The rest of the policy (band, quiet hours, margin) is the source's."""

    def stays(part: str) -> pd.DataFrame:
        return test[test["stay_id"].isin(getattr(target, part))]

    settings = {"band": policy.band, "quiet_hours": policy.quiet_hours, "margin": policy.margin}
    asked = alerting.scores(alerting.as_parts(alerting.stay_alerts(policy, validation)))["alerts_per_100_days"]
    policies = {
        "carried": lambda: policy,
        "site-burden": lambda: (
            alerting.choose(stays("train").drop(columns="label"), alerts_per_day=asked / 100, **settings).policy
        ),
        "site-labelled": lambda: alerting.choose(stays("validation"), **settings).policy,
    }
    rows = []
    for kind, chosen in policies.items():
        row = {
            "method": method,
            "split": split,
            "policy": kind,
            "alert_threshold": np.nan,
            "alerts_per_100_days_asked": asked if kind == "site-burden" else np.nan,
            "refused": "",
        }
        try:
            made = chosen()
        except AlertPolicyError as refusal:  # the floor's 0/1 risks cannot lower its burden: said in the table
            rows.append(row | {"refused": str(refusal)})
            continue
        write_frame(parts_path(out, method, "cross-hospital", split, kind), alerting.stay_alerts(made, stays("test")))
        rows.append(row | {"alert_threshold": made.threshold})
    return rows


def read_parts(out: Path, runs: pd.DataFrame) -> dict[tuple[str, str, int], pd.DataFrame]:
    """Each archived unit's stay parts, by (method, protocol, split); a unit whose file is missing is refused."""
    units = {}
    for row in runs.itertuples():
        path = parts_path(out, row.method, row.protocol, int(row.split))
        if not path.is_file():
            raise FileNotFoundError(
                f"{archive_folder(out) / 'runs.csv'} lists {row.method} {row.protocol}/split_"
                f"{row.split}, but {path} is missing"
            )
        frame = pd.read_csv(path)
        if list(frame.columns) != ["stay_id", *STAY_PARTS]:
            raise ValueError(f"{path}: columns {list(frame.columns)}, expected {['stay_id', *STAY_PARTS]}")
        units[(row.method, row.protocol, int(row.split))] = frame
    return units


def as_parts(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    parts = {name: frame[name].to_numpy() for name in STAY_PARTS}
    parts["septic"], parts["warned"] = parts["septic"].astype(bool), parts["warned"].astype(bool)
    return parts


def table(runs: pd.DataFrame, units: dict) -> pd.DataFrame:
    """Per method and protocol: utility and hourly AUROC/AUPRC mean +/- std over splits, and the ward scores of the
    protocol's test stays pooled."""
    rows = []
    for (method, protocol_name), group in runs.groupby(["method", "protocol"], sort=False):
        frames = [units[(method, protocol_name, int(split))] for split in group["split"]]
        utilities = [ward_scores(as_parts(frame))["utility"] for frame in frames]
        pooled = ward_scores(as_parts(pd.concat(frames, ignore_index=True)))
        rows.append(
            {
                "method": method,
                "protocol": protocol_name,
                "runs": len(group),
                "validation_utility": group["validation_utility"].mean(),
                "utility_mean": np.mean(utilities),
                "utility_std": np.std(utilities),
                "auroc_mean": group["auroc"].mean(),
                "auroc_std": group["auroc"].std(ddof=0),
                "auprc_mean": group["auprc"].mean(),
                "auprc_std": group["auprc"].std(ddof=0),
                **{name: pooled[name] for name in WARD[1:]},
            }
        )
    return pd.DataFrame(rows)


def resampled_utility(parts: dict[str, np.ndarray], counts: np.ndarray) -> np.ndarray:
    """The normalised utility of each resample of the stays (``counts``: [resamples, stays] times each is drawn)."""
    observed, inaction, best = (counts @ parts[name] for name in ("observed", "inaction", "best"))
    with np.errstate(divide="ignore", invalid="ignore"):  # a resample without a septic stay: NaN, as the Challenge
        return (observed - inaction) / (best - inaction)


def paired_utility(
    units: dict, method: str, other: str, protocol_name: str, splits: list[int], seed: int = 0
) -> dict[str, float]:
    """``method`` minus ``other`` in utility on the same test stays: the mean over splits, and a 95% interval from
    ``BOOTSTRAP`` resamples of every split's test stays."""
    rng = np.random.default_rng(seed)
    differences, resampled = [], []
    for split in splits:
        ours, theirs = units[(method, protocol_name, split)], units[(other, protocol_name, split)]
        if not np.array_equal(ours["stay_id"], theirs["stay_id"]):
            raise ValueError(f"{method} and {other} on {protocol_name}/split_{split} were tested on other stays")
        ours, theirs = as_parts(ours), as_parts(theirs)
        differences.append(ward_scores(ours)["utility"] - ward_scores(theirs)["utility"])
        stays = len(ours["hours"])
        counts = rng.multinomial(stays, np.full(stays, 1 / stays), BOOTSTRAP).astype(np.float64)  # [BOOTSTRAP, stays]
        resampled.append(resampled_utility(ours, counts) - resampled_utility(theirs, counts))
    low, high = np.nanpercentile(np.mean(resampled, axis=0), [2.5, 97.5])
    verdict = "tie" if low <= 0 <= high else (f"{method} better" if low > 0 else f"{other} better")
    return {
        "method": method,
        "against": other,
        "protocol": protocol_name,
        "runs": len(splits),
        "difference": float(np.mean(differences)),
        "ci_low": float(low),
        "ci_high": float(high),
        "verdict": verdict,
    }


def pairings(runs: pd.DataFrame) -> list[tuple[str, str, str, list[int]]]:
    """(protocol, method, other, splits) of each learned method against the floor and against gradient boosting,
    and of each GARLIC preset and stacked model against the best boosting (``BEST``), on the splits both have
    run."""
    found = []
    for protocol_name, group in runs.groupby("protocol", sort=False):
        splits = {method: set(rows_of["split"].astype(int)) for method, rows_of in group.groupby("method")}
        wanted = [(m, FLOOR) for m in splits if m != FLOOR] + [
            (m, "hourly_gbm") for m in splits if m not in (FLOOR, "hourly_gbm")
        ]
        wanted += [(m, BEST) for m in splits if m not in METHODS]
        for method, other in wanted:
            shared = sorted(splits[method] & splits.get(other, set()))
            if shared:
                found.append((protocol_name, method, other, shared))
    return found


def pairs(units: dict, runs: pd.DataFrame) -> pd.DataFrame:
    """Each learned method against the floor and against gradient boosting, in utility (``pairings``)."""
    return pd.DataFrame(
        [paired_utility(units, method, other, protocol, shared) for protocol, method, other, shared in pairings(runs)]
    )


def report(
    summary: pd.DataFrame,
    paired: pd.DataFrame,
    per_alert: pd.DataFrame,
    per_alert_paired: pd.DataFrame,
    sites: pd.DataFrame,
    figures: list[Path],
    goals: pd.DataFrame,
) -> str:
    lines = [
        "# Early warning: the P19 hourly task, scored as the Sepsis Challenge scored it",
        "",
        "Made by `python -m experiments.early_warning --mlruns STORE --out docs/results` (its docstring says how). "
        "Dataset `physionet2019-hourly`: every stay of sets A and B, a prediction time at every ICU hour. Utility: "
        "the Challenge's normalised utility at the alarm threshold each run chose on its validation stays. AUROC "
        "and AUPRC: over every test hour. Warned in time: septic stays with an alarm from 12 h before onset to 3 h "
        "after; warning hours: median hours from that first alarm to onset; false alarms: alarmed hours of stays "
        "never septic or more than 12 h before onset, per 100 patient-days. Means +/- std over the protocol's "
        "splits; the ward columns pool the protocol's test stays. `cross-hospital` split 0 trains on A and tests "
        "on B, split 1 the reverse; `in-hospital` is the same models on their own hospital's held-out tenth. A row "
        "with fewer runs than its protocol has splits (five-split: 5, the others: 2) is not finished yet. "
        "Validation utility: the mean over splits of each run's utility on its validation stays at the threshold "
        "it chose there, what a choice between configurations reads (the test unread).",
        "",
        "| method | protocol | runs | validation utility | utility | hourly AUROC | hourly AUPRC | warned in time | "
        "warning hours | false alarms / 100 days |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summary.itertuples():
        lines.append(
            f"| {row.method} | {row.protocol} | {row.runs} | {row.validation_utility:.3f} | "
            f"{row.utility_mean:.3f} ± {row.utility_std:.3f} | "
            f"{row.auroc_mean:.3f} ± {row.auroc_std:.3f} | {row.auprc_mean:.3f} ± {row.auprc_std:.3f} | "
            f"{row.warned_in_time:.1%} | {row.median_warning_hours:.0f} | "
            f"{row.false_alarms_per_100_days:.0f} |"
        )
    lines += [
        "",
        "Published (another test set: the Challenge's hidden stays, not these): the Challenge's winners, gradient "
        "boosting on engineered features, scored a utility of about 0.43 on held-out stays of hospitals A and B, "
        "and each of the top three scored below zero on the unseen third hospital (Reyna et al., Crit Care Med "
        "2020).",
        "",
        "## Paired, in utility (95% bootstrap interval over test stays; an interval holding 0 is a tie)",
        "",
        "| method | against | protocol | runs | difference | 95% interval | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in paired.itertuples():
        lines.append(
            f"| {row.method} | {row.against} | {row.protocol} | {row.runs} | {row.difference:+.3f} | "
            f"[{row.ci_low:+.3f}, {row.ci_high:+.3f}] | {row.verdict} |"
        )
    return "\n".join(lines + alert_report(per_alert, per_alert_paired, sites, figures) + goal_report(goals)) + "\n"


def alert_report(per_alert: pd.DataFrame, paired: pd.DataFrame, sites: pd.DataFrame, figures: list[Path]) -> list[str]:
    """The per-alert sections of the report."""
    lines = [
        "",
        "## Per alert, under the alert policy",
        "",
        "What a ward reads: alerts, not hours. Each run's alarms go through the one alert policy "
        "(`garlic.metrics.alert_policy`: on at the threshold, cleared below 75% of it, then quiet for 24 hours "
        "unless the risk reaches 1.25 times the threshold), its threshold chosen on the run's validation stays by "
        "the Challenge's utility. An alert is a run of consecutive alarmed hours; it is true when it overlaps "
        "onset - 12 h to onset + 3 h of a septic stay (onset: the first labelled hour + 6). Sensitivity: septic "
        "stays with a true alert; PPV: true alerts over all alerts; lead time: onset minus the start of the first "
        "true alert, uncapped (median [quartiles]); burden: alerts per 100 patient-days; alerted: the share of all "
        "stays with an alert (definitions: `docs/alerts.md`). Utility: the Challenge's, of the policy's alarms, "
        "mean +/- std over splits; the rest pools the protocol's test stays. Rows whose units were archived before "
        "alert policies are left out until trained again.",
        "",
        "| method | protocol | runs | utility | sensitivity | PPV | lead hours | alerts / 100 days | alerted |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in per_alert.itertuples():
        lines.append(
            f"| {row.method} | {row.protocol} | {row.runs} | {row.policy_utility_mean:.3f} ± "
            f"{row.policy_utility_std:.3f} | {row.sensitivity:.1%} | {row.ppv:.1%} | {row.lead_median:.0f} "
            f"[{row.lead_q1:.0f}, {row.lead_q3:.0f}] | {row.alerts_per_100_days:.1f} | "
            f"{row.share_alerted:.1%} |"
        )
    lines += [
        "",
        "Anchors from deployed systems, judged per alert on their own hospitals (not these stays): the Epic Sepsis "
        "Model, externally validated, AUROC 0.63, missed two thirds of sepsis and alerted on 18% of all "
        "hospitalisations (Wong et al., JAMA Intern Med 2021); TREWS, about one alert in two to three confirmed "
        "(Adams et al., Nat Med 2022).",
        "",
    ]
    lines += [f"![Burden curves, {path.stem.removeprefix(TABLE + '-burden-')}]({path.name})" for path in figures]
    lines += [
        "",
        "## Per alert, paired (95% bootstrap interval over test stays; an interval holding 0 is a tie)",
        "",
        "| method | against | protocol | runs | score | difference | 95% interval | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in paired.itertuples():
        scale, digits, unit = (100, 1, " pts") if row.score in ("sensitivity", "ppv") else (1, 3, "")
        if row.score == "alerts_per_100_days":
            digits = 1
        lines.append(
            f"| {row.method} | {row.against} | {row.protocol} | {row.runs} | {row.score} | "
            f"{scale * row.difference:+.{digits}f}{unit} | [{scale * row.ci_low:+.{digits}f}, "
            f"{scale * row.ci_high:+.{digits}f}] | {row.verdict} |"
        )
    if len(sites):
        lines += [
            "",
            "## A new hospital's threshold",
            "",
            "Each `cross-hospital` model on the hospital it was not trained on, scored on that hospital's held-out "
            "tenth (the `in-hospital` test stays of the other direction), its threshold set three ways: `carried`, "
            "the source hospital's policy as it is; `site-burden`, set on the new hospital's own training stays, "
            "unlabelled, for the alerts per patient-day the source policy raised on the source's validation stays "
            "(`garlic calibrate --alerts-per-day`); `site-labelled`, the threshold of highest utility on the new "
            "hospital's validation stays, a tenth of it, labelled (`garlic calibrate --labelled`).",
            "",
            "| method | direction | policy | threshold | stays | utility | sensitivity | PPV | lead hours | "
            "alerts / 100 days |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in sites.itertuples():
            if pd.isna(row.alert_threshold):
                lines.append(f"| {row.method} | {row.direction} | {row.policy} | none | | {row.refused} | | | | |")
                continue
            lines.append(
                f"| {row.method} | {row.direction} | {row.policy} | {row.alert_threshold:.4g} | "
                f"{row.stays:.0f} | {row.utility:.3f} | {row.sensitivity:.1%} | {row.ppv:.1%} | "
                f"{row.lead_median:.0f} | {row.alerts_per_100_days:.1f} |"
            )
    return lines


def read_alerts(out: Path, runs: pd.DataFrame, kind: str = "alerts") -> dict[tuple[str, str, int], pd.DataFrame]:
    """Each archived unit's ``kind`` file by (method, protocol, split), for the units that chose an alert policy (a
    unit archived before policies were has none; its row has no per-alert scores)."""
    units = {}
    for row in runs[runs["alert_threshold"].notna()].itertuples():
        path = parts_path(out, row.method, row.protocol, int(row.split), kind)
        if not path.is_file():
            raise FileNotFoundError(
                f"{archive_folder(out) / 'runs.csv'} gives {row.method} {row.protocol}/split_"
                f"{row.split} an alert policy, but {path} is missing"
            )
        units[(row.method, row.protocol, int(row.split))] = pd.read_csv(path)
    return units


def complete(runs: pd.DataFrame) -> pd.DataFrame:
    """The units of (method, protocol) groups whose every run chose an alert policy."""
    whole = runs.groupby(["method", "protocol"])["alert_threshold"].transform(lambda t: t.notna().all())
    return runs[whole]


def alert_table(runs: pd.DataFrame, alerts: dict) -> pd.DataFrame:
    """Per method and protocol, under each run's alert policy: the utility (mean +/- std over splits) and the
    per-alert scores of the protocol's test stays pooled."""
    rows = []
    for (method, protocol_name), group in complete(runs).groupby(["method", "protocol"], sort=False):
        frames = [alerts[(method, protocol_name, int(split))] for split in group["split"]]
        utilities = [alerting.scores(alerting.as_parts(frame))["utility"] for frame in frames]
        pooled = alerting.scores(alerting.as_parts(pd.concat(frames, ignore_index=True)))
        rows.append(
            {
                "method": method,
                "protocol": protocol_name,
                "runs": len(group),
                "policy_utility_mean": np.mean(utilities),
                "policy_utility_std": np.std(utilities),
                **{name: value for name, value in pooled.items() if name != "utility"},
            }
        )
    return pd.DataFrame(rows)


def resampled_scores(frames: list[pd.DataFrame], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``ALERT_SCORES`` of ``BOOTSTRAP`` resamples of every split's stays (``frames``, a split each; each resample
    redraws each split's stays, a draw shared by every method through ``rng``'s seed): the utility as the mean over
    splits, the per-alert scores pooled over them."""
    totals, utilities = {}, []
    for frame in frames:
        parts = alerting.as_parts(frame)
        stays = len(frame)
        counts = rng.multinomial(stays, np.full(stays, 1 / stays), BOOTSTRAP).astype(np.float64)
        summed = {
            name: counts @ parts[name]
            for name in ("observed", "inaction", "best", "hours", "alerts", "true_alerts", "septic", "detected")
        }
        with np.errstate(divide="ignore", invalid="ignore"):
            utilities.append((summed["observed"] - summed["inaction"]) / (summed["best"] - summed["inaction"]))
        totals = {name: totals.get(name, 0) + value for name, value in summed.items()}
    with np.errstate(divide="ignore", invalid="ignore"):
        return {
            "utility": np.mean(utilities, axis=0),
            "sensitivity": totals["detected"] / totals["septic"],
            "ppv": totals["true_alerts"] / totals["alerts"],
            "alerts_per_100_days": 2400 * totals["alerts"] / totals["hours"],
        }


def paired_alerts(alerts: dict, method: str, other: str, protocol_name: str, splits: list[int]) -> list[dict]:
    """``method`` minus ``other`` under their alert policies, on the same test stays, in each of ``ALERT_SCORES``:
    the difference of the table's numbers and a 95% bootstrap interval over stays."""
    ours = [alerts[(method, protocol_name, split)] for split in splits]
    theirs = [alerts[(other, protocol_name, split)] for split in splits]
    for split, a, b in zip(splits, ours, theirs):
        if not np.array_equal(a["stay_id"], b["stay_id"]):
            raise ValueError(f"{method} and {other} on {protocol_name}/split_{split} were tested on other stays")
    difference = {
        name: a - b
        for (name, a), b in zip(
            resampled_scores(ours, np.random.default_rng(0)).items(),
            resampled_scores(theirs, np.random.default_rng(0)).values(),
        )
    }
    point = {}
    for frames, sign in ((ours, 1), (theirs, -1)):
        pooled = alerting.scores(alerting.as_parts(pd.concat(frames, ignore_index=True)))
        pooled["utility"] = np.mean([alerting.scores(alerting.as_parts(f))["utility"] for f in frames])
        for name in ALERT_SCORES:
            point[name] = point.get(name, 0.0) + sign * pooled[name]
    rows = []
    for name in ALERT_SCORES:
        low, high = np.nanpercentile(difference[name], [2.5, 97.5])
        verdict = "tie" if low <= 0 <= high else (f"{method} higher" if low > 0 else f"{other} higher")
        rows.append(
            {
                "method": method,
                "against": other,
                "protocol": protocol_name,
                "runs": len(splits),
                "score": name,
                "difference": float(point[name]),
                "ci_low": float(low),
                "ci_high": float(high),
                "verdict": verdict,
            }
        )
    return rows


def alert_pairs(alerts: dict, runs: pd.DataFrame) -> pd.DataFrame:
    """Each method under its policy against the floor and against gradient boosting (``pairings`` of the units that
    chose a policy)."""
    rows = []
    for protocol, method, other, shared in pairings(complete(runs)):
        rows += paired_alerts(alerts, method, other, protocol, shared)
    return pd.DataFrame(rows)


def site_table(out: Path, sites: pd.DataFrame) -> pd.DataFrame:
    """Per method, direction and way of setting a new hospital's threshold: what it scores on that hospital's
    held-out tenth."""
    rows = []
    for row in sites.itertuples():
        source, target = ("A", "B") if int(row.split) == 0 else ("B", "A")
        found = {
            "method": row.method,
            "direction": f"{source}->{target}",
            "policy": row.policy,
            "alert_threshold": row.alert_threshold,
        }
        if pd.isna(row.alert_threshold):  # no threshold met the burden asked
            rows.append(found | {"refused": row.refused})
            continue
        frame = pd.read_csv(parts_path(out, row.method, "cross-hospital", int(row.split), row.policy))
        rows.append(found | {"stays": len(frame), **alerting.scores(alerting.as_parts(frame))})
    return pd.DataFrame(rows)


# What a ward can live with (the bedside issue's goal): within a hospital, a TREWS-like alarm; across hospitals,
# with the site's own threshold, better than the Epic model's PPV of 0.13-0.26. Each entry: (score, at least or at
# most, the goal).
GOALS = {
    "within": (
        ("sensitivity", ">=", 0.80),
        ("ppv", ">=", 0.33),
        ("lead_median", ">=", 6),
        ("alerts_per_100_days", "<=", 30),
    ),
    "across": (("sensitivity", ">=", 0.70), ("ppv", ">=", 0.25)),
}
SITE_POLICIES = ("site-burden", "site-labelled")  # the site's own threshold


def shortfalls(point, scope: str) -> list[str]:
    """The goals of ``scope`` that the operating point ``point`` (its scores as attributes) misses, each said with
    the value and the goal."""
    missed = []
    for score, way, goal in GOALS[scope]:
        value = getattr(point, score)
        if (value < goal) if way == ">=" else (value > goal):
            shown = (f"{value:.1%}", f"{goal:.0%}") if score in ("sensitivity", "ppv") else (f"{value:.1f}", goal)
            missed.append(f"{score} {shown[0]} (goal {way} {shown[1]})")
    return missed


def frontier(curve: pd.DataFrame, sensitivity: float) -> tuple[float, float]:
    """The highest PPV of any threshold of a (summed) burden curve whose sensitivity is at least ``sensitivity``,
    and the alerts per 100 patient-days there; NaNs where no threshold reaches it."""
    scores = alerting.curve_scores(curve)
    reaching = scores[(scores["sensitivity"] >= sensitivity) & scores["ppv"].notna()]
    if reaching.empty:
        return np.nan, np.nan
    best = reaching.loc[reaching["ppv"].idxmax()]
    return float(best["ppv"]), float(best["alerts_per_100_days"])


def goal_table(out: Path, runs: pd.DataFrame, per_alert: pd.DataFrame, sites: pd.DataFrame) -> pd.DataFrame:
    """Each method against ``GOALS``: within hospitals (``five-split``, ``in-hospital``) at the policy it chose on
    validation, across them (``cross-hospital``, each direction) at the site's own threshold (``SITE_POLICIES``);
    what it misses, and, read from the test stays' burden curve (not a choice: no threshold is chosen on test), the
    best PPV any threshold gives at the goal's sensitivity."""
    rows, chosen = [], complete(runs)
    for point in per_alert[per_alert["protocol"] != "cross-hospital"].itertuples():
        splits = chosen[(chosen["method"] == point.method) & (chosen["protocol"] == point.protocol)]["split"]
        best = frontier(pooled_curve(out, point.method, point.protocol, splits), GOALS["within"][0][2])
        rows.append(goal_row(point, point.protocol, "chosen on validation", "within", best))
    for point in sites[sites["policy"].isin(SITE_POLICIES)].dropna(subset=["alert_threshold"]).itertuples():
        split = 0 if point.direction == "A->B" else 1
        best = frontier(pooled_curve(out, point.method, "cross-hospital", [split]), GOALS["across"][0][2])
        rows.append(goal_row(point, f"cross-hospital {point.direction}", point.policy, "across", best))
    return pd.DataFrame(rows)


def goal_row(point, where: str, policy: str, scope: str, best: tuple[float, float]) -> dict:
    missed = shortfalls(point, scope)
    return {
        "method": point.method,
        "where": where,
        "policy": policy,
        "sensitivity": point.sensitivity,
        "ppv": point.ppv,
        "lead_median": point.lead_median,
        "alerts_per_100_days": point.alerts_per_100_days,
        "missed": "; ".join(missed) if missed else "none: goal reached",
        "best_ppv_at_goal_sensitivity": best[0],
        "alerts_per_100_days_there": best[1],
    }


def goal_report(goals: pd.DataFrame) -> list[str]:
    """The section that says where each method stands against ``GOALS``, and how far it is."""
    if goals.empty:
        return []
    lines = [
        "",
        "## Against the ward's goal",
        "",
        "Within hospitals: sensitivity at least 80%, PPV at least 33% (TREWS's one alert in three), a median lead of "
        "at least 6 hours, at most 30 alerts per 100 patient-days, at the policy chosen on validation. Across "
        "hospitals, with the site's own threshold (`site-burden`, `site-labelled` above): PPV at least 25% with "
        "sensitivity at least 70%. `missed` lists what the operating point falls short of. The last two columns say "
        "how far any threshold of the policy could go: on the test stays' burden curve (read, not chosen: no "
        "threshold is picked on test), the best PPV at the goal's sensitivity (80% within, 70% across) and the "
        "burden there.",
        "",
        "| method | where | policy | sensitivity | PPV | lead hours | alerts / 100 days | missed | best PPV at "
        "the goal's sensitivity | alerts / 100 days there |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in goals.itertuples():
        best = (
            "none reaches it"
            if pd.isna(row.best_ppv_at_goal_sensitivity)
            else f"{row.best_ppv_at_goal_sensitivity:.1%}"
        )
        there = "" if pd.isna(row.alerts_per_100_days_there) else f"{row.alerts_per_100_days_there:.1f}"
        lines.append(
            f"| {row.method} | {row.where} | {row.policy} | {row.sensitivity:.1%} | {row.ppv:.1%} | "
            f"{row.lead_median:.0f} | {row.alerts_per_100_days:.1f} | {row.missed} | {best} | {there} |"
        )
    return lines


def pooled_curve(out: Path, method: str, protocol_name: str, splits) -> pd.DataFrame:
    """The archived burden curves of a method's units on ``splits`` of a protocol, summed (their counts add up)."""
    frames = [read_curve(parts_path(out, method, protocol_name, int(split), "curve")) for split in splits]
    return sum(frame.set_index("threshold") for frame in frames).reset_index()


def read_curve(path: Path) -> pd.DataFrame:
    """A unit's archived burden curve, refused naming the file when its columns are not ``CURVE_COLUMNS``."""
    curve = pd.read_csv(path)
    if tuple(curve.columns) != alerting.CURVE_COLUMNS:
        raise ValueError(f"{path}: columns {list(curve.columns)}, expected {list(alerting.CURVE_COLUMNS)}")
    return curve


def burden_figures(out: Path, runs: pd.DataFrame, summary: pd.DataFrame) -> list[Path]:
    """Per protocol, each method's sensitivity and PPV against alerts per 100 patient-days over its policy's
    threshold (the curves of its splits summed), its chosen operating point marked: ``early-warning-burden-
    <protocol>.png``."""
    written = []
    for protocol_name, group in complete(runs).groupby("protocol", sort=False):
        curves, chosen = {}, {}
        for method, of_method in group.groupby("method", sort=False):
            curves[method] = alerting.curve_scores(pooled_curve(out, method, protocol_name, of_method["split"]))
            point = summary[(summary["method"] == method) & (summary["protocol"] == protocol_name)].iloc[0]
            chosen[method] = (point["alerts_per_100_days"], point["sensitivity"], point["ppv"])
        figure = plots.burden_figure(curves, chosen, f"P19 hourly, {protocol_name}: test stays pooled")
        path = out / f"{TABLE}-burden-{protocol_name}.png"
        with atomic_file(path, suffix=".png") as handle:
            figure.savefig(handle, format="png", dpi=110)
        plots.plt.close(figure)
        written.append(path)
    return written


def write_table(out: Path, runs: pd.DataFrame) -> pd.DataFrame:
    units = read_parts(out, runs)
    summary, paired = table(runs, units), pairs(units, runs)
    alerts = read_alerts(out, runs)
    per_alert, per_alert_paired = alert_table(runs, alerts), alert_pairs(alerts, runs)
    sites_index = archive_folder(out) / "site-thresholds.csv"
    sites = site_table(out, pd.read_csv(sites_index)) if sites_index.is_file() else pd.DataFrame()
    for name, frame in (
        (f"{TABLE}.csv", summary),
        (f"{TABLE}-paired.csv", paired),
        (f"{TABLE}-alerts.csv", per_alert),
        (f"{TABLE}-alerts-paired.csv", per_alert_paired),
        (f"{TABLE}-sites.csv", sites),
    ):
        with atomic_file(out / name, mode="w", suffix=".csv") as handle:
            frame.to_csv(handle, index=False, float_format="%.6g")
    figures = burden_figures(out, runs, per_alert) if len(per_alert) else []
    goals = goal_table(out, runs, per_alert, sites) if len(per_alert) else pd.DataFrame()
    with atomic_file(out / f"{TABLE}-goal.csv", mode="w", suffix=".csv") as handle:
        goals.to_csv(handle, index=False, float_format="%.6g")
    faithfulness = out / FAITHFULNESS
    drivers = pd.read_csv(faithfulness) if faithfulness.is_file() else pd.DataFrame()
    with atomic_file(out / f"{TABLE}.md", mode="w", suffix=".md") as handle:
        handle.write(
            report(summary, paired, per_alert, per_alert_paired, sites, figures, goals) + drivers_report(drivers)
        )
    return summary


def drivers_report(drivers: pd.DataFrame) -> str:
    """The section on the faithfulness of each method's alert drivers (``experiments.alert_faithfulness``'s rows,
    kept beside the table as ``FAITHFULNESS``); nothing where they were not measured."""
    if drivers.empty:
        return ""
    lines = [
        "",
        "## Are an alert's drivers the ones the model needs?",
        "",
        "At alerted hours, half of the variables observed by then are removed from the record, ranked by the "
        "model's own explanation at that hour (the drivers the ward and the dashboard show), and the model asked "
        "again: the mean drop in risk when the top, a random or the bottom half goes. Faithful drivers give top > "
        "random > bottom. Made by `" + drivers["command"].iloc[0] + "` (how and on which stays: "
        "`alert-faithfulness.md`).",
        "",
        "| method | split | threshold | alerted hours | mean risk | drop, top half | drop, random half | "
        "drop, bottom half |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in drivers.itertuples():
        lines.append(
            f"| {row.method} | {row.split} | {row.threshold:.3f} | {row.alerts:.0f} | {row.risk:.3f} | "
            f"{row.drop_top:.3f} | {row.drop_random:.3f} | {row.drop_bottom:.3f} |"
        )
    return "\n".join(lines) + "\n"


def merged_runs(out: Path, made: pd.DataFrame) -> pd.DataFrame:
    """The archive's runs, with those made now replacing the same units'."""
    index = archive_folder(out) / "runs.csv"
    before = pd.read_csv(index, dtype={"run_id": str, "settings": str, "data_digest": str}) if index.is_file() else None
    if before is None or before.empty:
        return made
    key = ["method", "protocol", "split"]
    kept = before[~before.set_index(key).index.isin(made.set_index(key).index)]
    return pd.concat([kept, made], ignore_index=True) if len(made) else kept


def merged_sites(out: Path, made: pd.DataFrame) -> pd.DataFrame:
    """The archive's new-hospital policies, with those made now replacing the same units'."""
    index = archive_folder(out) / "site-thresholds.csv"
    before = pd.read_csv(index) if index.is_file() else pd.DataFrame(columns=SITE_COLUMNS)
    if made.empty:
        return before
    key = ["method", "split", "policy"]
    kept = before[~before.set_index(key).index.isin(made.set_index(key).index)]
    return pd.concat([kept, made], ignore_index=True) if len(kept) else made


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="*", default=list(METHODS), help="registry methods (none: presets only)")
    parser.add_argument("--presets", nargs="*", default=[], help="GARLIC presets (garlic/configs/NAME.json)")
    parser.add_argument(
        "--stacked", nargs="*", default=[], metavar="PRESET", help=f"{STACKED} with GARLIC of each of these presets"
    )
    parser.add_argument("--protocols", nargs="+", default=list(PROTOCOLS))
    parser.add_argument("--mlruns", type=Path, default=Path("mlruns"))
    parser.add_argument("--data-root", type=Path, default=DEFAULT_DATA_ROOT)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--no-train", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    made, sites = train_and_keep(
        args.methods,
        args.presets,
        args.stacked,
        args.protocols,
        args.mlruns,
        args.data_root,
        args.out,
        not args.no_train,
    )
    if args.out is not None:
        index = archive_folder(args.out) / "runs.csv"
        with atomic_file(index, mode="w", suffix=".csv") as handle:
            merged_runs(args.out, made).to_csv(handle, index=False, float_format="%.6g")
        with atomic_file(archive_folder(args.out) / "site-thresholds.csv", mode="w", suffix=".csv") as handle:
            merged_sites(args.out, sites).to_csv(handle, index=False, float_format="%.6g")
        # The table from the archive as kept, so that it is made the same with or without the stores.
        runs = pd.read_csv(index, dtype={"run_id": str, "settings": str, "data_digest": str})
        print(write_table(args.out, runs.reindex(columns=RUN_COLUMNS)).to_string(index=False))


if __name__ == "__main__":
    main()
