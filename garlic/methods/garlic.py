"""GARLIC as a method of ``garlic.evaluation.fit_and_test``: ``fit`` / ``predict_proba``, and what a fitted GARLIC logs beside its
risks (the learned graph, the saved model, the explanations, the best epoch).

    estimator = GarlicEstimator(config)                 # config: garlic.config.Config
    estimator.fit(train, validation)                    # the config's trainer (garlic.training.schedules.make_trainer)
    risk = estimator.predict_proba(test)                # [N], in dataset order
"""
from __future__ import annotations

from typing import Callable

import mlflow
import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator

from garlic.config import Config
from garlic.data.batches import IrregularDataset
from garlic.explain.built_in import normalised_graph
from garlic.explain.report import edge_recovery_auroc, log_explanations
from garlic.methods.contract import check_fitted
from garlic.models.predict import predict_proba
from garlic.tracking import plots, run_contract
from garlic.tracking.saved_model import TrainedModel
from garlic.tracking.store import log_model
from garlic.training.schedules import make_trainer
from garlic.training.trainer import EpochRecord


class GarlicEstimator(BaseEstimator):
    """GARLIC of ``config``, fitted on a training part, its best epoch chosen on a validation part.

    - ``planted``: a known graph (the synthetic cohort's) that the learned one is scored against;
    - ``explain``, ``keep_model``: whether ``log_fitted`` logs the explanations of the test part and the model.

    It resumes (``garlic.methods.contract.can_resume``): ``set_training_hooks`` gives it what to call after every
    epoch (per-epoch metrics go to the active MLflow run in any case), where to hand the fit's state after every
    epoch, and a state to continue from (``garlic.training.state``).
    """

    def __init__(self, config: Config, planted: list[dict] | None = None, explain: bool = True,
                 keep_model: bool = True):  # fmt: skip
        self.config, self.planted, self.explain, self.keep_model = config, planted, explain, keep_model
        self.on_epoch = self.on_state = self.resume = None

    @property
    def at_prediction_times(self) -> bool:
        """The compact network answers any prediction time (``Garlic.classify_queries``, one pass per stay); the
        reference one gives one risk per stay."""
        return self.config.architecture == "compact"

    def set_training_hooks(
        self,
        on_epoch: Callable[[EpochRecord], None] | None = None,
        on_state: Callable[[dict], None] | None = None,
        resume: dict | None = None,
    ) -> None:
        self.on_epoch, self.on_state, self.resume = on_epoch, on_state, resume

    def fit(self, train: IrregularDataset, validation: IrregularDataset) -> "GarlicEstimator":
        tensors = train.tensors
        trainer = make_trainer(self.config, len(tensors.variables), len(tensors.static_features))
        log_epoch = self._log_epoch if mlflow.active_run() is not None else self.on_epoch
        self.fit_result_ = trainer.fit(train, validation, on_epoch=log_epoch, on_state=self.on_state,
                                       resume=self.resume)  # fmt: skip
        self.trained_model_ = TrainedModel(self.fit_result_.model, tensors.variables, tensors.static_features,
                                           train.normalisation)  # fmt: skip
        return self

    def _log_epoch(self, record: EpochRecord) -> None:
        mlflow.log_metrics({**record.metrics(), "stage_is_prediction": float(record.stage == "prediction")},
                           step=record.epoch)  # fmt: skip
        if self.on_epoch is not None:
            self.on_epoch(record)

    @property
    def model(self):
        check_fitted(self)
        return self.trained_model_.model

    def predict_proba(self, dataset: IrregularDataset) -> np.ndarray:
        check_fitted(self)
        return predict_proba(self.fit_result_.model, dataset)

    def log_fitted(self, parts: dict[str, IrregularDataset]) -> dict[str, float]:
        """Log the learned graph (table and figure), the model (``keep_model``) and the test part's explanations
        (``explain``; the reference architecture says instead why it has none); returns the best epoch and, with
        ``planted``, the edge recovery AUROC of the learned graph."""
        check_fitted(self)
        model, variables = self.fit_result_.model, self.trained_model_.variables
        adjacency = model.graph.adjacency.detach().cpu().numpy()
        mlflow.log_text(pd.DataFrame(adjacency, index=variables, columns=variables).to_csv(), run_contract.GRAPH)
        figure = plots.graph_figure(adjacency, variables)
        mlflow.log_figure(figure, run_contract.plot("graph.png"))
        plots.plt.close(figure)
        if self.keep_model:
            log_model(self.trained_model_)
        if self.explain and model.explanation_unavailable is None:
            log_explanations(self.trained_model_, parts["test"])
        elif self.explain:  # the run and its model are kept; what the explanation cannot say is said instead
            mlflow.set_tag(run_contract.EXPLANATIONS_TAG, model.explanation_unavailable)
        metrics = {"best_epoch": float(self.fit_result_.best_epoch)}
        if self.planted and self.config.use_graph:
            graph = normalised_graph(model).cpu().numpy()
            metrics["edge_recovery_auroc"] = edge_recovery_auroc(graph, variables, self.planted)
        return metrics
