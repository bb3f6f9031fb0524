"""The field's irregular-series classifiers from PyPOTS (the well-kept library of them): Raindrop (Zhang et al.,
ICLR 2022), SeFT (Horn et al., ICML 2020) and BRITS (Cao et al., NeurIPS 2018), as methods of ``garlic.evaluation.fit_and_test``, on
an hourly grid of the same stays. GRU-D is ours (``garlic.methods.recurrent``): PyPOTS's GRU-D tied with it on every
P12 protocol (docs/results/physionet2012-how.md, "The field's models"), so the project keeps one, the one that needs
no optional extra.

PyPOTS's models read a regular grid ``X`` [N, H, D] with NaN where nothing was measured. Each stay's observations
(normalised with the split's training statistics, as every method here sees them) are put on hourly bins: bin h
holds the last value observed in [h, h + 1) hours; H is the whole hours of the training part's longest stay, and a
later observation of a validation or test stay falls in the last bin. Static features are not used.

Each trains as PyPOTS's own ``fit`` trains it (its model, data handling, loss and Adam; the epoch of lowest
validation cross-entropy kept, stopped after ``patience`` epochs without a lower one: selection on validation only),
to the same weights for the same seed, but on the project's fit loop (``FieldTrainer``), so that it resumes as GARLIC
does: a state after every epoch and every 10 minutes within one, a fit continued from it ending as the
uninterrupted one. Two differences: PyPOTS 1.5's own ``BRITS.fit`` validates on the training stays (it makes its
validation loader of the training set); here BRITS is validated on the validation split, as the other two are. And
SeFT attends over each stay's observed cells, not over every cell of the grid with the unobserved masked out
(``seft_on_observed_cells``): the same model, a twentieth of the time; its dropout draws are not PyPOTS's. PyPOTS
is an optional extra (``pip install -e '.[pypots]'``); it is imported when a model is fitted.
"""

from __future__ import annotations

import math
import types
from pathlib import Path

import numpy as np
import torch
from sklearn.base import BaseEstimator
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from garlic.data.batches import IrregularDataset
from garlic.methods.contract import check_fitted, fitted_inputs
from garlic.methods.model_files import FITTED, WEIGHTS, load_state, read_fitted, save_weights
from garlic.methods.network import ResumableFit
from garlic.training.device import resolve_device
from garlic.training.trainer import EpochPass, Progress, Trainer
from garlic.io.atomic import write_json_atomic

MODELS = ("raindrop", "seft", "brits")


def hourly_grid(dataset: IrregularDataset, hours: int) -> np.ndarray:
    """The stays on ``hours`` hourly bins: [N, hours, D], the last value observed in each bin, NaN where none."""
    values, mask, times = dataset.values.numpy(), dataset.mask.numpy() > 0, dataset.times.numpy()
    stays, steps, variables = mask.shape
    bins = np.clip(np.floor(times), 0, hours - 1).astype(np.int64)  # [N, T]
    # the last observed step of each (stay, bin, variable): steps are in time order, so the largest
    last = np.full((stays, hours, variables), -1)
    stay, step, variable = np.nonzero(mask)
    np.maximum.at(last, (stay, bins[stay, step], variable), step)
    s, h, d = np.nonzero(last >= 0)
    grid = np.full((stays, hours, variables), np.nan, dtype="float32")
    grid[s, h, d] = values[s, last[s, h, d], d]
    return grid


def raindrop_on_pyg_scatter() -> None:
    """PyPOTS's Raindrop layer takes ``scatter`` from torch_scatter and ``SparseTensor`` from torch_sparse, compiled
    extensions with no wheel for this torch; without them its first batch fails (``name 'scatter' is not defined``).
    PyTorch Geometric (installed with the ``pypots`` extra for this) ships pure-torch versions of both with the same
    signatures: where the extensions are missing, the layer gets those."""
    from pypots.nn.modules.raindrop import layers

    if not hasattr(layers, "scatter"):
        from torch_geometric.typing import SparseTensor
        from torch_geometric.utils import scatter

        layers.scatter, layers.SparseTensor = scatter, SparseTensor


def seft_on_observed_cells(classifier) -> None:
    """Have PyPOTS's SeFT ``classifier`` attend over each stay's observed cells alone. Its backbone makes a set of
    every cell of the hourly grid, observed or not (on P12, 49 hours x 36 variables: 1,764 elements, of which 335
    a stay are observed on average), and masks the unobserved ones out of every attention (``key_padding_mask``):
    what they compute never reaches an observed cell or the pooling, yet each attention costs the square of the
    whole set. The set of the observed cells alone (padded to the largest of a few stays' and masked alike), as the
    SeFT paper has it, gives the same risks and gradients (tested against PyPOTS's forward) at a twentieth of the
    cost (a real P12 batch of 64 on one thread, forward and backward: 1.2 s, against 28 s). Its dropout draws differ
    from PyPOTS's (they are drawn over the smaller set): with dropout, a fit is PyPOTS's in distribution, not draw
    for draw. The weights are PyPOTS's own: saved, they load into PyPOTS's SeFT."""
    backbone = classifier.model.backbone
    backbone.forward = types.MethodType(_observed_set_forward, backbone)


