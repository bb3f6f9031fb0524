"""What the methods trained by ``garlic.training``'s fit loop share: they resume and log each epoch to the active
MLflow run (``ResumableFit``); those whose fit is one torch network also score with it and are saved as its weights
(``NetworkMethod``: GARLIC, GRU-D, decay + GRU)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from garlic.data.batches import IrregularDataset
from garlic.io.atomic import write_json_atomic
from garlic.methods.contract import check_fitted
from garlic.methods.model_files import FITTED, WEIGHTS, save_weights
from garlic.models.predict import predict_proba

if TYPE_CHECKING:
    from garlic.training.trainer import EpochRecord


class ResumableFit:
    """What the methods whose fit runs ``garlic.training``'s loop (``Trainer.fit``) share: they resume
    (``garlic.methods.contract.can_resume``), their fit taking the hooks of ``set_training_hooks``."""

    def set_training_hooks(
        self,
        on_epoch: Callable[[EpochRecord], None] | None = None,
        on_state: Callable[[dict], None] | None = None,
        resume: dict | None = None,
    ) -> None:
        """What ``fit`` calls after every epoch, where it hands the fit's state (``garlic.training.state``) after every
        epoch and within long ones, and a state to continue from."""
        self._training_hooks = {"on_epoch": on_epoch, "on_state": on_state, "resume": resume}

    def training_hooks(self) -> dict:
        """The hooks of ``set_training_hooks`` (none before it is called), keyed as ``Trainer.fit`` takes them (an
        attribute of its own, not a setting: scikit-learn's settings are the constructor's arguments). Within an
        active MLflow run, each epoch's ``epoch_metrics`` are logged to it (step: the epoch) before ``on_epoch``."""
        import mlflow

        hooks = dict(getattr(self, "_training_hooks", dict.fromkeys(("on_epoch", "on_state", "resume"))))
        if mlflow.active_run() is not None:
            on_epoch = hooks["on_epoch"]

            def log_epoch(record: EpochRecord) -> None:
                mlflow.log_metrics(self.epoch_metrics(record), step=record.epoch)
                if on_epoch is not None:
                    on_epoch(record)

            hooks["on_epoch"] = log_epoch
        return hooks

    def epoch_metrics(self, record: EpochRecord) -> dict[str, float]:
        """What an epoch logs: its record's losses and validation scores."""
        return record.metrics()


class NetworkMethod(ResumableFit):
    """What the methods whose fit is one torch network (``model_``, over the inputs of ``inputs_``) share, GARLIC's and
    the recurrent baselines': their risks are the network's (``garlic.models.predict``), they are saved as the
    network's weights (``WEIGHTS``) and a fitted.json of their name, their inputs and ``fitted_beside_inputs``, and
    they resume (``ResumableFit``)."""

    def predict_proba(self, dataset: IrregularDataset) -> np.ndarray:
        check_fitted(self)
        return predict_proba(self.model_, dataset)

    def save_fitted(self, folder: Path) -> None:
        check_fitted(self)
        save_weights(folder / WEIGHTS, self.model_.state_dict())
        write_json_atomic(folder / FITTED, {"method": self.name, **self.inputs_, **self.fitted_beside_inputs()})

    def fitted_beside_inputs(self) -> dict:
        """What fitted.json keeps beside the method's name and inputs, for ``restore_fitted`` to read back."""
        return {}
