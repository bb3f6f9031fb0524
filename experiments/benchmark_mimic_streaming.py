"""Benchmark of the MIMIC-III streaming path: rows per second and peak memory on a generated CHARTEVENTS.

Generates a MIMIC-III-shaped folder (ICUSTAYS, ADMISSIONS, PATIENTS, a small LABEVENTS and a CHARTEVENTS of
``--rows`` rows with the real table's 15 upper-case columns) in a temporary folder, then runs
``garlic.sources.mimic3.preprocess`` on it in a child process and reports the child's wall time, rows per second
and peak resident memory (``ru_maxrss``). Measuring in a child keeps the generator's own memory out of the number.

    python -m experiments.benchmark_mimic_streaming --rows 20000000

``--foreign-fraction`` of the rows belong to patients outside ICUSTAYS: they are read and discarded, so the file can
grow while the kept observations stay the same (the test suite uses this to show memory does not follow file size).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

CHART_COLUMNS = [
    "ROW_ID",
    "SUBJECT_ID",
    "HADM_ID",
    "ICUSTAY_ID",
    "ITEMID",
    "CHARTTIME",
    "STORETIME",
    "CGID",
    "VALUE",
    "VALUENUM",
    "VALUEUOM",
    "WARNING",
    "ERROR",
    "RESULTSTATUS",
    "STOPPED",
]
# Half the rows are benchmark variables (heart rate, blood pressures, respiratory rate, SpO2, temperature, GCS),
# half are items no cohort reads (alarms, code status, ...), as in the real table.
WANTED_ITEMS = [211, 220045, 220179, 220180, 220181, 220210, 220277, 223761, 198, 618, 646, 678]
OTHER_ITEMS = [212, 161, 128, 550, 1125, 159, 1484, 5815, 8549, 5820, 8554, 5819]
BASE_TIME = 4_102_444_800  # 2100-01-01 in seconds: MIMIC's shifted dates
FIRST_SUBJECT, FIRST_HADM, FIRST_STAY = 10_000, 100_000, 200_000


def _timestamps(seconds: np.ndarray) -> pa.Array:
    return pc.strftime(pa.array(seconds, pa.timestamp("s")), format="%Y-%m-%d %H:%M:%S")


def write_stays(folder: Path, stays: int, seed: int) -> np.ndarray:
    """ICUSTAYS, ADMISSIONS, PATIENTS for ``stays`` adult single-stay admissions of 2-6 days; return INTIMEs."""
    rng = np.random.default_rng(seed)
    index = np.arange(stays)
    intime = BASE_TIME + index * 7 * 86400 + rng.integers(0, 86400, stays)
    los_days = rng.uniform(2.0, 6.0, stays)
    outtime = intime + (los_days * 86400).astype(np.int64)
    died = rng.random(stays) < 0.12
    unit = pa.array(["MICU"] * stays)
    pacsv.write_csv(
        pa.table(
            {
                "ROW_ID": index,
                "SUBJECT_ID": FIRST_SUBJECT + index,
                "HADM_ID": FIRST_HADM + index,
                "ICUSTAY_ID": FIRST_STAY + index,
                "DBSOURCE": pa.array(["metavision"] * stays),
                "FIRST_CAREUNIT": unit,
                "LAST_CAREUNIT": unit,
                "FIRST_WARDID": np.full(stays, 52),
                "LAST_WARDID": np.full(stays, 52),
                "INTIME": _timestamps(intime),
                "OUTTIME": _timestamps(outtime),
                "LOS": np.round(los_days, 4),
            }
        ),
        folder / "ICUSTAYS.csv",
    )
    admit, discharge = intime - 3600, outtime + 86400
    deathtime = pa.array(np.where(died, outtime, 0), pa.int64()).cast(pa.timestamp("s"))
    deathtime = pc.if_else(
        pa.array(died), pc.strftime(deathtime, format="%Y-%m-%d %H:%M:%S"), pa.scalar(None, pa.string())
    )
    pacsv.write_csv(
        pa.table(
            {
                "ROW_ID": index,
                "SUBJECT_ID": FIRST_SUBJECT + index,
                "HADM_ID": FIRST_HADM + index,
                "ADMITTIME": _timestamps(admit),
                "DISCHTIME": _timestamps(np.where(died, outtime, discharge)),
                "DEATHTIME": deathtime,
                "HOSPITAL_EXPIRE_FLAG": died.astype(np.int64),
            }
        ),
        folder / "ADMISSIONS.csv",
    )
    pacsv.write_csv(
        pa.table(
            {
                "ROW_ID": index,
                "SUBJECT_ID": FIRST_SUBJECT + index,
                "GENDER": pa.array(np.where(index % 2, "M", "F")),
                "DOB": _timestamps(intime - (rng.uniform(20, 85, stays) * 365.25 * 86400).astype(np.int64)),
                "DOD": pa.nulls(stays, pa.string()),
            }
        ),
        folder / "PATIENTS.csv",
    )
    pacsv.write_csv(
        pa.table(
            {
                "ROW_ID": index,
                "SUBJECT_ID": FIRST_SUBJECT + index,
                "HADM_ID": FIRST_HADM + index,
                "ITEMID": np.full(stays, 50820),
                "CHARTTIME": _timestamps(intime + 7200),
                "VALUE": pa.array(["7.4"] * stays),
                "VALUENUM": np.full(stays, 7.4),
                "VALUEUOM": pa.array(["units"] * stays),
                "FLAG": pa.nulls(stays, pa.string()),
            }
        ),
        folder / "LABEVENTS.csv",
    )
    return intime


def _chart_chunk(rng, start: int, rows: int, intime: np.ndarray, foreign_fraction: float) -> pa.Table:
    stay = rng.integers(0, len(intime), rows)
    foreign = rng.random(rows) < foreign_fraction
    subject = np.where(foreign, 1_000_000 + stay, FIRST_SUBJECT + stay)  # patients outside ICUSTAYS
    wanted = rng.random(rows) < 0.5
    item = np.where(wanted, rng.choice(WANTED_ITEMS, rows), rng.choice(OTHER_ITEMS, rows))
    charttime = intime[stay] + rng.integers(-86400, 7 * 86400, rows)
    valuenum = np.round(rng.normal(80.0, 15.0, rows), 1)
    value = pc.cast(pa.array(valuenum), pa.string())
    empty = pa.nulls(rows, pa.string())
    return pa.table(
        {
            "ROW_ID": np.arange(start, start + rows),
            "SUBJECT_ID": subject,
            "HADM_ID": FIRST_HADM + stay,
            "ICUSTAY_ID": FIRST_STAY + stay,
            "ITEMID": item,
            "CHARTTIME": _timestamps(charttime),
            "STORETIME": _timestamps(charttime + 600),
            "CGID": rng.integers(14000, 21000, rows),
            "VALUE": value,
            "VALUENUM": valuenum,
            "VALUEUOM": pa.array(np.where(wanted, "bpm", "")),
            "WARNING": empty,
            "ERROR": np.zeros(rows, np.int64),
            "RESULTSTATUS": empty,
            "STOPPED": pa.array(["NotStopd"] * rows),
        }
    )


def write_synthetic_mimic(
    folder: Path,
    rows: int,
    stays: int = 5000,
    foreign_fraction: float = 0.0,
    seed: int = 0,
    chunk_rows: int = 1_000_000,
) -> Path:
    """A MIMIC-III-shaped folder whose CHARTEVENTS.csv has ``rows`` rows, written chunk by chunk."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    intime = write_stays(folder, stays, seed)
    rng = np.random.default_rng(seed + 1)
    with pacsv.CSVWriter(folder / "CHARTEVENTS.csv", _chart_chunk(rng, 0, 1, intime, 0).schema) as writer:
        for start in range(0, rows, chunk_rows):
            writer.write_table(_chart_chunk(rng, start, min(chunk_rows, rows - start), intime, foreign_fraction))
    return folder


