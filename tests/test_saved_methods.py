"""A registered method other than GARLIC saved with its run (garlic.methods.saved), and used by ``garlic evaluate``,
``garlic predict`` and the dashboard's replay as a GARLIC model is."""

import io
import json
import os
import re
import shutil
from pathlib import Path
from urllib.parse import urlparse

import mlflow
import numpy as np
import pandas as pd
import pytest
import skops.io
from sklearn.preprocessing import FunctionTransformer

from garlic.app.replay import method_risk_curve, prefix_tensors, replay_stay
from garlic.app import sources
from garlic import runs
from garlic.config import Config
from garlic.data.batches import IrregularDataset
from garlic.methods.model_files import ModelFileError
from garlic.methods.summary import SKOPS_FILE, load_skops
from garlic.tracking.store import get_run, use_store
from garlic.io.tables import read_processed
from helpers import error_line, garlic_main, record_files, synthetic_root


def test_a_skops_file_naming_an_untrusted_type_is_refused_before_anything_is_built(tmp_path):
    path = tmp_path / SKOPS_FILE
    path.write_bytes(skops.io.dumps(FunctionTransformer(func=os.system)))
    with pytest.raises(ModelFileError, match=r"names types this project does not load: .*system"):
        load_skops(path)
    path.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ModelFileError, match="not a readable skops model"):
        load_skops(path)


@pytest.fixture(scope="module")
def method_runs(tmp_path_factory):
    """gbm_static and grud trained by ``garlic train --method`` on split 0 of a small synthetic cohort."""
    root = synthetic_root(tmp_path_factory, n_stays=300, seed=3)
    store = tmp_path_factory.mktemp("method-runs") / "mlruns"
    config = Config.for_dataset("synthetic").override({"max_epochs": 2, "device": "cpu"})
    trained = {name: runs.train(config, [0], root, store, method=name)[0] for name in ("gbm_static", "grud")}
    return root, store, trained


@pytest.mark.parametrize("name", ["gbm_static", "grud"])
def test_evaluate_and_predict_read_a_method_run_as_they_read_a_garlic_run(name, method_runs, tmp_path, capsys):
    root, store, trained = method_runs
    run_id = trained[name]
    common = ["--data-root", str(root), "--mlruns", str(store)]
    garlic_main([*common, "evaluate", "--run", run_id])
    evaluated = json.loads(capsys.readouterr().out)
    use_store(store)
    logged = get_run(run_id).data.metrics
    assert evaluated["auroc"] == pytest.approx(logged["test_auroc"], abs=1e-12)
    assert evaluated["brier"] == pytest.approx(logged["test_brier"], abs=1e-12)

    test = pd.read_csv(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="predictions/test.csv"))
    chosen = test.head(3)
    paths = record_files(root / "processed" / "synthetic", chosen["stay_id"], tmp_path)
    garlic_main([*common, "predict", "--run", run_id, "--input", *paths])
    predicted = pd.read_csv(io.StringIO(capsys.readouterr().out))
    np.testing.assert_array_equal(predicted["stay_id"], chosen["stay_id"])
    # record files keep 6 significant digits and whole minutes: close, not bit for bit
    np.testing.assert_allclose(predicted["risk"], chosen["risk"], atol=1e-3)


@pytest.mark.parametrize("name", ["gbm_static", "grud"])
def test_a_method_replay_ends_at_the_runs_test_risk_and_each_hour_sees_only_its_past(name, method_runs):
    root, store, trained = method_runs
    predictor = runs.load_predictor(trained[name], store)
    dataset = sources.test_split(predictor, get_run(trained[name]), root)
    logged = pd.read_csv(
        mlflow.artifacts.download_artifacts(run_id=trained[name], artifact_path="predictions/test.csv")
    )
    position = 0
    replay = replay_stay(predictor, dataset, position)
    # the last hour holds the whole stay: the run's own test risk for it
    expected = logged.set_index("stay_id").loc[replay.stay_id, "risk"]
    assert replay.risk[-1] == pytest.approx(expected, abs=1e-6)
    # an hour's risk is the method on the stay cut there, with nothing later in it
    tensors = dataset.tensors.subset(np.array([position]))
    middle = len(replay.hours) // 2
    cut = prefix_tensors(tensors, replay.hours[middle : middle + 1])
    assert cut.times[0, : cut.lengths[0]].max() <= replay.hours[middle] and not cut.mask[0, cut.lengths[0] :].any()
    alone = predictor.predict_proba(IrregularDataset(cut, predictor.normalisation))[0]
    assert replay.risk[middle] == pytest.approx(alone, abs=1e-6)
    np.testing.assert_array_equal(method_risk_curve(predictor, tensors, replay.hours), replay.risk)


