"""Which coded readings are which of a model's inputs: the table ``codes.csv`` beside this module.

Each row maps a LOINC code to a variable of one dataset's naming (``physionet2012``, whose names the synthetic
cohort shares, or ``physionet2019``), with the unit the dataset records it in, as a UCUM code: a value sent in
another unit is converted where UCUM gives a fixed conversion (``[degF]`` for Temp, ``%`` for FiO2) and refused
otherwise (``garlic.live.values``), since a number read in the wrong unit would be scored as a real, wrong risk;
each variable's plausible range is ``ranges.csv``'s (``Ranges``).

A hospital's own code table (``garlic monitor --codes FILE``: the columns ``variable``, ``system``, ``code`` and,
optionally, ``unit``, ``display`` and ``naming``) is read instead of this one, for a model trained on its own data
(MEDS codes as variable names) or its own coding; every row must name an input of the model, once per code.

Inputs no LOINC code names exactly (the datasets' own coded descriptors: Gender as 0/1, ICUType, MechVent, Unit1,
Unit2, HospAdmTime) and any input of any model may also be sent under ``GARLIC_SYSTEM`` with the model's own name as
the code (``urn:garlic-icu:variable`` ``HR``).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from garlic.config import ConfigError
from garlic.live.values import SAME_NUMBER, Ranges  # noqa: F401  (SAME_NUMBER: read here before)

TABLE = Path(__file__).resolve().parent / "codes.csv"
LOINC = "http://loinc.org"
GARLIC_SYSTEM = "urn:garlic-icu:variable"
UCUM = "http://unitsofmeasure.org"
NAMING_OF_DATASET = {"synthetic": "physionet2012"}  # the synthetic cohort uses PhysioNet 2012's names
REQUIRED_COLUMNS = ("variable", "system", "code")
MAX_TABLE_BYTES = 1 << 20  # a code table is a few hundred rows


@dataclass(frozen=True)
class Code:
    system: str
    code: str
    unit: str = ""
    display: str = ""


def naming(dataset: str) -> str:
    """The variable naming a dataset uses: ``physionet2019-hourly`` -> ``physionet2019``."""
    source = dataset.split("-")[0]
    return NAMING_OF_DATASET.get(source, source)


class Codes:
    """The codes a model's inputs (``names``: its variables and static features) arrive under, both ways."""

    def __init__(self, dataset: str, names: list[str], table: Path | None = None, ranges: Ranges | None = None):
        """``table``: a hospital's own code table, read instead of ``codes.csv`` and checked (``ConfigError``
        naming its file and line); ``ranges``: the plausible ranges (default: ``ranges.csv``'s)."""
        self.names = list(names)
        self.ranges = ranges or Ranges()
        self.listed_in = "garlic/live/codes.csv" if table is None else "the monitor's --codes table"
        self.by_code: dict[tuple[str, str], str] = {(GARLIC_SYSTEM, name): name for name in names}
        self.of_variable: dict[str, Code] = {name: Code(GARLIC_SYSTEM, name) for name in names}
        if table is None:
            rows = [
                row for _, row in _rows(TABLE) if row["naming"] == naming(dataset) and row["variable"] in self.names
            ]
        else:
            rows = _own_rows(Path(table), naming(dataset), self.names)
        for row in rows:
            code = Code(row["system"], row["code"], row.get("unit") or "", row.get("display") or "")
            self.by_code[(code.system, code.code)] = row["variable"]
            self.of_variable[row["variable"]] = code

    def variable(self, system: str | None, code: str | None) -> str | None:
        """The input ``system|code`` names, None when this model reads no such code."""
        return self.by_code.get((system or "", code or ""))

    def unit(self, variable: str) -> str:
        """The UCUM unit the model reads ``variable`` in ("" for the coded descriptors)."""
        return self.of_variable[variable].unit


def _rows(table: Path) -> list[tuple[int, dict]]:
    """The rows of a code table with their line numbers; a table that cannot be read as one is a ``ConfigError``."""
    try:
        if not table.is_file():  # a pipe or a device would block the monitor before it starts
            raise ConfigError(f"the code table {table} is not a file")
        if table.stat().st_size > MAX_TABLE_BYTES:
            raise ConfigError(
                f"the code table {table} is over {MAX_TABLE_BYTES} bytes; a code table is a few hundred rows"
            )
        with open(table, newline="", encoding="utf-8") as lines:
            reader = csv.DictReader(lines)
            missing = [column for column in REQUIRED_COLUMNS if column not in (reader.fieldnames or [])]
            if missing:
                raise ConfigError(
                    f"the code table {table} has no column {', '.join(missing)} (expected a header of "
                    f"{', '.join(REQUIRED_COLUMNS)}, and optionally unit, display, naming)"
                )
            return [
                (reader.line_num, {key: (value or "").strip() for key, value in row.items() if key}) for row in reader
            ]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"the code table {table} cannot be read: {exc}") from None


def _own_rows(table: Path, dataset_naming: str, names: list[str]) -> list[dict]:
    """A hospital's code table's rows for a model of inputs ``names``: those of its naming (all, without a
    ``naming`` column), each checked."""
    rows, seen, inputs = [], {}, set(names)
    for line, row in _rows(table):
        if row.get("naming") and row["naming"] != dataset_naming:
            continue
        where = f"{table} line {line}"
        if not row["system"] or not row["code"]:
            raise ConfigError(f"{where}: system and code are required")
        if row["variable"] not in inputs:
            shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
            raise ConfigError(f"{where}: {row['variable']!r:.80} is not an input of this model ({shown})")
        key = (row["system"], row["code"])
        if key in seen:
            raise ConfigError(f"{where}: {row['system']}|{row['code']} is given already, on line {seen[key]}")
        seen[key] = line
        rows.append(row)
    if not rows:
        raise ConfigError(f"the code table {table} maps no code to an input of this model")
    return rows
