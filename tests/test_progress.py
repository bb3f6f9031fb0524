"""The training bar moves within an epoch (issue #72: a slow first epoch showed "epoch 0" for three minutes with no
word): it shows the batches the running epoch has done, on its split's bar."""

from garlic.cli import _Progress
from garlic.training.trainer import EpochPass, EpochRecord


def record(epoch: int) -> EpochRecord:
    return EpochRecord(
        epoch=epoch,
        stage="reconstruction",
        train_loss=1.0,
        train_bce=0.5,
        train_reconstruction=0.5,
        val_loss=1.0,
        val_bce=0.5,
        val_reconstruction=0.5,
        val_auroc=0.8,
        val_auprc=0.4,
        seconds=30.0,
    )


def running(epoch: int, done: int, monkeypatch) -> None:
    epoch_pass = EpochPass(list(range(150)), epoch=epoch)
    epoch_pass.done = done
    monkeypatch.setattr(EpochPass, "running", epoch_pass)


def test_the_bar_shows_the_running_epochs_batches_on_its_splits_bar(monkeypatch):
    with _Progress(10) as progress:
        running(1, 57, monkeypatch)  # the first epoch, before any split has a bar of its own
        progress._show_running_epoch()
        assert "epoch 0/10" in str(progress.waiting) and "epoch 1: 57/150 batches" in str(progress.waiting)
        progress("split_0", record(1))
        running(2, 12, monkeypatch)
        progress._show_running_epoch()
        shown = str(progress.bars["split_0"])
        assert "epoch 1/10" in shown and "val AUROC 0.800" in shown and "epoch 2: 12/150 batches" in shown
        running(1, 3, monkeypatch)  # the next split's first epoch: a bar of its own
        progress._show_running_epoch()
        assert "epoch 1: 3/150 batches" in str(progress.waiting) and "epoch 2:" in str(progress.bars["split_0"])
        progress("split_1", record(1))
        assert set(progress.bars) == {"split_0", "split_1"} and progress.waiting is None
