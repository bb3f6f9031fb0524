"""The one way files are written atomically (garlic.io.atomic), and the writers that use it."""

import json
import os

import pytest
import torch

from garlic.config import Config
from garlic.methods import model_files
from garlic.training import state as training_state
from garlic.io import atomic


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "result.json"
    atomic.write_json_atomic(path, {"a": 1})
    with pytest.raises(TypeError):
        atomic.write_json_atomic(path, {"a": object()})  # fails half-way through json.dump
    assert json.loads(path.read_text()) == {"a": 1}
    assert leftovers(tmp_path) == []
    assert os.stat(path).st_mode & 0o777 == 0o644


def test_saved_model_weights_and_training_state_are_published_whole(tmp_path, monkeypatch):
    state = {"weights": torch.ones(3)}
    training_state.save_training_state(tmp_path / "state.pt", state, Config())
    assert os.stat(tmp_path / "state.pt").st_mode & 0o777 == 0o644  # readable like every other artifact
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / model_files.WEIGHTS).write_bytes(b"the previous weights")

    def save_some_then_fail(obj, out):
        out.write(b"half a file")
        raise SystemExit("killed")  # SIGTERM arrives as SystemExit

    monkeypatch.setattr(torch, "save", save_some_then_fail)
    with pytest.raises(SystemExit):
        training_state.save_training_state(tmp_path / "state.pt", {"weights": torch.zeros(3)}, Config())
    with pytest.raises(SystemExit):
        model_files.save_weights(tmp_path / "model" / model_files.WEIGHTS, torch.nn.Linear(2, 1).state_dict())
    monkeypatch.undo()
    torch.testing.assert_close(torch.load(tmp_path / "state.pt", weights_only=True)["weights"], torch.ones(3))
    assert (tmp_path / "model" / model_files.WEIGHTS).read_bytes() == b"the previous weights"
    assert leftovers(tmp_path) == [] and leftovers(tmp_path / "model") == []


def test_the_sweep_removes_dead_writers_temporaries_only(tmp_path):
    path = tmp_path / "cache.npz"
    dead = tmp_path / ".cache.npz.dead1234.npz"
    dead.write_bytes(b"left by a killed writer")
    with atomic.atomic_file(path, suffix=".npz", lock=True) as out:
        (live,) = [p for p in tmp_path.iterdir() if p != dead]
        out.write(b"written")
        atomic.remove_stale_temporaries(path, suffix=".npz")
        assert not dead.exists() and live.exists()  # the live writer's temporary is locked
    assert path.read_bytes() == b"written" and not live.exists()
