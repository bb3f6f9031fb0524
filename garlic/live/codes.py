"""Which coded readings are which of a model's inputs: the table ``codes.csv`` beside this module.

Each row maps a LOINC code to a variable of one dataset's naming (``physionet2012``, whose names the synthetic
cohort shares, or ``physionet2019``), with the unit the dataset records it in: a feed must send values in that unit
(the table documents it; values are not converted). Inputs no LOINC code names exactly (the datasets' own coded
descriptors: Gender as 0/1, ICUType, MechVent, Unit1, Unit2, HospAdmTime) and any input of any model may also be sent
under ``GARLIC_SYSTEM`` with the model's own name as the code (``urn:garlic-icu:variable`` ``HR``).
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

TABLE = Path(__file__).resolve().parent / "codes.csv"
LOINC = "http://loinc.org"
GARLIC_SYSTEM = "urn:garlic-icu:variable"
NAMING_OF_DATASET = {"synthetic": "physionet2012"}  # the synthetic cohort uses PhysioNet 2012's names


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

    def __init__(self, dataset: str, names: list[str], table: Path = TABLE):
        self.names = list(names)
        self.by_code: dict[tuple[str, str], str] = {(GARLIC_SYSTEM, name): name for name in names}
        self.of_variable: dict[str, Code] = {name: Code(GARLIC_SYSTEM, name) for name in names}
        with open(table, newline="") as rows:
            for row in csv.DictReader(rows):
                if row["naming"] == naming(dataset) and row["variable"] in self.of_variable:
                    code = Code(row["system"], row["code"], row["unit"], row["display"])
                    self.by_code[(code.system, code.code)] = row["variable"]
                    self.of_variable[row["variable"]] = code

    def variable(self, system: str | None, code: str | None) -> str | None:
        """The input ``system|code`` names, None when this model reads no such code."""
        return self.by_code.get((system or "", code or ""))
