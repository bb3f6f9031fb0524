"""The P12 early-hours table: the mortality risk a bedside sees at hours 6, 12, 24, 36 and 48 of a stay, scored.

    python -m experiments.early_hours --mlruns STORE --out docs/results

On ``physionet2012-hourly`` (``garlic preprocess physionet2012 --cohort hourly``: P12's stays with a prediction time
at every whole ICU hour, labelled with the stay's in-hospital death), through the one fit-select-test-log path
(``garlic.studies.Baselines``, resumable), on the ``five-split`` splits of ``--splits``:

- ``garlic_whole_stays`` with ``--preset`` (default ``physionet2012-fast``, the recommended one): GARLIC trained as
  the per-stay task trains it, on whole 48-hour stays, and asked at each hour on the record cut there: what the
  dashboard's replay shows today;
- ``garlic`` with the same preset, trained on every hour's prefix at once (a loss at every prediction time);
- ``hourly_gbm``: gradient boosting on features of the record up to each hour, trained on every hour.

Each run selects on its validation stays and is tested once, at every hour; the table reads the hours of ``HOURS``.
P12's stays were all in the ICU for at least 48 hours, so every test stay counts at every hour (from its first
observation on: a stay not yet observed at hour 6 is left out there).

With ``--out``, each unit's test risks at ``HOURS`` are kept in ``OUT/physionet2012-hourly-runs/`` (``runs.csv`` and
``<row>/split_<k>.csv.gz``), and the tables are made from that archive alone: ``early-hours.md`` and
``early-hours.csv`` (per row and hour, AUROC and AUPRC mean +/- std over splits) and ``early-hours-paired.csv``
(each row trained on every hour against the whole-stays row, per hour: the AUROC difference with a 95% bootstrap
interval over test stays, ``garlic.evaluation.stats.paired_difference``). ``--no-train`` only gathers what the
store and the archive hold.
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
from garlic.evaluation.stats import paired_difference
from garlic.io.atomic import atomic_file
from garlic.io.tables import read_manifest
from garlic.metrics import binary_metrics
from garlic.tracking import queries, run_contract
from garlic.tracking.archive import GZIP, Unit

log = logging.getLogger("experiments")

DATASET = "physionet2012-hourly"
PROTOCOL = "five-split"
HOURS = (6, 12, 24, 36, 48)
PRESET = "physionet2012-fast"
WHOLE_STAYS = "garlic_whole_stays"
GARLIC_METHODS = (WHOLE_STAYS, "garlic")  # trained with the preset
BASELINES = ("hourly_gbm",)
TABLE = "early-hours"
RUN_COLUMNS = ["method", "split", "run_id", "settings", "data_digest", "auroc", "auprc"]
RISK_COLUMNS = ["stay_id", "time", "label", "risk"]


def archive_folder(out: Path) -> Path:
    return Path(out) / f"{DATASET}-runs"


def risks_path(out: Path, row: str, split: int) -> Path:
    return archive_folder(out) / row.replace(" ", "") / f"split_{split}.csv.gz"


def row_name(method: str, preset: str | None) -> str:
    return method if preset is None else f"{method} ({preset})"


def train_and_keep(
    preset: str, overrides: list[str], splits: list[int], store: Path, data_root: Path, out: Path | None, train: bool
) -> pd.DataFrame:
    """Every unit's run (trained where missing, with ``train``), and with ``out`` its test risks at ``HOURS``."""
    digest = run_contract.manifest_digest(read_manifest(processed_folder(DATASET, data_root)))
    cohort = studies.load_cohort(DATASET, data_root, PROTOCOL, splits)
    plans = [
        (studies.preset_config(preset, DATASET, overrides), GARLIC_METHODS, preset),
        (Config.for_dataset(DATASET), BASELINES, None),
    ]
    rows = []
    for config, methods, named_preset in plans:
        runner = studies.Baselines(config.override({"split_protocol": PROTOCOL}), cohort, data_root, store)
        for record in runner.run(list(methods), train).to_dict("records"):
            row = {
                "method": row_name(record["method"], named_preset),
                "split": record["split"],
                "run_id": record["run_id"],
                "settings": queries.settings_digest(runner.settings(record["method"])),
                "data_digest": digest,
                "auroc": record["test_auroc"],
                "auprc": record["test_auprc"],
            }
            rows.append(row)
            if out is not None:
                predictions = queries.test_predictions(store, row["run_id"])
                path = risks_path(out, row["method"], row["split"])
                path.parent.mkdir(parents=True, exist_ok=True)
                with atomic_file(path, suffix=".csv.gz") as handle:
                    predictions.loc[predictions["time"].isin(HOURS), RISK_COLUMNS].to_csv(
                        handle, index=False, compression=GZIP, float_format="%.6g"
                    )
            log.info("%s split_%d: kept", row["method"], row["split"])
    return pd.DataFrame(rows, columns=RUN_COLUMNS)