SET_CHUNK = 8  # stays whose sets are padded to one size: a batch's stays in chunks of similar counts


def _observed_set_forward(backbone, X: torch.Tensor, missing_mask: torch.Tensor) -> torch.Tensor:
    """``pypots.nn.modules.seft.BackboneSeFT.forward`` on the observed cells: ``X`` and ``missing_mask`` [B, T, F]
    (1 where observed) -> logits [B, n_classes]. Cell (t, f) is the element [time_enc(t / (T - 1)), embed(f),
    value], projected to d_model. A stay's logits depend on its own set alone, so the batch's stays go through in
    chunks of ``SET_CHUNK`` of similar counts, each padded to its own largest: less padding to attend over.

    A stay with no observed cell (P19's Raindrop cohort keeps 65 of its 38,803) has an empty set, over which
    PyPOTS's attention is NaN (every key masked), and so its loss and every gradient. Here attention over nothing
    adds nothing: its pooling is the seeds alone (``_empty_set_logits``), a learned answer for a stay of no data."""
    stays, steps, variables = X.shape
    observed = missing_mask.reshape(stays, steps * variables) > 0
    counts = observed.sum(dim=1)
    by_count = torch.argsort(counts)
    empty = int((counts == 0).sum())
    chunks = [_empty_set_logits(backbone, empty)] if empty else []
    chunks += [
        _observed_set_logits(backbone, X.reshape(stays, -1)[chunk], observed[chunk], steps, variables)
        for chunk in by_count[empty:].split(SET_CHUNK)
    ]
    return torch.cat(chunks)[torch.argsort(by_count)]  # back in the batch's order


def _empty_set_logits(backbone, stays: int) -> torch.Tensor:
    """Logits [stays, n_classes] of empty sets: PyPOTS's pooling (``_PMA.forward``) with its attention's output over
    no element taken as 0, its seeds Q -> norm2(Q' + ffn(Q')), Q' = norm1(Q)."""
    pma = backbone.pma
    seeds = pma.norm1(pma.seeds.expand(stays, -1, -1))
    pooled = pma.norm2(seeds + pma.dropout(pma.ffn(seeds)))  # [stays, n_seeds, d_model]
    return backbone.classifier(pooled.reshape(stays, -1))


