"""The method registry (``garlic.methods.registry``): a model registered once is trained by ``garlic train --method``, and
tabulated and compared by the studies, with no other file touched. The toy model here is the worked example of
``docs/adding-a-model.md``: keep the two alike."""
import mlflow
import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LogisticRegression

from experiments import compare
from experiments.baselines.run import main as baselines_main
from garlic.cli import main as garlic_main
from garlic.data.batches import IrregularDataset
from garlic.methods import registry
from garlic.methods.contract import check_fitted
from garlic.tracking import queries
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


TOY = registry.MethodSpec("toy", "logistic regression on last values",
                         build=lambda context: LastValues(seed=context.config.seed),
                         settings=lambda context: {"method": "toy", "C": 1.0, "seed": context.config.seed})  # fmt: skip


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
                 "synthetic", "--all-splits"])  # fmt: skip
    printed = capsys.readouterr().out
    assert printed.count("five-split/split_") == 5
    use_store(store)
    runs = mlflow.search_runs(search_all_experiments=True, filter_string="tags.method = 'toy'", output_format="list")
    (parent,) = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]  # the split runs are tagged too
    assert len(runs) == 6 and parent.info.status == "FINISHED"
    assert parent.data.params["C"] == "1.0"
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
    assert queries.finished_unit([store], config, "five-split/split_0", digest) is None
