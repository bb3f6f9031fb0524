"""Benchmark of the PhysioNet 2019 preprocessor: stays per minute for each cohort on the shared training set.

    python -m experiments.benchmark_physionet2019 [--source ../shared/data/physionet2019]

Each cohort is preprocessed from the archive into a temporary folder (reading, parsing and writing the tables) and
its wall time, stays read per minute, kept stays, positives and prevalence are printed as JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from garlic.sources.physionet2019 import COHORTS, preprocess

DEFAULT_SOURCE = Path(__file__).resolve().parents[2] / "shared" / "data" / "physionet2019"


def benchmark(source: Path, cohort: str) -> dict:
    with tempfile.TemporaryDirectory() as output:
        started = time.perf_counter()
        manifest = preprocess(source, Path(output) / "processed", cohort=cohort)
        seconds = time.perf_counter() - started
    counts = manifest["counts"]
    return {
        "cohort": cohort,
        "stays_read": counts["stays_read"],
        "seconds": round(seconds, 2),
        "stays_per_minute": round(counts["stays_read"] / seconds * 60),
        "stays": counts["stays"],
        "positives": counts["positives"],
        "prevalence": counts["prevalence"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--cohort", choices=sorted(COHORTS), action="append", help="default: every cohort")
    args = parser.parse_args()
    for cohort in args.cohort or list(COHORTS):
        print(json.dumps(benchmark(args.source, cohort)), flush=True)


if __name__ == "__main__":
    main()
