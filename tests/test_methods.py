"""The method registry (``garlic.methods.registry``): a model registered once is trained by ``garlic train --method``, and
tabulated and compared by the studies, with no other file touched. The toy model here is the worked example of
``docs/adding-a-model.md``: keep the two alike."""
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LogisticRegression

from experiments import compare
from experiments.baselines.run import main as baselines_main
from garlic import studies
from garlic.cli import main as garlic_main
from garlic.config import Config, ConfigError
from garlic.data.batches import IrregularDataset
from garlic.methods import registry
from garlic.methods.contract import check_fitted
from garlic.tracking.store import use_store
from helpers import synthetic_root


class LastValues:
    """Logistic regression on each variable's last observed value (0, the training mean, where never observed)."""

    def __init__(self, C: float = 1.0, seed: int = 0):
        self.C, self.seed = C, seed

    @staticmethod
    def features(dataset: IrregularDataset) -> np.ndarray:
        seen = dataset.mask.numpy() > 0  # [N, T, D]
        last = seen.shape[1] - 1 - seen[:, ::-1].argmax(axis=1)  # [N, D]
        values = np.take_along_axis(dataset.values.numpy(), last[:, None, :], axis=1)[:, 0]
        return np.where(seen.any(axis=1), values, 0.0)

    def fit(self, train: IrregularDataset, validation: IrregularDataset) -> "LastValues":
        self.model_ = LogisticRegression(C=self.C, max_iter=1000, random_state=self.seed)
        self.model_.fit(self.features(train), train.labels.numpy())
        return self

    def predict_proba(self, dataset: IrregularDataset) -> np.ndarray:
        check_fitted(self)
        return self.model_.predict_proba(self.features(dataset))[:, 1]


TOY = registry.MethodSpec("toy", "logistic regression on last values", LastValues)


@pytest.fixture
def toy():
    registry.register(TOY)
    yield TOY
    registry.METHODS.pop("toy")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return synthetic_root(tmp_path_factory, n_stays=300, seed=4)


