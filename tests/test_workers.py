"""``--workers`` and ``--deadline``: one definition and one check for every study that trains units in workers."""
import argparse
import importlib

import pytest

from garlic.training.workers import add_worker_arguments, check_worker_arguments

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
def test_every_study_refuses_bad_workers_and_deadlines_alike_before_reading_data(module, arguments, message, capsys,
                                                                               tmp_path):  # fmt: skip
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as refused:
        main(["--dataset", "synthetic", "--data-root", str(tmp_path), "--mlruns", str(tmp_path / "store"),
              *arguments])  # fmt: skip
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

