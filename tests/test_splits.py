"""Saved stratified splits, train-only normalisation, and the torch dataset + collate built on them."""

from __future__ import annotations

import gzip
import json
import warnings

import numpy as np
import pytest
import torch

from helpers import P12, requires_p12
from garlic.data.batches import IrregularDataset, collate, loader
from garlic.data.splits import PROTOCOLS, PUBLISHED, Normalisation, Split, draw_split, load_splits, published_ids
from garlic.sources.synthetic import generate
from garlic.io.tensors import IrregularTensors, load_tensors


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    folder = tmp_path_factory.mktemp("synthetic") / "processed"
    generate(folder, n_stays=2000, seed=3)
    return folder, load_tensors(folder)


def check_split(split: Split, tensors) -> None:
    n = len(tensors)
    parts = {"train": split.train, "validation": split.validation, "test": split.test}
    for name, share in (("train", 0.8), ("validation", 0.1), ("test", 0.1)):
        assert abs(len(parts[name]) - share * n) <= 1, (name, len(parts[name]), n)
    everything = np.concatenate(list(parts.values()))
    assert len(np.unique(everything)) == len(everything) == n  # disjoint
    assert np.array_equal(np.sort(everything), tensors.stay_ids)  # covering
    rate = tensors.labels.astype("float64").mean()
    for name, ids in parts.items():
        labels = tensors.labels[np.searchsorted(tensors.stay_ids, ids)].astype("float64")
        assert abs(labels.sum() - rate * len(ids)) <= 1, name  # stratified: positives as expected, within one
        assert abs(labels.mean() - rate) <= 0.01, (name, labels.mean(), rate)
        assert np.array_equal(split.positions(tensors, name), np.searchsorted(tensors.stay_ids, ids))


@requires_p12
def test_five_splits_on_p12_sizes_stratification_disjointness(p12_tensors, monkeypatch):
    # Only the stays are checked here (the statistics have their own test), so skip fitting them: 2 s a split.
    monkeypatch.setattr(Normalisation, "fit", classmethod(lambda cls, train: None))
    assert PROTOCOLS["five-split"].splits == (0, 1, 2, 3, 4)
    splits = [draw_split(p12_tensors, "five-split", index) for index in PROTOCOLS["five-split"].splits]
    for split in splits:
        check_split(split, p12_tensors)
    assert len(split.train) == 9_590 and len(split.validation) == len(split.test) == 1_199
    tests = [frozenset(s.test.tolist()) for s in splits]
    assert len(set(tests)) == 5  # five different draws


def test_splits_on_synthetic_and_determinism(synthetic, tmp_path):
    folder, tensors = synthetic
    splits = load_splits(folder, tensors, "five-split")
    for split in splits:
        check_split(split, tensors)
    again = draw_split(tensors, "five-split", 2)
    assert np.array_equal(again.train, splits[2].train) and np.array_equal(again.test, splits[2].test)
    # Drawn from scratch into another folder: identical files.
    elsewhere = load_splits(tmp_path, tensors, "five-split")
    for a, b in zip(splits, elsewhere):
        assert a.to_json() == b.to_json()


def test_too_few_stays_of_an_outcome_to_split_is_one_error_naming_the_split_and_the_counts(tmp_path):
    generate(tmp_path / "tiny", n_stays=12, seed=3)
    tensors = load_tensors(tmp_path / "tiny")
    negatives, positives = int((tensors.labels == 0).sum()), int((tensors.labels == 1).sum())
    assert min(negatives, positives) < 2  # too few of one outcome for stratified parts
    counts = rf"\(0: {negatives}, 1: {positives}, by stratum\)"
    with pytest.raises(ValueError, match=rf"protocol 'five-split' split 1: 12 stays {counts} are too few to split off"):
        draw_split(tensors, "five-split", 1)
    with pytest.raises(ValueError, match="--stays must be at least 1, got 0"):
        generate(tmp_path / "none", n_stays=0)


def test_saved_splits_are_read_back_not_redrawn(synthetic, tmp_path):
    _, tensors = synthetic
    load_splits(tmp_path, tensors, "five-split")
    path = tmp_path / "splits" / "five-split" / "split_0.json"
    payload = json.loads(path.read_text())
    # Move one stay from test to train in the saved file: a redraw would undo this, a read keeps it.
    moved = payload["test"].pop(0)
    payload["train"] = sorted(payload["train"] + [moved])
    path.write_text(json.dumps(payload))
    split = load_splits(tmp_path, tensors, "five-split")[0]
    assert moved in split.train.tolist() and moved not in split.test.tolist()
    assert json.loads(path.read_text()) == payload


