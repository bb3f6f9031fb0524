"""The comparison table: every method on every protocol, with paired differences against the best simple baseline,
made from its units (``garlic.studies.comparison_units``) and written with its report (``make_table``; the command
is ``python -m experiments.compare``, whose help says what each part means).
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from garlic import studies
from garlic.config import Config
from garlic.data.datasets import ensure_processed, processed_folder
from garlic.data.splits import DIRECTIONS, PROTOCOLS, load_splits, protocol
from garlic.evaluation import published
from garlic.evaluation.stats import BOOTSTRAP, paired_difference
from garlic.io.atomic import atomic_file
from garlic.io.tables import LABELS, DatasetNotFoundError, read_manifest
from garlic.io.tensors import load_tensors
from garlic.methods import registry
from garlic.studies.comparison_units import Pending, baseline_units, garlic_units, protocol_dataset, train_in_workers
from garlic.tracking import run_contract
from garlic.tracking.archive import RUNS, RunArchive, Unit, open_archive
from garlic.tracking.carry import of_data
from garlic.training.state import progress_of

log = logging.getLogger("experiments")

COLUMNS = ["method", "protocol", "runs", "auroc_mean", "auroc_std", "auprc_mean", "auprc_std", "brier_mean", "ece_mean"]


def table(units: list[Unit], protocols: list[str], dataset: str | None = None) -> pd.DataFrame:
    """One row per method and protocol (in first-seen order), then the published rows of those protocols on the
    table ``dataset`` (none without it)."""
    rows = []
    frame = pd.DataFrame([{"method": u.method, "protocol": u.protocol, **u.metrics} for u in units])
    if len(frame):
        for (method, protocol_name), group in frame.groupby(["method", "protocol"], sort=False):
            rows.append(
                {
                    "method": method,
                    "protocol": protocol_name,
                    "runs": len(group),
                    "auroc_mean": group["auroc"].mean(),
                    "auroc_std": group["auroc"].std(ddof=0),
                    "auprc_mean": group["auprc"].mean(),
                    "auprc_std": group["auprc"].std(ddof=0),
                    "brier_mean": group["brier"].mean(),
                    "ece_mean": group["ece"].mean(),
                }
            )
    shown = (
        []
        if dataset is None
        else [row for name in protocols for row in published.results(protocol_dataset(dataset, name), name)]
    )
    for row in shown:
        rows.append(
            {
                "method": row.method,
                "protocol": row.protocol,
                "runs": None,
                "auroc_mean": row.auroc[0],
                "auroc_std": row.auroc[1],
                "auprc_mean": row.auprc[0],
                "auprc_std": row.auprc[1],
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS).astype({"runs": "Int64"})  # published rows have none


DROP_COLUMNS = ["method", "direction", "metric", "in_hospital", "cross_hospital", "drop"]


def hospital_drops(units: list[Unit]) -> pd.DataFrame:
    """Per method, direction and metric: the ``in-hospital`` test, the ``cross-hospital`` test of the same model
    (the same training and validation stays, the same seed) and the drop between them."""
    home = {(u.method, u.split, u.seed): u for u in units if u.protocol == "in-hospital"}
    rows = []
    for unit in units:
        same = home.get((unit.method, unit.split, unit.seed)) if unit.protocol == "cross-hospital" else None
        if same is not None:
            source, target = DIRECTIONS[unit.split]
            for metric in ("auroc", "auprc"):
                rows.append(
                    {
                        "method": unit.method,
                        "direction": f"{source} -> {target}",
                        "metric": metric,
                        "in_hospital": same.metrics[metric],
                        "cross_hospital": unit.metrics[metric],
                        "drop": unit.metrics[metric] - same.metrics[metric],
                    }
                )
    return pd.DataFrame(rows, columns=DROP_COLUMNS)


PAIRED_COLUMNS = ["preset", "protocol", "metric", "baseline", "runs", "difference", "ci_low", "ci_high", "verdict"]


def comparisons(units: list[Unit], presets: list[str], protocols: list[str], against: list[str] = ()) -> pd.DataFrame:
    """Every preset against the protocol's best simple baseline (per metric) and against each preset of ``against``
    too (unit by unit: the same split and model seed); a preset of ``against`` also against each network baseline
    of the protocol (``registry.network_baselines``: the field's models). Each pair covers the splits both sides
    have run (a model still training has some): ``runs`` says how many of the preset's runs."""
    rows = []
    summary = table(units, protocols)
    is_simple = summary["method"].isin(registry.simple_baselines())
    is_network = summary["method"].isin(registry.network_baselines())
    for protocol_name in protocols:
        simple = summary[(summary["protocol"] == protocol_name) & is_simple]
        networks = list(summary.loc[(summary["protocol"] == protocol_name) & is_network, "method"])
        for name in presets:
            ours = [u for u in units if u.method == name and u.protocol == protocol_name]
            others = [other for other in against if other != name] + (networks if name in against else [])
            for metric in ("auroc", "auprc"):
                baselines = [] if simple.empty else [simple.loc[simple[f"{metric}_mean"].idxmax(), "method"]]
                for baseline in baselines + others:
                    theirs = [u for u in units if u.method == baseline and u.protocol == protocol_name]
                    shared = [u for u in ours if u.split in {other.split for other in theirs}]
                    if shared:
                        rows.append(
                            {
                                "preset": name,
                                "protocol": protocol_name,
                                "metric": metric,
                                "baseline": baseline,
                                "runs": len(shared),
                                **paired_difference(shared, theirs, metric),
                            }
                        )
    # The columns even without a row, so that the -paired.csv written from it is read back by the next call.
    return pd.DataFrame(rows, columns=PAIRED_COLUMNS)


def kept_from_before(
    previous: Path, made: pd.DataFrame, key: list[str], names: list[str], protocols: list[str]
) -> pd.DataFrame:
    """The rows of the table already at ``previous`` for ``names`` on ``protocols`` that this call did not make
    again: their runs are in no store given and not in the run archive (they were measured before it existed).
    Dropping them would lose a measurement silently; they are kept, and the report names them."""
    if not previous.is_file():
        return made.iloc[:0]
    before = pd.read_csv(previous)
    if before.empty:
        return before
    asked = before[key[0]].isin(names) & before["protocol"].isin(protocols)
    made_keys = set(map(tuple, made[key].astype(str).values)) if len(made) else set()
    again = before[key].astype(str).apply(tuple, axis=1).isin(made_keys)
    return before[asked & ~again]


def protocol_runs(protocol_name: str) -> int:
    chosen = protocol(protocol_name)
    return len(chosen.splits) * max(1, len(chosen.seeds or ()))


def in_protocol_order(rows: pd.DataFrame, key: str, names: list[str], protocols: list[str]) -> pd.DataFrame:
    position = {name: i for i, name in enumerate(names)}
    order = rows["protocol"].map(protocols.index) * len(names) + rows[key].map(position)
    return rows.iloc[np.argsort(order.to_numpy(), kind="stable")].reset_index(drop=True)


def table_archives(out: Path, table_name: str, data_root: Path, opened: dict[str, RunArchive]) -> dict[str, RunArchive]:
    """``opened`` and the run archives at ``out`` of the table's other cohorts (a source's table: ``TABLE_COHORTS``),
    but those whose dataset is not on this machine (their rows are kept from the previous table)."""
    archives = dict(opened)
    for dataset in dict.fromkeys(protocol_dataset(table_name, name) for name in PROTOCOLS):
        if dataset not in archives and (out / f"{dataset}-runs" / RUNS).is_file():
            try:
                archives[dataset] = open_archive(out, dataset, data_root)
            except DatasetNotFoundError as exc:
                log.warning("%s: its rows are kept from the previous table", exc)
    return archives


def not_named(archives: dict[str, RunArchive], table_name: str, names: list[str], protocols: list[str]) -> list[Unit]:
    """The units the run archives keep, on their data, of the methods or protocols a call does not name (each as it
    was kept, with its own settings)."""
    units = []
    for dataset, archive in archives.items():
        for row in archive.runs[archive.runs["data_digest"].eq(archive.data_digest)].itertuples():
            named = row.method in names and row.protocol in protocols
            if named or row.protocol not in PROTOCOLS or protocol_dataset(table_name, row.protocol) != dataset:
                continue
            seed = None if pd.isna(row.seed) else int(row.seed)
            units.append(archive.find(row.method, row.protocol, int(row.split), seed, row.settings))
    return units


def row_order(rows: pd.DataFrame) -> list[str]:
    """The methods of a table in its order: each protocol lists some of them in one order, so a method comes after
    every method it follows in some protocol (the first seen first where none orders two)."""
    seen = list(dict.fromkeys(rows["method"]))
    follows = {name: set() for name in seen}
    for _, group in rows.groupby("protocol", sort=False):
        for earlier, later in zip(group["method"], group["method"].iloc[1:]):
            follows[later].add(earlier)
    order: list[str] = []
    while len(order) < len(seen):
        left = [name for name in seen if name not in order]
        order.append(next((name for name in left if follows[name] <= set(order)), left[0]))
    return order


def widened(*names: list[str]) -> list[str]:
    """Every name of ``names``, once, in first-seen order."""
    return list(dict.fromkeys(name for group in names for name in group))


@dataclass
class Extent:
    """What a table holds: its baselines and presets, its protocols, the presets it pairs every preset with
    (``--against``), and the archived units of what the call that makes it does not name."""

    methods: list[str]
    presets: list[str]
    protocols: list[str]
    against: list[str]
    unnamed: list[Unit]


def extent(
    out: Path,
    table_name: str,
    archives: dict[str, RunArchive],
    methods: list[str],
    presets: list[str],
    protocols: list[str],
    against: str | None,
) -> Extent:
    """The table at ``out`` extended by a call naming ``methods``, ``presets``, ``protocols`` and ``against``: what
    it holds stays, in its order, made from the run ``archives`` (a call naming fewer, such as one new method on
    one protocol, extends the table rather than cutting it); what the call adds comes after."""
    unnamed = not_named(archives, table_name, [*methods, *presets], protocols)
    previous = out / f"{table_name}.csv"
    rows = pd.read_csv(previous).dropna(subset=["runs"]) if previous.is_file() else pd.DataFrame(columns=COLUMNS)
    names = widened(row_order(rows), [*methods, *presets], [unit.method for unit in unnamed])
    ours = [name for name in names if name not in registry.METHODS]
    paired = out / f"{table_name}-paired.csv"
    baselines = pd.read_csv(paired)["baseline"] if paired.is_file() else []
    return Extent(
        [name for name in names if name in registry.METHODS],
        ours,
        [
            name
            for name in widened(rows["protocol"], protocols, [unit.protocol for unit in unnamed])
            if name in PROTOCOLS
        ],
        widened([against] if against else [], [name for name in baselines if name in ours]),
        unnamed,
    )


def with_rows_kept(
    previous: Path,
    summary: pd.DataFrame,
    paired: pd.DataFrame,
    missing: list[Pending],
    names: list[str],
    presets: list[str],
    protocols: list[str],
):
    """``summary``, ``paired`` and ``missing`` with the rows of the previous table at ``previous`` (its ``.csv`` and
    ``-paired.csv``) that this call could not make again; and a line naming each kept row."""
    measured = summary[summary["runs"].notna()]
    before = kept_from_before(
        previous.with_name(f"{previous.name}.csv"), measured, ["method", "protocol"], names, protocols
    )
    kept = [
        f"{row.method} {row.protocol} ({int(row.runs)} of the protocol's {protocol_runs(row.protocol)} runs)"
        for row in before.itertuples()
    ]
    carried = set(zip(before["method"], before["protocol"]))
    # they ran; only their record is gone
    missing = [unit for unit in missing if (unit.preset, unit.protocol) not in carried]
    summary = pd.concat(
        [in_protocol_order(pd.concat([measured, before]), "method", names, protocols), summary[summary["runs"].isna()]],
        ignore_index=True,
    ).astype({"runs": "Int64"})
    paired_before = kept_from_before(
        previous.with_name(f"{previous.name}-paired.csv"), paired, ["preset", "protocol", "metric"], presets, protocols
    )
    if len(paired_before):
        paired = in_protocol_order(pd.concat([paired, paired_before]), "preset", presets, protocols)
    return summary, paired, missing, kept


def formatted(summary: pd.DataFrame) -> pd.DataFrame:
    shown = summary.copy()
    for metric in ("auroc", "auprc"):
        shown[metric] = [f"{m:.4f} ± {s:.4f}" for m, s in zip(shown.pop(f"{metric}_mean"), shown.pop(f"{metric}_std"))]
    for column in ("brier_mean", "ece_mean"):
        shown[column] = [f"{v:.4f}" if pd.notna(v) else "" for v in shown[column]]
    shown["runs"] = [str(int(r)) if pd.notna(r) else "published" for r in shown["runs"]]
    return shown[["method", "protocol", "runs", "auroc", "auprc", "brier_mean", "ece_mean"]]


def what_the_model_sees(dataset: str, data_root: Path, protocols: list[str]) -> list[str]:
    """Lines on the dataset's cohort rule and, where the labels say when each stay was first labelled positive
    (PhysioNet 2019's ``first_septic_hour``), how many test positives of each protocol show the model a value
    recorded at or after that hour: their label is partly read off their input."""
    folder = ensure_processed(dataset, data_root)
    manifest = read_manifest(folder)
    if "cohort_rule" not in manifest:
        return []
    lines = [
        f"`{dataset}` (protocols {', '.join(protocols)}): {manifest['cohort_rule']}. Label: {manifest['label']}.",
        "",
    ]
    labels = pq.read_table(folder / LABELS).to_pandas().set_index("stay_id")
    if "first_septic_hour" not in labels:
        return lines
    tensors = load_tensors(folder)
    last_input = pd.Series(tensors.times[np.arange(len(tensors)), tensors.lengths - 1], index=tensors.stay_ids)
    for protocol_name in protocols:
        test = np.concatenate([split.test for split in load_splits(folder, tensors, protocol_name, dataset)])
        positives = labels.loc[test].query("label == 1")
        seen = int((last_input[positives.index] >= positives["first_septic_hour"]).sum())
        lines.append(
            f"- `{protocol_name}`: {seen:,} of {len(positives):,} test positives (over its splits) show the "
            f"model a value recorded at or after their first SepsisLabel 1."
        )
    return [*lines, ""]


def length_alone(summary: pd.DataFrame) -> list[str]:
    """Lines on what the number of input hours alone scores on each protocol (the ``input_hours`` rows of
    ``summary``), and what it means for every other number on that protocol, the published ones included."""
    rows = summary[summary["method"] == "input_hours"]
    if rows.empty:
        return []
    return [
        "`input_hours` is a logistic regression on the number of hours of input alone. Where a protocol's window "
        "ends at a time that depends on the label (in P19's Raindrop cohort, which every P19 protocol but "
        "`garlic-reference` splits, a septic stay is cut before its onset and a negative one kept whole, up to 60 "
        "hours), that number tells part of the label: every AUROC and AUPRC on the protocol, ours and the "
        "published ones on the same windows, holds what it gives away, so read each against this row, not "
        "against 0.5. Where every stay has the same window (48 hours on P12 and on `garlic-reference`), it "
        "scores near 0.5; what is left comes from stays that end inside the window.",
        "",
        *[
            f"- `{row.protocol}`: AUROC {row.auroc_mean:.3f} ± {row.auroc_std:.3f}, AUPRC {row.auprc_mean:.3f} ± "
            f"{row.auprc_std:.3f} ({row.runs} run{'s' if row.runs > 1 else ''})"
            for row in rows.itertuples()
        ],
        "",
    ]


def method_settings(methods: list[str], datasets: list[str], overrides: list[str]) -> list[str]:
    """A line per method of ``methods`` that takes settings (not GARLIC, whose settings are its preset's file): its
    constructor's arguments as each dataset's configuration gives them (one line where they agree), the networks'
    epoch budget among them."""
    lines = []
    for name in methods:
        spec = registry.method(name)
        if spec.keyed_by_run:
            continue
        given = {
            dataset: spec.arguments(
                registry.MethodContext(Config.for_dataset(dataset).override(overrides), pd.DataFrame())
            )
            for dataset in datasets
        }
        agree = len({str(arguments) for arguments in given.values()}) == 1
        for dataset, arguments in list(given.items())[:1] if agree else given.items():
            where = "" if agree else f" on `{dataset}`"
            lines.append(f"- `{name}`{where}: " + ", ".join(f"{key} {value}" for key, value in arguments.items()))
    return lines


def under_way(carried: Path, digests: set[str]) -> list[str]:
    """A line for each unit whose training state is carried in ``carried`` (``--carry``): how far it has come, and
    how long its last epochs took (what the hours left are counted from). A unit of data other than ``digests``'
    (manifest digests) belongs to another table, and is left out (``garlic.tracking.carry.of_data``)."""
    lines = []
    for path in sorted(Path(carried).glob("*.pt")):
        if not of_data(path, digests):
            continue
        try:
            progress = progress_of(path)
        except ValueError as exc:
            lines.append(f"`{path.name}`: {exc}")
            continue
        history = progress.get("history") if isinstance(progress.get("history"), list) else []
        seconds = [r["seconds"] for r in history[-5:] if isinstance(r, dict) and isinstance(r.get("seconds"), float)]
        pace = f", {np.median(seconds) / 60:.1f} minutes an epoch lately" if seconds else ""
        lines.append(
            f"`{path.stem}`: {progress.get('epoch')} epochs done, the best at epoch {progress.get('best_epoch')}{pace}"
        )
    return lines


def data_digests(datasets: list[str], data_root: Path) -> set[str]:
    """The manifest digests of those of ``datasets`` processed here."""
    digests = set()
    for dataset in datasets:
        try:
            manifest = read_manifest(processed_folder(dataset, data_root))
        except (DatasetNotFoundError, ValueError):  # not processed here: its units are not this machine's
            continue
        digests.add(run_contract.manifest_digest(manifest))
    return digests


def report(
    summary: pd.DataFrame,
    paired: pd.DataFrame,
    drops: pd.DataFrame,
    missing: list[str],
    kept: list[str],
    command: str,
    dataset: str,
    seen: list[str],
    unnamed: dict[str, list[str]],
    settings: list[str] = (),
    carried: tuple[Path, list[str]] | None = None,
) -> str:
    lines = [
        f"# {dataset}: every method on every protocol",
        "",
        "Made by:",
        "",
        "```bash",
        command,
        "```",
        "",
        "Test metrics, mean ± std over the protocol's runs (garlic-reference: one split, five model seeds for "
        "GARLIC; the baselines are deterministic, so one run). Normalisation is fitted on each split's "
        "training part for every protocol (the GARLIC reference code fits it on all stays). Rows marked "
        "`published` are numbers reported elsewhere, not measured here. A GARLIC row with fewer runs than its "
        "protocol names (its splits times its seeds) is partial; what it lacks is listed at the end, and its "
        "paired differences cover only the runs it has.",
        "",
        studies.markdown(formatted(summary)),
        "",
    ]
    if seen:
        lines += ["## What the model sees", "", *seen]
    if alone := length_alone(summary):
        lines += ["## The input's length alone", "", *alone]
    if settings:
        lines += [
            "## The methods' settings",
            "",
            "Each method's arguments for these rows: its defaults, over them what the dataset's configuration "
            "gives. A network trains for at most `max_epochs`, stops after `patience` (`early_stopping`) "
            "epochs without improving on the validation stays, and keeps its best epoch. GARLIC's settings are "
            "its preset's, `garlic/configs/<preset>.json`.",
            "",
            *settings,
            "",
        ]
    if len(paired):
        shown = paired.copy()
        for column in ("difference", "ci_low", "ci_high"):
            shown[column] = shown[column].map(lambda v: f"{v:+.4f}")
        lines += [
            "## Paired differences against the best simple baseline",
            "",
            f"Mean over the protocol's runs of (preset - baseline) on the same test stays, with a 95% interval "
            f"from {BOOTSTRAP} bootstrap resamples of the test stays; an interval holding 0 is a tie. The "
            f"baseline is the protocol's best simple baseline in that metric, or a preset named with "
            f"`--against` (then paired run by run: the same split and model seed); that preset is also paired "
            f"with each network baseline of the table (GRU-D, decay-GRU, PyPOTS's models).",
            "",
            studies.markdown(shown),
            "",
        ]
    if len(drops):
        shown = drops.copy()
        for column in ("in_hospital", "cross_hospital", "drop"):
            shown[column] = shown[column].map(lambda v: f"{v:+.4f}" if column == "drop" else f"{v:.4f}")
        lines += [
            "## From its own hospital to the other",
            "",
            "Each method trained and selected on one hospital system, tested on the held-out tenth of that "
            "system (`in-hospital`) and on every stay of the other (`cross-hospital`): the same model, "
            "so the drop is what moving to another hospital costs it.",
            "",
            studies.markdown(shown),
            "",
        ]
    if unnamed:
        lines += [
            "## Read from the run archive, not named by the command",
            "",
            "The command above does not name these methods on these protocols: their rows are made from the "
            "units the run archive keeps of them, so that a command naming fewer extends the table rather than "
            "cutting it.",
            "",
            *[f"- {name}: {', '.join(methods)}" for name, methods in unnamed.items()],
            "",
        ]
    if kept:
        lines += [
            "## Kept from the previous table",
            "",
            "These rows' runs are in none of the stores above and not in the run archive (they were measured "
            "before it existed, and their stores are gone), so they are the previous table's numbers, not "
            "made again here:",
            "",
            *[f"- {k}" for k in kept],
            "",
        ]
    if missing:
        lines += ["## Not yet run", "", *[f"- {m}" for m in missing], ""]
    if carried is not None and carried[1]:
        lines += [
            "## Under way",
            "",
            f"Units whose training states are carried in `{carried[0]}` (`--carry`), to go "
            "on from where they stopped (method, protocol, split, seed, settings and data digests):",
            "",
            *[f"- {line}" for line in carried[1]],
            "",
        ]
    return "\n".join(lines)


def make_table(
    args: argparse.Namespace,
    datasets: dict[str, str],
    configs: dict[str, dict[str, Config]],
    presets: list[str],
    overrides: list[str],
    command: str,
) -> str:
    """The table that ``command`` (``python -m experiments.compare``, parsed into ``args``) asks for, made and
    logged (to the first store's ``compare-<dataset>`` experiment), and with ``--out`` written there; returns its
    report. ``datasets``: the dataset each protocol runs on; ``configs``: by dataset, each preset's config;
    ``overrides``: the ``--set`` and ``--device`` that made them."""
    in_workers = args.workers > 1 and not args.no_train
    archives = {} if args.out is None else {d: open_archive(args.out, d, args.data_root) for d in configs}
    if in_workers:  # the units that neither a store nor the run archive holds
        pending = [
            unit
            for protocol_name in args.protocols
            for name, config in configs[datasets[protocol_name]].items()
            for unit in garlic_units(
                name,
                config,
                protocol_name,
                args.mlruns,
                args.data_root,
                False,
                archives.get(datasets[protocol_name]),
                args.seeds,
            )[1]
            if args.splits is None or unit.split in args.splits
        ]
        train_in_workers(
            pending, args.workers, args.mlruns[0], args.data_root, overrides, args.deadline, args.carry, archives
        )
    units, missing = [], []
    for protocol_name in args.protocols:
        dataset, archive = datasets[protocol_name], archives.get(datasets[protocol_name])
        found, lacking = baseline_units(
            args.methods,
            dataset,
            protocol_name,
            args.mlruns,
            args.data_root,
            overrides,
            archive,
            not args.no_train,
            args.carry,
            args.splits,
        )
        units += found
        missing += lacking
        for name, config in configs[dataset].items():
            train = not (args.no_train or in_workers)
            found, lacking = garlic_units(
                name,
                config,
                protocol_name,
                args.mlruns,
                args.data_root,
                train,
                archive,
                args.seeds,
                args.carry,
                args.splits,
            )
            units += found
            missing += lacking
    shown = Extent(args.methods, presets, args.protocols, [args.against] if args.against else [], [])
    if args.out is not None:
        archives = table_archives(args.out, args.dataset, args.data_root, archives)
        shown = extent(args.out, args.dataset, archives, args.methods, presets, args.protocols, args.against)
    methods, presets, protocols, unnamed = shown.methods, shown.presets, shown.protocols, shown.unnamed
    datasets |= {name: protocol_dataset(args.dataset, name) for name in protocols}
    summary = table(units + unnamed, protocols, args.dataset)
    paired = comparisons(units + unnamed, presets, protocols, shown.against)
    kept = []
    if args.out is not None:  # every unit is in its archive already: read from it, or kept as it was gathered
        summary, paired, missing, kept = with_rows_kept(
            args.out / args.dataset, summary, paired, missing, [*methods, *presets], presets, protocols
        )
    drops = hospital_drops(units + unnamed)
    readable = set(configs) | set(archives)  # the datasets on this machine
    cohorts = list(dict.fromkeys(datasets[name] for name in protocols))
    seen = [
        line
        for dataset in cohorts
        if dataset in readable
        for line in what_the_model_sees(
            dataset, args.data_root, [name for name in protocols if datasets[name] == dataset]
        )
    ]
    by_protocol = {
        name: list(dict.fromkeys(unit.method for unit in unnamed if unit.protocol == name)) for name in protocols
    }
    text = report(
        summary,
        paired,
        drops,
        missing,
        kept,
        command,
        args.dataset,
        seen,
        {name: found for name, found in by_protocol.items() if found},
        method_settings([m for m in methods if m in set(summary["method"])], cohorts, overrides),
        None if args.carry is None else (args.carry, under_way(args.carry, data_digests(cohorts, args.data_root))),
    )
    experiment_id = studies.open_experiment(f"compare-{args.dataset}", args.mlruns[0])
    tables = {args.dataset: summary, f"{args.dataset}-paired": paired, f"{args.dataset}-hospitals": drops}
    studies.log_summary(experiment_id, "comparison", tables, {}, {"study": "compare", "dataset": args.dataset})
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        for name, write in [
            (".md", lambda out: out.write(text)),
            (".csv", lambda out: summary.to_csv(out, index=False, float_format="%.4f")),
            ("-paired.csv", lambda out: paired.to_csv(out, index=False, float_format="%.4f")),
        ]:
            with atomic_file(args.out / f"{args.dataset}{name}", "w") as out:
                write(out)
    return text
