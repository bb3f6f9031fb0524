"""The README's lines, run top to bottom in an empty folder (experiments/readme_walk.py), with one-epoch trainings."""

import csv
import io
import re

import pytest

from experiments.readme_walk import readme_lines, walk
from garlic.sources.synthetic import EXAMPLE_IDS


@pytest.mark.slow
def test_the_readme_lines_run_in_the_order_written(tmp_path):
    steps = walk(tmp_path, quick=True, say=lambda message: None)
    ran = {step.line: step for step in steps if not step.skipped}
    assert [step.line for step in steps] == readme_lines()
    assert "bin/setup && .venv/bin/garlic train --dataset synthetic" in ran  # command 1, first of all
    predicted = next(step for line, step in ran.items() if " predict " in line and "RUN_ID" in line)
    rows = list(csv.DictReader(io.StringIO(predicted.output)))
    assert sorted(int(row["stay_id"]) for row in rows) == EXAMPLE_IDS
    assert all(0 < float(row["risk"]) < 1 for row in rows)
    assert any(" dashboard " in line for line in ran) and any("mlflow ui" in line for line in ran)
    servers = [step for line, step in ran.items() if re.search(r" dashboard | mlflow ui| monitor ", line)]
    assert len(servers) >= 2 and all(step.output.startswith("answered on port ") for step in servers), servers
    for step in steps:
        assert step.skipped or step.command, step
        if step.skipped:  # only the suite itself, the PhysioNet 2012 lines, and the live ward's without its library
            assert any(why in step.skipped for why in ("test suite", "PhysioNet 2012", "live ward")), step