def test_a_damaged_saved_split_is_refused_naming_its_file_never_drawn_again(synthetic, tmp_path):
    folder, tensors = synthetic
    load_splits(tmp_path, tensors, "five-split")
    saved = tmp_path / "splits" / "five-split" / "split_2.json"
    for damage in ("{not json", '{"protocol": "five-split"}', "\udcff"):
        saved.write_text(damage, errors="surrogateescape")
        with pytest.raises(ValueError, match=f"^{saved}: not a saved split .*delete it to have it made again"):
            load_splits(tmp_path, tensors, "five-split")
        assert saved.read_text(errors="surrogateescape") == damage  # left for the user to restore


def test_protocols_name_their_splits_and_seeds(synthetic, tmp_path):
    assert PROTOCOLS["raindrop"].splits == (0, 1, 2, 3, 4) and PROTOCOLS["raindrop"].seeds is None
    assert PROTOCOLS["garlic-reference"].splits == (0,) and PROTOCOLS["garlic-reference"].seeds == (0, 1, 2, 3, 4)
    _, tensors = synthetic
    with pytest.raises(ValueError, match="unknown split protocol 'ten-split'"):
        load_splits(tmp_path, tensors, "ten-split")
    with pytest.raises(ValueError, match="`reference` was replaced by `garlic-reference`"):
        load_splits(tmp_path, tensors, "reference")


@pytest.mark.parametrize("name", ["garlic-reference", "raindrop"])
def test_shipped_protocol_files_equal_the_shared_ones(name):
    shipped = json.loads(gzip.decompress((PUBLISHED / "physionet2012" / f"{name}.json.gz").read_bytes()))
    shared = P12 / "splits" / f"{name}.json"
    if not shared.is_file():
        pytest.skip(f"the shared protocol file is not at {shared}")
    assert shipped == json.loads(shared.read_text())
    parts = published_ids(name, "physionet2012")
    assert len(parts) == (1 if name == "garlic-reference" else 5)
    for index, ids in parts.items():
        assert [len(ids[p]) for p in ("train", "validation", "test")] == [9_590, 1_199, 1_199]
        everything = np.concatenate(list(ids.values()))
        assert len(np.unique(everything)) == 11_988  # disjoint
        source = shipped["splits"][str(index + 1)]
        assert all(np.array_equal(ids[p], np.sort(source[p])) for p in ids)


def test_a_published_protocol_names_the_stays_the_dataset_lacks(synthetic, tmp_path):
    _, tensors = synthetic  # synthetic stay ids are not P12 RecordIDs
    with pytest.raises(ValueError, match=r"protocol 'raindrop' split 0 names 9590 train stays .* does not hold"):
        load_splits(tmp_path, tensors, "raindrop", "physionet2012")
    with pytest.raises(
        ValueError,
        match="'raindrop' is not published for dataset 'synthetic'; it is for physionet2012, physionet2019-raindrop",
    ):
        load_splits(tmp_path, tensors, "raindrop", "synthetic")
    assert not (tmp_path / "splits" / "raindrop").exists()


@requires_p12
@pytest.mark.parametrize("name", ["garlic-reference", "raindrop"])
def test_published_splits_on_p12_are_the_shared_ones(name, p12_tensors, tmp_path):
    shared = json.loads((P12 / "splits" / f"{name}.json").read_text())["splits"]
    splits = load_splits(tmp_path, p12_tensors, name, "physionet2012")
    assert [s.index for s in splits] == list(range(len(shared)))
    for split, key in zip(splits, sorted(shared, key=int)):
        assert split.name == f"{name}/split_{split.index}"
        for part in ("train", "validation", "test"):
            assert getattr(split, part).tolist() == sorted(shared[key][part])
        check_normalised_on(split, p12_tensors)
        assert (tmp_path / "splits" / name / f"split_{split.index}.json").is_file()
    # Read back unchanged; a saved file that lost a published stay is refused, not used.
    again = load_splits(tmp_path, p12_tensors, name, "physionet2012")
    assert [a.digest() for a in again] == [s.digest() for s in splits]
    path = tmp_path / "splits" / name / "split_0.json"
    payload = json.loads(path.read_text())
    payload["test"] = payload["test"][1:]
    path.write_text(json.dumps(payload))
    with pytest.raises(ValueError, match="does not hold the stays of the published"):
        load_splits(tmp_path, p12_tensors, name, "physionet2012")


