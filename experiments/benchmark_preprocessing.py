"""Time the PhysioNet 2012 data spine: release -> Parquet tables -> tensors (first build) -> cached tensors reload.

    python experiments/benchmark_preprocessing.py [--source ../shared/data/physionet2012] [--out FOLDER]

Targets (issue #2): parse + first tensor build <= 60 s, reloading the cached tensors <= 5 s.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from garlic.sources.physionet2012 import preprocess  # noqa: E402
from garlic.io.tensors import TENSORS, load_tensors  # noqa: E402

TARGET_PARSE_AND_TENSORS_S = 60.0
TARGET_RELOAD_S = 5.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--source",
        type=Path,
        default=REPO.parent / "shared" / "data" / "physionet2012",
        help="the PhysioNet 2012 release (default: ../shared/data/physionet2012 from the repo root)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where to write the processed tables (default: a temporary folder, removed afterwards)",
    )
    parser.add_argument("--sets", nargs="*", default=None, help="only these sets (a, b, c); default all found")
    args = parser.parse_args(argv)

    temporary = None
    if args.out is None:
        temporary = Path(tempfile.mkdtemp(prefix="garlic-bench-"))
        destination = temporary / "physionet2012"
    else:
        destination = args.out
    try:
        start = time.perf_counter()
        manifest = preprocess(args.source, destination, sets=args.sets)
        parse_s = time.perf_counter() - start

        start = time.perf_counter()
        built = load_tensors(destination)
        build_s = time.perf_counter() - start

        start = time.perf_counter()
        reloaded = load_tensors(destination)
        reload_s = time.perf_counter() - start
        assert reloaded.values.shape == built.values.shape

        counts = manifest["counts"]
        stays = counts["stays"]
        rows = [
            ("release -> Parquet tables", parse_s, counts["records_read"]),
            ("tables -> tensors (first build)", build_s, stays),
            ("cached tensors reload", reload_s, stays),
        ]
        print(f"source: {args.source} (sets {', '.join(manifest['source']['sets'])})")
        cache_mib = (destination / TENSORS).stat().st_size / 2**20
        print(f"records read {counts['records_read']:,}, stays kept {stays:,}, observations {counts['observations']:,}")
        print(f"tensors [N, T, D] = {tuple(built.values.shape)}, cache {cache_mib:,.0f} MiB")
        print()
        print(f"{'step':<34}{'seconds':>10}{'stays/s':>12}")
        for name, seconds, n in rows:
            print(f"{name:<34}{seconds:>10.2f}{n / seconds:>12,.0f}")
        total = parse_s + build_s
        print(f"{'parse + tensors':<34}{total:>10.2f}{stays / total:>12,.0f}")
        ok_total, ok_reload = total <= TARGET_PARSE_AND_TENSORS_S, reload_s <= TARGET_RELOAD_S
        print()
        print(
            f"target parse + tensors <= {TARGET_PARSE_AND_TENSORS_S:g} s: {'met' if ok_total else 'MISSED'}; "
            f"reload <= {TARGET_RELOAD_S:g} s: {'met' if ok_reload else 'MISSED'}"
        )
        return 0 if ok_total and ok_reload else 1
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
