"""The ``garlic`` command end to end on a small synthetic cohort, as a user runs it."""

import errno
import io
import os
import json
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest

from garlic.cli import _config, main, parser
from garlic.tracking.store import use_store
from helpers import error_line, garlic_here, garlic_main, record_files
from garlic.sources import physionet2012
from garlic.io.tables import read_processed
from garlic.inference import predict_tables

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--set", "max_epochs=2", "--set", "hidden_dim=16", "--set", "feature_dim=4"]


def garlic(*args: str, root) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "garlic.cli", "--data-root", str(root / "data"), "--mlruns", str(root / "mlruns")]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    made = garlic_here("preprocess", "synthetic", "--stays", "300", "--seed", "3", root=root)
    assert made.returncode == 0, made.stderr
    result = garlic_here("train", "--dataset", "synthetic", *SMALL, root=root)
    assert result.returncode == 0, result.stderr
    run_id = re.search(r"^run ([0-9a-f]{32})", result.stdout, re.MULTILINE).group(1)
    return root, run_id, result


def test_train_reports_test_metrics_and_leaves_a_run(trained):
    root, run_id, result = trained
    assert "test auroc" in result.stdout and "mlflow ui --workers 1 --backend-store-uri" in result.stdout
    use_store(root / "mlruns")
    run = mlflow.MlflowClient().get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["max_epochs"] == "2" and run.data.params["hidden_dim"] == "16"
    assert run.data.tags["preset"] == "synthetic"  # garlic/configs/synthetic.json, under the --set overrides


def test_evaluate_recomputes_the_logged_test_metrics(trained):
    root, run_id, _ = trained
    result = garlic_here("evaluate", "--run", run_id, root=root)
    assert result.returncode == 0, result.stderr
    evaluated = json.loads(result.stdout)
    use_store(root / "mlruns")
    logged = mlflow.MlflowClient().get_run(run_id).data.metrics
    assert evaluated["auroc"] == pytest.approx(logged["test_auroc"], abs=1e-9)
    assert evaluated["brier"] == pytest.approx(logged["test_brier"], abs=1e-9)


def test_evaluate_reads_the_dataset_under_data_root_from_any_folder(trained, tmp_path, monkeypatch, capsys):
    root, run_id, _ = trained
    # The data moved (as a folder recorded relative to where training ran is, seen from elsewhere): evaluate finds it
    # under --data-root, from another folder.
    moved = tmp_path / "moved"
    (root / "data").rename(moved)
    monkeypatch.chdir(tmp_path)
    try:
        main(["--data-root", str(moved), "--mlruns", str(root / "mlruns"), "evaluate", "--run", run_id])
    finally:
        moved.rename(root / "data")
    assert json.loads(capsys.readouterr().out)["n_test"] == 30


def test_predict_on_record_files_matches_the_runs_own_test_predictions(trained, tmp_path):
    root, run_id, _ = trained
    use_store(root / "mlruns")
    logged = pd.read_csv(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="predictions/test.csv"))
    chosen = logged.head(3)
    paths = record_files(root / "data" / "processed" / "synthetic", chosen["stay_id"], tmp_path)

    result = garlic_here("predict", "--run", run_id, "--input", *paths, root=root)
    assert result.returncode == 0, result.stderr
    predicted = pd.read_csv(io.StringIO(result.stdout))
    assert list(predicted.columns) == ["stay_id", "risk", "left_out"]
    np.testing.assert_array_equal(predicted["stay_id"], chosen["stay_id"])
    # Record files keep 6 significant digits and whole minutes, so the risks agree closely but not bit for bit.
    np.testing.assert_allclose(predicted["risk"], chosen["risk"], atol=1e-3)


