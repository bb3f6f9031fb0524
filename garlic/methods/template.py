"""The method to copy: a new model starts as a copy of this file (``docs/adding-a-model.md``), one entry in
``garlic.methods.registry`` and one line in ``docs/methods.md``; ``tests/test_method_conformance.py`` then checks
it as it checks every registered method, with no edit.

A method follows scikit-learn's conventions (``garlic.methods.contract``):

- its settings are its constructor's arguments, each kept as an attribute of the same name and nothing else done
  there (``sklearn.base.BaseEstimator`` makes ``get_params`` of them; the registry hashes them into a trained unit's
  identity, and ``garlic train --method NAME --set C=0.1`` sets one);
- ``fit(train, validation)`` returns the method; it may choose settings or an epoch on ``validation``, never sees the
  test part, and keeps what it learns in attributes ending in ``_``;
- ``predict_proba(dataset)`` gives one risk in [0, 1] per stay, in the dataset's order, and calls ``check_fitted``
  first, so that a call before ``fit`` is a clear ``NotFittedError``;
- optional: ``save_fitted(folder)`` and ``restore_fitted(folder)`` write what it fitted and read it back (JSON, a
  scikit-learn model in skops's format, torch weights with ``garlic.methods.model_files.save_weights``; never
  pickle), so that its runs are saved and ``garlic predict``, ``garlic evaluate`` and the dashboard use them;
  ``log_fitted(parts)`` logs what it shows beyond its risks (see ``SummaryModel.log_fitted``).

What it receives, a ``garlic.data.batches.IrregularDataset``: ``values`` [N, T, D] normalised with the training
part's statistics (0 where unobserved), ``mask`` [N, T, D], ``times`` [N, T] in hours, ``lengths`` [N], ``static``
[N, S] and ``labels`` [N].

This one: logistic regression on each variable's last observed value (0, the training mean, where never observed).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.linear_model import LogisticRegression

from garlic.data.batches import IrregularDataset
from garlic.io.atomic import write_json_atomic
from garlic.methods.contract import check_fitted, fitted_inputs
from garlic.methods.summary import SKOPS_FILE, load_skops, save_skops
from garlic.methods.model_files import FITTED, read_fitted


class LastValues(BaseEstimator):
    """Logistic regression (inverse regularisation ``C``, random state ``seed``) on each variable's last observed
    value."""

    name = "last_values"  # what fitted.json records: a folder is read back by the method that wrote it only

    def __init__(self, C: float = 1.0, seed: int = 0):
        self.C, self.seed = C, seed

    @staticmethod
    def features(dataset: IrregularDataset) -> np.ndarray:
        """[N, D] each variable's last observed value, 0 where it was never observed."""
        seen = dataset.mask.numpy() > 0  # [N, T, D]
        last = seen.shape[1] - 1 - seen[:, ::-1].argmax(axis=1)  # [N, D]: argmax finds the first True
        values = np.take_along_axis(dataset.values.numpy(), last[:, None, :], axis=1)[:, 0]
        return np.where(seen.any(axis=1), values, 0.0)

    def fit(self, train: IrregularDataset, validation: IrregularDataset) -> "LastValues":
        self.inputs_ = fitted_inputs(train)  # the variables in their order: a saved model reads these only
        self.model_ = LogisticRegression(C=self.C, max_iter=1000, random_state=self.seed)
        self.model_.fit(self.features(train), train.labels.numpy())
        return self

    def predict_proba(self, dataset: IrregularDataset) -> np.ndarray:
        check_fitted(self)
        return self.model_.predict_proba(self.features(dataset))[:, 1]

    def save_fitted(self, folder: Path) -> None:
        check_fitted(self)
        save_skops(folder / SKOPS_FILE, self.model_)
        write_json_atomic(folder / FITTED, {"method": self.name, **self.inputs_})

    def restore_fitted(self, folder: Path) -> None:
        """Into a method the registry built with the same settings."""
        fitted = read_fitted(folder)
        self.model_ = load_skops(folder / SKOPS_FILE)
        self.inputs_ = {key: fitted[key] for key in ("variables", "static_features")}
