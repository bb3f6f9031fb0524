"""Property-based tests: every parser, fed random and adversarial input, ends in a clear error or counted skips.

Never an uncaught exception, never a hang (each example has a deadline), never a half-written dataset: after an
error the destination does not exist and no staging folder is left beside it; after success it is complete.
Parsers: PhysioNet 2012 (archives, record files as uploaded, outcomes), PhysioNet 2019 (folders and archives), the
MIMIC-III tables, and the checksum lists the downloader reads.
"""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
import threading
import zipfile
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from garlic.sources import mimic3, physionet2012, physionet2019, raw, records
from garlic.io.download import DownloadError, parse_checksums
from garlic.io.tables import MANIFEST, NoUsableStayError, read_processed
from garlic.io.tensors import load_tensors

# Derandomised, so that the suite is repeatable; a whole release per example costs about a second, so those
# tests draw fewer examples than the ones that parse a single file.
BOUNDED = settings(
    max_examples=60,
    deadline=timedelta(seconds=20),
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
RELEASES = settings(BOUNDED, max_examples=30)

# --------------------------------------------------------------------------------------------------------------
# Adversarial building blocks
# --------------------------------------------------------------------------------------------------------------

NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.sampled_from(["nan", "NaN", "inf", "-inf", "1e308", "1e309", "-1", "", " ", "1,5", '"', "0x1f", "١٢", "\x00"]),
)
TIMES = st.one_of(
    st.sampled_from(["00:00", "47:59", "48:00", "48:01", "-1:00", "1:60", "99999999999999999999:00", "12", ":", ""]),
    st.tuples(st.integers(0, 10**12), st.integers(0, 99)).map(lambda t: f"{t[0]:02d}:{t[1]:02d}"),
)
P12_PARAMETERS = st.one_of(
    st.sampled_from(sorted(physionet2012.KNOWN_PARAMETERS)), st.sampled_from(["", "hr", "Weight ", "GCS\r", "Ä"])
)
ENCODINGS = st.sampled_from(["utf-8", "utf-16", "latin-1", "utf-8-sig"])


def _encode(text: str, encoding: str) -> bytes:
    return text.encode(encoding, errors="replace")