# ---------------------------------------------------------------------------------------------------------------
# A saved folder that was edited: refused in one line naming the file, never scored otherwise than it was fitted


@pytest.fixture(scope="module")
def static_run(tmp_path_factory):
    """logreg_static (which reads the variables and the static features) trained on split 0 by ``garlic train``."""
    root = synthetic_root(tmp_path_factory, n_stays=200, seed=5)
    store = tmp_path_factory.mktemp("static-run") / "mlruns"
    run_id = runs.train(Config.for_dataset("synthetic"), [0], root, store, method="logreg_static")[0]
    return root, store, run_id


@pytest.fixture
def edit_model(static_run, tmp_path):
    """``edit(file, change)`` applies ``change`` to the JSON ``file`` of the run's model folder in its store; the
    folder is put back as it was after the test."""
    root, store, run_id = static_run
    use_store(store)
    folder = Path(urlparse(get_run(run_id).info.artifact_uri).path) / "model"
    shutil.copytree(folder, tmp_path / "original")

    def edit(name: str, change) -> None:
        path = folder / name
        description = json.loads(path.read_text())
        change(description)
        path.write_text(json.dumps(description))

    yield edit
    shutil.rmtree(folder)
    shutil.copytree(tmp_path / "original", folder)


def _predict_fails(static_run, tmp_path, capsys) -> str:
    root, store, run_id = static_run
    processed = root / "processed" / "synthetic"
    paths = record_files(processed, read_processed(processed).labels["stay_id"].head(2), tmp_path)
    with pytest.raises(SystemExit) as stopped:
        garlic_main(["--data-root", str(root), "--mlruns", str(store), "predict", "--run", run_id, "--input", *paths])
    error = capsys.readouterr().err
    assert stopped.value.code == 2 and "Traceback" not in error
    line = error_line(error)
    return line


def _reversed(key: str):
    return lambda description: description.update({key: description[key][::-1]})


@pytest.mark.parametrize("key", ["variables", "static_features"])
def test_a_saved_method_whose_input_order_was_edited_is_refused_naming_the_file(
    static_run, edit_model, tmp_path, capsys, key
):
    edit_model("method.json", _reversed(key))  # read in this order, every value went into another one's column
    line = _predict_fails(static_run, tmp_path, capsys)
    assert re.fullmatch(
        rf"garlic: error: \S+/model/method\.json: its {key} are not those the model was fitted on, "
        r"in their order: \['.+'\] at position 0, where \S+/model/fitted\.json has \['.+'\]; .*",
        line,
    ), line


@pytest.mark.parametrize(
    "name, change, message",
    [
        (
            "method.json",
            lambda d: d.update(method="logreg"),
            r"method\.json names method logreg, but \S+/fitted\.json "
            "was written by logreg_static",
        ),
        ("method.json", lambda d: d.update(method="gbm_static"), "names method gbm_static, but .* by logreg_static"),
        ("method.json", lambda d: d.update(method="grud"), "names method grud, but .* by logreg_static"),
        (
            "fitted.json",
            lambda d: d.update(kept=d["kept"][:-3]),
            r"fitted\.json: 'kept' marks \d+ of \d+ columns, but "
            r"the model reads \d+ of the \d+ summary columns",
        ),
    ],
)
def test_a_saved_method_renamed_or_with_a_short_kept_list_is_one_line_naming_the_file(
    static_run, edit_model, tmp_path, capsys, name, change, message
):
    edit_model(name, change)
    line = _predict_fails(static_run, tmp_path, capsys)
    assert line.startswith("garlic: error: ") and re.search(message, line), line
