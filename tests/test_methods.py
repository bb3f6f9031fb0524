"""The method registry (``garlic.methods.registry``): a model registered once is trained by ``garlic train --method``, and
tabulated and compared by the studies, with no other file touched. ``docs/adding-a-model.md`` is walked here as
written: the template copied under a new name, registered by the guide's line, trained and compared by its
commands."""

import json
import re
import shlex
import shutil
import sys
from pathlib import Path

import mlflow
import pandas as pd
import pytest

import garlic.methods
from experiments import compare
from experiments.baselines.run import main as baselines_main
from garlic.config import Config, ConfigError
from garlic.methods import registry
from garlic.tracking import queries, run_contract
from garlic.tracking.store import use_store
from helpers import garlic_main, synthetic_root

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "adding-a-model.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", GUIDE.read_text(), flags=re.S)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return synthetic_root(tmp_path_factory, n_stays=300, seed=4)


@pytest.fixture
def guides_model(tmp_path, monkeypatch):
    """The guide's first two steps: the template copied under its new name (into a folder added to
    ``garlic.methods``' path, so that the package is left as it is) and registered by the guide's line; returns the
    name it registered. Both are undone after the test."""
    (copy,), (registration,) = blocks("bash")[:1], blocks("python")
    command, source, destination = shlex.split(copy)
    assert command == "cp" and source == "garlic/methods/template.py", copy
    folder = tmp_path / "methods"
    folder.mkdir()
    shutil.copy(ROOT / source, folder / Path(destination).name)
    monkeypatch.setattr(garlic.methods, "__path__", [*garlic.methods.__path__, str(folder)])
    before = set(registry.METHODS)
    exec(registration, dict(vars(registry)))  # as written at the end of garlic/methods/registry.py
    (name,) = set(registry.METHODS) - before
    yield name
    registry.METHODS.pop(name)
    sys.modules.pop(f"garlic.methods.{Path(destination).stem}")


def test_the_guides_copy_of_the_template_is_trained_saved_and_compared_by_its_commands(
    guides_model, root, tmp_path, capsys
):
    store = tmp_path / "mlruns"
    (commands,) = blocks("bash")[1:]
    for line in commands.strip().splitlines():
        argv = shlex.split(line, comments=True)
        if argv[0] == "garlic":
            garlic_main(["--data-root", str(root), "--mlruns", str(store), *argv[1:]])
        else:
            assert argv[:3] == ["python", "-m", "experiments.compare"], line
            compare.main([*argv[3:], "--data-root", str(root), "--mlruns", str(store)])
    printed = capsys.readouterr().out
    use_store(store)
    runs = mlflow.search_runs(experiment_names=["synthetic"], output_format="list")  # garlic train's and the table's
    (run,) = [run for run in runs if run_contract.SPLIT_INDICES in run.data.params]  # garlic train's
    assert run.info.status == "FINISHED" and run.data.params["C"] == "0.1"  # --set reached the method's own setting
    test = pd.read_csv(mlflow.artifacts.download_artifacts(f"{run.info.artifact_uri}/predictions/test.csv"))
    assert len(test) == int(run.data.params["n_test"]) and test["risk"].between(0, 1).all()
    # the synthetic label follows the last values of its planted drivers: far better than chance
    assert run.data.metrics["test_auroc"] > 0.6
    # saved with its run: read back from its folder, it scores the test stays as the run did
    garlic_main(["--data-root", str(root), "--mlruns", str(store), "evaluate", "--run", run.info.run_id])
    assert json.loads(capsys.readouterr().out)["auroc"] == pytest.approx(run.data.metrics["test_auroc"], abs=1e-12)
    # the comparison: its row over the protocol's five splits
    row = next(line for line in printed.splitlines() if line.startswith(f"| {guides_model} |"))
    assert "| five-split | 5 |" in row, row


