"""``docs/adding-a-source.md`` walked as written: its module saved as a new source of ``garlic.sources`` (a folder
added to the package's path, so the test leaves the package as it is), its commands run through the real ``garlic``
command, and the processed tables checked against the example files."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "adding-a-source.md"
# `garlic` with one more folder on garlic.sources' path, where the guide's module is saved
GARLIC = (
    "import sys, garlic.sources; garlic.sources.__path__.append(sys.argv.pop(1)); "
    "from garlic.cli import main; main(sys.argv[1:])"
)


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", GUIDE.read_text(), flags=re.S)


def write_export(folder: Path, stays: int = 120, seed: int = 0) -> pd.DataFrame:
    """A ward export as the guide describes it: heart rate and lactate over two days, the outcome tied to the
    lactate; one stay has no measurement (the module drops it)."""
    rng = np.random.default_rng(seed)
    folder.mkdir()
    died = (np.arange(stays) % 4 == 0).astype(int)
    rows = []
    for stay in range(1, stays):  # stay 0 is never measured
        for hour in np.sort(rng.uniform(0, 48, 12)):
            rows.append((stay, round(hour, 2), "HR", round(80 + 10 * rng.standard_normal(), 1)))
        for hour in (6.0, 30.0):
            rows.append((stay, hour, "Lactate", round(1.5 + 2 * died[stay] + rng.standard_normal() * 0.5, 2)))
    events = pd.DataFrame(rows, columns=["stay_id", "hours", "variable", "value"])
    events.to_csv(folder / "events.csv", index=False)
    pd.DataFrame({"stay_id": range(stays), "age": rng.integers(20, 90, stays), "died": died}).to_csv(
        folder / "outcomes.csv", index=False
    )
    return events


def garlic(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    environment = {
        **os.environ,
        "GARLIC_DATA_ROOT": str(tmp_path / "data"),
        "GARLIC_MLRUNS": str(tmp_path / "mlruns"),
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run(
        [sys.executable, "-c", GARLIC, str(tmp_path / "sources"), *argv],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def walked(tmp_path_factory) -> tuple[Path, pd.DataFrame, list[subprocess.CompletedProcess]]:
    tmp_path = tmp_path_factory.mktemp("own-source")
    (module,) = blocks("python")
    (tmp_path / "sources").mkdir()
    (tmp_path / "sources" / "ward_csv.py").write_text(module)
    events = write_export(tmp_path / "ward-export")
    (commands,) = blocks("bash")
    results = []
    for line in commands.strip().splitlines():
        argv = line.split()
        assert argv[0] == "garlic"
        results.append(garlic(tmp_path, *argv[1:]))
        assert results[-1].returncode == 0, results[-1].stderr[-3000:]
    return tmp_path, events, results


def test_the_guides_module_is_found_and_preprocesses_the_export(walked):
    from garlic.io.tables import read_processed

    tmp_path, events, _ = walked
    processed = read_processed(tmp_path / "data" / "processed" / "ward_csv")
    assert processed.variables == ["HR", "Lactate"]
    assert processed.manifest["dropped_stays"] == {"no measurement": 1}
    assert processed.manifest["counts"]["stays"] == 119 and processed.manifest["counts"]["observations"] == len(events)
    assert 0 not in set(processed.labels["stay_id"])
    lactate = processed.observations.query("stay_id == 5 and variable == 'Lactate'").sort_values("time")
    raw = events.query("stay_id == 5 and variable == 'Lactate'").sort_values("hours")
    np.testing.assert_allclose(lactate["value"], raw["value"], rtol=1e-6)
    assert set(processed.labels.query("label == 1")["stay_id"]) == set(range(4, 120, 4))


def test_the_guides_commands_train_garlic_and_a_baseline_on_it(walked):
    tmp_path, _, (_, garlic_run, baseline) = walked
    for result in (garlic_run, baseline):
        assert re.search(r"test auroc \d\.\d+", result.stdout + result.stderr), result.stdout[-2000:]
    from garlic.data.splits import split_path

    saved = json.loads(split_path(tmp_path / "data" / "processed" / "ward_csv", "five-split", 0).read_text())
    assert len(saved["train"]) + len(saved["validation"]) + len(saved["test"]) == 119  # drawn and saved on first use


def test_a_malformed_export_is_named_with_its_file(tmp_path):
    (tmp_path / "sources").mkdir()
    (tmp_path / "sources" / "ward_csv.py").write_text(blocks("python")[0])
    write_export(tmp_path / "bad")
    pd.read_csv(tmp_path / "bad" / "events.csv").drop(columns="value").to_csv(
        tmp_path / "bad" / "events.csv", index=False
    )
    result = garlic(tmp_path, "preprocess", "ward_csv", "--source", "bad")
    assert result.returncode != 0
    assert "bad/events.csv: missing column(s) value; expected stay_id, hours, variable, value" in result.stderr
    assert not (tmp_path / "data" / "processed" / "ward_csv").exists()
