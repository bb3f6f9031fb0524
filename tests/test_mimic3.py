"""MIMIC-III: demo cohorts, the observation window, zeros, header case and compression, bad input, memory."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.benchmark_mimic_streaming import measure_in_child, write_synthetic_mimic
from garlic.sources.mimic3 import BENCHMARK_VARIABLES, GARLIC_VARIABLES, MimicError, preprocess
from garlic.io.tables import read_processed
from garlic.io.tensors import load_tensors
from helpers import SHARED

DEMO = SHARED / "mimic3-demo"
needs_demo = pytest.mark.skipif(
    not (DEMO / "CHARTEVENTS.csv.gz").is_file(), reason=f"shared MIMIC-III demo not found at {DEMO}"
)


# ---------------------------------------------------------------------------------------------------------------
# The 100-patient demo


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    cache = {}

    def get(cohort: str):
        if cohort not in cache:
            destination = tmp_path_factory.mktemp(cohort) / "processed"
            preprocess(DEMO, destination, cohort=cohort)
            cache[cohort] = (destination, read_processed(destination))
        return cache[cohort]

    return get


def _demo_table(name: str, columns: list[str]) -> pd.DataFrame:
    return pd.read_csv(DEMO / f"{name}.csv.gz", usecols=columns, low_memory=False)


def _stays_of(dataset) -> pd.DataFrame:
    stays = _demo_table("ICUSTAYS", ["icustay_id", "intime"])
    stays = stays[stays["icustay_id"].isin(dataset.labels["stay_id"])]
    return stays.assign(intime=pd.to_datetime(stays["intime"]))


def _in_window(events: pd.DataFrame, stays: pd.DataFrame, time: str = "charttime") -> pd.DataFrame:
    events = events.merge(stays, on="icustay_id")
    hours = (pd.to_datetime(events[time]) - events["intime"]).dt.total_seconds() / 3600
    return events[(hours >= 0) & (hours <= 48)]


@needs_demo
@pytest.mark.parametrize("cohort, stays, deaths, variables", [("benchmark", 57, 17, 17), ("garlic", 72, 27, 98)])
def test_demo_cohort_stays_deaths_and_variables(demo, cohort, stays, deaths, variables):
    folder, dataset = demo(cohort)
    counts = dataset.manifest["counts"]
    assert (counts["stays"], counts["positives"]) == (stays, deaths)
    assert counts["variables_found"] == variables
    assert counts["icu_stays_read"] == 136
    assert len(dataset.variables) == (17 if cohort == "benchmark" else 103)
    assert dataset.labels["stay_id"].is_unique
    assert set(dataset.observations["stay_id"]) == set(dataset.labels["stay_id"])
    tensors = load_tensors(folder)
    assert tensors.values.shape[0] == stays and tensors.static_features == ["Age", "Gender"]
    assert dataset.manifest["tables"]["CHARTEVENTS"]["rows_read"] == 758_355
    assert {report["repeated_rows"] for report in dataset.manifest["tables"].values()} == {0}  # the demo has none
    assert counts["dropped_stays"]["OUTTIME before INTIME"] == 0


@needs_demo
def test_benchmark_cohort_rules_on_the_demo(demo):
    _, dataset = demo("benchmark")
    stays = _demo_table("ICUSTAYS", ["hadm_id", "icustay_id", "first_careunit", "last_careunit", "los"])
    kept = stays[stays["icustay_id"].isin(dataset.labels["stay_id"])]
    assert (kept["first_careunit"] == kept["last_careunit"]).all()
    assert kept["hadm_id"].is_unique and (kept["los"] * 24 >= 48).all()
    admissions = _demo_table("ADMISSIONS", ["hadm_id", "hospital_expire_flag"])
    expected = kept.merge(admissions, on="hadm_id").set_index("icustay_id")["hospital_expire_flag"]
    assert (dataset.labels.set_index("stay_id")["label"] == expected.reindex(dataset.labels["stay_id"])).all()


@needs_demo
@pytest.mark.parametrize("cohort", ["benchmark", "garlic"])
def test_no_event_outside_the_window(demo, cohort):
    _, dataset = demo(cohort)
    assert dataset.observations["time"].between(0, 48).all()
    # Heart rate, recomputed from the raw table: every charted value in the window, none outside.
    chart = _demo_table("CHARTEVENTS", ["icustay_id", "itemid", "charttime", "valuenum", "error"])
    heart = chart[chart["itemid"].isin([211, 220045]) & (chart["error"] != 1) & chart["valuenum"].notna()]
    expected = _in_window(heart, _stays_of(dataset))
    name = "Heart Rate" if cohort == "benchmark" else "Heart rate"
    got = dataset.observations[dataset.observations["variable"] == name]
    assert len(got) == len(expected) > 1000
    assert len(heart.merge(_stays_of(dataset), on="icustay_id")) > len(expected)  # the window did cut events


@needs_demo
def test_metavision_inputs_must_end_inside_the_window(demo):
    _, dataset = demo("garlic")
    inputs = _demo_table(
        "INPUTEVENTS_MV", ["icustay_id", "itemid", "starttime", "endtime", "amount", "statusdescription"]
    )
    saline = inputs[(inputs["itemid"] == 225158) & (inputs["statusdescription"] != "Rewritten")]
    started = _in_window(saline, _stays_of(dataset), "starttime")
    ended = _in_window(started.drop(columns="intime"), _stays_of(dataset), "endtime")
    assert len(ended) < len(started)  # some infusions run past hour 48: they must not be read
    cv = _demo_table("INPUTEVENTS_CV", ["icustay_id", "itemid", "charttime", "amount", "amountuom"])
    cv = cv[(cv["itemid"] == 30018) & cv["amount"].notna() & (cv["amountuom"] == "ml")]
    cv = _in_window(cv, _stays_of(dataset))
    got = dataset.observations[dataset.observations["variable"] == "NaCl 0.9%"]
    assert len(got) == len(ended) + len(cv)


@needs_demo
def test_zeros_are_observations(demo):
    _, dataset = demo("garlic")
    urine = dataset.observations[dataset.observations["variable"] == "Urine output"]
    output = _demo_table("OUTPUTEVENTS", ["icustay_id", "itemid", "charttime", "value"])
    urine_items = next(v for v in GARLIC_VARIABLES if v.name == "Urine output").items["output"]
    raw = _in_window(output[output["itemid"].isin(urine_items)], _stays_of(dataset))
    raw = raw[raw["value"].notna()]
    totals = raw.groupby(["icustay_id", "charttime"])["value"].sum()  # outputs charted together are summed
    assert len(totals) < len(raw)  # the demo has such outputs
    assert (totals == 0).sum() > 0
    assert (urine["value"] == 0).sum() == (totals == 0).sum()
    assert len(urine) == len(totals)
    assert urine["value"].sum() == pytest.approx(totals.sum(), rel=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# A tiny hand-written database: exact window, ICU stay, zero and malformed-row behaviour

INTIME = pd.Timestamp("2150-01-01 10:00:00")


def _at(hours: float) -> str:
    return (INTIME + pd.Timedelta(hours=hours)).strftime("%Y-%m-%d %H:%M:%S")


def _tiny_tables() -> dict[str, pd.DataFrame]:
    stays = pd.DataFrame(
        {
            "ROW_ID": [1, 2],
            "SUBJECT_ID": [1, 2],
            "HADM_ID": [11, 12],
            "ICUSTAY_ID": [101, 102],
            "FIRST_CAREUNIT": ["MICU", "MICU"],
            "LAST_CAREUNIT": ["MICU", "SICU"],
            "FIRST_WARDID": [1, 1],
            "LAST_WARDID": [1, 2],
            "INTIME": [_at(0), _at(0)],
            "OUTTIME": [_at(72), _at(72)],
            "LOS": [3.0, 3.0],
        }
    )
    admissions = pd.DataFrame(
        {
            "ROW_ID": [1, 2],
            "SUBJECT_ID": [1, 2],
            "HADM_ID": [11, 12],
            "ADMITTIME": [_at(-5), _at(-5)],
            "DISCHTIME": [_at(100), _at(100)],
            "DEATHTIME": [_at(100), None],
        }
    )
    patients = pd.DataFrame(
        {
            "ROW_ID": [1, 2],
            "SUBJECT_ID": [1, 2],
            "GENDER": ["F", "M"],
            "DOB": ["2100-01-01 00:00:00"] * 2,
            "DOD": [None, None],
        }
    )
    heart = [(-0.5, 90), (0, 91), (47.99, 92), (48, 0), (48.5, 94)]  # outside, inside, inside, inside (zero), outside
    chart = pd.DataFrame(
        {
            "ROW_ID": range(9),
            "SUBJECT_ID": [1] * 7 + [2, 1],
            "HADM_ID": [11] * 7 + [12, 11],
            "ICUSTAY_ID": [101] * 5 + [999, None, 102, 101],
            "ITEMID": [220045] * 7 + [220045, 3348],
            "CHARTTIME": [_at(h) for h, _ in heart] + [_at(1), _at(2), _at(1), _at(3)],
            "VALUE": [str(v) for _, v in heart] + ["95", "96", "97", "Normal <3 secs"],
            "VALUENUM": [v for _, v in heart] + [95, 96, 97, None],
            "VALUEUOM": ["bpm"] * 8 + [None],
            "ERROR": [0] * 9,
        }
    )
    labs = pd.DataFrame(
        {
            "ROW_ID": [1],
            "SUBJECT_ID": [1],
            "HADM_ID": [None],
            "ITEMID": [50820],
            "CHARTTIME": [_at(5)],
            "VALUE": ["7.31"],
            "VALUENUM": [7.31],
            "VALUEUOM": ["units"],
        }
    )
    return {"ICUSTAYS": stays, "ADMISSIONS": admissions, "PATIENTS": patients, "CHARTEVENTS": chart, "LABEVENTS": labs}


def _write(folder: Path, tables: dict[str, pd.DataFrame], lower: bool = False, gz: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, frame in tables.items():
        frame = frame.rename(columns=str.lower) if lower else frame
        text = frame.to_csv(index=False).encode()
        stem = name.lower() if lower else name
        if gz:
            (folder / f"{stem}.csv.gz").write_bytes(gzip.compress(text))
        else:
            (folder / f"{stem}.csv").write_bytes(text)
    return folder


def test_window_icu_stay_and_zero_rules(tmp_path):
    manifest = preprocess(_write(tmp_path / "db", _tiny_tables()), tmp_path / "out")
    dataset = read_processed(tmp_path / "out")
    # stay 102 changes care unit: not in the benchmark cohort
    assert dataset.labels[["stay_id", "label"]].values.tolist() == [[101, 1]]
    assert manifest["dropped_stays"]["ICU transfer (first and last care unit or ward differ)"] == [102]
    obs = dataset.observations.sort_values(["variable", "time"])
    heart = obs[obs["variable"] == "Heart Rate"]
    # -0.5 h and 48.5 h are outside; ICUSTAY_ID 999 is another stay; a missing ICUSTAY_ID is attached by time.
    assert heart["time"].tolist() == pytest.approx([0.0, 2.0, 47.99, 48.0], abs=1e-4)
    assert heart["value"].tolist() == [91.0, 96.0, 92.0, 0.0]
    assert obs[obs["variable"] == "Capillary refill rate"]["value"].tolist() == [0.0]
    assert obs[obs["variable"] == "pH"]["value"].tolist() == pytest.approx([7.31])  # a lab without HADM_ID
    assert dataset.static[["Age", "Gender"]].round(0).values.tolist() == [[50.0, 0.0]]


def test_header_case_and_compression_do_not_matter(tmp_path):
    tables = _tiny_tables()
    preprocess(_write(tmp_path / "upper", tables), tmp_path / "upper-out")
    preprocess(_write(tmp_path / "lower", tables, lower=True, gz=True), tmp_path / "lower-out")
    upper, lower = read_processed(tmp_path / "upper-out"), read_processed(tmp_path / "lower-out")
    for table in ("observations", "labels", "static"):
        pd.testing.assert_frame_equal(getattr(upper, table), getattr(lower, table))


def test_missing_table_or_column_is_named(tmp_path):
    tables = _tiny_tables()
    _write(tmp_path / "no-labs", {k: v for k, v in tables.items() if k != "LABEVENTS"})
    with pytest.raises(MimicError, match="required table LABEVENTS not found"):
        preprocess(tmp_path / "no-labs", tmp_path / "out")
    _write(tmp_path / "no-column", {**tables, "CHARTEVENTS": tables["CHARTEVENTS"].drop(columns="VALUENUM")})
    with pytest.raises(MimicError, match=r"table CHARTEVENTS lacks required column\(s\) \['VALUENUM'\]"):
        preprocess(tmp_path / "no-column", tmp_path / "out")
    _write(tmp_path / "no-intime", {**tables, "ICUSTAYS": tables["ICUSTAYS"].drop(columns="INTIME")})
    with pytest.raises(MimicError, match=r"table ICUSTAYS lacks required column\(s\) \['INTIME'\]"):
        preprocess(tmp_path / "no-intime", tmp_path / "out")
    with pytest.raises(MimicError, match="unknown cohort"):
        preprocess(tmp_path / "no-column", tmp_path / "out", cohort="nope")


def test_a_table_in_two_files_is_refused_naming_both(tmp_path):
    tables = _tiny_tables()
    source = _write(tmp_path / "source", tables, gz=True)
    _write(tmp_path / "partial", {"ADMISSIONS": tables["ADMISSIONS"].iloc[:0]})
    (tmp_path / "partial" / "ADMISSIONS.csv").rename(source / "ADMISSIONS.csv")
    with pytest.raises(
        MimicError,
        match=r"table ADMISSIONS is in more than one file \(ADMISSIONS\.csv, "
        r"ADMISSIONS\.csv\.gz\); keep one of them",
    ):
        preprocess(source, tmp_path / "out")


def test_malformed_rows_are_counted_and_skipped(tmp_path):
    folder = _write(tmp_path / "db", _tiny_tables())
    with open(folder / "CHARTEVENTS.csv", "a") as chart:
        chart.write("20,1,11,101,220045\n")  # too few fields
        chart.write("21,1,11,101,220045,not-a-time,99,99,bpm,0\n")
        chart.write(f"22,1,11,abc,220045,{_at(4)},99,99,bpm,0\n")
    manifest = preprocess(folder, tmp_path / "out")
    report = manifest["tables"]["CHARTEVENTS"]
    assert report["malformed_rows"] == 3
    assert any("expected 10 fields, got 5" in e for e in report["malformed_examples"])
    assert any("not-a-time" in e for e in report["malformed_examples"])
    assert manifest["counts"]["observations_per_variable"]["Heart Rate"] == 4  # the good rows are all kept


@pytest.mark.parametrize(
    "bad, message",
    [
        ("20,1,11,101,220045\n", "Expected 10 columns, got 5"),
        ("21,1,11,101,220045,not-a-time,99,99,bpm,0\n", "not-a-time"),
    ],
)
def test_strict_stops_at_the_first_malformed_row_naming_the_table(tmp_path, bad, message):
    folder = _write(tmp_path / "db", _tiny_tables())
    with open(folder / "CHARTEVENTS.csv", "a") as chart:
        chart.write(bad)
    with pytest.raises(MimicError, match=rf"CHARTEVENTS\.csv: .*{message}"):
        preprocess(folder, tmp_path / "out", strict=True)
    assert not (tmp_path / "out").exists()
    preprocess(_write(tmp_path / "clean", _tiny_tables()), tmp_path / "clean-out", strict=True)  # nothing to stop on


def test_outputs_charted_at_one_time_are_summed(tmp_path):
    tables = _tiny_tables()
    # Foley 400 mL and a void of 0 mL charted together, then 50 mL; the garlic cohort reads OUTPUTEVENTS.
    tables["OUTPUTEVENTS"] = pd.DataFrame(
        {
            "ROW_ID": range(3),
            "SUBJECT_ID": [1] * 3,
            "HADM_ID": [11] * 3,
            "ICUSTAY_ID": [101] * 3,
            "CHARTTIME": [_at(2), _at(2), _at(3)],
            "ITEMID": [40055, 226560, 40055],
            "VALUE": [400, 0, 50],
            "VALUEUOM": ["mL"] * 3,
            "ISERROR": [None] * 3,
        }
    )
    empty = {
        "ROW_ID": [],
        "SUBJECT_ID": [],
        "HADM_ID": [],
        "ICUSTAY_ID": [],
        "ITEMID": [],
        "AMOUNT": [],
        "AMOUNTUOM": [],
    }
    tables["INPUTEVENTS_CV"] = pd.DataFrame({**empty, "CHARTTIME": []})
    tables["INPUTEVENTS_MV"] = pd.DataFrame({**empty, "STARTTIME": [], "ENDTIME": [], "STATUSDESCRIPTION": []})
    manifest = preprocess(_write(tmp_path / "db", tables), tmp_path / "out", cohort="garlic")
    assert manifest["summed_variables"] == ["Urine output", "Stool output"]
    urine = read_processed(tmp_path / "out").observations.query("variable == 'Urine output'").sort_values("time")
    assert urine["value"].tolist() == [400, 50]
    tensors = load_tensors(tmp_path / "out")
    column = tensors.variables.index("Urine output")
    observed = tensors.values[0][tensors.mask[0][:, column], column]
    assert observed.tolist() == [400, 50]  # not the later 0


def _outputs(*rows: tuple[int, float, int]) -> dict[str, pd.DataFrame]:
    """The tiny database with OUTPUTEVENTS rows (ROW_ID, hour, mL of Foley urine) and empty input tables, for the
    garlic cohort, which reads OUTPUTEVENTS."""
    tables = _tiny_tables()
    tables["OUTPUTEVENTS"] = pd.DataFrame(
        {
            "ROW_ID": [r[0] for r in rows],
            "SUBJECT_ID": [1] * len(rows),
            "HADM_ID": [11] * len(rows),
            "ICUSTAY_ID": [101] * len(rows),
            "CHARTTIME": [_at(r[1]) for r in rows],
            "ITEMID": [40055] * len(rows),
            "VALUE": [r[2] for r in rows],
            "VALUEUOM": ["mL"] * len(rows),
            "ISERROR": [None] * len(rows),
        }
    )
    empty = {
        "ROW_ID": [],
        "SUBJECT_ID": [],
        "HADM_ID": [],
        "ICUSTAY_ID": [],
        "ITEMID": [],
        "AMOUNT": [],
        "AMOUNTUOM": [],
    }
    tables["INPUTEVENTS_CV"] = pd.DataFrame({**empty, "CHARTTIME": []})
    tables["INPUTEVENTS_MV"] = pd.DataFrame({**empty, "STARTTIME": [], "ENDTIME": [], "STATUSDESCRIPTION": []})
    return tables


def test_a_row_repeated_with_its_row_id_is_read_once_and_counted_even_blocks_apart(tmp_path):
    # Urine 200 mL at hour 2, its row repeated at the end of the file: summed as outputs at one time are, the
    # repeat made it 400 mL. The repeated heart rate row added an observation.
    tables = _outputs(*[(row, 2 + row / 10, 200 if row == 0 else 10) for row in range(40)], (0, 2, 200))
    chart = tables["CHARTEVENTS"]
    tables["CHARTEVENTS"] = pd.concat([chart, chart.iloc[[1]]], ignore_index=True)
    folder = _write(tmp_path / "db", tables)
    block = 256  # the repeats lie several blocks after their first reading
    assert (folder / "OUTPUTEVENTS.csv").stat().st_size > 4 * block
    manifest = preprocess(folder, tmp_path / "out", cohort="garlic", block_size=block)
    urine = read_processed(tmp_path / "out").observations.query("variable == 'Urine output'")
    assert urine.sort_values("time")["value"].tolist() == [200] + [10] * 39
    assert manifest["counts"]["observations_per_variable"]["Heart rate"] == 5  # stay 101's 4, 102's 1: no repeat
    assert manifest["tables"]["OUTPUTEVENTS"]["repeated_rows"] == 1
    assert manifest["tables"]["CHARTEVENTS"]["repeated_rows"] == 1
    assert manifest["tables"]["LABEVENTS"]["repeated_rows"] == 0


def test_an_icu_stay_that_ends_before_it_begins_is_dropped_and_counted_or_refused_under_strict(tmp_path):
    tables = _outputs()  # the garlic cohort below reads OUTPUTEVENTS
    stays = tables["ICUSTAYS"].copy()
    stays.loc[0, "OUTTIME"] = _at(-1)  # stay 101 (the benchmark cohort's only one) ends an hour before it begins
    folder = _write(tmp_path / "db", {**tables, "ICUSTAYS": stays})
    with pytest.raises(
        MimicError,
        match=r"ICUSTAYS\.csv line 2: ICUSTAY_ID 101 ends \(OUTTIME 2150-01-01 "
        r"09:00:00\) before it begins \(INTIME 2150-01-01 10:00:00\)",
    ):
        preprocess(folder, tmp_path / "strict-out", strict=True)
    manifest = preprocess(folder, tmp_path / "out", cohort="garlic")
    assert manifest["dropped_stays"]["OUTTIME before INTIME"] == [101]
    assert manifest["counts"]["dropped_stays"]["OUTTIME before INTIME"] == 1
    assert read_processed(tmp_path / "out").labels["stay_id"].tolist() == [102]


@pytest.mark.parametrize("table", ["CHARTEVENTS", "ICUSTAYS"])
def test_a_column_named_twice_in_two_cases_is_refused_naming_file_and_column(tmp_path, table):
    tables = _tiny_tables()
    twice = tables[table].assign(subject_id=tables[table]["SUBJECT_ID"])
    _write(tmp_path / "db", {**tables, table: twice})
    with pytest.raises(
        MimicError,
        match=rf"{table}\.csv: column SUBJECT_ID appears twice in the header "
        r"\('SUBJECT_ID' and 'subject_id'\)",
    ):
        preprocess(tmp_path / "db", tmp_path / "out")


def test_variable_tables_map_each_itemid_once():
    for variables in (BENCHMARK_VARIABLES, GARLIC_VARIABLES):
        for source in ("chart", "lab", "output", "input"):
            items = [i for v in variables for i in v.items.get(source, ())]
            assert len(items) == len(set(items)), source
    assert len(BENCHMARK_VARIABLES) == 17 and len(GARLIC_VARIABLES) == 103


@needs_demo
def test_every_itemid_is_in_the_dictionaries():
    items = _demo_table("D_ITEMS", ["itemid", "linksto"])
    labs = set(_demo_table("D_LABITEMS", ["itemid"])["itemid"])
    linksto = dict(zip(items["itemid"], items["linksto"]))
    expected = {"chart": {"chartevents"}, "output": {"outputevents"}, "input": {"inputevents_cv", "inputevents_mv"}}
    for variable in BENCHMARK_VARIABLES + GARLIC_VARIABLES:
        for source, ids in variable.items.items():
            for itemid in ids:
                if source == "lab":
                    assert itemid in labs, (variable.name, itemid)
                else:
                    assert linksto.get(itemid) in expected[source], (variable.name, itemid)


# ---------------------------------------------------------------------------------------------------------------
# Streaming: memory does not follow the size of CHARTEVENTS


def test_streaming_memory_does_not_grow_with_the_file(tmp_path):
    small = write_synthetic_mimic(tmp_path / "small", rows=200_000, stays=200)
    # Four times the rows, the extra three quarters from patients outside the cohort: same kept data, bigger file.
    large = write_synthetic_mimic(tmp_path / "large", rows=800_000, stays=200, foreign_fraction=0.75)
    block = 1 << 20
    small_run, large_run = measure_in_child(small, block_size=block), measure_in_child(large, block_size=block)
    assert large_run["chartevents_bytes"] > 3.5 * small_run["chartevents_bytes"]
    assert large_run["stays_kept"] == small_run["stays_kept"] == 200
    growth_mib = large_run["peak_rss_mib"] - small_run["peak_rss_mib"]
    file_growth_mib = (large_run["chartevents_bytes"] - small_run["chartevents_bytes"]) / 2**20
    assert growth_mib < 0.25 * file_growth_mib, (small_run, large_run)
    assert np.isfinite(large_run["rows_per_second"])


def test_a_time_that_is_not_one_is_named_with_its_table_and_line(tmp_path):
    tables = _tiny_tables()
    stays = tables["ICUSTAYS"].astype({"INTIME": "object"})
    stays.loc[0, "INTIME"] = "2101-13-45 99:00:00"
    _write(tmp_path / "db", {**tables, "ICUSTAYS": stays})
    with pytest.raises(MimicError, match=r"ICUSTAYS line 2: INTIME '2101-13-45 99:00:00' is not a time"):
        preprocess(tmp_path / "db", tmp_path / "out")


@pytest.mark.parametrize("table", ["CHARTEVENTS", "ICUSTAYS"])
def test_a_truncated_compressed_table_is_named(tmp_path, table):
    source = _write(tmp_path / "db", _tiny_tables(), gz=True)
    path = source / f"{table}.csv.gz"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # once: pyarrow's "Truncated compressed stream" and a traceback
    with pytest.raises(
        MimicError,
        match=rf"{table}\.csv\.gz: cannot be read to its end \(.*\); a truncated or "
        "damaged file",
    ):
        preprocess(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()
