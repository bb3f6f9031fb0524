"""Which coded readings are which of a model's inputs: the table ``codes.csv`` beside this module.

Each row maps a LOINC code to a variable of one dataset's naming (``physionet2012``, whose names the synthetic
cohort shares, or ``physionet2019``), with the unit the dataset records it in, as a UCUM code: a feed must send values
in that unit. Values are not converted; a value sent in another unit (``degF`` for Temp, ``%`` for FiO2) is refused
(``unit_refusal``), since a number read in the wrong unit would be scored as a real, wrong risk.

Inputs no LOINC code names exactly (the datasets' own coded descriptors: Gender as 0/1, ICUType, MechVent, Unit1,
Unit2, HospAdmTime) and any input of any model may also be sent under ``GARLIC_SYSTEM`` with the model's own name as
the code (``urn:garlic-icu:variable`` ``HR``).
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

TABLE = Path(__file__).resolve().parent / "codes.csv"
LOINC = "http://loinc.org"
GARLIC_SYSTEM = "urn:garlic-icu:variable"
UCUM = "http://unitsofmeasure.org"
# Other spellings of the table's UCUM codes that give the same number: what monitors and laboratory systems send.
SAME_NUMBER = {
    "mm[Hg]": ("mmHg", "mm Hg"),
    "[IU]/L": ("IU/L", "U/L", "[U]/L"),
    "Cel": ("°C", "degC"),
    "/min": ("1/min", "{beats}/min", "{breaths}/min", "bpm", "beats/min", "breaths/min"),
    "10*3/uL": ("10^3/uL", "10*9/L", "10^9/L", "K/uL"),
    "ug/L": ("µg/L", "ng/mL"),
    "ng/mL": ("ug/L", "µg/L"),
    "[pH]": ("pH",),
    "a": ("yr", "years", "{years}"),
    "{score}": ("{Score}", "score"),
}
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

    def unit_refusal(self, variable: str, sent: str | None) -> str | None:
        """Why a value of ``variable`` sent in the unit ``sent`` cannot be taken, None when it can: when no unit is
        sent, when the table gives the variable none (the coded descriptors), or when ``sent`` is the table's unit
        or another spelling of it (``SAME_NUMBER``)."""
        expected = self.of_variable[variable].unit
        if not sent or not expected or sent == expected or sent in SAME_NUMBER.get(expected, ()):
            return None
        spellings = ", ".join(repr(s) for s in (expected, *SAME_NUMBER.get(expected, ())))
        return (f"{sent!r:.40} is not the unit of {variable}, which this model reads in {expected} (sent as "
                f"{spellings}); values are not converted")