def test_predict_leaves_out_a_record_without_an_observation_in_48_h_naming_it(trained, tmp_path, capsys):
    root, run_id, _ = trained
    late, sound = tmp_path / "1001.txt", tmp_path / "1002.txt"
    late.write_text(
        physionet2012.format_record(1001, pd.DataFrame({"time": [49.0], "variable": ["HR"], "value": [80.0]}), {})
    )
    tables = read_processed(root / "data" / "processed" / "synthetic")
    stay = int(tables.labels["stay_id"].iloc[0])
    sound.write_text(physionet2012.format_record(1002, tables.observations[tables.observations["stay_id"] == stay], {}))
    # Alone: refused (once a ZeroDivisionError).
    with pytest.raises(SystemExit) as stopped:
        main(
            [
                "--data-root",
                str(root / "data"),
                "--mlruns",
                str(root / "mlruns"),
                "predict",
                "--run",
                run_id,
                "--input",
                str(late),
            ]
        )
    assert stopped.value.code == 2
    assert error_line(capsys.readouterr().err).startswith(f"garlic: error: {late}: no observation")
    # Among others (a folder of a hospital's stays): left out with a warning naming it, and the others predicted
    # (once a risk made of nothing, then one empty stay blocking all the others).
    # It is in the output too, as a row without a risk, and in the exit status: never dropped silently.
    result = garlic("predict", "--run", run_id, "--input", str(tmp_path), root=root)
    assert result.returncode == 3, result.stderr
    risks = pd.read_csv(io.StringIO(result.stdout), keep_default_na=False)
    assert risks["stay_id"].tolist() == [1002, 1001]
    assert 0 < float(risks["risk"][0]) < 1 and risks["risk"][1] == ""
    assert risks["left_out"].tolist() == ["", "no observation of a time-series variable in the first 48 h"]
    assert (
        f"{late}: no observation of a time-series variable in the first 48 h; left out, with no risk" in result.stderr
    )
    assert f"garlic: 1 of 2 records left out, with no risk (rows with an empty risk): {late}" in result.stderr


def test_evaluate_names_a_broken_weights_file_in_one_line(trained, capsys):
    root, run_id, _ = trained
    use_store(root / "mlruns")
    weights = next(Path(mlflow.get_run(run_id).info.artifact_uri.removeprefix("file://")).rglob("weights.pt"))
    original = weights.read_bytes()

    class Planted:
        def __reduce__(self):
            return (print, ("the planted pickle ran",))

    try:
        for payload, reason in [
            (original[: len(original) // 2], "truncated or not a PyTorch weights file"),
            (pickle.dumps({"weight": Planted()}, protocol=2), "holds objects other than tensors"),
        ]:
            weights.write_bytes(payload)
            with pytest.raises(SystemExit) as stopped:
                main(["--data-root", str(root / "data"), "--mlruns", str(root / "mlruns"), "evaluate", "--run", run_id])
            assert stopped.value.code == 2
            captured = capsys.readouterr()
            assert re.fullmatch(rf"garlic: error: \S*weights\.pt: {reason}.*", error_line(captured.err)), captured.err
            assert "planted pickle ran" not in captured.out
    finally:
        weights.write_bytes(original)


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "--set", "no_such_key=1"], "unknown config key 'no_such_key'"),
        (["train", "--set", "hidden_dim=lots"], "config key 'hidden_dim' expects an integer, got 'lots'"),
        (["train", "--set", "dropout=2"], "config key 'dropout' must be at least 0 and below 1, got 2.0"),
        (["train", "--set", "device=cuda:7"], "device 'cuda:7' was asked for, but torch sees"),
        (["train", "--set", "lr_cls=inf"], "config key 'lr_cls' must be from 0 to 10, got inf"),
        (["dashboard", "--port", "99999"], "expected a port number from 1 to 65535, got '99999'"),
        (["train", "--dataset", "physionet2012"], "garlic preprocess physionet2012"),
        (["evaluate", "--run", "0123456789abcdef0123456789abcdef"], "no MLflow store in"),
        (["predict", "--run", "0123456789abcdef0123456789abcdef", "--input", "x.txt"], "no MLflow store in"),
        (
            [
                "predict",
                "--run",
                "0123456789abcdef0123456789abcdef",
                "--input",
                "x.txt",
                "--hourly",
                "--threshold",
                "2",
            ],
            "--threshold is a risk in (0, 1], got 2.0",
        ),
        (
            ["predict", "--run", "0123456789abcdef0123456789abcdef", "--input", "x.txt", "--threshold", "0.3"],
            "--threshold goes with --hourly or --labels",
        ),  # a per-stay predict would have ignored it
        (
            [
                "predict",
                "--run",
                "0123456789abcdef0123456789abcdef",
                "--input",
                "x",
                "--labels",
                "y",
                "--window-hours",
                "-1",
            ],
            "--window-hours must be a positive number of hours, got -1.0",
        ),
        (["preprocess", "synthetic", "--stays", "-5"], "--stays must be at least 1, got -5"),
        (["preprocess", "synthetic", "--strict"], "--strict does not apply to synthetic"),
        (
            ["preprocess", "synthetic", "--cohort", "garlic"],
            "unknown cohort 'garlic' for synthetic; choose one of outcome, hourly",
        ),
        (["preprocess", "meds", "--cohort", "garlic"], "--cohort does not apply to meds"),
        (
            ["preprocess", "physionet2012", "--source", ".", "--cohort", "garlic"],
            "unknown cohort 'garlic' for physionet2012",
        ),
        (["preprocess", "physionet2012", "--source", ".", "--seed", "1"], "--seed does not apply to physionet2012"),
        (["preprocess", "physionet2019", "--source", ".", "--cohort", "late"], "unknown cohort 'late' for"),
        (["preprocess", "mimic3", "--cohort", "garlic"], "--source is required for mimic3"),
        (["train", "--dataset", "mimic3"], "mimic3 has one dataset per cohort; name one of mimic3-benchmark"),
        (["train", "--dataset", "mimic3-garlic"], "preprocess mimic3 --source PATH_TO_RAW_DATA --cohort garlic"),
    ],
)
def test_bad_input_gives_a_clear_message_and_a_nonzero_exit(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as stopped:
        main(["--data-root", str(tmp_path / "data"), "--mlruns", str(tmp_path / "mlruns"), *args])
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "mlruns").exists()  # reading runs leaves no empty store behind


