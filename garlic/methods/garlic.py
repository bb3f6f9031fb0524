"""GARLIC as a method of ``garlic.evaluation.fit_and_test``: ``fit`` / ``predict_proba``, what a fitted GARLIC logs
beside its risks (the learned graph, the explanations, the best epoch), and its network saved and read back as every
saved method's is (``garlic.methods.saved``).

    estimator = GarlicEstimator(network, training)      # its network's settings and its training's
    estimator = GarlicEstimator.of_run(config)          # or both, as a run config (garlic.config.Config) gives them
    estimator.fit(train, validation)                    # the training's trainer (garlic.training.schedules.make_trainer)
    risk = estimator.predict_proba(test)                # [N], in dataset order

Fitting and logging import the trainer (scikit-learn's metrics), MLflow and plotting where they are used, not above:
a saved GARLIC read back to score one stay (``garlic predict``) needs none of them.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from garlic.config import Config
from garlic.data.batches import IrregularDataset
from garlic.explain.built_in import normalised_graph
from garlic.methods.contract import check_fitted, check_learns_score, fitted_inputs
from garlic.methods.model_files import WEIGHTS, load_state, load_weights, read_fitted
from garlic.methods.network import NetworkMethod
from garlic.models.architectures import build_model
from garlic.models.network_config import NetworkConfig
from garlic.training.training_config import TrainingConfig
from garlic.tracking.run_contract import GARLIC

if TYPE_CHECKING:
    from garlic.training.trainer import EpochRecord


class GarlicEstimator(NetworkMethod):
    """GARLIC, fitted on a training part, its best epoch chosen on a validation part.

    - ``network``: the network's settings (``garlic.models.network_config``);
    - ``training``: how it is trained (``garlic.training.training_config``: the schedule, the optimisation, what it
      learns at each prediction time, the seed and the device);
    - ``planted``: a known graph (the synthetic cohort's) that the learned one is scored against;
    - ``explain``: whether ``log_fitted`` logs the explanations of the test part.

    It resumes (``garlic.methods.contract.can_resume``): ``set_training_hooks`` gives it what to call after every epoch
    (per-epoch metrics go to the active MLflow run in any case), where to hand the fit's state after every epoch and
    within long ones, and a state to continue from (``garlic.training.state``). It explains its risks (``explains``)
    through its fitted network (``model``), and is saved (``save_fitted`` / ``restore_fitted``).
    """

    name = GARLIC
    explains = True

    def __init__(
        self,
        network: NetworkConfig = NetworkConfig(),
        training: TrainingConfig = TrainingConfig(),
        planted: list[dict] | None = None,
        explain: bool = True,
    ):
        self.network, self.training, self.planted, self.explain = network, training, planted, explain

    @classmethod
    def of_run(cls, config: Config, planted: list[dict] | None = None, explain: bool = True) -> "GarlicEstimator":
        """GARLIC with the network and training settings of the run config ``config`` (a preset's)."""
        return cls(NetworkConfig.from_run(config), TrainingConfig.from_run(config), planted, explain)

    # scikit-learn's get_params / set_params, written out rather than inherited from its BaseEstimator: a one-stay
    # `garlic predict` builds this class and must not import scikit-learn (2.5 s) to do it.
    def get_params(self, deep: bool = True) -> dict:
        return {"network": self.network, "training": self.training, "planted": self.planted, "explain": self.explain}

    def set_params(self, **params) -> "GarlicEstimator":
        for key, value in params.items():
            if key not in self.get_params():
                raise ValueError(f"GarlicEstimator has no setting {key!r}")
            setattr(self, key, value)
        return self

    @property
    def learns_score(self) -> str | None:
        """With ``hourly_target`` 'utility', what the Sepsis Challenge's utility rewards (``contract.learns_score``)."""
        if self.training.hourly_target != "utility":
            return None
        # Here, not at the top: garlic.metrics imports scikit-learn, which a one-stay `garlic predict` never needs.
        from garlic.metrics.utility import SEPSIS_UTILITY

        return SEPSIS_UTILITY

    @property
    def at_prediction_times(self) -> bool:
        """The compact network answers any prediction time (``Garlic.classify_queries``, one pass per stay); the
        reference one gives one risk per stay."""
        return self.network.architecture == "compact"

    def fit(self, train: IrregularDataset, validation: IrregularDataset) -> "GarlicEstimator":
        from garlic.training.schedules import make_trainer

        if self.learns_score is not None:
            check_learns_score(self, train.prediction_times.score, "GARLIC with hourly_target=utility")
            train, validation = train.with_utility_targets(), validation.with_utility_targets()
        tensors = train.tensors
        trainer = make_trainer(self.network, self.training, len(tensors.variables), len(tensors.static_features))
        self.fit_result_ = trainer.fit(train, validation, **self.training_hooks())
        self.model_, self.inputs_ = self.fit_result_.model, fitted_inputs(train)
        return self

    def epoch_metrics(self, record: EpochRecord) -> dict[str, float]:
        return {**record.metrics(), "stage_is_prediction": float(record.stage == "prediction")}

    @property
    def model(self) -> torch.nn.Module:
        """The fitted network (``garlic.models``), in eval mode after ``fit``'s best epoch was restored."""
        check_fitted(self)
        return self.model_

    def restore_fitted(self, folder: Path) -> None:
        inputs = {key: read_fitted(folder)[key] for key in ("variables", "static_features")}
        model = build_model(len(inputs["variables"]), len(inputs["static_features"]), self.network)
        weights = load_weights(folder / WEIGHTS)
        weights.setdefault("logit_offset", torch.zeros(()))  # saved before the offset existed: trained unweighted
        load_state(model, folder / WEIGHTS, weights)
        self.model_, self.inputs_ = model.eval(), inputs

    def log_fitted(self, parts: dict[str, IrregularDataset]) -> dict[str, float]:
        """Log the learned graph (table and figure) and the test part's explanations (``explain``; the reference
        architecture says instead why it has none); returns the best epoch and, with ``planted``, the edge recovery
        AUROC of the learned graph."""
        import mlflow

        from garlic.explain.report import edge_recovery_auroc, log_explanations
        from garlic.tracking import plots, run_contract

        check_fitted(self)
        model, variables = self.model_, self.inputs_["variables"]
        adjacency = model.graph.adjacency.detach().cpu().numpy()
        mlflow.log_text(pd.DataFrame(adjacency, index=variables, columns=variables).to_csv(), run_contract.GRAPH)
        figure = plots.graph_figure(adjacency, variables)
        mlflow.log_figure(figure, run_contract.plot("graph.png"))
        plots.plt.close(figure)
        if self.explain and model.explanation_unavailable is None:
            log_explanations(model, parts["test"])
        elif self.explain:  # the run and its model are kept; what the explanation cannot say is said instead
            mlflow.set_tag(run_contract.EXPLANATIONS_TAG, model.explanation_unavailable)
        metrics = {"best_epoch": float(self.fit_result_.best_epoch)}
        if self.planted and self.network.use_graph:
            graph = normalised_graph(model).cpu().numpy()
            metrics["edge_recovery_auroc"] = edge_recovery_auroc(graph, variables, self.planted)
        return metrics


class WholeStaysGarlic(GarlicEstimator):
    """GARLIC as the per-stay task trains it (each stay whole, with its one label), asked at every prediction time
    of a task on the stay's record cut there (``IrregularTensors.cut_at_prediction_times``): the risk that the
    replay shows for a model trained on whole windows, scored hour by hour beside models trained on every hour."""

    name = "garlic_whole_stays"
    at_prediction_times = True  # any network answers a cut record, whatever its architecture
    CHUNK_STAYS = 128  # stays cut at once: their prefixes (a stay's every hour) are held as stays of their own

    def fit(self, train: IrregularDataset, validation: IrregularDataset) -> "WholeStaysGarlic":
        return super().fit(whole_stays(train), whole_stays(validation))

    def predict_proba(self, dataset: IrregularDataset) -> np.ndarray:
        tensors = dataset.tensors
        risks = [
            super(WholeStaysGarlic, self).predict_proba(
                IrregularDataset(
                    tensors.subset(
                        np.arange(start, min(start + self.CHUNK_STAYS, len(tensors)))
                    ).cut_at_prediction_times(),
                    dataset.normalisation,
                )
            )
            for start in range(0, len(tensors), self.CHUNK_STAYS)
        ]
        return np.concatenate(risks) if risks else np.zeros(0)

    def log_fitted(self, parts: dict[str, IrregularDataset]) -> dict[str, float]:
        return super().log_fitted({part: whole_stays(dataset) for part, dataset in parts.items()})


def whole_stays(dataset: IrregularDataset) -> IrregularDataset:
    """``dataset`` without its task: one risk per stay, from its whole input, with the stay's label."""
    if dataset.tensors.task is None:
        return dataset
    return IrregularDataset(replace(dataset.tensors, task=None), dataset.normalisation)