def read_risks(out: Path, runs: pd.DataFrame) -> dict[tuple[str, int], pd.DataFrame]:
    """Each archived unit's test risks at ``HOURS``, by (row, split); a unit whose file is missing is refused."""
    units = {}
    for run in runs.itertuples():
        path = risks_path(out, run.method, int(run.split))
        if not path.is_file():
            raise FileNotFoundError(
                f"{archive_folder(out) / 'runs.csv'} lists {run.method} split_{run.split}, but {path} is missing"
            )
        frame = pd.read_csv(path)
        if list(frame.columns) != RISK_COLUMNS:
            raise ValueError(f"{path}: columns {list(frame.columns)}, expected {RISK_COLUMNS}")
        units[(run.method, int(run.split))] = frame
    return units


def table(runs: pd.DataFrame, units: dict) -> pd.DataFrame:
    """Per row and hour: AUROC and AUPRC mean +/- std over splits, the test stays scored there (per split), their
    deaths' share and the mean risk (a risk that reads as a probability at every hour has the two alike)."""
    records = []
    for row, group in runs.groupby("method", sort=False):
        for hour in HOURS:
            frames = [units[(row, int(split))] for split in group["split"]]
            at_hour = [frame[frame["time"] == hour] for frame in frames]
            scores = [binary_metrics(at["label"].to_numpy(), at["risk"].to_numpy()) for at in at_hour]
            stays = [len(at) for at in at_hour]
            records.append(
                {
                    "method": row,
                    "hour": hour,
                    "runs": len(group),
                    "stays": int(np.mean(stays)),
                    "deaths": float(np.mean([at["label"].mean() for at in at_hour])),
                    "mean_risk": float(np.mean([at["risk"].mean() for at in at_hour])),
                    **{
                        f"{m}_{stat}": getattr(np, stat)([s[m] for s in scores])
                        for m in ("auroc", "auprc")
                        for stat in ("mean", "std")
                    },
                }
            )
    return pd.DataFrame(records)


def as_unit(row: str, split: int, frame: pd.DataFrame, hour: int) -> Unit:
    at = frame[frame["time"] == hour]
    return Unit(row, PROTOCOL, split, None, "", "", {}, at[["stay_id", "label", "risk"]].reset_index(drop=True))


def pairs(runs: pd.DataFrame, units: dict) -> pd.DataFrame:
    """Each row trained on every hour against the whole-stays row, per hour, on the splits both have run."""
    splits = {row: set(group["split"].astype(int)) for row, group in runs.groupby("method")}
    against = next((row for row in splits if row.startswith(WHOLE_STAYS)), None)
    records = []
    for row in splits:
        shared = sorted(splits[row] & splits.get(against, set()))
        if row == against or not shared:
            continue
        for hour in HOURS:
            ours = [as_unit(row, s, units[(row, s)], hour) for s in shared]
            theirs = [as_unit(against, s, units[(against, s)], hour) for s in shared]
            records.append(
                {
                    "method": row,
                    "against": against,
                    "hour": hour,
                    "runs": len(shared),
                    **paired_difference(ours, theirs, "auroc"),
                }
            )
    return pd.DataFrame(records)