def test_a_registered_model_is_trained_tested_and_logged_by_garlic_train(toy, root, tmp_path, capsys):
    store = tmp_path / "mlruns"
    garlic_main(["--data-root", str(root), "--mlruns", str(store), "train", "--method", "toy", "--dataset",
                 "synthetic", "--all-splits", "--set", "C=0.1"])  # fmt: skip
    printed = capsys.readouterr().out
    assert printed.count("five-split/split_") == 5
    use_store(store)
    runs = mlflow.search_runs(search_all_experiments=True, filter_string="tags.method = 'toy'", output_format="list")
    (parent,) = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]  # the split runs are tagged too
    assert len(runs) == 6 and parent.info.status == "FINISHED"
    assert parent.data.params["C"] == "0.1"  # --set reached the method's own setting
    splits = mlflow.search_runs(search_all_experiments=True, output_format="list",
                                filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")  # fmt: skip
    assert sorted(run.data.params["split"] for run in splits) == [f"five-split/split_{k}" for k in range(5)]
    aurocs = [run.data.metrics["test_auroc"] for run in splits]
    assert parent.data.metrics["test_auroc_mean"] == pytest.approx(np.mean(aurocs))
    # the synthetic label follows the last values of its planted drivers: far better than chance
    assert min(aurocs) > 0.6
    test = pd.read_csv(mlflow.artifacts.download_artifacts(f"{splits[0].info.artifact_uri}/predictions/test.csv"))
    assert len(test) == int(splits[0].data.params["n_test"]) and test["risk"].between(0, 1).all()
    with pytest.raises(SystemExit):  # the toy writes nothing to a folder, so it saved no model: evaluate says so
        garlic_main(["--data-root", str(root), "--mlruns", str(store), "evaluate", "--run", splits[0].info.run_id])
    assert "is a toy run that saved no model" in capsys.readouterr().err


def test_a_registered_model_has_its_row_in_the_baselines_table_and_the_comparison(toy, root, tmp_path, capsys):
    store, out = tmp_path / "mlruns", tmp_path / "results"
    baselines_main(["--dataset", "synthetic", "--splits", "0", "1", "--methods", "toy", "--data-root", str(root),
                    "--mlruns", str(store)])  # fmt: skip
    assert "| toy | 2 |" in capsys.readouterr().out
    compare.main(["--dataset", "synthetic", "--protocols", "five-split", "--methods", "toy", "--presets",
                  "--data-root", str(root), "--mlruns", str(store), "--out", str(out)])  # fmt: skip
    table = pd.read_csv(out / "synthetic.csv")
    row = table[table["method"] == "toy"].iloc[0]
    assert row["runs"] == 5 and 0.5 < row["auroc_mean"] <= 1
    assert (out / "synthetic-runs" / "toy").is_dir()  # archived like every other method's units


def test_the_baselines_command_lists_every_registered_method_with_its_description(toy, capsys):
    with pytest.raises(SystemExit):
        baselines_main(["--help"])
    assert "  toy: logistic regression on last values" in capsys.readouterr().out


def test_a_name_is_registered_once_and_an_unknown_one_is_refused_by_name(toy, root, tmp_path, capsys):
    with pytest.raises(ValueError, match="already registered"):
        registry.register(TOY)
    with pytest.raises(SystemExit):
        garlic_main(["--data-root", str(root), "--mlruns", str(tmp_path), "train", "--method", "toys"])
    assert "unknown method 'toys'; registered: " in capsys.readouterr().err


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
    with pytest.raises(ConfigError, match=r"grud's setting 'lr' expects a number, got 'x'"):
        spec.parse_settings(["lr=x"])
    with pytest.raises(SystemExit):
        garlic_main(["--data-root", str(root), "--mlruns", str(tmp_path), "train", "--method", "grud", "--set",
                     "C=1"])  # fmt: skip
    assert ("unknown config key 'C', nor a setting of method grud (hidden_dim, dropout, lr, weight_decay, "
            "batch_size); known config keys: alternating, architecture,") in capsys.readouterr().err


def test_an_entry_naming_an_argument_its_class_lacks_or_leaving_one_unset_is_refused_as_written():
    from garlic.methods.recurrent import RecurrentModel

    with pytest.raises(ValueError, match="method grud2: RecurrentModel takes no argument patience"):
        registry.MethodSpec("grud2", "", RecurrentModel, fixed={"name": "grud"},
                            from_run={"patience": "early_stopping"})
    with pytest.raises(ValueError, match="method grud2: nothing gives name, which RecurrentModel takes without a "):
        registry.MethodSpec("grud2", "", RecurrentModel)


def test_the_simple_baselines_are_the_registrys_and_a_model_the_data_cannot_feed_is_refused(root, tmp_path, capsys):
    assert registry.simple_baselines() == ["logreg", "logreg_static", "gbm", "gbm_static"]
    with pytest.raises(SystemExit):
        garlic_main(["--data-root", str(root), "--mlruns", str(tmp_path), "train", "--method", "saps"])
    assert "saps needs the SAPS-I column, which synthetic does not have" in capsys.readouterr().err


def test_a_method_run_is_never_taken_for_a_garlic_unit_by_the_comparison(toy, root, tmp_path):
    from garlic.tracking import run_contract
    from garlic.config import Config
    from garlic.io.tables import read_manifest

    store = tmp_path / "mlruns"
    garlic_main(["--data-root", str(root), "--mlruns", str(store), "train", "--method", "toy", "--dataset", "synthetic",
                 "--split", "0"])  # fmt: skip
    digest = run_contract.manifest_digest(read_manifest(root / "processed" / "synthetic"))
    # one split: the run itself holds the split's params and a seed, as a GARLIC split run does
    config = Config().override({"dataset": "synthetic"})
    assert studies.finished_unit([store], config, "five-split/split_0", digest) is None


# ---------------------------------------------------------------------------------------------------------------
# A unit's settings are hashed into its identity (``studies.settings_digest``): the archived runs of
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
        "grud": {"hidden_dim": 64, "dropout": 0.2, "lr": 0.001, "weight_decay": 0.0001, "batch_size": 64,
                 "max_epochs": 100, "early_stopping": 10, "seed": 0, "device": "auto"},
        "decay_gru": {"hidden_dim": 64, "dropout": 0.2, "lr": 0.001, "weight_decay": 0.0001, "batch_size": 64,
                      "max_epochs": 100, "early_stopping": 10, "seed": 0, "device": "auto"},
        "pypots_raindrop": {"method": "pypots_raindrop", "hidden_dim": 64, "dropout": 0.2, "batch_size": 64,
                            "max_epochs": 100, "patience": 10, "seed": 0, "device": "auto"},
        "pypots_seft": {"method": "pypots_seft", "hidden_dim": 64, "dropout": 0.2, "batch_size": 64,
                        "max_epochs": 100, "patience": 10, "seed": 0, "device": "auto"},
        "pypots_brits": {"method": "pypots_brits", "hidden_dim": 64, "dropout": 0.2, "batch_size": 64,
                         "max_epochs": 100, "patience": 10, "seed": 0, "device": "auto"},
    },
    "run settings changed": {
        "saps": {"method": "saps", "seed": 7},
        "sofa": {"method": "sofa", "seed": 7},
        "logreg": {"method": "logreg", "seed": 7},
        "logreg_static": {"method": "logreg_static", "seed": 7},
        "gbm": {"method": "gbm", "seed": 7},
        "gbm_static": {"method": "gbm_static", "seed": 7},
        "input_hours": {"method": "input_hours", "seed": 7},
        "grud": {"hidden_dim": 64, "dropout": 0.2, "lr": 0.001, "weight_decay": 0.0001, "batch_size": 64,
                 "max_epochs": 3, "early_stopping": 2, "seed": 7, "device": "cpu"},
        "decay_gru": {"hidden_dim": 64, "dropout": 0.2, "lr": 0.001, "weight_decay": 0.0001, "batch_size": 64,
                      "max_epochs": 3, "early_stopping": 2, "seed": 7, "device": "cpu"},
        "pypots_raindrop": {"method": "pypots_raindrop", "hidden_dim": 64, "dropout": 0.2, "batch_size": 64,
                            "max_epochs": 3, "patience": 2, "seed": 7, "device": "cpu"},
        "pypots_seft": {"method": "pypots_seft", "hidden_dim": 64, "dropout": 0.2, "batch_size": 64,
                        "max_epochs": 3, "patience": 2, "seed": 7, "device": "cpu"},
        "pypots_brits": {"method": "pypots_brits", "hidden_dim": 64, "dropout": 0.2, "batch_size": 64,
                         "max_epochs": 3, "patience": 2, "seed": 7, "device": "cpu"},
    },
}  # fmt: skip