def check_normalised_on(split: Split, tensors) -> None:
    """The statistics are the training part's (the reference code fits them on every stay; we do not)."""
    expected = Normalisation.fit(tensors.subset(split.positions(tensors, "train")))
    np.testing.assert_array_equal(split.normalisation.value_mean, expected.value_mean)
    np.testing.assert_array_equal(split.normalisation.value_high, expected.value_high)


def test_split_naming_missing_stays_is_refused(synthetic):
    _, tensors = synthetic
    split = draw_split(tensors, "five-split", 0)
    split.test = np.append(split.test, 999_999_999)
    with pytest.raises(ValueError, match="re-create the split"):
        split.positions(tensors, "test")


def independent_stats(dataset, stays):
    """Per-variable mean and std (ddof 0) of the observed values of ``stays`` clipped to their own 0.1 and 99.9
    percentiles, from the long table."""
    obs = dataset.observations
    obs = obs[obs["stay_id"].isin(stays)].drop_duplicates(["stay_id", "time", "variable"], keep="last")
    value, variable = obs["value"].astype("float64"), obs["variable"]  # categorical: grouped by its codes
    by_variable = value.groupby(variable, observed=True)
    low, high = by_variable.transform("quantile", 0.001), by_variable.transform("quantile", 0.999)
    grouped = value.clip(lower=low, upper=high).groupby(variable, observed=True)
    return (
        grouped.mean().reindex(dataset.variables).to_numpy(),
        grouped.std(ddof=0).reindex(dataset.variables).to_numpy(),
    )


def dataset_variable(dataset, where):
    return [v for v, w in zip(dataset.variables, where) if w]


@requires_p12
def test_normalisation_uses_the_training_part_only(p12_processed, p12_tensors, p12_dataset):
    (split,) = load_splits(p12_processed, p12_tensors, "garlic-reference")
    norm = split.normalisation
    mean, std = independent_stats(p12_dataset, split.train)
    assert (std == 0).sum() == 1 and dataset_variable(p12_dataset, std == 0) == ["MechVent"]  # always 1 in P12
    np.testing.assert_allclose(norm.value_mean, mean, rtol=1e-4)
    np.testing.assert_allclose(norm.value_std, np.where(std == 0, 1.0, std), rtol=1e-3)  # a constant is left as is
    all_mean, all_std = independent_stats(p12_dataset, p12_dataset.labels["stay_id"])
    assert not np.allclose(norm.value_mean, all_mean, rtol=1e-5)  # other stays' values did not leak in
    assert not np.allclose(norm.value_std, np.where(all_std == 0, 1.0, all_std), rtol=1e-5)

    static = p12_dataset.static.set_index("stay_id").loc[split.train].to_numpy("float64")
    np.testing.assert_allclose(norm.static_mean, np.nanmean(static, axis=0), rtol=1e-5)
    np.testing.assert_allclose(norm.static_std, np.nanstd(static, axis=0), rtol=1e-4)
    # Saved and read back unchanged.
    (again,) = load_splits(p12_processed, p12_tensors, "garlic-reference")
    assert np.array_equal(again.normalisation.value_mean, norm.value_mean)


@requires_p12
def test_clipping_keeps_physiological_ranges_apart(p12_processed, p12_tensors):
    """Without clipping, P12's few pH values of 735 set its standard deviation, and 7.0 and 7.6 lay 0.1 apart."""
    (split,) = load_splits(p12_processed, p12_tensors, "garlic-reference")
    norm = split.normalisation
    ph = p12_tensors.variables.index("pH")
    assert p12_tensors.values[..., ph].max() > 700  # the outliers are in the data
    assert 7.5 < norm.value_high[ph] < 8.0 and 6.5 < norm.value_low[ph] < 7.2
    values = np.zeros(len(p12_tensors.variables), "float32")
    acidotic, alkalotic = values.copy(), values.copy()
    acidotic[ph], alkalotic[ph] = 7.0, 7.6
    assert norm.standardise(alkalotic)[ph] - norm.standardise(acidotic)[ph] > 3
    assert norm.standardise(np.where(np.arange(len(values)) == ph, 735.0, values))[ph] < 5


