"""Padded irregular tensors against the long table they are built from."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from helpers import P12_TIME_SERIES, requires_p12
from garlic.io.tables import ProcessedDataset, write_processed
from garlic.io.tensors import TENSORS, load_tensors, tensorize


def check_against_long_table(tensors, observations: pd.DataFrame, static: pd.DataFrame, labels: pd.DataFrame):
    """Every property of the tensors, derived here from the long table with pandas group-bys."""
    n, t, d = tensors.values.shape
    assert tensors.mask.shape == (n, t, d) and tensors.times.shape == (n, t) and tensors.lengths.shape == (n,)
    assert tensors.values.dtype == np.float32 and tensors.mask.dtype == bool and tensors.times.dtype == np.float32
    assert np.array_equal(tensors.stay_ids, np.sort(labels["stay_id"].to_numpy()))

    obs = observations.assign(variable=observations["variable"].astype(str))
    # The later of repeated (stay, time, variable) rows wins: groupby keeps row order within a group.
    cells = obs.groupby(["stay_id", "time", "variable"], sort=True)["value"].last().reset_index()
    # A stay without an observation is one empty step.
    steps = cells.groupby("stay_id")["time"].nunique().reindex(tensors.stay_ids, fill_value=0).clip(lower=1)
    assert np.array_equal(tensors.lengths, steps.to_numpy())
    assert t == steps.max()
    assert int(tensors.mask.sum()) == len(cells)

    position = np.arange(t)[None, :]
    padding = position >= tensors.lengths[:, None]
    assert (tensors.times[padding] == 0).all()
    assert not tensors.mask[padding].any() and (tensors.values[padding] == 0).all()
    inside = ~padding[:, 1:]
    assert (np.diff(tensors.times, axis=1)[inside] > 0).all()  # strictly ascending within each stay's length
    assert (tensors.values[~tensors.mask] == 0).all()
    observed = tensors.mask.any(axis=(1, 2))
    assert tensors.mask.any(axis=2)[~padding & observed[:, None]].all()  # every real step holds an observation

    # The observed cells, read back from the tensors, are exactly the long table's cells.
    i, step, k = np.nonzero(tensors.mask)
    back = pd.DataFrame(
        {
            "stay_id": tensors.stay_ids[i],
            "time": tensors.times[i, step],
            "variable": np.asarray(tensors.variables)[k],
            "value": tensors.values[i, step, k],
        }
    ).sort_values(["stay_id", "time", "variable"], ignore_index=True)
    assert np.array_equal(back["stay_id"].to_numpy(), cells["stay_id"].to_numpy())
    assert np.array_equal(back["time"].to_numpy(), cells["time"].to_numpy())
    assert (back["variable"].to_numpy() == cells["variable"].to_numpy()).all()
    assert np.array_equal(back["value"].to_numpy(), cells["value"].to_numpy())

    expected_static = static.set_index("stay_id").reindex(tensors.stay_ids)[tensors.static_features]
    assert np.array_equal(tensors.static, expected_static.to_numpy("float32"), equal_nan=True)
    expected_labels = labels.set_index("stay_id")["label"].reindex(tensors.stay_ids)
    assert np.array_equal(tensors.labels, expected_labels.to_numpy("float32"))


VARIABLES = ["HR", "Temp", "Lactate"]


def small_tables():
    observations = pd.DataFrame(
        [
            # stay 7: rows out of time order, a repeated (time, variable) whose later row must win
            (7, 2.0, "HR", 90.0),
            (7, 0.5, "HR", 80.0),
            (7, 0.5, "Temp", 37.0),
            (7, 2.0, "HR", 95.0),  # later duplicate of (7, 2.0, HR)
            (7, 1.25, "Lactate", 2.5),
            (7, 0.5, "HR", 81.0),  # later duplicate of (7, 0.5, HR), listed after a later time
            # stay 3: a single step
            (3, 10.0, "Temp", 38.5),
            # stay 5: two steps, the second at the window's end
            (5, 0.0, "Lactate", 1.0),
            (5, 48.0, "Lactate", 4.0),
            (5, 48.0, "HR", 120.0),
        ],
        columns=["stay_id", "time", "variable", "value"],
    ).astype({"time": "float32", "value": "float32"})
    static = pd.DataFrame({"stay_id": [7, 3, 5], "Age": [70.0, np.nan, 50.0], "Weight": [80.0, 60.0, np.nan]})
    labels = pd.DataFrame({"stay_id": [5, 7, 3], "label": [1, 0, 1]})
    return observations, static, labels


def test_small_tables_by_hand(tmp_path):
    observations, static, labels = small_tables()
    write_processed(tmp_path, observations, static, labels, VARIABLES, {"dataset": "hand-made"})
    tensors = load_tensors(tmp_path)

    # Written out by hand from the rows above.
    assert tensors.stay_ids.tolist() == [3, 5, 7]
    assert tensors.lengths.tolist() == [1, 2, 3]
    assert tensors.values.shape == (3, 3, 3)
    assert tensors.times.tolist() == [[10.0, 0, 0], [0.0, 48.0, 0], [0.5, 1.25, 2.0]]
    hr, temp, lactate = (VARIABLES.index(v) for v in ("HR", "Temp", "Lactate"))
    expected = np.zeros((3, 3, 3), dtype="float32")
    expected[0, 0, temp] = 38.5
    expected[1, 0, lactate], expected[1, 1, lactate], expected[1, 1, hr] = 1.0, 4.0, 120.0
    expected[2, 0, hr], expected[2, 0, temp] = 81.0, 37.0
    expected[2, 1, lactate] = 2.5
    expected[2, 2, hr] = 95.0
    assert np.array_equal(tensors.values, expected)
    assert np.array_equal(tensors.mask, expected != 0)
    assert tensors.labels.tolist() == [1.0, 1.0, 0.0]
    assert tensors.static_features == ["Age", "Weight"]
    assert np.array_equal(tensors.static, [[np.nan, 60], [50, np.nan], [70, 80]], equal_nan=True)

    check_against_long_table(tensors, observations, static, labels)


def test_stay_without_observations_and_subset(tmp_path):
    observations, static, labels = small_tables()
    labels = pd.concat([labels, pd.DataFrame({"stay_id": [9], "label": [0]})], ignore_index=True)
    static = pd.concat([static, pd.DataFrame({"stay_id": [9], "Age": [40.0], "Weight": [70.0]})], ignore_index=True)
    tensors = tensorize(ProcessedDataset(observations, static, labels, VARIABLES))
    assert tensors.stay_ids.tolist() == [3, 5, 7, 9]
    assert tensors.lengths[-1] == 1 and tensors.times[-1, 0] == 0 and not tensors.mask[-1].any()  # one empty step
    check_against_long_table(tensors, observations, static, labels)

    part = tensors.subset(np.array([2, 0]))
    assert part.stay_ids.tolist() == [7, 3]
    assert np.array_equal(part.values[0], tensors.values[2]) and part.lengths.tolist() == [3, 1]


def test_cut_at_prediction_times_gives_each_time_its_prefix_as_a_stay():
    observations, static, labels = small_tables()
    tasks = pd.DataFrame({"stay_id": [7, 7, 7, 5, 3], "time": [0.2, 1.25, 9.0, 47.0, 10.0], "label": [0, 0, 1, 1, 1]})
    tensors = tensorize(ProcessedDataset(observations, static, labels, VARIABLES, tasks=tasks))
    cut = tensors.cut_at_prediction_times()
    assert cut.task is None and cut.stay_ids.tolist() == [3, 5, 7, 7, 7]  # sorted by stay, then time
    assert cut.lengths.tolist() == [1, 1, 0, 2, 3]  # stay 7 at 0.2 h: nothing yet; at 1.25: the steps at 0.5 and 1.25
    assert cut.labels.tolist() == [1, 1, 0, 0, 1]  # each time's own label
    whole = tensors.subset(np.array([0, 1, 2, 2, 2]))
    for row, steps in enumerate(cut.lengths):
        assert np.array_equal(cut.values[row, :steps], whole.values[row, :steps])
        assert np.array_equal(cut.times[row, :steps], whole.times[row, :steps])
        assert (
            not cut.mask[row, steps:].any() and not cut.values[row, steps:].any() and not cut.times[row, steps:].any()
        )
    assert np.array_equal(cut.static, whole.static, equal_nan=True)


def test_cache_is_reused_and_loads_without_pickle(tmp_path):
    observations, static, labels = small_tables()
    write_processed(tmp_path, observations, static, labels, VARIABLES, {"dataset": "hand-made"})
    first = load_tensors(tmp_path)
    cache = tmp_path / TENSORS
    assert cache.is_file()
    with np.load(cache, allow_pickle=False) as stored:  # no object arrays in the cache
        assert all(stored[key].dtype != object for key in stored.files)
    stamp = cache.stat().st_mtime_ns
    second = load_tensors(tmp_path)
    assert cache.stat().st_mtime_ns == stamp  # read back, not rebuilt
    for name in ("stay_ids", "values", "mask", "times", "lengths", "static", "labels"):
        a, b = getattr(first, name), getattr(second, name)
        assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True), name
    assert first.variables == second.variables == VARIABLES
    assert first.static_features == second.static_features


def test_stale_cache_is_rebuilt_when_only_a_value_changes(tmp_path):
    """Same manifest, same counts, one different value: the cache must not be served."""
    observations, static, labels = small_tables()
    write_processed(tmp_path, observations, static, labels, VARIABLES, {"dataset": "hand-made"})
    old = load_tensors(tmp_path)
    stale = (tmp_path / TENSORS).read_bytes()

    changed = observations.copy()
    changed.loc[changed["value"] == 38.5, "value"] = 39.5
    write_processed(tmp_path, changed, static, labels, VARIABLES, {"dataset": "hand-made"})
    (tmp_path / TENSORS).write_bytes(stale)  # the old cache next to the new tables
    new = load_tensors(tmp_path)
    temp = VARIABLES.index("Temp")
    assert old.values[0, 0, temp] == 38.5 and new.values[0, 0, temp] == 39.5
    check_against_long_table(new, changed, static, labels)


@pytest.mark.parametrize("damage", ["cut short", "not a zip"])
def test_a_damaged_cache_is_made_again_from_the_tables_saying_so(tmp_path, caplog, damage):
    observations, static, labels = small_tables()
    write_processed(tmp_path, observations, static, labels, VARIABLES, {"dataset": "hand-made"})
    load_tensors(tmp_path)
    cache = tmp_path / TENSORS
    whole = cache.read_bytes()
    cache.write_bytes(whole[: len(whole) // 2] if damage == "cut short" else b"not an archive")
    with caplog.at_level("WARNING", logger="garlic.io.tensors"):
        again = load_tensors(tmp_path)
    assert f"the tensor cache {cache} cannot be read" in caplog.text
    check_against_long_table(again, observations, static, labels)
    assert cache.read_bytes() == whole  # made again, whole


@pytest.mark.parametrize("damage", ["{not json", "[]", "\udcff"])
def test_a_damaged_manifest_is_one_error_naming_it(tmp_path, damage):
    observations, static, labels = small_tables()
    write_processed(tmp_path, observations, static, labels, VARIABLES, {"dataset": "hand-made"})
    (tmp_path / "manifest.json").write_text(damage, errors="surrogateescape")
    with pytest.raises(ValueError, match=f"^{tmp_path / 'manifest.json'}: not a processed dataset's manifest"):
        load_tensors(tmp_path)


@requires_p12
def test_real_p12_tensors_against_the_long_table(p12_tensors, p12_dataset, p12_raw):
    n, t, d = p12_tensors.values.shape
    assert (n, d) == (11_988, 36)
    assert sorted(p12_tensors.variables) == sorted(P12_TIME_SERIES)
    # T independently: the most distinct observation times of a stay in the raw files (time series, <= 48 h).
    assert t == max(len({time for time, _, _ in rows}) for rows in p12_raw.in_window.values()) == 214

    obs = p12_dataset.observations
    # Whole-cohort counts are cheap; the cell-by-cell check runs on a sample of stays.
    cells = obs.drop_duplicates(["stay_id", "time", "variable"])
    assert int(p12_tensors.mask.sum()) == len(cells)
    sample = np.sort(np.random.default_rng(1).choice(p12_tensors.stay_ids, 400, replace=False))
    rows = np.searchsorted(p12_tensors.stay_ids, sample)
    longest = int(p12_tensors.lengths.argmax())
    rows = np.union1d(rows, [longest])  # the longest stay sets T
    part = p12_tensors.subset(rows)
    ids = part.stay_ids
    part_obs = obs[obs["stay_id"].isin(ids)]
    # Trim to the sample's longest stay so the helper's T check applies.
    part.values, part.mask, part.times = (a[:, : part.lengths.max()] for a in (part.values, part.mask, part.times))
    check_against_long_table(
        part,
        part_obs,
        p12_dataset.static[p12_dataset.static["stay_id"].isin(ids)],
        p12_dataset.labels[p12_dataset.labels["stay_id"].isin(ids)][["stay_id", "label"]],
    )


@requires_p12
def test_real_p12_reload_equals_first_build(p12_processed, p12_tensors):
    again = load_tensors(p12_processed)
    for name in ("stay_ids", "lengths", "labels"):
        assert np.array_equal(getattr(again, name), getattr(p12_tensors, name))
    assert np.array_equal(again.mask, p12_tensors.mask)
    assert np.array_equal(again.static, p12_tensors.static, equal_nan=True)
    assert np.array_equal(again.values, p12_tensors.values) and np.array_equal(again.times, p12_tensors.times)


@pytest.mark.parametrize("bad", ["NoSuchVariable"])
def test_tables_naming_unknown_variables_are_refused(tmp_path, bad):
    observations, static, labels = small_tables()
    observations.loc[0, "variable"] = bad
    with pytest.raises(ValueError, match=bad):
        write_processed(tmp_path / "out", observations, static, labels, VARIABLES, {})
    assert not (tmp_path / "out").exists()