@pytest.mark.parametrize("configured", list(PINNED))
def test_every_entrys_settings_are_those_its_archived_runs_are_keyed_by(configured):
    from garlic.config import Config

    config = Config() if configured == "default" else Config().override(RUN_SETTINGS)
    context = registry.MethodContext(config, pd.DataFrame({"stay_id": []}))
    pinned = PINNED[configured]
    for name in pinned:  # in order too: the params are logged in it
        assert list(registry.method(name).settings(context).items()) == list(pinned[name].items()), name
    # GARLIC's settings are its config, as its units are keyed (``studies.config_digest``)
    assert registry.method("garlic").settings(context) == config.to_dict()


def test_the_committed_run_archives_are_found_with_the_registrys_settings():
    from garlic.config import Config

    for runs_file in sorted(Path(__file__).resolve().parents[1].glob("docs/results/**/*-runs/runs.csv")):
        dataset = runs_file.parent.name.removesuffix("-runs")
        context = registry.MethodContext(Config.for_dataset(dataset), pd.DataFrame({"stay_id": []}))
        archived = pd.read_csv(runs_file, dtype={"settings": str})
        methods = archived[archived["method"].isin(registry.METHODS) & (archived["method"] != "garlic")]
        assert len(methods), runs_file
        for method, digest in methods[["method", "settings"]].drop_duplicates().itertuples(index=False):
            assert studies.settings_digest(registry.method(method).settings(context)) == digest, (runs_file, method)