def test_a_method_setting_is_set_by_name_and_a_key_of_neither_it_nor_the_config_is_refused(root, tmp_path, capsys):
    spec = registry.method("grud")
    to_config, own = spec.parse_settings(["hidden_dim=8", "max_epochs=2", "dropout=0.5"])
    assert own == {"hidden_dim": 8, "dropout": 0.5} and to_config == ["max_epochs=2"]
    # PyPOTS's patience is the config's early stopping under another name: set there
    assert registry.method("pypots_brits").parse_settings(["patience=3"]) == (["early_stopping=3"], {})
    context = registry.MethodContext(Config(), pd.DataFrame({"stay_id": []}), settings=own)
    assert spec.settings(context)["hidden_dim"] == 8 and spec.create(context).get_params()["hidden_dim"] == 8
    with pytest.raises(ConfigError, match=r"grud's setting 'hidden_dim' must be from 1 to 4096, got 0"):
        spec.parse_settings(["hidden_dim=0"])
    with pytest.raises(ConfigError, match=r"last_values's setting 'C' expects a number, got 'x'"):
        registry.method("last_values").parse_settings(["C=x"])
    with pytest.raises(SystemExit):
        garlic_main(["--data-root", str(root), "--mlruns", str(tmp_path), "train", "--method", "grud", "--set", "C=1"])
    assert (
        "unknown config key 'C', nor a setting of method grud (hidden_dim, dropout, lr, weight_decay, "
        "batch_size); known config keys: alternating, architecture,"
    ) in capsys.readouterr().err


def test_the_baselines_command_lists_every_registered_method_with_its_description(capsys):
    with pytest.raises(SystemExit):
        baselines_main(["--help"])
    assert "  last_values: logistic regression on each variable's last value" in capsys.readouterr().out


def test_a_name_is_registered_once_and_an_unknown_one_is_refused_by_name(root, tmp_path, capsys):
    with pytest.raises(ValueError, match="already registered"):
        registry.register(registry.method("last_values"))
    with pytest.raises(SystemExit):
        garlic_main(["--data-root", str(root), "--mlruns", str(tmp_path), "train", "--method", "toys"])
    assert "unknown method 'toys'; registered: " in capsys.readouterr().err


def test_an_entry_naming_an_argument_its_class_lacks_or_leaving_one_unset_is_refused_as_written():
    from garlic.methods.recurrent import RecurrentModel

    with pytest.raises(ValueError, match="method grud2: RecurrentModel takes no argument patience"):
        registry.MethodSpec(
            "grud2", "", RecurrentModel, fixed={"name": "grud"}, from_run={"patience": "early_stopping"}
        )
    with pytest.raises(ValueError, match="method grud2: nothing gives name, which RecurrentModel takes without a "):
        registry.MethodSpec("grud2", "", RecurrentModel)


def test_the_simple_baselines_are_the_registrys_and_a_model_the_data_cannot_feed_is_refused(root, tmp_path, capsys):
    assert registry.simple_baselines() == ["logreg", "logreg_static", "gbm", "gbm_static"]
    with pytest.raises(SystemExit):
        garlic_main(["--data-root", str(root), "--mlruns", str(tmp_path), "train", "--method", "saps"])
    assert "saps needs the SAPS-I column, which synthetic does not have" in capsys.readouterr().err


def test_a_method_run_saves_no_model_it_cannot_and_is_never_taken_for_a_garlic_unit(root, tmp_path, capsys):
    from garlic.io.tables import read_manifest

    store = tmp_path / "mlruns"
    garlic_main(
        [
            "--data-root",
            str(root),
            "--mlruns",
            str(store),
            "train",
            "--method",
            "input_hours",
            "--dataset",
            "synthetic",
            "--split",
            "0",
        ]
    )
    use_store(store)
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    with pytest.raises(SystemExit):  # input_hours writes nothing to a folder, so it saved no model: evaluate says so
        garlic_main(["--data-root", str(root), "--mlruns", str(store), "evaluate", "--run", run.info.run_id])
    assert "is a input_hours run that saved no model" in capsys.readouterr().err
    digest = run_contract.manifest_digest(read_manifest(root / "processed" / "synthetic"))
    # one split: the run itself holds the split's params and a seed, as a GARLIC split run does
    config = Config().override({"dataset": "synthetic"})
    assert queries.finished_unit([store], config, "five-split/split_0", digest) is None


