"""``--workers`` and ``--deadline``: one definition and one check for every study that trains units in workers."""

import argparse
import importlib
import os
import sys
import time

import pytest

from garlic.training.workers import Job, add_worker_arguments, check_worker_arguments, run_jobs

STUDIES = ["experiments.compare", "experiments.ablations", "experiments.fidelity"]


@pytest.mark.parametrize("module", STUDIES)
@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--workers", "0"], "--workers must be at least 1, got 0"),
        (["--workers", "2", "--deadline", "-1"], "--deadline takes minutes (0 or more)"),
        (["--deadline", "5"], "with --workers 2 or more; got --deadline 5.0 with --workers 1"),
    ],
)
def test_every_study_refuses_bad_workers_and_deadlines_alike_before_reading_data(
    module, arguments, message, capsys, tmp_path
):
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as refused:
        main(["--dataset", "synthetic", "--data-root", str(tmp_path), "--mlruns", str(tmp_path / "store"), *arguments])
    assert refused.value.code == 2
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before any data or store was made


def test_a_worker_leaves_the_deadline_to_its_parent():
    parser = argparse.ArgumentParser()
    add_worker_arguments(parser, "the units")
    check_worker_arguments(parser, parser.parse_args(["--workers", "2", "--deadline", "0"]))
    # a worker's command repeats its parent's, --deadline included, with --workers 1: not refused
    check_worker_arguments(parser, parser.parse_args(["--deadline", "1.5", "--workers", "1"]), worker=True)
    with pytest.raises(SystemExit):
        check_worker_arguments(parser, parser.parse_args(["--deadline", "1.5", "--workers", "1"]))


def test_at_the_deadline_the_running_jobs_are_stopped_and_the_others_never_start(tmp_path):
    sleeper = "import os, time; print(os.getpid(), flush=True); time.sleep(120)"
    jobs = [
        Job(f"unit {k}", [sys.executable, "-c", sleeper], tmp_path / "locks" / f"unit-{k}", tmp_path / f"{k}.log")
        for k in range(3)
    ]
    started = time.monotonic()
    outcomes = run_jobs(jobs, 2, minutes=0.05)  # 3 s: the two first run into it, the third finds it passed
    assert time.monotonic() - started < 30  # not the sleepers' 120 s
    for k in (0, 1):
        assert outcomes[f"unit {k}"] == (
            f"stopped at the deadline (its run is FAILED and resumable), see {tmp_path / f'{k}.log'}"
        )
        with pytest.raises(ProcessLookupError):  # terminated and waited for: gone
            os.kill(int((tmp_path / f"{k}.log").read_text()), 0)
    assert outcomes["unit 2"] == "not started: the deadline had passed"
    assert not (tmp_path / "2.log").exists()


def test_each_job_that_succeeds_is_handed_over_as_it_ends_while_the_others_still_run(tmp_path):
    # experiments.compare keeps each unit in its run archive then, not after the last: the machine may not last
    commands = {"quick": "pass", "slow": "import time; time.sleep(4)", "failing": "raise SystemExit(3)"}
    jobs = [
        Job(name, [sys.executable, "-c", code], tmp_path / "locks" / name, tmp_path / f"{name}.log")
        for name, code in commands.items()
    ]
    handed, started = [], time.monotonic()
    outcomes = run_jobs(jobs, 3, finished=lambda job: handed.append((job.name, time.monotonic() - started)))
    assert [name for name, _ in handed] == ["quick", "slow"]  # not the one that failed
    assert handed[0][1] < 3 < handed[1][1]  # the quick one before the slow one had ended
    assert outcomes == {"quick": "done", "slow": "done", "failing": f"failed (exit 3), see {tmp_path / 'failing.log'}"}