@st.composite
def p12_record(draw, record_id: int) -> bytes:
    """A record that is mostly right and wrong in drawn ways, or plain random bytes."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=300))
    lines = ["Time,Parameter,Value" if draw(st.integers(0, 9)) else draw(st.text(max_size=20))]
    lines.append(f"00:00,RecordID,{record_id if draw(st.integers(0, 9)) else draw(NUMBERS)}")
    rows = draw(st.lists(st.tuples(TIMES, P12_PARAMETERS, NUMBERS), max_size=12))
    rows += rows[: draw(st.integers(0, 3))]  # duplicated rows
    lines += [",".join(row) for row in rows]
    lines += draw(st.lists(st.text(max_size=30), max_size=2))  # free text
    newline = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    return _encode(newline.join(lines), draw(ENCODINGS))


def _outcomes_text(record_ids: list[int], draw, hostile: bool = True) -> bytes:
    """The outcomes table of ``record_ids``; ``hostile``: with drawn scores, labels, repeats and encodings."""
    lines = [",".join(physionet2012.OUTCOME_COLUMNS)]
    for record_id in record_ids:
        label = draw(st.sampled_from(["0", "1", "1", "2", "nan", ""])) if hostile else "1"
        lines.append(f"{record_id},{draw(NUMBERS) if hostile else 12},1,5,-1,{label}")
    if hostile:
        lines += lines[1 : 1 + draw(st.integers(0, 1))]  # a repeated row
    return _encode("\n".join(lines) + "\n", draw(ENCODINGS) if hostile else "utf-8")


def _tar_gz(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


@contextmanager
def workspace():
    with tempfile.TemporaryDirectory() as folder:
        yield Path(folder)


def assert_complete_or_absent(destination: Path, failed: bool) -> None:
    """Atomic writes: a failed run leaves nothing; a finished one leaves a readable dataset, and no staging."""
    leftovers = [p.name for p in destination.parent.iterdir() if p.name.startswith(f".{destination.name}.")]
    assert not leftovers, leftovers
    if failed:
        assert not destination.exists()
    else:
        assert (destination / MANIFEST).is_file()
        load_tensors(destination)  # and the tensor cache builds from it


def assert_sound(dataset) -> None:
    """What every later stage relies on: finite float32 values and times, 0/1 labels, one row per stay."""
    assert np.isfinite(dataset.observations[["time", "value"]].to_numpy("float32")).all()
    static = dataset.static.drop(columns="stay_id").to_numpy("float32")
    assert not np.isinf(static).any()
    assert dataset.labels["label"].isin([0, 1]).all() and dataset.labels["stay_id"].is_unique


def run_parser(call, error: type[Exception], destination: Path) -> object:
    """``call()``, which may fail only with ``error`` (or, when no record is usable, ``NoUsableStayError``) and a
    message; then the destination is checked."""
    try:
        result = call()
    except (error, NoUsableStayError) as exc:
        assert str(exc).strip()
        assert_complete_or_absent(destination, failed=True)
        return exc
    assert_complete_or_absent(destination, failed=False)
    return result


# --------------------------------------------------------------------------------------------------------------
# PhysioNet 2012
# --------------------------------------------------------------------------------------------------------------


@RELEASES
@given(data=st.data(), count=st.integers(1, 4))
def test_physionet2012_release_of_hostile_records(data, count):
    record_ids = data.draw(st.lists(st.integers(1, 10**12), min_size=count, max_size=count, unique=True))
    members = {f"set-a/{i}.txt": data.draw(p12_record(i)) for i in record_ids}
    with workspace() as folder:
        (folder / "raw").mkdir()
        (folder / "raw" / "set-a.tar.gz").write_bytes(_tar_gz(members))
        # Mostly sound outcomes, so that most examples reach the records.
        hostile = data.draw(st.integers(0, 4)) == 0
        (folder / "raw" / "Outcomes-a.txt").write_bytes(_outcomes_text(record_ids, data.draw, hostile))
        destination = folder / "out"
        result = run_parser(
            lambda: physionet2012.preprocess(folder / "raw", destination), physionet2012.PhysioNet2012Error, destination
        )
        if isinstance(result, dict):  # every skipped line is counted, and named in the manifest
            assert result["counts"]["skipped_lines"] == len(result["skipped_lines"])
            assert_sound(read_processed(destination))


@BOUNDED
@given(data=st.data())
def test_physionet2012_uploaded_record_files(data):
    """The record reader behind ``garlic predict`` and the dashboard's upload: strict, so any bad line is an error."""
    record_id = data.draw(st.integers(1, 10**9))
    name = data.draw(st.sampled_from([f"{record_id}.txt", "..txt", "x.txt", f"{record_id}.TXT"]))
    with workspace() as folder:
        path = folder / name
        path.write_bytes(data.draw(p12_record(record_id)))
        try:
            observations, static = records.read_record_files([path])
        except ValueError as exc:  # PhysioNet2012Error is a ValueError, as is the reader's own suffix check
            assert str(exc).strip()
            return
        assert np.isfinite(observations[["time", "value"]].to_numpy("float32")).all()
        assert len(static) == 1 and not np.isinf(static.drop(columns="stay_id").to_numpy("float32")).any()


P12_RECORD = "Time,Parameter,Value\n00:00,RecordID,{id}\n00:00,Age,60\n{body}\n"


def test_a_record_file_without_an_observation_in_48_h_is_refused_by_name(tmp_path):
    late, sound = tmp_path / "1001.txt", tmp_path / "1002.txt"
    late.write_text(P12_RECORD.format(id=1001, body="49:00,HR,80"))
    sound.write_text(P12_RECORD.format(id=1002, body="00:10,HR,80"))
    for paths in ([late], [sound, late]):  # alone, and hidden among sound files
        with pytest.raises(physionet2012.PhysioNet2012Error, match=rf"^{late}: no observation .* first 48 h"):
            records.read_record_files(paths)
    assert records.read_record_files([sound])[0]["stay_id"].tolist() == [1002]