# ---------------------------------------------------------------------------------------------------------------
# A unit's settings are hashed into its identity (``queries.settings_digest``): the archived runs of
# docs/results/*-runs/runs.csv and the MLflow runs of every store are matched on them. These literal values pin what
# every entry produced before settings came from the methods' constructors: a change here orphans archived runs.

RUN_SETTINGS = {"seed": 7, "max_epochs": 3, "early_stopping": 2, "device": "cpu"}
PINNED = {
    "default": {
        "saps": {"method": "saps", "seed": 0},
        "sofa": {"method": "sofa", "seed": 0},
        "logreg": {"method": "logreg", "seed": 0},
        "logreg_static": {"method": "logreg_static", "seed": 0},
        "gbm": {"method": "gbm", "seed": 0},
        "gbm_static": {"method": "gbm_static", "seed": 0},
        "input_hours": {"method": "input_hours", "seed": 0},
        "grud": {
            "hidden_dim": 64,
            "dropout": 0.2,
            "lr": 0.001,
            "weight_decay": 0.0001,
            "batch_size": 64,
            "max_epochs": 100,
            "early_stopping": 10,
            "seed": 0,
            "device": "auto",
        },
        "decay_gru": {
            "hidden_dim": 64,
            "dropout": 0.2,
            "lr": 0.001,
            "weight_decay": 0.0001,
            "batch_size": 64,
            "max_epochs": 100,
            "early_stopping": 10,
            "seed": 0,
            "device": "auto",
        },
        "pypots_raindrop": {
            "method": "pypots_raindrop",
            "hidden_dim": 64,
            "dropout": 0.2,
            "batch_size": 64,
            "max_epochs": 100,
            "patience": 10,
            "seed": 0,
            "device": "auto",
        },
        "pypots_seft": {
            "method": "pypots_seft",
            "hidden_dim": 64,
            "dropout": 0.2,
            "batch_size": 64,
            "max_epochs": 100,
            "patience": 10,
            "seed": 0,
            "device": "auto",
        },
        "pypots_brits": {
            "method": "pypots_brits",
            "hidden_dim": 64,
            "dropout": 0.2,
            "batch_size": 64,
            "max_epochs": 100,
            "patience": 10,
            "seed": 0,
            "device": "auto",
        },
    },
    "run settings changed": {
        "saps": {"method": "saps", "seed": 7},
        "sofa": {"method": "sofa", "seed": 7},
        "logreg": {"method": "logreg", "seed": 7},
        "logreg_static": {"method": "logreg_static", "seed": 7},
        "gbm": {"method": "gbm", "seed": 7},
        "gbm_static": {"method": "gbm_static", "seed": 7},
        "input_hours": {"method": "input_hours", "seed": 7},
        "grud": {
            "hidden_dim": 64,
            "dropout": 0.2,
            "lr": 0.001,
            "weight_decay": 0.0001,
            "batch_size": 64,
            "max_epochs": 3,
            "early_stopping": 2,
            "seed": 7,
            "device": "cpu",
        },
        "decay_gru": {
            "hidden_dim": 64,
            "dropout": 0.2,
            "lr": 0.001,
            "weight_decay": 0.0001,
            "batch_size": 64,
            "max_epochs": 3,
            "early_stopping": 2,
            "seed": 7,
            "device": "cpu",
        },
        "pypots_raindrop": {
            "method": "pypots_raindrop",
            "hidden_dim": 64,
            "dropout": 0.2,
            "batch_size": 64,
            "max_epochs": 3,
            "patience": 2,
            "seed": 7,
            "device": "cpu",
        },
        "pypots_seft": {
            "method": "pypots_seft",
            "hidden_dim": 64,
            "dropout": 0.2,
            "batch_size": 64,
            "max_epochs": 3,
            "patience": 2,
            "seed": 7,
            "device": "cpu",
        },
        "pypots_brits": {
            "method": "pypots_brits",
            "hidden_dim": 64,
            "dropout": 0.2,
            "batch_size": 64,
            "max_epochs": 3,
            "patience": 2,
            "seed": 7,
            "device": "cpu",
        },
    },
}