@pytest.mark.parametrize(
    "option, command",
    [
        ("--data-root", ["train", *SMALL]),
        ("--data-root", ["preprocess", "synthetic", "--stays", "50"]),
        ("--data-root", ["evaluate", "--run", "0123456789abcdef0123456789abcdef"]),
        ("--mlruns", ["train", *SMALL]),
        ("--mlruns", ["evaluate", "--run", "0123456789abcdef0123456789abcdef"]),
    ],
)
def test_a_folder_option_naming_a_file_is_one_line_saying_so(tmp_path, capsys, option, command):
    file = tmp_path / "a-file"
    file.write_text("not a folder")
    folders = {"--data-root": str(tmp_path / "data"), "--mlruns": str(tmp_path / "mlruns"), option: str(file)}
    with pytest.raises(SystemExit) as stopped:
        garlic_main([item for pair in folders.items() for item in pair] + command)
    error = capsys.readouterr().err
    assert stopped.value.code == 2 and "Traceback" not in error
    assert error.strip().splitlines()[-1] == f"garlic: error: {option} {file} is a file, not a folder", error[-2000:]


def test_ctrl_c_during_a_method_run_ends_it_killed_and_the_command_it_prints_finishes_it(
    trained, tmp_path, capsys, monkeypatch
):
    from garlic.methods.summary import SummaryModel

    fit = SummaryModel.fit

    def interrupted(self, train, validation):
        raise KeyboardInterrupt  # Ctrl-C as the method fits

    monkeypatch.setattr(SummaryModel, "fit", interrupted)
    root, _, _ = trained
    with pytest.raises(SystemExit) as stopped:
        garlic_main(
            [
                "--data-root",
                str(root / "data"),
                "--mlruns",
                str(tmp_path / "mlruns"),
                "train",
                "--method",
                "logreg",
                "--all-splits",
            ]
        )
    error = capsys.readouterr().err
    assert stopped.value.code == 130 and "Traceback" not in error
    assert "training: " in error and "epoch" not in error  # a method fitted in one go counts no epochs
    said = re.fullmatch(
        r"garlic: interrupted: run ([0-9a-f]{32}) is marked KILLED; continue it where it stopped "
        r"with: \S+ (--data-root \S+ --mlruns \S+ train --resume \1)",
        error.strip().splitlines()[-1],
    )
    assert said is not None, error[-2000:]
    use_store(tmp_path / "mlruns")
    (split,) = mlflow.search_runs(
        search_all_experiments=True, output_format="list", filter_string=f"tags.mlflow.parentRunId = '{said.group(1)}'"
    )
    assert {mlflow.get_run(said.group(1)).info.status, split.info.status} == {"KILLED"}
    monkeypatch.setattr(SummaryModel, "fit", fit)
    garlic_main(said.group(2).split())  # every method resumes: its splits run in the same MLflow run
    assert mlflow.get_run(said.group(1)).info.status == "FINISHED"
    assert (
        len(
            mlflow.search_runs(
                search_all_experiments=True,
                output_format="list",
                filter_string=f"tags.mlflow.parentRunId = '{said.group(1)}'",
            )
        )
        == 5
    )


