"""What a new user meets first: the synthetic preset shows the alternating training, and the synthetic cohort comes
with record files of new stays that ``garlic predict`` and the dashboard's upload read."""

import numpy as np
import pytest

from garlic.config import Config
from garlic.data.batches import IrregularDataset
from garlic.data.splits import load_splits
from garlic.training.alternating import AlternatingTrainer
from garlic.sources import synthetic
from garlic.sources.records import read_record_files
from garlic.io.tables import read_processed
from garlic.io.tensors import load_tensors
from helpers import garlic_settings


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    folder = tmp_path_factory.mktemp("synthetic") / "processed" / "synthetic"
    synthetic.generate(folder, n_stays=300, seed=0)
    return folder


def test_the_synthetic_preset_alternates_between_the_stages(cohort):
    # The preset's stage settings on a small cohort and a small model (for speed); early stopping is held off so
    # that 10 epochs run whatever the validation AUROC of 30 stays does (the full main job's stages are reported by
    # experiments/benchmark_first_run.py).
    small = {"early_stopping": 20, "max_epochs": 10, "hidden_dim": 16, "feature_dim": 4}
    config = Config.for_dataset("synthetic").override(small)
    tensors = load_tensors(cohort)
    split = load_splits(cohort, tensors, config.split_protocol)[0]
    parts = {
        part: IrregularDataset(tensors.subset(split.positions(tensors, part)), split.normalisation)
        for part in ("train", "validation")
    }
    trainer = AlternatingTrainer(*garlic_settings(config), len(tensors.variables), len(tensors.static_features))
    history = trainer.fit(parts["train"], parts["validation"]).history
    stages = [record.stage for record in history]
    switches = sum(a != b for a, b in zip(stages, stages[1:]))
    assert stages[0] == "reconstruction" and "prediction" in stages
    assert switches >= 2, stages


def test_the_cohort_comes_with_record_files_of_new_stays(cohort):
    folder = cohort / synthetic.EXAMPLE_RECORDS
    paths = sorted(folder.glob("*.txt"))
    assert [p.stem for p in paths] == [str(i) for i in synthetic.EXAMPLE_IDS]
    observations, static = read_record_files([folder])  # a folder stands for its record files
    assert sorted(static["stay_id"]) == synthetic.EXAMPLE_IDS
    assert set(observations["variable"]) <= set(synthetic.VARIABLES)
    cohort_ids = set(read_processed(cohort).static["stay_id"])
    assert not cohort_ids & set(synthetic.EXAMPLE_IDS)  # stays that no split holds
    # new stays, not copies of cohort stays under new ids
    first = observations[observations["stay_id"] == synthetic.EXAMPLE_IDS[0]]["value"].to_numpy()
    values = read_processed(cohort).observations.groupby("stay_id")["value"].apply(np.asarray)
    assert not any(len(v) == len(first) and np.allclose(v, first, rtol=1e-5) for v in values)


@pytest.mark.parametrize(
    "name, message",
    [
        ("", "is a folder without record files (.psv, .txt)"),
        ("notes.csv", "not a record file; expected a name ending in .psv or .txt"),
    ],
)
def test_record_paths_that_are_not_records_are_refused_by_name(tmp_path, name, message):
    path = tmp_path / name
    if name:
        path.write_text("x")
    with pytest.raises(ValueError) as refused:
        read_record_files([path])
    assert message in str(refused.value) and str(tmp_path) in str(refused.value)