@pytest.mark.parametrize("name", ["99999999999999999999999.txt", "p99999999999999999999999.psv"])
def test_a_record_id_too_large_for_an_integer_is_refused_by_name(tmp_path, name):
    path = tmp_path / name
    path.write_text(P12_RECORD.format(id=1, body="00:10,HR,80"))
    error = physionet2012.PhysioNet2012Error if name.endswith(".txt") else physionet2019.PhysioNet2019Error
    with pytest.raises(error, match=rf"^{path}: the record id in '{name}' is too large \(at most 9223372036854775807"):
        records.read_record_files([path])
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "set-a.tar.gz").write_bytes(_tar_gz({f"set-a/{name}": path.read_bytes()}))
    (tmp_path / "raw" / "Outcomes-a.txt").write_text(",".join(physionet2012.OUTCOME_COLUMNS) + "\n1,1,1,1,1,0\n")
    if name.endswith(".txt"):  # a tar member of that name in a release
        with pytest.raises(physionet2012.PhysioNet2012Error, match=rf"set-a.tar.gz: the record id in '{name}' is too"):
            physionet2012.preprocess(tmp_path / "raw", tmp_path / "out")


def test_one_stay_in_two_files_is_refused_naming_both(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = tmp_path / "a" / "1001.txt", tmp_path / "b" / "1001.txt"
    for path in (first, second):
        path.write_text(P12_RECORD.format(id=1001, body="00:10,HR,80"))
    with pytest.raises(physionet2012.PhysioNet2012Error, match=rf"^stay 1001 is in two files: {first} and {second}$"):
        records.read_record_files([first, second])
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "set-a.tar.gz").write_bytes(_tar_gz({"set-a/1001.txt": first.read_bytes()}))
    (tmp_path / "raw" / "set-b.tar.gz").write_bytes(_tar_gz({"set-b/1001.txt": first.read_bytes()}))
    for outcomes, stay in (("Outcomes-a.txt", 1001), ("Outcomes-b.txt", 1002)):
        (tmp_path / "raw" / outcomes).write_bytes(_outcomes_text([stay], None, hostile=False))
    with pytest.raises(
        physionet2012.PhysioNet2012Error,
        match=r"^stay 1001 is in two files: set-a.tar.gz:set-a/1001"
        r".txt and set-b.tar.gz:set-b/1001.txt$",
    ):
        physionet2012.preprocess(tmp_path / "raw", tmp_path / "out")


def test_a_record_file_that_is_not_a_record_is_named_but_not_quoted(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("kept-private:x:0:0:/home/kept-private:/bin/bash\nsecond line\n")  # as /etc/passwd
    link = tmp_path / "132539.txt"
    link.symlink_to(secret)
    with pytest.raises(physionet2012.PhysioNet2012Error) as refused:
        records.read_record_files([link])
    assert str(refused.value).startswith(f"{link} line 1: expected header")
    assert "kept-private" not in str(refused.value) and "second" not in str(refused.value)


def test_a_line_longer_than_a_csv_block_is_a_skip_naming_file_and_line(tmp_path):
    # One 1.5 MiB line (pyarrow reads 1 MiB blocks): once an error naming no file ("straddling object").
    members = {
        "set-a/1001.txt": P12_RECORD.format(id=1001, body=f"00:10,HR,80\n00:11,HR,{'9' * (3 << 19)}").encode(),
        "set-a/1002.txt": P12_RECORD.format(id=1002, body="00:10,HR,81").encode(),
    }
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "set-a.tar.gz").write_bytes(_tar_gz(members))
    (tmp_path / "raw" / "Outcomes-a.txt").write_bytes(_outcomes_text([1001, 1002], None, hostile=False))
    manifest = physionet2012.preprocess(tmp_path / "raw", tmp_path / "out")
    assert manifest["skipped_lines"] == [
        "set-a.tar.gz:set-a/1001.txt line 5: line of 1,572,873 bytes, longer than the 65,536 a record line may have"
    ]
    assert read_processed(tmp_path / "out").observations["value"].tolist() == [80, 81]


