"""A stacked model for hourly tasks, named as such: gradient boosting on ``hourly_gbm``'s features with GARLIC's own
risk at each prediction time as one more column. It is not GARLIC winning: it is the boosting, told what GARLIC's
sequence model saw, for a ward that wants whichever alarms best.

``fit`` trains GARLIC first (the network and training settings of the run's config, its epoch chosen on validation
as every GARLIC run's is), then the boosting (``garlic.methods.hourly.HourlyModel``, its setting chosen by validation
AUROC) on the training part's features and GARLIC's log-odds there. GARLIC's log-odds on its own training stays are a
little surer than on new ones, so the boosting may lean on that column more than it should; the validation part,
which neither model fitted, says what the stack is worth, and its threshold is chosen there as every run's is.

Its drivers are the boosting's exact tree SHAP values folded into the variables, as ``hourly_gbm``'s; GARLIC's
column, like the static features and the hour, is no variable's and stays out of them (its share is in the risk, not
in the drivers).

Saved as the boosting's files (``garlic.methods.summary.ChosenClassifier``) with GARLIC's weights and fitted.json in
the subfolder ``GARLIC_FOLDER``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from garlic.data.batches import IrregularDataset
from garlic.methods.garlic import GarlicEstimator
from garlic.methods.hourly import HourlyModel, hourly_features
from garlic.models.network_config import NetworkConfig
from garlic.training.training_config import TrainingConfig

GARLIC_FOLDER = "garlic"
SURE = 1e-6  # GARLIC's risks are clipped to [SURE, 1 - SURE] before their log-odds: a finite column


class HourlyStacked(HourlyModel):
    """``HourlyModel`` (gradient boosting, ``target`` 'label' or 'utility') on ``hourly_features`` plus GARLIC's
    log-odds at each prediction time, GARLIC (``network``, ``training``) fitted first on the same training part."""

    COLUMNS = "stacked hourly feature"

    def __init__(
        self,
        network: NetworkConfig = NetworkConfig(),
        training: TrainingConfig = TrainingConfig(),
        seed: int = 0,
        target: str = "utility",
    ):
        super().__init__("gbm", seed, target)
        self.network, self.training = network, training

    @property
    def name(self) -> str:
        return "hourly_stacked"

    def fit(self, train: IrregularDataset, validation: IrregularDataset) -> "HourlyStacked":
        self.garlic_ = GarlicEstimator(self.network, self.training, explain=False).fit(train, validation)
        return super().fit(train, validation)

    def features(self, dataset: IrregularDataset) -> np.ndarray:
        """[M, hourly features + 1]: ``hourly_features`` and GARLIC's log-odds at each prediction time."""
        risk = np.clip(np.asarray(self.garlic_.predict_proba(dataset), dtype="float64"), SURE, 1 - SURE)
        return np.column_stack([hourly_features(dataset.tensors), np.log(risk / (1 - risk))]).astype("float32")

    def columns(self, inputs: dict) -> int:
        return super().columns(inputs) + 1

    def save_fitted(self, folder: Path) -> None:
        super().save_fitted(folder)
        (Path(folder) / GARLIC_FOLDER).mkdir(exist_ok=True)
        self.garlic_.save_fitted(Path(folder) / GARLIC_FOLDER)

    def restore_fitted(self, folder: Path) -> None:
        self.garlic_ = GarlicEstimator(self.network, self.training, explain=False)
        self.garlic_.restore_fitted(Path(folder) / GARLIC_FOLDER)
        super().restore_fitted(folder)