def test_splits_saved_before_clipping_are_refitted_on_the_same_stays(synthetic, tmp_path):
    folder, tensors = synthetic
    fresh = load_splits(tmp_path, tensors, "five-split")[0]
    path = tmp_path / "splits" / "five-split" / "split_0.json"
    old = json.loads(path.read_text())
    del old["normalisation"]["value_low"], old["normalisation"]["value_high"]
    old["normalisation"]["value_mean"] = [0.0] * len(tensors.variables)
    path.write_text(json.dumps(old))
    loaded = load_splits(tmp_path, tensors, "five-split")[0]
    assert np.array_equal(loaded.train, fresh.train) and np.array_equal(loaded.test, fresh.test)
    assert np.array_equal(loaded.normalisation.value_mean, fresh.normalisation.value_mean)
    assert "value_low" in json.loads(path.read_text())["normalisation"]  # rewritten


def test_statistics_without_bounds_apply_no_clipping():
    norm = Normalisation(np.zeros(2, "float32"), np.ones(2, "float32"), np.zeros(0, "float32"), np.ones(0, "float32"))
    assert norm.standardise(np.array([735.0, -17.8])).tolist() == pytest.approx([735.0, -17.8])
    assert Normalisation.from_json(norm.to_json()).value_low is None


def test_normalisation_on_synthetic_train_part(synthetic):
    folder, tensors = synthetic
    from garlic.io.tables import read_processed

    dataset = read_processed(folder)
    split = draw_split(tensors, "five-split", 1)
    mean, std = independent_stats(dataset, split.train)
    np.testing.assert_allclose(split.normalisation.value_mean, mean, rtol=1e-4)
    np.testing.assert_allclose(split.normalisation.value_std, std, rtol=1e-3)


def test_a_column_without_a_training_value_is_named_once_and_fitted_as_0_and_1(synthetic, caplog):
    _, tensors = synthetic
    train = tensors.subset(np.arange(200))
    train.mask[..., 1] = False
    train.values[..., 1] = 0.0
    train.static[:, 0] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "Mean of empty slice" is not what a user should read
        norm = Normalisation.fit(train)
    named = [r.getMessage() for r in caplog.records if "no value in the training part" in r.getMessage()]
    assert len(named) == 1
    assert f"variable {tensors.variables[1]}" in named[0] and f"static feature {tensors.static_features[0]}" in named[0]
    assert (norm.value_mean[1], norm.value_std[1], norm.static_mean[0], norm.static_std[0]) == (0, 1, 0, 1)
    np.testing.assert_allclose(norm.static_mean[1:], np.nanmean(train.static[:, 1:], axis=0), rtol=1e-6)
    caplog.clear()
    Normalisation.fit(tensors.subset(np.arange(200)))
    assert not [r for r in caplog.records if "no value in the training part" in r.getMessage()]


def test_dataset_and_collate(synthetic):
    folder, tensors = synthetic
    split = draw_split(tensors, "five-split", 0)
    norm = split.normalisation
    part = tensors.subset(split.positions(tensors, "validation"))
    part.static[0, 0] = np.nan  # an unknown static value
    dataset = IrregularDataset(part, norm)
    assert len(dataset) == len(split.validation)

    batches = list(loader(dataset, batch_size=16))
    assert sum(len(b) for b in batches) == len(dataset)
    start = 0
    for batch in batches:
        rows = np.arange(start, start + len(batch))
        start += len(batch)
        longest = int(part.lengths[rows].max())
        b, d = len(batch), len(part.variables)
        assert batch.values.shape == (b, longest, d) and batch.mask.shape == (b, longest, d)
        assert batch.times.shape == (b, longest) and batch.static.shape == (b, len(part.static_features))
        assert batch.values.dtype == torch.float32 and batch.mask.dtype == torch.float32
        mask = part.mask[rows, :longest]
        assert np.array_equal(batch.mask.numpy(), mask.astype("float32"))
        clipped = np.clip(part.values[rows, :longest], norm.value_low, norm.value_high)
        expected = (clipped - norm.value_mean) / norm.value_std
        np.testing.assert_allclose(batch.values.numpy()[mask], expected[mask], rtol=1e-5, atol=1e-5)
        assert (batch.values.numpy()[~mask] == 0).all()
        assert np.array_equal(batch.times.numpy(), part.times[rows, :longest])
        assert np.array_equal(batch.lengths.numpy(), part.lengths[rows])
        assert np.array_equal(batch.labels.numpy(), part.labels[rows])
        static = (part.static[rows] - norm.static_mean) / norm.static_std
        known = ~np.isnan(static)
        np.testing.assert_allclose(batch.static.numpy()[known], static[known], rtol=1e-5, atol=1e-6)
        assert (batch.static.numpy()[~known] == 0).all()
    assert batches[0].static[0, 0] == 0  # the NaN became 0
    # The whole split's normalised training values have mean ~0 and std ~1 per variable.
    train = IrregularDataset(tensors.subset(split.positions(tensors, "train")), norm)
    observed = train.mask.bool()
    for k in range(len(tensors.variables)):
        values = train.values[..., k][observed[..., k]].double()
        assert abs(values.mean().item()) < 1e-3 and abs(values.std(unbiased=False).item() - 1) < 1e-3


