"""The early-warning table: the P19 hourly task (a risk and an alarm at every ICU hour), scored as the Sepsis
Challenge scored it, within and across hospitals.

    python -m experiments.early_warning --mlruns STORE --out docs/results

Every method of ``--methods`` (registry names: the hourly baselines and the floor by default) and GARLIC with each
preset of ``--presets`` (files of ``garlic/configs/``, trained on every hour at once; a row named by the preset) is
trained on every split of every protocol of ``--protocols`` through the one fit-select-test-log path
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
learned method against the floor, and logistic regression against gradient boosting, in utility: the mean
difference over splits with a 95% bootstrap interval over test stays (each resample redraws every split's test
stays; an interval holding 0 is a tie).

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
from garlic.evaluation.stats import BOOTSTRAP
from garlic.io.atomic import atomic_file
from garlic.io.tables import read_manifest
from garlic.metrics.utility import STAY_PARTS, choose_threshold, stay_lengths, stay_parts, ward_scores
from garlic.tracking import queries, run_contract

log = logging.getLogger("experiments")

DATASET = "physionet2019-hourly"
METHODS = ("hourly_gbm", "hourly_gbm_utility", "hourly_logreg", "alarm_after_hour")
FLOOR = "alarm_after_hour"
PROTOCOLS = ("five-split", "cross-hospital", "in-hospital")
TABLE = "early-warning"
RUN_COLUMNS = ["method", "protocol", "split", "run_id", "settings", "data_digest", "threshold", "validation_utility",
               "auroc", "auprc"]  # fmt: skip
WARD = ("utility", "warned_in_time", "median_warning_hours", "false_alarms_per_100_days")


def archive_folder(out: Path) -> Path:
    return Path(out) / f"{DATASET}-runs"


def parts_path(out: Path, method: str, protocol: str, split: int) -> Path:
    return archive_folder(out) / method / f"{protocol}-split_{split}.csv.gz"


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


def train_and_keep(methods: list[str], presets: list[str], protocols: list[str], store: Path, data_root: Path,
                   out: Path | None, train: bool) -> pd.DataFrame:  # fmt: skip
    """Every unit's run (trained where missing, with ``train``), and with ``out`` its stays' parts kept there."""
    digest = run_contract.manifest_digest(read_manifest(processed_folder(DATASET, data_root)))
    experiment = studies.open_experiment(f"baselines-{DATASET}", store)
    rows = []
    for protocol_name in protocols:
        cohort = studies.load_cohort(DATASET, data_root, protocol_name, None)
        configs = {None: Config.for_dataset(DATASET)} | {
            preset: studies.preset_config(preset, DATASET, []) for preset in presets}
        records = []
        for preset, config in configs.items():
            runner = studies.Baselines(config.override({"split_protocol": protocol_name}), cohort, experiment,
                                       data_root, store)  # fmt: skip
            chosen = methods if preset is None else ["garlic"]
            records += [(preset or record["method"], runner.settings(record["method"]), record)
                        for record in runner.run(chosen, train).to_dict("records")]  # fmt: skip
        for name, settings, record in records:
            row = {"method": name, "protocol": protocol_name, "split": record["split"],
                   "run_id": record["run_id"], "settings": queries.settings_digest(settings),
                   "data_digest": digest, "threshold": record["threshold"],
                   "validation_utility": validation_utility(store, record["run_id"]), "auroc": record["test_auroc"],
                   "auprc": record["test_auprc"]}  # fmt: skip
            rows.append(row)
            if out is not None:
                path = parts_path(out, row["method"], protocol_name, row["split"])
                path.parent.mkdir(parents=True, exist_ok=True)
                with atomic_file(path, suffix=".csv.gz") as handle:
                    unit_parts(store, row["run_id"], row["threshold"]).to_csv(handle, index=False, compression="gzip",
                                                                              float_format="%.6g")  # fmt: skip
            log.info("%s %s/split_%d: utility kept", row["method"], protocol_name, row["split"])
        del cohort
    return pd.DataFrame(rows, columns=RUN_COLUMNS)


def read_parts(out: Path, runs: pd.DataFrame) -> dict[tuple[str, str, int], pd.DataFrame]:
    """Each archived unit's stay parts, by (method, protocol, split); a unit whose file is missing is refused."""
    units = {}
    for row in runs.itertuples():
        path = parts_path(out, row.method, row.protocol, int(row.split))
        if not path.is_file():
            raise FileNotFoundError(f"{archive_folder(out) / 'runs.csv'} lists {row.method} {row.protocol}/split_"
                                    f"{row.split}, but {path} is missing")  # fmt: skip
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
        rows.append({"method": method, "protocol": protocol_name, "runs": len(group),
                     "validation_utility": group["validation_utility"].mean(),
                     "utility_mean": np.mean(utilities), "utility_std": np.std(utilities),
                     "auroc_mean": group["auroc"].mean(), "auroc_std": group["auroc"].std(ddof=0),
                     "auprc_mean": group["auprc"].mean(), "auprc_std": group["auprc"].std(ddof=0),
                     **{name: pooled[name] for name in WARD[1:]}})  # fmt: skip
    return pd.DataFrame(rows)