def report(summary: pd.DataFrame, paired: pd.DataFrame) -> str:
    lines = [
        "# P12 early hours: the mortality risk at hours 6 to 48, scored",
        "",
        "Made by `python -m experiments.early_hours --mlruns STORE --out docs/results` (its docstring says how). "
        f"Dataset `{DATASET}`: P12's stays with a prediction time at every whole ICU hour (the label: in-hospital "
        "death), `five-split` splits. AUROC and AUPRC over the test stays at that hour (all of them were still in "
        "the ICU; a stay not yet observed at hour 6 is left out there), mean +/- std over splits; `stays`: test "
        "stays scored at that hour, per split; `deaths` their share who died, beside the `mean risk` the row gave "
        "them. `garlic_whole_stays`: GARLIC trained on whole 48-hour stays (the "
        "per-stay task) and asked on the record cut at each hour, as the dashboard's replay does; `garlic`: the same "
        "preset trained on every hour's prefix; `hourly_gbm`: gradient boosting on features of the record up to "
        "each hour, trained on every hour. No setting was tuned for this table.",
        "",
        "| method | hour | runs | stays | deaths | mean risk | AUROC | AUPRC |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in summary.itertuples():
        lines.append(
            f"| {r.method} | {r.hour} | {r.runs} | {r.stays} | {r.deaths:.3f} | {r.mean_risk:.3f} | "
            f"{r.auroc_mean:.3f} ± {r.auroc_std:.3f} | "
            f"{r.auprc_mean:.3f} ± {r.auprc_std:.3f} |"
        )
    if len(paired):
        lines += [
            "",
            "## Paired, in AUROC against the whole-stays GARLIC (95% bootstrap interval over test stays; an "
            "interval holding 0 is a tie)",
            "",
            "| method | hour | runs | difference | 95% interval | verdict |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {p.method} | {p.hour} | {p.runs} | {p.difference:+.4f} | [{p.ci_low:+.4f}, {p.ci_high:+.4f}] | "
            f"{p.verdict} |"
            for p in paired.itertuples()
        ]
    return "\n".join(lines) + "\n"


def write_tables(out: Path, runs: pd.DataFrame) -> None:
    """The archive's ``runs.csv`` (the units given, merged over what it held) and the tables made from it alone."""
    folder = archive_folder(out)
    folder.mkdir(parents=True, exist_ok=True)
    held = folder / "runs.csv"
    if held.is_file():
        old = pd.read_csv(held, dtype={"settings": str, "data_digest": str})
        runs = pd.concat([old, runs]).drop_duplicates(["method", "split"], keep="last")
    runs = runs.sort_values(["method", "split"], kind="stable", ignore_index=True)
    with atomic_file(held, suffix=".csv") as handle:
        runs.to_csv(handle, index=False)
    units = read_risks(out, runs)
    summary, paired = table(runs, units), pairs(runs, units)
    for name, frame in ((f"{TABLE}.csv", summary), (f"{TABLE}-paired.csv", paired)):
        with atomic_file(Path(out) / name, suffix=".csv") as handle:
            frame.to_csv(handle, index=False, float_format="%.6g")
    with atomic_file(Path(out) / f"{TABLE}.md", suffix=".md") as handle:
        handle.write(report(summary, paired).encode())
    log.info("wrote %s", Path(out) / f"{TABLE}.md")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mlruns", type=Path, default=Path("mlruns-early-hours"), help="the MLflow store")
    parser.add_argument("--out", type=Path, help="the archive and tables (docs/results)")
    parser.add_argument("--data-root", type=Path, default=DEFAULT_DATA_ROOT)
    parser.add_argument("--splits", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="five-split splits")
    parser.add_argument("--preset", default=PRESET, help="GARLIC's preset (garlic/configs/)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the preset changed (repeatable; the runs are then other units)",
    )
    parser.add_argument("--no-train", action="store_true", help="gather finished runs only")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    runs = train_and_keep(
        args.preset, args.overrides, args.splits, args.mlruns, args.data_root, args.out, not args.no_train
    )
    if args.out is not None:
        write_tables(args.out, runs)
    else:
        print(runs.to_string(index=False))


if __name__ == "__main__":
    main()