@RELEASES
@given(payload=st.binary(max_size=2000), truncate=st.booleans())
def test_physionet2012_random_or_truncated_archive_is_a_clear_error(payload, truncate):
    with workspace() as folder:
        (folder / "raw").mkdir()
        archive = _tar_gz({"set-a/1.txt": b"Time,Parameter,Value\n00:00,RecordID,1\n00:10,HR,80\n"})
        (folder / "raw" / "set-a.tar.gz").write_bytes(archive[: len(archive) // 2] if truncate else payload)
        (folder / "raw" / "Outcomes-a.txt").write_text(",".join(physionet2012.OUTCOME_COLUMNS) + "\n1,1,1,1,1,0\n")
        destination = folder / "out"
        run_parser(
            lambda: physionet2012.preprocess(folder / "raw", destination), physionet2012.PhysioNet2012Error, destination
        )


@pytest.mark.parametrize("member", ["../1.txt", "set-a/../../1.txt", "/tmp/1.txt"])
def test_physionet2012_archive_member_escaping_its_folder_is_refused(tmp_path, member):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "set-a.tar.gz").write_bytes(_tar_gz({member: b"Time,Parameter,Value\n00:00,RecordID,1\n"}))
    (tmp_path / "raw" / "Outcomes-a.txt").write_text(",".join(physionet2012.OUTCOME_COLUMNS) + "\n1,1,1,1,1,0\n")
    with pytest.raises(physionet2012.PhysioNet2012Error, match="escapes its folder; refusing the archive"):
        physionet2012.preprocess(tmp_path / "raw", tmp_path / "out")
    assert not (tmp_path / "out").exists()


@BOUNDED
@given(data=st.data())
def test_physionet2012_outcomes_table(data):
    if data.draw(st.booleans()):
        payload = data.draw(st.binary(max_size=500))
    else:
        payload = _outcomes_text(data.draw(st.lists(st.integers(-5, 10**20), max_size=5)), data.draw)
    with workspace() as folder:
        (folder / "Outcomes-a.txt").write_bytes(payload)
        try:
            outcomes = physionet2012.read_outcomes(folder / "Outcomes-a.txt")
        except physionet2012.PhysioNet2012Error as exc:
            assert "Outcomes-a.txt" in str(exc)
            return
        assert outcomes[physionet2012.LABEL].isin([0, 1]).all() and outcomes["RecordID"].is_unique


# --------------------------------------------------------------------------------------------------------------
# Download checksum lists
# --------------------------------------------------------------------------------------------------------------


@BOUNDED
@given(text=st.text(max_size=400))
def test_checksum_lists_parse_or_are_refused_by_line(text):
    try:
        sums = parse_checksums(text, "SHA256SUMS.txt")
    except DownloadError as exc:
        assert "SHA256SUMS.txt line " in str(exc)
        return
    for path, digest in sums.items():
        assert ".." not in Path(path).parts and not path.startswith("/") and len(digest) == 64


# --------------------------------------------------------------------------------------------------------------
# PhysioNet 2019
# --------------------------------------------------------------------------------------------------------------


@st.composite
def p19_record(draw) -> bytes:
    """Hourly rows that are mostly right: drawn cells, hours, repeated rows, encodings; or random bytes."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=300))
    width = len(physionet2019.COLUMNS)
    header = physionet2019.HEADER.decode() if draw(st.integers(0, 9)) else draw(st.text(max_size=30))
    lines = [header]
    for hour in range(1, draw(st.integers(0, 6)) + 1):
        cells = [draw(st.one_of(NUMBERS, st.just("NaN"), st.just("80"))) for _ in range(width - 2)]
        hour_cell = str(hour) if draw(st.integers(0, 4)) else draw(NUMBERS)
        lines.append("|".join([*cells, hour_cell, draw(st.sampled_from(["0", "1", "2", "NaN", ""]))]))
        if draw(st.integers(0, 5)) == 0:
            lines.append(lines[-1])  # a duplicated hour
    if draw(st.integers(0, 5)) == 0:
        lines.append("|".join(["1"] * draw(st.integers(1, width + 3))))  # a row of the wrong width
    return _encode(draw(st.sampled_from(["\n", "\r\n"])).join(lines) + "\n", draw(ENCODINGS))


@RELEASES
@given(data=st.data(), count=st.integers(1, 3), packing=st.sampled_from(["folder", "zip", "tar.gz"]))
def test_physionet2019_training_set_of_hostile_records(data, count, packing):
    # One sound stay beside the hostile ones: a set with no readable row at all is a known bug (tested below).
    sound = physionet2019.HEADER + b"\n" + b"|".join([b"80"] * (len(physionet2019.COLUMNS) - 2) + [b"1", b"0"]) + b"\n"
    files = {"training_setA/p000000.psv": sound}
    files |= {f"training_setA/p{i:06d}.psv": data.draw(p19_record()) for i in range(1, count + 1)}
    cohort = data.draw(st.sampled_from(sorted(physionet2019.COHORTS)))
    with workspace() as folder:
        raw = folder / "raw"
        raw.mkdir()
        if packing == "folder":
            for name, payload in files.items():
                (raw / name).parent.mkdir(exist_ok=True)
                (raw / name).write_bytes(payload)
        else:
            pack = _zip if packing == "zip" else _tar_gz
            (raw / f"training_setA.{packing}").write_bytes(pack(files))
        destination = folder / "out"
        result = run_parser(
            lambda: physionet2019.preprocess(raw, destination, cohort=cohort),
            physionet2019.PhysioNet2019Error,
            destination,
        )
        if isinstance(result, dict):
            assert result["counts"]["skipped_lines"] == len(result["skipped_lines"])
            assert_sound(read_processed(destination))


@pytest.mark.parametrize("packing", ["zip", "tar.gz"])
@pytest.mark.parametrize("member", ["../p000001.psv", "training_setA/../../p000001.psv", "/tmp/p000001.psv"])
def test_physionet2019_archive_member_escaping_its_folder_is_refused(tmp_path, packing, member):
    (tmp_path / "raw").mkdir()
    pack = _zip if packing == "zip" else _tar_gz
    (tmp_path / "raw" / f"training_setA.{packing}").write_bytes(pack({member: physionet2019.HEADER + b"\n"}))
    with pytest.raises(physionet2019.PhysioNet2019Error, match="escapes its folder"):
        physionet2019.preprocess(tmp_path / "raw", tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "payload",
    [
        b"",  # an empty file: the one-pass reader gets no bytes at all ('Empty CSV file')
        physionet2019.HEADER + b"\n\x80\n",  # a malformed row that is not UTF-8: pyarrow cannot even report it
    ],
    ids=["empty file", "non-UTF-8 row"],
)
def test_physionet2019_empty_or_undecodable_files_end_in_a_clear_error_or_skip(tmp_path, payload):
    (tmp_path / "raw" / "training_setA").mkdir(parents=True)
    (tmp_path / "raw" / "training_setA" / "p000001.psv").write_bytes(payload)
    run_parser(
        lambda: physionet2019.preprocess(tmp_path / "raw", tmp_path / "out"),
        physionet2019.PhysioNet2019Error,
        tmp_path / "out",
    )


def test_physionet2019_a_line_longer_than_a_csv_block_is_a_skip_naming_file_and_line(tmp_path):
    row = b"|".join([b"80"] * (len(physionet2019.COLUMNS) - 2) + [b"1", b"0"])
    (tmp_path / "raw" / "training_setA").mkdir(parents=True)
    long_row = b"9" * (3 << 19) + row[2:].replace(b"|1|0", b"|2|0")
    (tmp_path / "raw" / "training_setA" / "p000001.psv").write_bytes(b"\n".join([physionet2019.HEADER, row, long_row]))
    manifest = physionet2019.preprocess(tmp_path / "raw", tmp_path / "out")
    assert len(manifest["skipped_lines"]) == 1
    assert manifest["skipped_lines"][0].startswith("training_setA/p000001.psv line 3: line of 1,57")


def test_physionet2019_a_record_file_without_an_observation_in_the_window_is_refused_by_name(tmp_path):
    late = tmp_path / "p000001.psv"  # one row, at ICU hour 49
    row = b"|".join([b"80"] * (len(physionet2019.COLUMNS) - 2) + [b"49", b"0"])
    late.write_bytes(physionet2019.HEADER + b"\n" + row)
    with pytest.raises(physionet2019.PhysioNet2019Error, match=rf"^{late}: no observation .*\(ICULOS <= 48\)"):
        records.read_record_files([late])


@RELEASES
@given(payload=st.binary(max_size=2000), packing=st.sampled_from(["zip", "tar.gz"]))
def test_physionet2019_random_archive_is_a_clear_error(payload, packing):
    with workspace() as folder:
        (folder / "raw").mkdir()
        (folder / "raw" / f"training_setA.{packing}").write_bytes(payload)
        destination = folder / "out"
        run_parser(
            lambda: physionet2019.preprocess(folder / "raw", destination), physionet2019.PhysioNet2019Error, destination
        )


# --------------------------------------------------------------------------------------------------------------
# MIMIC-III tables
# --------------------------------------------------------------------------------------------------------------

STAYS = (
    "ROW_ID,SUBJECT_ID,HADM_ID,ICUSTAY_ID,FIRST_CAREUNIT,LAST_CAREUNIT,FIRST_WARDID,LAST_WARDID,INTIME,OUTTIME,LOS\n"
    "1,1,11,101,MICU,MICU,1,1,2150-01-01 10:00:00,2150-01-04 10:00:00,3.0\n"
)
ADMISSIONS = (
    "ROW_ID,SUBJECT_ID,HADM_ID,ADMITTIME,DISCHTIME,DEATHTIME\n1,1,11,2150-01-01 05:00:00,2150-01-06 00:00:00,\n"
)
PATIENTS = "ROW_ID,SUBJECT_ID,GENDER,DOB,DOD\n1,1,F,2100-01-01 00:00:00,\n"
CHART_HEADER = "ROW_ID,SUBJECT_ID,HADM_ID,ICUSTAY_ID,ITEMID,CHARTTIME,VALUE,VALUENUM,VALUEUOM,ERROR"
LAB_HEADER = "ROW_ID,SUBJECT_ID,HADM_ID,ITEMID,CHARTTIME,VALUE,VALUENUM,VALUEUOM"


@st.composite
def chart_rows(draw) -> str:
    """CHARTEVENTS rows of heart rate (220045) with drawn times, values, ids, duplicates, wrong widths."""
    rows = []
    for number in range(draw(st.integers(0, 6))):
        hour = draw(st.sampled_from(["11", "12", "23", "59", "xx", ""]))
        time = draw(st.sampled_from([f"2150-01-01 {hour}:00:00", "2150-02-30 10:00:00", "", "now"]))
        value = draw(NUMBERS)
        stay = draw(st.sampled_from(["101", "", "999", "abc", "1e30"]))
        rows.append(
            f"{number},1,11,{stay},{draw(st.sampled_from(['220045', '211', 'x']))},{time},{value},"
            f"{value},bpm,{draw(st.sampled_from(['0', '1', '', 'x']))}"
        )
        if draw(st.integers(0, 4)) == 0:
            rows.append(rows[-1])
    if draw(st.booleans()):
        rows.append(draw(st.text(max_size=40)).replace("\r", ""))
    return "\n".join(rows)


@RELEASES
@given(data=st.data())
def test_mimic3_tables_with_hostile_rows(data):
    chart = f"{CHART_HEADER}\n{data.draw(chart_rows())}\n"
    tables = {
        "ICUSTAYS": STAYS,
        "ADMISSIONS": ADMISSIONS,
        "PATIENTS": PATIENTS,
        "CHARTEVENTS": chart,
        "LABEVENTS": f"{LAB_HEADER}\n",
    }
    victim = data.draw(st.sampled_from([None, *tables]))  # one table may be replaced by random bytes
    encoding = data.draw(ENCODINGS)
    with workspace() as folder:
        raw = folder / "raw"
        raw.mkdir()
        for name, text in tables.items():
            payload = data.draw(st.binary(max_size=300)) if name == victim else _encode(text, encoding)
            (raw / f"{name}.csv").write_bytes(payload)
        destination = folder / "out"
        result = run_parser(lambda: mimic3.preprocess(raw, destination), mimic3.MimicError, destination)
        if isinstance(result, dict):
            assert_sound(read_processed(destination))


def test_mimic3_a_malformed_row_that_is_not_utf8_is_a_clear_error(tmp_path):
    tables = {
        "ICUSTAYS": STAYS,
        "ADMISSIONS": ADMISSIONS,
        "PATIENTS": PATIENTS,
        "CHARTEVENTS": f"{CHART_HEADER}\n",
        "LABEVENTS": f"{LAB_HEADER}\n",
    }
    (tmp_path / "raw").mkdir()
    for name, text in tables.items():
        (tmp_path / "raw" / f"{name}.csv").write_bytes(text.encode() + (b"\x80\n" if name == "CHARTEVENTS" else b""))
    run_parser(lambda: mimic3.preprocess(tmp_path / "raw", tmp_path / "out"), mimic3.MimicError, tmp_path / "out")


# --------------------------------------------------------------------------------------------------------------
# Bounded reads: what is not a regular file, or too large to be a record, is not read
# --------------------------------------------------------------------------------------------------------------

P19_ROW = b"|".join([b"80"] * (len(physionet2019.COLUMNS) - 2) + [b"1", b"0"])


def unreadable_records(folder: Path, name) -> dict[str, str]:
    """Beside the sound record 1: files named like records 2-6 that must not be read, and why each is refused."""
    folder.mkdir(parents=True, exist_ok=True)
    os.mkfifo(folder / name(2))  # opening it to read would wait for a writer forever
    (folder / name(3)).symlink_to("/dev/zero")  # read whole, it never ends
    (folder / name(4)).symlink_to(folder / name(4))  # a loop
    (folder / name(5)).mkdir()
    (folder / name(6)).write_bytes(b"9" * ((2 << 20) + 1))
    return {
        name(2): "not a regular file (a FIFO); not read",
        name(3): "not a regular file (a device or socket); not read",
        name(4): "a symbolic link loop; not read",
        name(5): "not a regular file (a folder); not read",
        name(6): "2,097,153 bytes, more than the 2,097,152 a record file may have; not read",
    }


def finishing(call, seconds: float = 60):
    """``call()`` in a thread that must end within ``seconds`` (a FIFO once hung the folder readers)."""
    outcome = {}

    def run() -> None:
        try:
            outcome["result"] = call()
        except Exception as exc:  # raised again in the test's own thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "still reading"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


@pytest.mark.parametrize("source", ["physionet2012", "physionet2019"])
def test_a_folder_source_skips_and_counts_what_is_not_a_record_file(tmp_path, source):
    if source == "physionet2012":
        folder, name = tmp_path / "raw" / "set-a", lambda i: f"100{i}.txt"
        (folder.parent / "Outcomes-a.txt").parent.mkdir(parents=True)
        (folder.parent / "Outcomes-a.txt").write_bytes(_outcomes_text([1001], None, hostile=False))
        folder.mkdir()
        (folder / name(1)).write_text(P12_RECORD.format(id=1001, body="00:10,HR,80"))
        preprocess, error = physionet2012.preprocess, physionet2012.PhysioNet2012Error
    else:
        folder, name = tmp_path / "raw" / "training_setA", lambda i: f"p00000{i}.psv"
        folder.mkdir(parents=True)
        (folder / name(1)).write_bytes(physionet2019.HEADER + b"\n" + P19_ROW + b"\n")
        preprocess, error = physionet2019.preprocess, physionet2019.PhysioNet2019Error
    refused = unreadable_records(folder, name)
    manifest = finishing(lambda: preprocess(tmp_path / "raw", tmp_path / "out"))
    assert manifest["counts"]["stays"] == 1 and manifest["counts"]["skipped_lines"] == 5
    assert manifest["skipped_lines"] == [f"{folder.name}/{file}: {reason}" for file, reason in refused.items()]
    with pytest.raises(error, match=f"^{folder.name}/{name(2)}: not a regular file"):  # --strict stops at the first
        finishing(lambda: preprocess(tmp_path / "raw", tmp_path / "strict", strict=True))


def test_a_record_file_given_to_predict_that_cannot_be_one_is_refused_saying_why(tmp_path):
    refused = unreadable_records(tmp_path, lambda i: f"100{i}.txt")
    del refused["1005.txt"]  # a folder given as input stands for the record files in it
    for file, reason in refused.items():
        with pytest.raises(physionet2012.PhysioNet2012Error) as error:
            finishing(lambda: records.read_record_files([tmp_path / file]))
        assert str(error.value).startswith(f"{tmp_path / file}: {reason}")


@pytest.mark.parametrize("packing", ["zip", "tar.gz"])
def test_an_archive_member_too_large_for_a_record_is_skipped_unread(tmp_path, packing):
    pack = _zip if packing == "zip" else _tar_gz
    sound = physionet2019.HEADER + b"\n" + P19_ROW + b"\n"
    members = {"training_setA/p000001.psv": sound, "training_setA/p000002.psv": b"0" * (100 << 20)}  # 0.1 MB zipped
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / f"training_setA.{packing}").write_bytes(pack(members))
    manifest = physionet2019.preprocess(tmp_path / "raw", tmp_path / "out")
    assert manifest["counts"]["stays"] == 1
    assert manifest["skipped_lines"] == [
        f"training_setA.{packing}:training_setA/p000002.psv: 104,857,600 bytes, more "
        "than the 2,097,152 a record file may have; not read"
    ]


def test_records_adding_up_past_the_source_budget_stop_the_reader_naming_the_record(tmp_path, monkeypatch):
    folder = tmp_path / "raw" / "training_setA"
    folder.mkdir(parents=True)
    for stay in (1, 2, 3):
        (folder / f"p00000{stay}.psv").write_bytes(physionet2019.HEADER + b"\n" + P19_ROW + b"\n")
    monkeypatch.setattr(raw, "MAX_SOURCE_BYTES", 2 * len(physionet2019.HEADER + P19_ROW) + 4)  # two records fit
    with pytest.raises(
        physionet2019.PhysioNet2019Error,
        match="^training_setA/p000003.psv: the records read so far add up to more than",
    ):
        physionet2019.preprocess(tmp_path / "raw", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_byte_order_mark_or_an_underscored_number_is_named_as_such(tmp_path):
    bom = tmp_path / "1001.txt"
    bom.write_bytes(raw.BYTE_ORDER_MARK + P12_RECORD.format(id=1001, body="00:10,HR,80").encode())
    with pytest.raises(physionet2012.PhysioNet2012Error, match="first line starts with a byte-order mark"):
        records.read_record_files([bom])
    underscored = tmp_path / "1002.txt"
    underscored.write_text(P12_RECORD.format(id=1002, body="00:10,HR,80\n00:20,HR,1_000"))
    with pytest.raises(physionet2012.PhysioNet2012Error, match=r"line 5: unparseable value '1_000' for HR"):
        records.read_record_files([underscored])
    psv = tmp_path / "p000001.psv"
    psv.write_bytes(raw.BYTE_ORDER_MARK + physionet2019.HEADER + b"\n" + P19_ROW + b"\n")
    with pytest.raises(physionet2019.PhysioNet2019Error, match="first line starts with a byte-order mark"):
        records.read_record_files([psv])