def _observed_set_logits(
    backbone, values: torch.Tensor, observed: torch.Tensor, steps: int, variables: int
) -> torch.Tensor:
    """Logits [b, n_classes] of b stays' grids ``values`` and ``observed`` [b, T * F], each stay's set of its observed
    cells padded to K, the most a stay of them has."""
    counts = observed.sum(dim=1)
    size = max(int(counts.max()), 1)
    # each stay's observed cells first, in grid order (a stable sort), then padding
    cells = torch.argsort((~observed).to(torch.int8), dim=1, stable=True)[:, :size]  # [b, K]
    padding = torch.arange(size, device=values.device) >= counts[:, None]  # [b, K], True: not a cell of the stay
    times = torch.linspace(0.0, 1.0, steps, device=values.device)[cells // variables]
    elements = torch.cat(
        [
            backbone._time_encoding(times),
            backbone.feature_embedding(cells % variables),
            values.gather(1, cells).unsqueeze(-1),
        ],
        dim=-1,
    )
    elements = backbone.input_projection(elements)  # [b, K, d_model]
    for block in backbone.sab_layers:
        elements = block(elements, key_padding_mask=padding)
    pooled = backbone.pma(elements, key_padding_mask=padding)  # [b, n_seeds, d_model]
    return backbone.classifier(pooled.reshape(len(values), -1))


def build(settings: "FieldModel", steps: int, variables: int):
    """A fresh PyPOTS classifier of ``settings`` (its name, size and training) for ``steps`` hourly bins of
    ``variables`` variables. ``FieldTrainer`` fits it; its own ``fit`` would train it the same (the tests compare)."""
    from pypots.classification import BRITS, Raindrop, SeFT  # the optional extra
    from pypots.utils.random import set_random_seed

    raindrop_on_pyg_scatter()

    set_random_seed(settings.seed)
    common = {
        "n_steps": steps,
        "n_features": variables,
        "n_classes": 2,
        "batch_size": settings.batch_size,
        "epochs": settings.max_epochs,
        # PyPOTS refuses a patience that the budget cannot reach; then no early stop is needed
        "patience": settings.patience if settings.patience < settings.max_epochs else None,
        "device": str(resolve_device(settings.device)),
        "saving_path": None,
        "verbose": False,
    }
    hidden = settings.hidden_dim
    if settings.name == "raindrop":  # d_model: a few features per variable, as in the Raindrop paper
        return Raindrop(n_layers=2, d_model=4 * variables, n_heads=2, d_ffn=hidden, dropout=settings.dropout, **common)
    if settings.name == "seft":
        classifier = SeFT(n_layers=2, n_heads=2, d_model=hidden, d_ffn=2 * hidden, dropout=settings.dropout, **common)
        seft_on_observed_cells(classifier)
        return classifier
    if settings.name == "brits":
        return BRITS(rnn_hidden_size=hidden, **common)
    raise ValueError(f"name must be one of {', '.join(MODELS)}, got {settings.name!r}")


def pypots_dataset(name: str, data: dict):
    """The torch dataset PyPOTS's ``fit`` of model ``name`` makes of ``data`` (``X`` and ``y``): each model reads
    its own (Raindrop GRU-D's, with the last observation carried forward and the time since it; BRITS both ways)."""
    from pypots.classification.grud.data import DatasetForGRUD
    from pypots.data.dataset.base import BaseDataset
    from pypots.imputation.brits.data import DatasetForBRITS

    if name == "raindrop":
        return DatasetForGRUD(data)
    if name == "brits":
        return DatasetForBRITS(data, return_X_ori=False, return_y=True)
    return BaseDataset(data, return_X_ori=False, return_X_pred=False, return_y=True)


def drawn_pass_seed() -> int:
    """The seed of a training pass's order, drawn from torch's global generator as a shuffled ``DataLoader`` of
    PyPOTS's draws it when the pass begins: its iterator first draws a base seed (for worker processes: none here),
    then its ``RandomSampler`` the seed of its permutation (torch 2's ``torch.utils.data``)."""
    torch.empty((), dtype=torch.int64).random_()
    return int(torch.empty((), dtype=torch.int64).random_().item())


class ShuffledPasses:
    """The training batches in the order PyPOTS's shuffled ``DataLoader`` gives them: each pass a permutation of the
    ``size`` stays from ``seed`` (``drawn_pass_seed``), cut into batches of ``batch_size``. Its pass's seed is set
    before the pass, so that a pass continued within (``EpochPass``) goes through the same order; ``epoch`` counts
    the passes, as ``Trainer`` keeps a sampler's."""

    def __init__(self, size: int, batch_size: int):
        self.size, self.batch_size, self.seed, self.epoch = size, batch_size, 0, 0

    def __len__(self) -> int:
        return math.ceil(self.size / self.batch_size)

    def __iter__(self):
        order = RandomSampler(range(self.size), generator=torch.Generator().manual_seed(self.seed))
        self.epoch += 1
        return iter(BatchSampler(order, self.batch_size, drop_last=False))


class FieldTrainer(Trainer):
    """PyPOTS's training of ``classifier`` (a model of ``build``; ``settings``, the ``FieldModel``) on the hourly
    grids ``train_set`` and ``val_set`` (``X`` and ``y``), on the project's fit loop
    (``garlic.training.trainer.Trainer``): each epoch as PyPOTS's ``BaseNNModel._train_model`` runs it (its batches,
    inputs, loss and Adam, drawing what it draws from torch's generator, in the same order), the epoch of lowest
    validation loss (PyPOTS's mean over validation batches) kept, stopped after ``settings.patience`` epochs without
    a lower one. The same seed gives the weights PyPOTS's own ``fit`` gives, and the fit resumes as the others on this
    loop do. An error or Ctrl-C ends the fit, as on the others (PyPOTS's loop logs it and keeps the best epoch so
    far)."""

    stages = ("training",)

    def __init__(self, classifier, settings: "FieldModel", train_set: dict, val_set: dict):
        self.classifier, self.config, self.device = classifier, settings, classifier.device
        self.model = classifier.model
        self.optimisers, self.schedulers = {"model": classifier.optimizer.torch_optimizer}, {}
        self.passes = ShuffledPasses(len(train_set["y"]), settings.batch_size)
        # the pass draws its seeds itself (``run_epoch``): the loader's own generator leaves torch's untouched
        self.train_batches = DataLoader(
            pypots_dataset(settings.name, train_set), batch_sampler=self.passes, generator=torch.Generator()
        )
        self.validation_data = pypots_dataset(settings.name, val_set)

    def batches(self, train: IrregularDataset) -> DataLoader:
        return self.train_batches  # the training grid this trainer was made with

    def run_epoch(self, batches: EpochPass, progress: Progress) -> dict[str, float]:
        classifier = self.classifier
        self.model.train()
        sums = batches.tally(loss=0.0, count=0, order=None)
        if sums["order"] is None:  # a pass begins: it draws its order; one continued keeps the order it drew
            sums["order"] = drawn_pass_seed()
        self.passes.seed = sums["order"]
        for _, data in batches:
            inputs = classifier._assemble_input_for_training(data)
            classifier.optimizer.zero_grad()
            loss = self.model(inputs, calc_criterion=True)["loss"].sum()
            loss.backward()
            classifier.optimizer.step()
            sums["loss"], sums["count"] = sums["loss"] + loss.item(), sums["count"] + 1
        mean = sums["loss"] / max(sums["count"], 1)  # PyPOTS's training loss, its mean over the batches
        return {"loss": mean, "bce": mean, "mse": math.nan}

    @torch.no_grad()
    def validate(self, validation: IrregularDataset) -> dict:
        """The risks of the validation grid this trainer was made with, and PyPOTS's validation loss: the mean over
        batches of each batch's. Its loader is PyPOTS's (in order): starting, it draws a base seed from torch's
        generator, as PyPOTS's validation does."""
        self.model.eval()
        losses, risks = [], []
        for data in DataLoader(self.validation_data, batch_size=self.config.batch_size, shuffle=False):
            results = self.model(self.classifier._assemble_input_for_validating(data), calc_criterion=True)
            losses.append(results["metric"].sum().item())
            risks.append(results["classification_proba"][:, 1].cpu().numpy())
        return {"probabilities": np.concatenate(risks), "losses": {"bce": float(np.mean(losses)), "mse": math.nan}}

    def validation_loss(self, progress: Progress, losses: dict[str, float]) -> float:
        return losses["bce"]

    def score(self, losses: dict[str, float], scores: dict[str, float]) -> float:
        return -losses["bce"]

    def decide(self, progress: Progress, score: float, losses: dict[str, float]) -> tuple[bool, bool]:
        progress.stale = 0 if progress.best_epoch == progress.epoch else progress.stale + 1
        return False, progress.stale >= self.config.patience


class FieldModel(ResumableFit, BaseEstimator):
    """PyPOTS's ``name`` (one of ``MODELS``) as a method of ``garlic.evaluation.fit_and_test``: its size
    (``hidden_dim``, ``dropout``), the batch, the epoch budget and ``patience``, the seed and the device. It resumes
    (``garlic.methods.contract.can_resume``): its fit is ``FieldTrainer``'s."""

    def __init__(
        self,
        name: str,
        hidden_dim: int = 64,
        dropout: float = 0.2,
        batch_size: int = 64,
        max_epochs: int = 30,
        patience: int = 5,
        seed: int = 0,
        device: str = "auto",
    ):
        if name not in MODELS:
            raise ValueError(f"name must be one of {', '.join(MODELS)}, got {name!r}")
        self.name, self.hidden_dim, self.dropout, self.batch_size = name, hidden_dim, dropout, batch_size
        self.max_epochs, self.patience, self.seed, self.device = max_epochs, patience, seed, device

    def fit(self, train: IrregularDataset, validation: IrregularDataset) -> "FieldModel":
        last = train.times.numpy()[np.arange(len(train)), np.maximum(train.lengths.numpy() - 1, 0)]
        self.hours_ = max(1, math.ceil(float(last.max())))
        grids = {part: hourly_grid(data, self.hours_) for part, data in (("train", train), ("val", validation))}
        self.num_variables_ = grids["train"].shape[-1]
        self.inputs_ = fitted_inputs(train)
        self.model_ = build(self, self.hours_, self.num_variables_)
        sets = {
            part: {"X": grids[part], "y": data.labels.numpy().astype(np.int64)}
            for part, data in (("train", train), ("val", validation))
        }
        FieldTrainer(self.model_, self, sets["train"], sets["val"]).fit(train, validation, **self.training_hooks())
        return self

    def predict_proba(self, dataset: IrregularDataset) -> np.ndarray:
        check_fitted(self)
        return self.model_.predict_proba({"X": hourly_grid(dataset, self.hours_)})[:, 1]

    def save_fitted(self, folder: Path) -> None:
        check_fitted(self)
        save_weights(folder / WEIGHTS, self.model_.model.state_dict())  # the torch module inside PyPOTS's model
        write_json_atomic(
            folder / FITTED,
            {"method": self.name, **self.inputs_, "hours": self.hours_, "num_variables": self.num_variables_},
        )

    def restore_fitted(self, folder: Path) -> None:
        fitted = read_fitted(folder)
        self.model_ = build(self, fitted["hours"], fitted["num_variables"])
        load_state(self.model_.model, folder / WEIGHTS)
        self.model_.model.eval()
        self.hours_, self.num_variables_ = fitted["hours"], fitted["num_variables"]
        self.inputs_ = {key: fitted[key] for key in ("variables", "static_features")}