@pytest.mark.parametrize("command", ["evaluate", "predict"])
def test_an_unknown_run_in_an_existing_store_is_named(trained, capsys, command):
    root, _, _ = trained
    args = ["--mlruns", str(root / "mlruns"), command, "--run", "0123456789abcdef0123456789abcdef"]
    with pytest.raises(SystemExit) as stopped:
        main(args + (["--input", "x.txt"] if command == "predict" else []))
    assert stopped.value.code == 2
    assert "no run '0123456789abcdef0123456789abcdef'" in capsys.readouterr().err


HEAVY = ("torch", "mlflow", "streamlit", "sklearn")  # pandas and pyarrow come with the dataset registry


@pytest.mark.parametrize(
    "argv", [["--help"], ["train", "--no-such-option"], ["train", "--dataset", "nope"], ["predict", "--run", "x"]]
)
def test_help_and_argument_errors_import_nothing_heavy(argv):
    # sys.modules after the parser has answered, in a fresh interpreter: what a user waits for before the answer
    probe = (
        "import sys\nfrom garlic.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        f"print('heavy:', sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=60)
    assert "heavy: []" in result.stdout, result.stdout + result.stderr


def test_parsing_a_training_command_imports_nothing_heavy():
    probe = (
        "import sys\nfrom garlic.cli import _config, parser\n"
        "_config(parser().parse_args(['train', '--config', 'garlic/configs/synthetic.json', '--set', 'dropout=0']))"
        "\n"
        "print('heavy:', sorted(m for m in ('torch', 'mlflow', 'streamlit') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert "heavy: []" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize(
    "argv, dataset",
    [
        (["train", "--config", "garlic/configs/physionet2012.json"], "physionet2012"),  # the file beats default
        (["train", "--config", "garlic/configs/physionet2012.json", "--dataset", "synthetic"], "synthetic"),
        (["train"], "synthetic"),
        (["train", "--dataset", "physionet2019-early"], "physionet2019-early"),
        (
            ["train", "--config", "garlic/configs/physionet2019.json", "--dataset", "physionet2019-early"],
            "physionet2019-early",
        ),
    ],
)
def test_an_explicit_flag_beats_the_config_file_which_beats_the_default(argv, dataset, monkeypatch):
    monkeypatch.chdir(ROOT)
    config = _config(parser().parse_args(argv))
    assert config.dataset == dataset
    if "garlic/configs/physionet2012.json" in argv:  # the file's hyper-parameters are kept either way
        assert config.window_size == 3 and config.lr_cls == pytest.approx(1e-4)


def test_a_record_of_another_dataset_is_refused_naming_the_models_dataset(trained, tmp_path):
    root, run_id, _ = trained
    record = tmp_path / "132539.txt"
    record.write_text("Time,Parameter,Value\n00:00,RecordID,132539\n00:00,Age,54\n00:07,HR,80\n00:07,HCO3,24\n")
    result = garlic_here("predict", "--run", run_id, "--input", str(record), root=root)
    assert result.returncode == 2
    message = result.stderr.strip().splitlines()[-1]
    assert "variables the model does not know: ['HCO3']" in message
    assert "trained on the synthetic dataset" in message and "garlic train --dataset physionet2012" in message


def test_predict_reads_the_example_records_written_beside_the_cohort(trained):
    root, run_id, _ = trained
    folder = root / "data" / "processed" / "synthetic" / "example-records"
    result = garlic_here("predict", "--run", run_id, "--input", str(folder), root=root)
    assert result.returncode == 0, result.stderr
    predicted = pd.read_csv(io.StringIO(result.stdout))
    assert predicted["stay_id"].tolist() == [900001, 900002, 900003]
    assert predicted["risk"].between(0, 1).all()


def test_a_one_stay_predict_says_what_it_loads_as_it_goes(trained):
    root, run_id, _ = trained
    record = root / "data" / "processed" / "synthetic" / "example-records" / "900001.txt"
    result = garlic_here("predict", "--run", run_id, "--input", str(record), root=root)
    assert result.returncode == 0, result.stderr
    said = result.stderr.splitlines()
    expected = [
        f"garlic: predicting with run {run_id}; loading torch and the model code ...",
        f"garlic: reading run {run_id}'s model from ",
        f"garlic: reading the records in {record} ...",
        "garlic: scoring 1 stay ...",
    ]
    assert len(said) == len(expected) and all(line.startswith(start) for line, start in zip(said, expected)), said


def test_evaluate_says_what_it_loads_as_it_goes(trained):
    root, run_id, _ = trained
    result = garlic_here("evaluate", "--run", run_id, root=root)
    assert result.returncode == 0, result.stderr
    folder = root / "data" / "processed" / "synthetic"
    assert result.stderr.splitlines() == [
        f"garlic: evaluating run {run_id}; loading torch, scikit-learn and MLflow ...",
        f"garlic: reading run {run_id}'s model ...",
        f"garlic: reading the synthetic stays in {folder} ...",
        "garlic: scoring the 30 test stays of five-split/split_0 ...",
    ]


def test_a_one_stay_predict_loads_neither_mlflow_nor_scikit_learn_nor_plotting(trained):
    # A fresh interpreter, as a user's first try and a live service start one: what a one-stay predict imported.
    root, run_id, _ = trained
    record = root / "data" / "processed" / "synthetic" / "example-records" / "900001.txt"
    unused = ("mlflow", "sqlalchemy", "alembic", "sklearn", "scipy", "matplotlib", "captum", "streamlit")
    probe = (
        "import sys\nfrom garlic.cli import main\nmain(sys.argv[1:])\n"
        f"print('unused:', sorted(m for m in {unused!r} if m in sys.modules))"
    )
    arguments = [
        "--data-root",
        str(root / "data"),
        "--mlruns",
        str(root / "mlruns"),
        "predict",
        "--run",
        run_id,
        "--input",
        str(record),
    ]
    result = subprocess.run(
        [sys.executable, "-c", probe, *arguments], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("stay_id,risk,left_out\n900001,0.") and "unused: []" in result.stdout, (
        result.stdout + result.stderr
    )


def test_train_says_what_it_does_and_names_the_next_steps(trained):
    _, run_id, result = trained
    assert result.stderr.startswith("garlic: training GARLIC")  # printed before torch is imported
    assert "making the tensor cache" in result.stderr
    assert re.search(r"stages by epoch: reconstruction 1", result.stdout)
    assert f"dashboard --run {run_id}" in result.stdout
    assert f"{sys.executable} -m mlflow ui" in result.stdout or "bin/python -m mlflow ui" in result.stdout
    use_store(trained[0] / "mlruns")
    assert mlflow.MlflowClient().get_run(run_id).data.tags["stages"].startswith("reconstruction 1")


# each damage with one command (as processes: all they print counts, and a process starts slowly)
@pytest.mark.parametrize("damage, command", [("truncated", "evaluate"), ("random bytes", "predict")])
def test_a_damaged_store_is_one_line_naming_it(trained, tmp_path, damage, command):
    root, run_id, _ = trained
    store = tmp_path / "mlruns"
    shutil.copytree(root / "mlruns", store)
    database = (store / "mlflow.db").read_bytes()
    (store / "mlflow.db").write_bytes(
        database[: len(database) // 3] if damage == "truncated" else np.random.default_rng(0).bytes(len(database))
    )
    arguments = ["--run", run_id] + (["--input", str(tmp_path)] if command == "predict" else [])
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "garlic.cli",
            "--mlruns",
            str(store),
            "--data-root",
            str(root / "data"),
            command,
            *arguments,
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2, result.stderr
    assert error_line(result.stderr).startswith(f"garlic: error: the MLflow store {store} cannot be used: ")


def refused_training(tmp_path: Path, capsys) -> str:
    """The last line ``garlic train`` printed as it stopped with exit status 2."""
    with pytest.raises(SystemExit) as stopped:
        main(
            [
                "--mlruns",
                str(tmp_path / "mlruns"),
                "--data-root",
                str(tmp_path / "data"),
                "train",
                "--dataset",
                "synthetic",
                "--set",
                "max_epochs=1",
            ]
        )
    assert stopped.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("reason", ["database or disk is full", "attempt to write a readonly database"])
def test_a_full_or_read_only_store_is_one_line_naming_it(tmp_path, monkeypatch, capsys, reason):
    import sqlite3

    import sqlalchemy.exc

    def refused(*args, **kwargs):  # what SQLAlchemy raises when SQLite cannot write (needs a full disk, or no root)
        raise sqlalchemy.exc.OperationalError("INSERT INTO runs ...", {}, sqlite3.OperationalError(reason))

    monkeypatch.setattr(mlflow, "start_run", refused)
    assert refused_training(tmp_path, capsys) == (
        f"garlic: error: the MLflow store {tmp_path / 'mlruns'} cannot be used: "
        f"{reason} (a damaged, read-only or full database: restore it from a copy, free space or fix its "
        "permissions, or give another --mlruns)"
    )


@pytest.mark.parametrize("number", [errno.ENOSPC, errno.EROFS])
def test_a_full_or_read_only_disk_outside_sqlite_is_one_line_naming_the_file(tmp_path, monkeypatch, capsys, number):
    import garlic.runs

    path = tmp_path / "mlruns" / "artifacts" / "weights.pt"

    def refused(*args, **kwargs):  # what writing an artifact raises on a full disk or read-only mount (simulated)
        raise OSError(number, os.strerror(number), str(path))

    monkeypatch.setattr(garlic.runs, "train", refused)
    assert refused_training(tmp_path, capsys) == (
        f"garlic: error: cannot write {path}: {os.strerror(number)} (free space or make it writable; a training "
        "stopped this way continues with garlic train --resume RUN_ID)"
    )


def test_calibrate_a_per_stay_run_for_a_burden_on_the_sites_records_cut_at_every_hour(trained, tmp_path):
    from garlic.evaluation.alerting import choose
    from garlic.inference import predict_each_hour
    from garlic.methods.saved import load_predictor
    from garlic.sources.records import read_record_files

    root, run_id, _ = trained
    use_store(root / "mlruns")
    logged = pd.read_csv(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="predictions/test.csv"))
    site = tmp_path / "site"
    site.mkdir()
    record_files(root / "data" / "processed" / "synthetic", logged["stay_id"].head(20), site)
    profile = tmp_path / "site.json"
    result = garlic_here(
        "calibrate", "--run", run_id, "--site", str(site), "--alerts-per-day", "1", "--profile", str(profile), root=root
    )
    assert result.returncode == 0, result.stderr
    written = json.loads(profile.read_text())
    assert written["stays"] == 20 and written["scores_on_site"]["alerts_per_100_days"] <= 100
    # The risk at each hour is the model's on the record cut there, as the ward and the replay score it
    trained_model = load_predictor(run_id, root / "mlruns")
    observations, static = read_record_files([site])
    hourly = predict_each_hour(trained_model, observations, static)
    stay = int(static["stay_id"].iloc[0])
    some = hourly[hourly["stay_id"] == stay].iloc[[0, 5, -1]]
    for row in some.itertuples():
        cut = observations[(observations["stay_id"] == stay) & (observations["time"] <= row.time)]
        alone = predict_tables(trained_model, cut, static[static["stay_id"] == stay])["risk"].iloc[0]
        assert row.risk == pytest.approx(alone, abs=1e-6)
    assert written["policy"]["threshold"] == choose(hourly, alerts_per_day=1.0).policy.threshold
    # A per-stay run has no hourly labels: a sensitivity or a utility is refused
    refused = garlic_here(
        "calibrate",
        "--run",
        run_id,
        "--site",
        str(site),
        "--labelled",
        "--profile",
        str(tmp_path / "no.json"),
        root=root,
    )
    assert refused.returncode == 2 and "gives one risk per stay" in refused.stderr