def resampled_utility(parts: dict[str, np.ndarray], counts: np.ndarray) -> np.ndarray:
    """The normalised utility of each resample of the stays (``counts``: [resamples, stays] times each is drawn)."""
    observed, inaction, best = (counts @ parts[name] for name in ("observed", "inaction", "best"))
    with np.errstate(divide="ignore", invalid="ignore"):  # a resample without a septic stay: NaN, as the Challenge
        return (observed - inaction) / (best - inaction)


def paired_utility(units: dict, method: str, other: str, protocol_name: str, splits: list[int],
                   seed: int = 0) -> dict[str, float]:  # fmt: skip
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
    return {"method": method, "against": other, "protocol": protocol_name, "runs": len(splits),
            "difference": float(np.mean(differences)), "ci_low": float(low), "ci_high": float(high),
            "verdict": verdict}  # fmt: skip


def pairs(units: dict, runs: pd.DataFrame) -> pd.DataFrame:
    """Each learned method against the floor and against gradient boosting, on the splits both have run."""
    rows = []
    for protocol_name, group in runs.groupby("protocol", sort=False):
        splits = {method: set(rows_of["split"].astype(int)) for method, rows_of in group.groupby("method")}
        wanted = [(m, FLOOR) for m in splits if m != FLOOR] + [(m, "hourly_gbm") for m in splits
                                                               if m not in (FLOOR, "hourly_gbm")]  # fmt: skip
        for method, other in wanted:
            shared = sorted(splits[method] & splits.get(other, set()))
            if shared:
                rows.append(paired_utility(units, method, other, protocol_name, shared))
    return pd.DataFrame(rows)


def report(summary: pd.DataFrame, paired: pd.DataFrame) -> str:
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
        lines.append(f"| {row.method} | {row.protocol} | {row.runs} | {row.validation_utility:.3f} | "
                     f"{row.utility_mean:.3f} ± {row.utility_std:.3f} | "
                     f"{row.auroc_mean:.3f} ± {row.auroc_std:.3f} | {row.auprc_mean:.3f} ± {row.auprc_std:.3f} | "
                     f"{row.warned_in_time:.1%} | {row.median_warning_hours:.0f} | "
                     f"{row.false_alarms_per_100_days:.0f} |")  # fmt: skip
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
        lines.append(f"| {row.method} | {row.against} | {row.protocol} | {row.runs} | {row.difference:+.3f} | "
                     f"[{row.ci_low:+.3f}, {row.ci_high:+.3f}] | {row.verdict} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def write_table(out: Path, runs: pd.DataFrame) -> pd.DataFrame:
    units = read_parts(out, runs)
    summary, paired = table(runs, units), pairs(units, runs)
    for name, frame in ((f"{TABLE}.csv", summary), (f"{TABLE}-paired.csv", paired)):
        with atomic_file(out / name, mode="w", suffix=".csv") as handle:
            frame.to_csv(handle, index=False, float_format="%.6g")
    with atomic_file(out / f"{TABLE}.md", mode="w", suffix=".md") as handle:
        handle.write(report(summary, paired))
    return summary


def merged_runs(out: Path, made: pd.DataFrame) -> pd.DataFrame:
    """The archive's runs, with those made now replacing the same units'."""
    index = archive_folder(out) / "runs.csv"
    before = pd.read_csv(index, dtype={"run_id": str, "settings": str, "data_digest": str}) if index.is_file() else None
    if before is None or before.empty:
        return made
    key = ["method", "protocol", "split"]
    kept = before[~before.set_index(key).index.isin(made.set_index(key).index)]
    return pd.concat([kept, made], ignore_index=True) if len(made) else kept


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="*", default=list(METHODS), help="registry methods (none: presets only)")
    parser.add_argument("--presets", nargs="*", default=[], help="GARLIC presets (garlic/configs/NAME.json)")
    parser.add_argument("--protocols", nargs="+", default=list(PROTOCOLS))
    parser.add_argument("--mlruns", type=Path, default=Path("mlruns"))
    parser.add_argument("--data-root", type=Path, default=DEFAULT_DATA_ROOT)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--no-train", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    made = train_and_keep(args.methods, args.presets, args.protocols, args.mlruns, args.data_root, args.out,
                          not args.no_train)  # fmt: skip
    if args.out is not None:
        index = archive_folder(args.out) / "runs.csv"
        with atomic_file(index, mode="w", suffix=".csv") as handle:
            merged_runs(args.out, made).to_csv(handle, index=False, float_format="%.6g")
        # The table from the archive as kept, so that it is made the same with or without the stores.
        runs = pd.read_csv(index, dtype={"run_id": str, "settings": str, "data_digest": str})
        print(write_table(args.out, runs).to_string(index=False))


if __name__ == "__main__":
    main()