@pytest.mark.parametrize("configured", list(PINNED))
def test_every_entrys_settings_are_those_its_archived_runs_are_keyed_by(configured):
    config = Config() if configured == "default" else Config().override(RUN_SETTINGS)
    context = registry.MethodContext(config, pd.DataFrame({"stay_id": []}))
    pinned = PINNED[configured]
    for name in pinned:  # in order too: the params are logged in it
        assert list(registry.method(name).settings(context).items()) == list(pinned[name].items()), name
    # GARLIC's settings are its config, as its units are keyed (``queries.config_digest``): keys added later, at the
    # value that trains as before, are left out, so that units trained before them are still found
    later = {"lr_schedule": "plateau", "hours_input": False, "hourly_target": "label"}
    expected = {k: v for k, v in config.to_dict().items() if later.get(k, object()) != v}
    assert registry.method("garlic").settings(context) == expected and "seed" in expected


def test_the_committed_run_archives_are_found_with_the_registrys_settings():
    for runs_file in sorted(ROOT.glob("docs/results/**/*-runs/runs.csv")):
        dataset = runs_file.parent.name.removesuffix("-runs")
        context = registry.MethodContext(Config.for_dataset(dataset), pd.DataFrame({"stay_id": []}))
        archived = pd.read_csv(runs_file, dtype={"settings": str})
        methods = archived[archived["method"].isin(registry.METHODS) & (archived["method"] != "garlic")]
        assert len(methods), runs_file
        for method, digest in methods[["method", "settings"]].drop_duplicates().itertuples(index=False):
            assert queries.settings_digest(registry.method(method).settings(context)) == digest, (runs_file, method)


def test_the_committed_archives_garlic_units_are_found_with_the_registrys_settings():
    # GARLIC's units in the hourly tables were archived under the digest of its registry settings (the preset's
    # config on the unit's protocol): built from its network's and its training's settings now, it keys them alike.
    checked = 0
    for dataset in ("physionet2012-hourly", "physionet2019-hourly"):
        archived = pd.read_csv(ROOT / "docs" / "results" / f"{dataset}-runs" / "runs.csv", dtype={"settings": str})
        for row in archived.drop_duplicates(["method", "settings"]).itertuples():
            method, _, preset = row.method.removesuffix(")").partition(" (")
            if not preset:
                method, preset = "garlic", method
            if not (ROOT / "garlic" / "configs" / f"{preset}.json").is_file():
                continue  # a baseline's row
            protocol = getattr(row, "protocol", "five-split")
            config = Config.load(preset, dataset=dataset).override({"split_protocol": protocol})
            context = registry.MethodContext(config, pd.DataFrame({"stay_id": []}))
            assert queries.settings_digest(registry.method(method).settings(context)) == row.settings, row
            checked += 1
    assert checked >= 9  # garlic and garlic_whole_stays on P12, three presets on three protocols on P19


def test_garlics_settings_are_its_networks_and_its_trainings_from_the_runs_config():
    config = Config().override({"hidden_dim": 8, "lr_cls": 0.01, "seed": 3, "dataset": "synthetic"})
    built = registry.method("garlic").create(registry.MethodContext(config, pd.DataFrame({"stay_id": []})))
    params = built.get_params()
    assert params["network"].hidden_dim == 8 and params["training"].lr_cls == 0.01 and params["training"].seed == 3
    # every key of the run's config but its data is one of the two, once
    network, training = (set(vars(params[name])) for name in ("network", "training"))
    assert not network & training and network | training | {"dataset", "split_protocol"} == set(Config().to_dict())
    assert registry.method("garlic").own_settings() == []  # --set hidden_dim=... sets the run's config, as before


def test_every_entry_named_by_where_its_class_is_imports_and_passes_the_entrys_check():
    for spec in registry.METHODS.values():
        assert set(spec.parameters()) >= {*spec.fixed, *spec.from_run, *spec.from_data}, spec.name