def test_collate_trims_to_the_longest_stay_in_the_batch(synthetic):
    _, tensors = synthetic
    norm = draw_split(tensors, "five-split", 0).normalisation
    dataset = IrregularDataset(tensors, norm)
    order = np.argsort(tensors.lengths)
    short, long = int(order[0]), int(order[-1])
    assert tensors.lengths[short] < tensors.lengths[long]
    assert collate([dataset[short]]).values.shape[1] == tensors.lengths[short]
    assert collate([dataset[short], dataset[long]]).values.shape[1] == tensors.lengths[long]
    shuffled = [b.labels for b in loader(dataset, 64, shuffle=True, seed=1)]
    again = [b.labels for b in loader(dataset, 64, shuffle=True, seed=1)]
    assert all(torch.equal(a, b) for a, b in zip(shuffled, again))


def two_hospitals(stays_each: int = 200) -> IrregularTensors:
    """A cohort with PhysioNet 2019's ids: set A from p000001, set B from p100001."""
    generator = np.random.default_rng(0)
    n = 2 * stays_each
    ids = np.concatenate([np.arange(1, stays_each + 1), np.arange(100_001, 100_001 + stays_each)])
    return IrregularTensors(
        stay_ids=ids,
        values=generator.normal(size=(n, 3, 2)).astype("float32"),
        mask=np.ones((n, 3, 2), bool),
        times=np.tile(np.arange(3, dtype="float32"), (n, 1)),
        lengths=np.full(n, 3),
        static=np.zeros((n, 1), "float32"),
        labels=(generator.random(n) < 0.2).astype("float32"),
        variables=["HR", "Temp"],
        static_features=["Age"],
    )


def test_cross_hospital_trains_on_one_system_and_tests_on_every_stay_of_the_other(tmp_path):
    tensors = two_hospitals()
    system_a, system_b = tensors.stay_ids[:200], tensors.stay_ids[200:]
    across = load_splits(tmp_path, tensors, "cross-hospital", "physionet2019-raindrop")
    home = load_splits(tmp_path, tensors, "in-hospital", "physionet2019-raindrop")
    for split, same, (source, target) in zip(across, home, [(system_a, system_b), (system_b, system_a)]):
        assert np.isin(split.train, source).all() and np.isin(split.validation, source).all()
        assert np.array_equal(split.test, target)
        # in-hospital: the same training and validation stays, tested on the rest of the source system
        assert np.array_equal(same.train, split.train) and np.array_equal(same.validation, split.validation)
        assert np.array_equal(np.sort(np.concatenate([same.train, same.validation, same.test])), source)
        assert (len(same.train), len(same.validation), len(same.test)) == (160, 20, 20)
        check_normalised_on(split, tensors)
    with pytest.raises(ValueError, match="'cross-hospital' needs hospital systems, which only physionet2019 has"):
        load_splits(tmp_path / "p12", tensors, "cross-hospital", "physionet2012")
    with pytest.raises(ValueError, match="needs stays of both hospital systems"):
        load_splits(tmp_path / "a", tensors.subset(np.arange(200)), "cross-hospital", "physionet2019-raindrop")