def measure(folder: Path, cohort: str, block_size: int) -> dict:
    """Preprocess ``folder`` in this process and report time and this process's peak memory."""
    from garlic.sources.mimic3 import preprocess

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as output:
        manifest = preprocess(
            folder, Path(output) / "processed", cohort=cohort, block_size=block_size, hash_sources=False
        )
    seconds = time.perf_counter() - started
    rows = manifest["tables"]["CHARTEVENTS"]["rows_read"]
    return {
        "chartevents_rows": rows,
        "chartevents_bytes": (folder / "CHARTEVENTS.csv").stat().st_size,
        "seconds": round(seconds, 2),
        "rows_per_second": round(rows / seconds),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "stays_kept": manifest["counts"]["stays"],
        "observations_kept": manifest["counts"]["observations"],
    }


def measure_in_child(folder: Path, cohort: str = "benchmark", block_size: int = 16 << 20) -> dict:
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.benchmark_mimic_streaming",
            "--measure",
            str(folder),
            "--cohort",
            cohort,
            "--block-size",
            str(block_size),
        ],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    if completed.returncode:
        raise RuntimeError(f"measuring {folder} failed:\n{completed.stderr}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--stays", type=int, default=5000)
    parser.add_argument("--foreign-fraction", type=float, default=0.0)
    parser.add_argument("--cohort", default="benchmark")
    parser.add_argument("--block-size", type=int, default=16 << 20)
    parser.add_argument("--workdir", type=Path, default=None, help="where to generate (default: a temp folder)")
    parser.add_argument("--measure", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.cohort, args.block_size)))
        return
    workdir = Path(tempfile.mkdtemp(prefix="mimic-bench-", dir=args.workdir))
    try:
        started = time.perf_counter()
        write_synthetic_mimic(workdir, args.rows, args.stays, args.foreign_fraction)
        print(f"generated {args.rows:,} CHARTEVENTS rows in {time.perf_counter() - started:.0f} s", flush=True)
        print(json.dumps(measure_in_child(workdir, args.cohort, args.block_size), indent=2))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
