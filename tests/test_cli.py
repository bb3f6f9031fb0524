"""The ``garlic`` command end to end on a small synthetic cohort, as a user runs it."""
import io
import json
import pickle
import re
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest

from garlic.cli import main
from garlic.tracking import use_store
from preprocessing import physionet2012
from preprocessing.tables import read_processed

SMALL = ["--set", "max_epochs=2", "--set", "hidden_dim=16", "--set", "feature_dim=4"]


def garlic(*args: str, root) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "garlic.cli", "--data-root", str(root / "data"), "--mlruns", str(root / "mlruns")]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    made = garlic("preprocess", "synthetic", "--stays", "300", "--seed", "3", root=root)
    assert made.returncode == 0, made.stderr
    result = garlic("train", "--dataset", "synthetic", *SMALL, root=root)
    assert result.returncode == 0, result.stderr
    run_id = re.search(r"^run ([0-9a-f]{32})", result.stdout, re.MULTILINE).group(1)
    return root, run_id, result


def test_train_reports_test_metrics_and_leaves_a_run(trained):
    root, run_id, result = trained
    assert "test auroc" in result.stdout and "mlflow ui --backend-store-uri" in result.stdout
    use_store(root / "mlruns")
    run = mlflow.MlflowClient().get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["max_epochs"] == "2" and run.data.params["hidden_dim"] == "16"


def test_evaluate_recomputes_the_logged_test_metrics(trained):
    root, run_id, _ = trained
    result = garlic("evaluate", "--run", run_id, root=root)
    assert result.returncode == 0, result.stderr
    evaluated = json.loads(result.stdout)
    use_store(root / "mlruns")
    logged = mlflow.MlflowClient().get_run(run_id).data.metrics
    assert evaluated["auroc"] == pytest.approx(logged["test_auroc"], abs=1e-9)
    assert evaluated["brier"] == pytest.approx(logged["test_brier"], abs=1e-9)


def test_predict_on_record_files_matches_the_runs_own_test_predictions(trained, tmp_path):
    root, run_id, _ = trained
    use_store(root / "mlruns")
    logged = pd.read_csv(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="predictions/test.csv"))
    chosen = logged.head(3)
    tables = read_processed(root / "data" / "processed" / "synthetic")
    paths = []
    for stay in chosen["stay_id"]:
        observations = tables.observations[tables.observations["stay_id"] == stay]
        static = tables.static.set_index("stay_id").loc[stay].to_dict()
        path = tmp_path / f"{stay}.txt"
        path.write_text(physionet2012.format_record(int(stay), observations, static))
        paths.append(str(path))

    result = garlic("predict", "--run", run_id, "--input", *paths, root=root)
    assert result.returncode == 0, result.stderr
    predicted = pd.read_csv(io.StringIO(result.stdout))
    assert list(predicted.columns) == ["stay_id", "risk"]
    np.testing.assert_array_equal(predicted["stay_id"], chosen["stay_id"])
    # Record files keep 6 significant digits and whole minutes, so the risks agree closely but not bit for bit.
    np.testing.assert_allclose(predicted["risk"], chosen["risk"], atol=1e-3)


def test_predict_refuses_a_record_without_an_observation_in_48_h_by_name(trained, tmp_path, capsys):
    root, run_id, _ = trained
    late, sound = tmp_path / "1001.txt", tmp_path / "1002.txt"
    late.write_text(physionet2012.format_record(1001, pd.DataFrame({"time": [49.0], "variable": ["HR"],
                                                                    "value": [80.0]}), {}))  # fmt: skip
    tables = read_processed(root / "data" / "processed" / "synthetic")
    stay = int(tables.labels["stay_id"].iloc[0])
    sound.write_text(physionet2012.format_record(1002, tables.observations[tables.observations["stay_id"] == stay], {}))
    for inputs in ([late], [sound, late]):  # alone: once a ZeroDivisionError; among others: once a risk of nothing
        with pytest.raises(SystemExit) as stopped:
            main(["--data-root", str(root / "data"), "--mlruns", str(root / "mlruns"), "predict", "--run", run_id,
                  "--input", *map(str, inputs)])  # fmt: skip
        assert stopped.value.code == 2
        error = capsys.readouterr().err.strip()
        assert error.startswith(f"garlic: error: {late}: no observation") and "\n" not in error
        assert "risk" not in capsys.readouterr().out


def test_evaluate_names_a_broken_weights_file_in_one_line(trained, capsys):
    root, run_id, _ = trained
    use_store(root / "mlruns")
    weights = next(Path(mlflow.get_run(run_id).info.artifact_uri.removeprefix("file://")).rglob("weights.pt"))
    original = weights.read_bytes()

    class Planted:
        def __reduce__(self):
            return (print, ("the planted pickle ran",))

    try:
        for payload, reason in [(original[: len(original) // 2], "truncated or not a PyTorch weights file"),
                                (pickle.dumps({"weight": Planted()}), "holds objects other than tensors")]:  # fmt: skip
            weights.write_bytes(payload)
            with pytest.raises(SystemExit) as stopped:
                main(["--data-root", str(root / "data"), "--mlruns", str(root / "mlruns"), "evaluate", "--run", run_id])
            assert stopped.value.code == 2
            captured = capsys.readouterr()
            assert re.fullmatch(rf"garlic: error: \S*weights\.pt: {reason}.*\n", captured.err), captured.err
            assert "planted pickle ran" not in captured.out
    finally:
        weights.write_bytes(original)


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "--set", "no_such_key=1"], "unknown config key 'no_such_key'"),
        (["train", "--set", "hidden_dim=lots"], "expects a int"),
        (["train", "--dataset", "physionet2012"], "garlic preprocess physionet2012"),
        (["evaluate", "--run", "0123456789abcdef0123456789abcdef"], "no run"),
        (["predict", "--run", "0123456789abcdef0123456789abcdef", "--input", "x.txt"], "no run"),
        (["preprocess", "synthetic", "--strict"], "--strict does not apply to synthetic"),
        (["preprocess", "physionet2012", "--source", ".", "--cohort", "garlic"], "--cohort does not apply to"),
        (["preprocess", "physionet2012", "--source", ".", "--seed", "1"], "--seed does not apply to physionet2012"),
        (["preprocess", "physionet2019", "--source", ".", "--cohort", "late"], "unknown cohort 'late' for"),
        (["preprocess", "mimic3", "--cohort", "garlic"], "--source is required for mimic3"),
        (["train", "--dataset", "mimic3"], "invalid choice: 'mimic3'"),  # a cohort must be named
        (["train", "--dataset", "mimic3-garlic"], "preprocess mimic3 --source PATH_TO_RAW_DATA --cohort garlic"),
    ],
)
def test_bad_input_gives_a_clear_message_and_a_nonzero_exit(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as stopped:
        main(["--data-root", str(tmp_path / "data"), "--mlruns", str(tmp_path / "mlruns"), *args])
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err
