"""The load benchmark (issues #56 and #72): its section of docs/results/speed.md, its conditions, and a short run on
the synthetic cohort."""

from experiments import benchmark_load, benchmark_training
from experiments.benchmark_load import HEADING, condition_name, load_table, with_section
from garlic.data.datasets import processed_folder
from garlic.sources import synthetic

TABLE = "# Speed\n\n| preset | ... |\n|---|\n| physionet2012-fast | ... |\n"


def test_the_load_section_replaces_its_own_and_no_other():
    first = with_section(TABLE, f"{HEADING}\n\nfirst\n")
    assert first == TABLE + f"\n{HEADING}\n\nfirst\n"
    by_hand = first + "\n## Notes\n\nkept\n"
    assert with_section(by_hand, f"{HEADING}\n\nsecond\n") == TABLE + f"\n{HEADING}\n\nsecond\n\n## Notes\n\nkept\n"
    assert with_section("", f"{HEADING}\n\nalone\n") == f"{HEADING}\n\nalone\n"


def test_the_speed_table_written_again_keeps_the_load_section(tmp_path):
    report = tmp_path / "speed.md"
    report.write_text(with_section(TABLE, f"{HEADING}\n\nmeasured\n"))
    assert benchmark_training.sections_after_the_table(report) == f"\n{HEADING}\n\nmeasured\n"
    report.write_text(TABLE)
    assert benchmark_training.sections_after_the_table(report) == ""


def test_conditions_beside_another_training_are_named_and_each_round_is_set_against_its_own_one_thread_time():
    assert [condition_name(False, 0), condition_name(False, 2), condition_name(True, 0), condition_name(True, 1)] == [
        "idle",
        "beside 2 busy processes",
        "beside a training",
        "beside a training and 1 busy process",
    ]
    measured = {"training": True, "busy": 0, "threads": 1, "stays_per_second": 900.0, "load": 3.0}
    rows = [
        measured | {"round": 0, "variant": "one", "epoch_seconds": 10.0},
        measured | {"round": 0, "variant": "automatic", "epoch_seconds": 11.0},
        measured | {"round": 1, "variant": "one", "epoch_seconds": 20.0},
        measured | {"round": 1, "variant": "automatic", "epoch_seconds": 21.0},
    ]
    table = load_table(rows, 40)
    assert "| beside a training | automatic | 1 | 11.0 | 1.10 | 900 | 3.0 |" in table
    assert "| beside a training | automatic | 1 | 21.0 | 1.05 | 900 | 3.0 |" in table


def test_a_short_run_measures_each_variant_in_its_own_process_and_writes_its_section(tmp_path, capsys):
    small = ["--set", "dataset=synthetic", "--set", "hidden_dim=8", "--set", "feature_dim=4", "--set", "device=cpu"]
    synthetic.generate(processed_folder("synthetic", tmp_path / "data"), n_stays=300, seed=0)
    out = tmp_path / "out"
    out.mkdir()
    (out / "speed.md").write_text(TABLE)
    benchmark_load.main(
        [
            "--preset",
            "synthetic",
            *small,
            "--batches",
            "2",
            "--busy",
            "0",
            "--variants",
            "one",
            "automatic",
            "--data-root",
            str(tmp_path / "data"),
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert "idle, one: 1 thread(s)" in printed and "idle, automatic: " in printed
    report = (out / "speed.md").read_text()
    assert report.startswith(TABLE + f"\n{HEADING}\n")
    assert "| idle | one | 1 | " in report and "| 1.00 |" in report and "| idle | automatic | " in report
    assert "python -m experiments.benchmark_load --preset synthetic" in report
