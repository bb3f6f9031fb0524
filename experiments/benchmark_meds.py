"""How fast ``garlic preprocess meds`` reads, and in how much memory: against the native PhysioNet 2012 path on P12,
and on a synthetic MEDS folder of N rows (issue #57; the goal: at least 0.8 times the native speed, 100 million rows
within 4 GB).

    python -m experiments.benchmark_meds --p12 ../shared/data/physionet2012 --rows 100000000 --work /tmp/meds-bench
    python -m experiments.benchmark_meds --rows 200000                  # a quick check that it runs

Each measurement runs in a process of its own, which reports its wall time and its peak resident memory
(``ru_maxrss``: the interpreter and its libraries included, about 150 MB before any data). The rates are rows per
second of wall time: the processed observations written (the same on both P12 paths), and for MEDS the shard rows
read as well.

- P12 native: ``garlic.sources.physionet2012.preprocess`` of the whole release (the archives parsed).
- P12 MEDS: the same release exported (``garlic.io.meds.write_meds``, not timed) and read back with the dataset's
  own variable and static lists, the window 48 h: the same tables.
- Synthetic MEDS: ``write_synthetic`` writes N rows for N / 1,000 subjects, written shard by shard in bounded
  memory: each subject's events spread over 30 days, 30 timed codes of skewed frequencies and 3 static codes, one
  label row 48 h or more after its first event, in shards of about 5 million rows and row groups of one million. It
  is read with ``--variables 20`` (the 20 most frequent codes: two passes over the shards) and a 48 h window, so
  about a fifteenth of the events are kept, as when a long history is cut to a prediction's window.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from garlic.io.meds import ADMISSION, LABELS_FILE, LABELS_FOLDER, MICROSECONDS_PER_HOUR, write_meds

EVENTS_PER_SUBJECT = 1_000
ROWS_PER_SHARD = 5_000_000
ROW_GROUP_ROWS = 1_000_000
TIMED_CODES = [f"LAB//{k:02d}" for k in range(30)]
STATIC_CODES = ["AGE", "HEIGHT", "WEIGHT"]
HISTORY_HOURS = 30 * 24


def write_synthetic(folder: Path, rows: int, seed: int = 0) -> int:
    """A MEDS folder of about ``rows`` events (``data/N.parquet``) and its label file (``labels/labels.parquet``),
    generated and written one shard at a time; returns the rows written."""
    rng = np.random.default_rng(seed)
    (folder / "data").mkdir(parents=True)
    (folder / LABELS_FOLDER).mkdir()
    weights = 1.0 / np.arange(1, len(TIMED_CODES) + 1)  # Zipf-like: a few codes are most of the events
    weights /= weights.sum()
    subjects_per_shard = max(1, ROWS_PER_SHARD // EVENTS_PER_SUBJECT)
    total_subjects = max(1, rows // EVENTS_PER_SUBJECT)
    written, first_subject, shard, labels = 0, 0, 0, []
    while first_subject < total_subjects:
        count = min(subjects_per_shard, total_subjects - first_subject)
        subject = np.arange(first_subject, first_subject + count, dtype="int64")
        timed = EVENTS_PER_SUBJECT - len(STATIC_CODES)
        hours = np.sort(rng.uniform(0, HISTORY_HOURS, (count, timed)), axis=1)
        times = ADMISSION + np.rint(hours * MICROSECONDS_PER_HOUR).astype("int64").astype("timedelta64[us]")
        codes = rng.choice(len(TIMED_CODES), (count, timed), p=weights)
        static_values = rng.normal(70, 15, (count, len(STATIC_CODES)))
        static = np.tile(np.arange(EVENTS_PER_SUBJECT) < len(STATIC_CODES), count)  # each subject's first rows
        table = pa.table(
            {
                "subject_id": np.repeat(subject, EVENTS_PER_SUBJECT),
                "time": pa.array(
                    np.concatenate([np.full((count, len(STATIC_CODES)), ADMISSION), times], axis=1).ravel(),
                    pa.timestamp("us"),
                    mask=static,
                ),
                "code": pa.DictionaryArray.from_arrays(
                    np.concatenate(
                        [np.tile(np.arange(len(STATIC_CODES)), (count, 1)), codes + len(STATIC_CODES)], axis=1
                    )
                    .ravel()
                    .astype("int32"),
                    pa.array(STATIC_CODES + TIMED_CODES),
                ).cast(pa.string()),
                "numeric_value": np.concatenate([static_values, rng.normal(1, 0.3, (count, timed))], axis=1)
                .ravel()
                .astype("float32"),
            }
        )
        pq.write_table(table, folder / "data" / f"{shard}.parquet", row_group_size=ROW_GROUP_ROWS)
        prediction = rng.uniform(48, HISTORY_HOURS, count)
        labels.append((subject, prediction, rng.random(count) < 0.1))
        written += table.num_rows
        first_subject += count
        shard += 1
    subject, prediction, label = (np.concatenate(parts) for parts in zip(*labels))
    pq.write_table(
        pa.table(
            {
                "subject_id": subject,
                "prediction_time": pa.array(
                    ADMISSION + np.rint(prediction * MICROSECONDS_PER_HOUR).astype("int64").astype("timedelta64[us]"),
                    pa.timestamp("us"),
                ),
                "boolean_value": label,
            }
        ),
        folder / LABELS_FOLDER / LABELS_FILE,
    )
    return written


def child() -> None:
    """In a measuring process: the job in ``sys.argv[2]``; prints seconds, observations and peak memory as JSON."""
    job = json.loads(sys.argv[2])
    start = time.perf_counter()
    if job["path"] == "native":
        from garlic.sources.physionet2012 import preprocess

        manifest = preprocess(Path(job["source"]), Path(job["destination"]))
    else:
        from garlic.sources.meds import preprocess

        manifest = preprocess(
            Path(job["source"]),
            Path(job["destination"]),
            Path(job["labels"]),
            48.0,
            job["variables"],
            Path(job["static"]) if job.get("static") else None,
        )
    seconds = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "observations": manifest["counts"]["observations"], "peak_mb": peak_mb}))


def measure(job: dict) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "experiments.benchmark_meds", "--child", json.dumps(job)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def line(name: str, result: dict, rows_read: int | None = None) -> str:
    read = f", {rows_read / result['seconds']:,.0f} shard rows/s" if rows_read else ""
    return (
        f"| {name} | {result['seconds']:.1f} s | {result['observations'] / result['seconds']:,.0f} "
        f"observations/s{read} | {result['peak_mb']:,.0f} MB |"
    )


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p12", type=Path, help="the PhysioNet 2012 release (set-a/b/c, Outcomes-a/b/c.txt)")
    parser.add_argument("--rows", type=int, help="rows of the synthetic MEDS folder")
    parser.add_argument("--work", type=Path, help="where the folders are written (default: a temporary folder)")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="benchmark-meds-"))
    lines = ["| path | time | rate | peak memory |", "|---|---|---|---|"]
    if args.p12:
        from garlic.io.tables import read_processed

        native = measure({"path": "native", "source": str(args.p12), "destination": str(work / "p12-native")})
        lines.append(line("P12 native", native))
        dataset = read_processed(work / "p12-native")
        written = write_meds(work / "p12-meds", dataset, "physionet2012")
        (work / "variables.txt").write_text("\n".join(dataset.variables) + "\n")
        (work / "static.txt").write_text("\n".join(dataset.static_features) + "\n")
        back = measure(
            {
                "path": "meds",
                "source": str(work / "p12-meds"),
                "destination": str(work / "p12-back"),
                "labels": str(work / "p12-meds" / LABELS_FOLDER),
                "variables": str(work / "variables.txt"),
                "static": str(work / "static.txt"),
            }
        )
        lines.append(line("P12 MEDS", back, written["events"]))
        lines.append(f"| P12 MEDS / native speed | {native['seconds'] / back['seconds']:.2f} | | |")
    if args.rows:
        rows = write_synthetic(work / "synthetic-meds", args.rows)
        result = measure(
            {
                "path": "meds",
                "source": str(work / "synthetic-meds"),
                "destination": str(work / "synthetic-back"),
                "labels": str(work / "synthetic-meds" / LABELS_FOLDER),
                "variables": "20",
            }
        )
        lines.append(line(f"synthetic MEDS, {rows:,} rows", result, 2 * rows))  # two passes: count, then keep
    print("\n".join(lines))
    return lines


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child()
    else:
        main()
