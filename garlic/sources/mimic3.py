"""MIMIC-III v1.4 -> 48-hour in-hospital mortality tables (see ``tables``), streaming the large event tables.

Source format. The MIMIC-III Clinical Database v1.4 is one ``TABLE.csv`` (or ``TABLE.csv.gz``) per table. The
full database spells column names in upper case (``ICUSTAY_ID``), the 100-patient demo in lower case: names are
matched case-insensitively, and a table may be named in either case. The tables read are ADMISSIONS, ICUSTAYS,
PATIENTS (whole: they are small) and the event tables CHARTEVENTS, LABEVENTS, OUTPUTEVENTS, INPUTEVENTS_CV and
INPUTEVENTS_MV, which are *streamed*: CHARTEVENTS alone is 330 million rows (33 GB).

Streaming. Each event table is read with pyarrow's streaming CSV reader (``pyarrow.csv.open_csv``), only the
needed columns, in blocks of ``block_size`` bytes. Every record batch is filtered, vectorised, to the cohort's
patients and the variables' ITEMIDs, then joined to the cohort's ICU stays (a pandas merge on SUBJECT_ID) and cut
to the observation window; only the rows that survive are kept, as four compact columns. Peak memory is thus one
block plus the kept observations, whatever the table's size (measured by ``experiments/benchmark_mimic_streaming``).
Rows that the CSV parser cannot split into the header's fields, and rows whose id or time cannot be read, are
counted and skipped; the manifest lists the counts and the first examples per table. A row whose ROW_ID an earlier
row of its table had (a file concatenated twice, an export repeated) is read once: a second OUTPUTEVENTS row would
double a volume, which outputs at one time add up to; each table's ``repeated_rows`` counts them. A column named
twice in a header (``SUBJECT_ID`` and ``subject_id``: names are matched ignoring case) is refused.

Time is hours since the ICU stay's INTIME. The stay id is ICUSTAY_ID. An event belongs to a stay when it is the
patient's, its time lies in the window [INTIME, INTIME + 48 h] (both ends included, as in mimic3-benchmarks), and
its ICUSTAY_ID, when the row has one, is the stay's. Events without an ICUSTAY_ID (all of LABEVENTS) are attached
by patient and time, as mimic3-benchmarks does. Input events of INPUTEVENTS_MV are placed at STARTTIME but kept
only when their ENDTIME is inside the window too, because their AMOUNT is only known once they end; so no
information from after the window reaches the input. Rows flagged ERROR/ISERROR = 1 and MetaVision input rows with
STATUSDESCRIPTION "Rewritten" (superseded orders) are dropped. A value of 0 is an observation like any other
(urine output of 0 mL, PEEP of 0 cmH2O): nothing is dropped for being zero. Outputs (OUTPUTEVENTS) charted for a
stay at the same time (a Foley and a void together) are summed into one observation; the tensors keep the later
of any other variable's simultaneous values.

An ICU stay whose OUTTIME is before its INTIME is dropped and counted (``strict``: refused, naming its line).

Cohorts (``COHORTS``), both with label = death in hospital (DEATHTIME, or else DOD, between ADMITTIME and
DISCHTIME, the mimic3-benchmarks rule), window = first 48 h of the ICU stay, static features Age (years at INTIME;
MIMIC shifts ages over 89 to about 300, these become 90) and Gender (1 = male, 0 = female):

- ``benchmark`` (default): the mimic3-benchmarks in-hospital-mortality task (Harutyunyan et al., Sci Data 2019).
  ICU stays without a transfer (same first and last care unit and ward), in admissions with exactly one such ICU
  stay, patients aged 18 or more at INTIME, ICU length of stay (LOS) of at least 48 h, at least one event of the 17
  variables in the window. Variables: the 17 of ``BENCHMARK_VARIABLES``, with exactly the ITEMIDs that
  mimic3-benchmarks' ``itemid_to_variable_map.csv`` marks "ready" (including, as there, urine glucose and urine pH
  lab items), read from CHARTEVENTS and LABEVENTS. Cleaning follows mimic3-benchmarks' ``preprocessing.py``:
  systolic/diastolic pressure from "120/80" text, capillary refill "Normal <3 secs"/"Brisk" -> 0 and
  "Abnormal >3 secs"/"Delayed" -> 1, FiO2 > 1 divided by 100, oxygen saturation <= 1 multiplied by 100,
  temperature converted from Fahrenheit for Fahrenheit items or values >= 79, weight from pounds and ounces,
  height from inches; GCS text is scored 1-6 (MIMIC's VALUENUM already holds that score). Differences, stated
  honestly: mimic3-benchmarks' Fahrenheit test (``'F' in s.lower()``) never fires, so it converts only values
  >= 79; here Fahrenheit items are converted whatever their value (a 78 F reading would otherwise stay 78 "C").
  It rounds heights to whole cm; here they are not rounded. It does not drop ERROR = 1 rows; here they are
  dropped. It keeps every value; so does this cohort (no range filter).
- ``garlic``: a Warpformer/STraTS-style extraction for comparison with the paper: the ~100 variables of
  ``GARLIC_VARIABLES`` (vital signs and ventilator settings from CHARTEVENTS, laboratory values from LABEVENTS,
  urine and stool output from OUTPUTEVENTS, drug and fluid amounts from both INPUTEVENTS tables), with unit
  harmonisation (Fahrenheit -> Celsius, pounds and ounces -> kg, inches -> cm, percent -> fraction for FiO2,
  mcg and g -> mg, L -> mL for inputs; input rows in other units are dropped and counted) and the physiological
  ranges of the table (values outside are dropped and counted per variable). ICU stays of adults (18+) with LOS of
  at least 48 h and at least one event in the window; all ICU stays of an admission are kept. The reference
  implementation's code is not available here: the variable list and ranges approximate its description (103
  variables from the four event sources), they do not reproduce it item for item; unlike it, zeros are kept.
"""

from __future__ import annotations

import logging
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from garlic.io.tables import read_manifest, sha256_of, sum_simultaneous, write_processed
from garlic.sources import Source

log = logging.getLogger(__name__)

WINDOW_HOURS = 48.0
ADULT_AGE = 18.0
SHIFTED_AGE = 90.0  # ages over 89 are shifted to ~300 in MIMIC-III
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
DEFAULT_BLOCK_SIZE = 16 << 20
MAX_EXAMPLES = 20


class MimicError(ValueError):
    """Input that cannot be read as MIMIC-III; the message names the table (and column)."""


# ---------------------------------------------------------------------------------------------------------------
# Variables: name, source table, ITEMIDs, conversion, physiological range


@dataclass(frozen=True)
class Variable:
    """One output variable. ``items`` maps a source ('chart', 'lab', 'output', 'input') to its ITEMIDs.

    ``convert`` maps an ITEMID to the name of its conversion (see ``CONVERSIONS``); ``unit`` is the target unit of
    input amounts; ``low``/``high`` bound accepted values after conversion (``None``: no range filter).
    """

    name: str
    items: dict[str, tuple[int, ...]]
    convert: dict[int, str] = field(default_factory=dict)
    unit: str | None = None
    low: float | None = None
    high: float | None = None


_SBP = (51, 220050, 225309, 6701, 455, 220179, 3313, 3315, 442, 3317, 3323, 3321, 224167, 227243)
_DBP = (8368, 220051, 225310, 8555, 8441, 220180, 8502, 8440, 8503, 8504, 8507, 8506, 224643)
_MAP = (52, 220052, 225312, 224, 6702, 224322, 456, 220181, 3312, 3314, 3316, 3322, 3320)
_RR = (618, 220210, 3603, 224689, 614, 651, 224422, 615, 224690)
_TEMP_C, _TEMP_F = (3655, 677, 676, 223762), (3654, 678, 223761, 679)
_WEIGHT_KG, _WEIGHT_LB, _WEIGHT_OZ = (763, 224639, 226512, 3580, 3693), (3581, 226531), (3582,)
_HEIGHT_IN, _HEIGHT_CM = (226707, 1394), (226730,)
_FIO2 = (3420, 223835, 3422, 189, 727)
_CRR = (3348, 115, 8377)
_GLUCOSE_CHART = (807, 811, 1529, 3745, 225664, 220621, 226537)

_TEMPERATURE = {**{i: "celsius_or_fahrenheit" for i in _TEMP_C}, **{i: "fahrenheit" for i in _TEMP_F}}
_WEIGHT = {**{i: "pounds" for i in _WEIGHT_LB}, **{i: "ounces" for i in _WEIGHT_OZ}}

# mimic3-benchmarks' 17 variables, with the ITEMIDs its itemid_to_variable_map.csv marks "ready".
BENCHMARK_VARIABLES = [
    Variable("Capillary refill rate", {"chart": _CRR}, {i: "capillary_refill" for i in _CRR}),
    Variable("Diastolic blood pressure", {"chart": _DBP}, {i: "diastolic_text" for i in _DBP}),
    Variable("Fraction inspired oxygen", {"chart": _FIO2}, {i: "percent_to_fraction" for i in _FIO2}),
    Variable("Glascow coma scale eye opening", {"chart": (184, 220739)}, {184: "gcs", 220739: "gcs"}),
    Variable("Glascow coma scale motor response", {"chart": (454, 223901)}, {454: "gcs", 223901: "gcs"}),
    Variable("Glascow coma scale total", {"chart": (198,)}),
    Variable("Glascow coma scale verbal response", {"chart": (723, 223900)}, {723: "gcs", 223900: "gcs"}),
    Variable("Glucose", {"chart": _GLUCOSE_CHART, "lab": (50931, 50809, 51478)}),
    Variable("Heart Rate", {"chart": (211, 220045)}),
    Variable("Height", {"chart": _HEIGHT_IN + _HEIGHT_CM}, {i: "inches" for i in _HEIGHT_IN}),
    Variable("Mean blood pressure", {"chart": _MAP}),
    Variable(
        "Oxygen saturation",
        {"chart": (834, 8498, 220227, 646, 220277), "lab": (50817,)},
        {i: "fraction_to_percent" for i in (834, 8498, 220227, 646, 220277, 50817)},
    ),
    Variable("Respiratory rate", {"chart": _RR}),
    Variable("Systolic blood pressure", {"chart": _SBP}, {i: "systolic_text" for i in _SBP}),
    Variable("Temperature", {"chart": _TEMP_C + _TEMP_F}, _TEMPERATURE),
    Variable("Weight", {"chart": _WEIGHT_KG + _WEIGHT_LB + _WEIGHT_OZ}, _WEIGHT),
    Variable(
        "pH", {"chart": (3839, 1673, 780, 1126, 223830, 4753, 4202, 860, 220274), "lab": (50820, 51491, 50831, 51094)}
    ),
]


def _chart(name, items, low, high, convert=None):
    return Variable(name, {"chart": tuple(items)}, convert or {}, None, low, high)


def _lab(name, items, low, high):
    return Variable(name, {"lab": tuple(items)}, {}, None, low, high)


def _input(name, items, unit, high):
    return Variable(name, {"input": tuple(items)}, {}, unit, 0.0, high)


def _output(name, items, high):
    return Variable(name, {"output": tuple(items)}, {}, None, 0.0, high)


# The garlic cohort's variables. Labs come from LABEVENTS only (MetaVision copies some into CHARTEVENTS: reading
# both would count them twice); bedside glucose and saturation come from CHARTEVENTS as well.
GARLIC_VARIABLES = [
    # vital signs and bedside scores (CHARTEVENTS)
    _chart("Heart rate", (211, 220045), 0, 350),
    _chart("Systolic BP", _SBP, 0, 375, {i: "systolic_text" for i in _SBP}),
    _chart("Diastolic BP", _DBP, 0, 375, {i: "diastolic_text" for i in _DBP}),
    _chart("Mean BP", _MAP, 0, 375),
    _chart("Respiratory rate", _RR, 0, 300),
    _chart("SpO2", (646, 220277), 0, 100, {646: "fraction_to_percent", 220277: "fraction_to_percent"}),
    Variable(
        "SaO2",
        {"chart": (834, 220227), "lab": (50817,)},
        {834: "fraction_to_percent", 220227: "fraction_to_percent"},
        None,
        0,
        100,
    ),
    _chart("Temperature", _TEMP_C + _TEMP_F, 14.2, 47, _TEMPERATURE),
    _chart("FiO2", _FIO2, 0.2, 1.0, {i: "percent_to_fraction" for i in _FIO2}),
    _chart("GCS eye", (184, 220739), 1, 4, {184: "gcs", 220739: "gcs"}),
    _chart("GCS motor", (454, 223901), 1, 6, {454: "gcs", 223901: "gcs"}),
    _chart("GCS verbal", (723, 223900), 1, 5, {723: "gcs", 223900: "gcs"}),
    _chart("GCS total", (198,), 3, 15),
    _chart("Capillary refill", _CRR + (224308, 223951), 0, 1, {i: "capillary_refill" for i in _CRR + (224308, 223951)}),
    _chart("Weight", _WEIGHT_KG + _WEIGHT_LB + _WEIGHT_OZ, 20, 500, _WEIGHT),
    _chart("Height", _HEIGHT_IN + _HEIGHT_CM + (920,), 100, 250, {i: "inches" for i in _HEIGHT_IN + (920,)}),
    _chart("Glucose (bedside)", _GLUCOSE_CHART, 0, 2200),
    _chart("CVP", (113, 220074), -20, 100),
    _chart("PAP systolic", (492, 220059), 0, 150),
    _chart("PAP diastolic", (8448, 220060), 0, 100),
    _chart("PAP mean", (491, 220061), 0, 120),
    _chart("Cardiac output", (220088, 224842), 0, 30),
    _chart("SvO2", (823, 223772), 0, 100),
    _chart("ScvO2", (227686,), 0, 100),
    _chart("EtCO2", (1817, 228640), 0, 100),
    _chart("PEEP set", (505, 506, 220339), 0, 40),
    _chart("Total PEEP", (224700,), 0, 40),
    _chart("Tidal volume observed", (682, 224685), 0, 2500),
    _chart("Tidal volume set", (683, 224684), 0, 2500),
    _chart("Peak inspiratory pressure", (535, 224695), 0, 100),
    _chart("Plateau pressure", (543, 224696), 0, 100),
    _chart("Minute volume", (445, 448, 450, 224687), 0, 50),
    _chart("Mean airway pressure", (444, 224697), 0, 60),
    _chart("O2 flow", (470, 471, 223834), 0, 100),
    _chart("Respiratory rate set", (619, 224688), 0, 80),
    _chart("ICP", (226, 220765), -10, 100),
    # laboratory values (LABEVENTS)
    _lab("Albumin", (50862,), 0, 10),
    _lab("ALT", (50861,), 0, 20000),
    _lab("AST", (50878,), 0, 40000),
    _lab("Alkaline phosphatase", (50863,), 0, 5000),
    _lab("Anion gap", (50868,), -10, 80),
    _lab("Base excess", (50802,), -50, 50),
    _lab("Bicarbonate", (50882,), 0, 70),
    _lab("Bilirubin total", (50885,), 0, 80),
    _lab("Bilirubin direct", (50883,), 0, 60),
    _lab("BUN", (51006,), 0, 300),
    _lab("Calcium total", (50893,), 0, 25),
    _lab("Calcium ionized", (50808,), 0, 5),
    _lab("Chloride", (50902, 50806), 50, 175),
    _lab("Creatinine", (50912,), 0, 40),
    _lab("Creatine kinase", (50910,), 0, 200000),
    _lab("CK-MB", (50911,), 0, 2000),
    _lab("Glucose (lab)", (50931, 50809), 0, 2200),
    _lab("Hematocrit", (51221, 50810), 0, 100),
    _lab("Hemoglobin", (51222, 50811), 0, 30),
    _lab("INR", (51237,), 0, 25),
    _lab("PT", (51274,), 0, 200),
    _lab("PTT", (51275,), 0, 250),
    _lab("Lactate", (50813,), 0, 40),
    _lab("LDH", (50954,), 0, 50000),
    _lab("Magnesium", (50960,), 0, 20),
    _lab("Phosphate", (50970,), 0, 30),
    _lab("Platelets", (51265,), 0, 3000),
    _lab("Potassium", (50971, 50822), 0, 15),
    _lab("Sodium", (50983, 50824), 50, 225),
    _lab("WBC", (51301, 51300), 0, 1100),
    _lab("Basophils", (51146,), 0, 100),
    _lab("Eosinophils", (51200,), 0, 100),
    _lab("Lymphocytes", (51244,), 0, 100),
    _lab("Monocytes", (51254,), 0, 100),
    _lab("Neutrophils", (51256,), 0, 100),
    _lab("Bands", (51144,), 0, 100),
    _lab("pH", (50820,), 6.3, 8.4),
    _lab("PaCO2", (50818,), 0, 250),
    _lab("PaO2", (50821,), 0, 800),
    _lab("Total CO2", (50804,), 0, 80),
    _lab("Troponin T", (51003,), 0, 100),
    _lab("Troponin I", (51002,), 0, 1000),
    _lab("Fibrinogen", (51214,), 0, 2000),
    # outputs (OUTPUTEVENTS, mL)
    _output(
        "Urine output",
        (
            40055,
            43175,
            40069,
            40094,
            40715,
            40473,
            40085,
            40057,
            40056,
            40405,
            40428,
            40096,
            40651,
            226559,
            226560,
            226561,
            226584,
            226563,
            226564,
            226565,
            226567,
            226557,
            226558,
        ),
        5000,
    ),
    _output("Stool output", (40054, 226579), 5000),
    # inputs (INPUTEVENTS_CV and INPUTEVENTS_MV amounts, in the stated unit)
    _input("Norepinephrine", (221906, 30047, 30120), "mg", 100),
    _input("Epinephrine", (221289, 30044, 30119, 30309), "mg", 100),
    _input("Phenylephrine", (221749, 30127, 30128), "mg", 1000),
    _input("Vasopressin", (222315, 30051), "units", 1000),
    _input("Dopamine", (221662, 30043, 30307), "mg", 5000),
    _input("Dobutamine", (221653, 30042, 30306), "mg", 5000),
    _input("Propofol", (222168, 30131), "mg", 20000),
    _input("Fentanyl", (221744, 225942, 30118, 30149), "mg", 100),
    _input("Midazolam", (221668, 30124), "mg", 1000),
    _input("Morphine", (225154, 30126), "mg", 1000),
    _input("Insulin", (223258, 223262, 30045), "units", 1000),
    _input("Heparin", (225152, 30025), "units", 100000),
    _input("Furosemide", (221794, 30123), "mg", 2000),
    _input("Amiodarone", (221347, 30112), "mg", 5000),
    _input("Nitroglycerin", (222056, 30121, 30049), "mg", 1000),
    _input("Potassium chloride", (225166, 30026), "meq", 500),
    _input("Magnesium sulfate", (222011, 30027), "mg", 20000),
    _input("NaCl 0.9%", (225158, 30018), "ml", 10000),
    _input("Dextrose 5%", (220949, 30013), "ml", 10000),
    _input("Lactated Ringer's", (225828, 30021), "ml", 10000),
    _input("Packed red blood cells", (225168, 30001, 30179), "ml", 5000),
    _input("Fresh frozen plasma", (220970, 30005), "ml", 5000),
]

# Input amount units -> (canonical unit, factor to it).
INPUT_UNITS = {
    "mg": ("mg", 1.0),
    "mcg": ("mg", 1e-3),
    "g": ("mg", 1e3),
    "gm": ("mg", 1e3),
    "grams": ("mg", 1e3),
    "ml": ("ml", 1.0),
    "l": ("ml", 1e3),
    "u": ("units", 1.0),
    "units": ("units", 1.0),
    "meq": ("meq", 1.0),
}


def _numbers(series: pd.Series) -> pd.Series:
    """Text -> float64 (NaN where not a number), whatever the text column's pandas dtype."""
    return pd.to_numeric(series, errors="coerce").astype("float64")


_BP_TEXT = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*/\s*(\d+(?:\.\d*)?)\s*$")


def _capillary_refill(value: pd.Series, text: pd.Series) -> pd.Series:
    lowered = text.str.lower()
    normal = lowered.str.startswith("normal") | (lowered == "brisk")
    abnormal = lowered.str.startswith("abnormal") | (lowered == "delayed")
    return pd.Series(np.where(normal, 0.0, np.where(abnormal, 1.0, np.nan)), index=value.index)


def _blood_pressure_text(part: int):
    def convert(value: pd.Series, text: pd.Series) -> pd.Series:
        from_text = _numbers(text.str.extract(_BP_TEXT, expand=True)[part - 1])
        return value.fillna(from_text)

    return convert


def _gcs(value: pd.Series, text: pd.Series) -> pd.Series:
    # CareVue text starts with the score ("4 Spontaneously"); MetaVision's VALUENUM holds it.
    leading = _numbers(text.str.extract(r"^\s*(\d)", expand=False))
    return value.fillna(leading)


CONVERSIONS = {
    "fahrenheit": lambda v, t: (v - 32.0) * 5.0 / 9.0,
    # mimic3-benchmarks: Celsius items holding a value >= 79 were charted in Fahrenheit.
    "celsius_or_fahrenheit": lambda v, t: v.where(v < 79, (v - 32.0) * 5.0 / 9.0),
    "pounds": lambda v, t: v * 0.453592,
    "ounces": lambda v, t: v / 16.0 * 0.453592,
    "inches": lambda v, t: v * 2.54,
    "percent_to_fraction": lambda v, t: v.where(v <= 1, v / 100.0),
    "fraction_to_percent": lambda v, t: v.where(v > 1, v * 100.0),
    "capillary_refill": _capillary_refill,
    "systolic_text": _blood_pressure_text(1),
    "diastolic_text": _blood_pressure_text(2),
    "gcs": _gcs,
}


# ---------------------------------------------------------------------------------------------------------------
# Tables and columns


@dataclass(frozen=True)
class EventTable:
    """How one event table is read: its source kind and the (lower-case) columns that carry each role."""

    name: str
    source: str
    time: str
    number: str
    text: str | None = None
    unit: str | None = None
    end_time: str | None = None
    error: str | None = None
    status: str | None = None
    icustay: bool = True

    @property
    def columns(self) -> list[str]:
        optional = [self.text, self.unit, self.end_time, self.error, self.status]
        return ["row_id", "subject_id", "itemid", self.time, self.number, *[c for c in optional if c]] + (
            ["icustay_id"] if self.icustay else []
        )


EVENT_TABLES = [
    EventTable("CHARTEVENTS", "chart", "charttime", "valuenum", text="value", unit="valueuom", error="error"),
    EventTable("LABEVENTS", "lab", "charttime", "valuenum", text="value", unit="valueuom", icustay=False),
    EventTable("OUTPUTEVENTS", "output", "charttime", "value", unit="valueuom", error="iserror"),
    EventTable("INPUTEVENTS_CV", "input", "charttime", "amount", unit="amountuom"),
    EventTable(
        "INPUTEVENTS_MV",
        "input",
        "starttime",
        "amount",
        unit="amountuom",
        end_time="endtime",
        status="statusdescription",
    ),
]

STAY_COLUMNS = {
    "ICUSTAYS": [
        "subject_id",
        "hadm_id",
        "icustay_id",
        "first_careunit",
        "last_careunit",
        "first_wardid",
        "last_wardid",
        "intime",
        "outtime",
        "los",
    ],
    "ADMISSIONS": ["hadm_id", "admittime", "dischtime", "deathtime"],
    "PATIENTS": ["subject_id", "gender", "dob", "dod"],
}


def find_table(source: Path, name: str) -> Path:
    """The one file of table ``name`` in ``source``: ``NAME.csv`` or ``NAME.csv.gz``, upper or lower case. Two of
    them (a partial ``ADMISSIONS.csv`` beside the full ``ADMISSIONS.csv.gz``) are refused, naming both: reading
    either would be a guess."""
    found: list[Path] = []
    for path in (source / f"{stem}{suffix}" for suffix in (".csv", ".csv.gz") for stem in (name, name.lower())):
        if path.is_file() and not any(path.samefile(other) for other in found):  # one file on a case-blind disk
            found.append(path)
    if len(found) > 1:
        raise MimicError(
            f"{source}: table {name} is in more than one file ({', '.join(p.name for p in found)}); keep one of them"
        )
    if found:
        return found[0]
    raise MimicError(
        f"{source}: required table {name} not found (looked for {name}.csv or {name}.csv.gz, upper or lower case)"
    )


@contextmanager
def reading(path: Path) -> Iterator[None]:
    """Turn an error of reading ``path`` (a truncated ``.gz``, damaged bytes) into a ``MimicError`` naming it."""
    try:
        yield
    except (OSError, pa.ArrowInvalid, EOFError) as exc:
        raise MimicError(f"{path}: cannot be read to its end ({exc}); a truncated or damaged file?") from None


def read_header(path: Path) -> list[str]:
    with reading(path), pa.input_stream(str(path), compression="detect") as stream:
        first = stream.read(1 << 16).split(b"\n", 1)[0]
    return [c.strip().strip('"') for c in first.decode("utf-8", errors="replace").strip().split(",")]


def column_names(path: Path, table: str, wanted: list[str]) -> dict[str, str]:
    """Lower-case column name -> the file's own spelling; a missing column, or one named twice (names are matched
    ignoring case, so ``SUBJECT_ID`` beside ``subject_id`` is twice), is an error naming file, table and column."""
    actual: dict[str, str] = {}
    for name in read_header(path):
        if name.lower() in actual:
            raise MimicError(
                f"{path}: column {name.upper()} appears twice in the header ({actual[name.lower()]!r} and "
                f"{name!r}); table {table} must have one"
            )
        actual[name.lower()] = name
    missing = [c.upper() for c in wanted if c not in actual]
    if missing:
        raise MimicError(f"{path}: table {table} lacks required column(s) {missing}")
    return {c: actual[c] for c in wanted}


def read_small_table(source: Path, name: str) -> tuple[pd.DataFrame, Path]:
    path = find_table(source, name)
    names = column_names(path, name, STAY_COLUMNS[name])
    with reading(path):
        table = pacsv.read_csv(
            str(path),
            convert_options=pacsv.ConvertOptions(
                include_columns=list(names.values()),
                column_types={n: pa.string() for n in names.values()},
                strings_can_be_null=True,
            ),
        )
    frame = table.to_pandas()
    frame.columns = [c.lower() for c in frame.columns]
    return frame, path


def _datetimes(frame: pd.DataFrame, columns: list[str], table: str) -> pd.DataFrame:
    for column in columns:
        parsed = pd.to_datetime(frame[column], format=TIME_FORMAT, errors="coerce")  # a bad one is named below
        broken = frame[column].notna() & parsed.isna()
        if broken.any():
            line = int(np.flatnonzero(broken)[0]) + 2
            raise MimicError(f"{table} line {line}: {column.upper()} {frame[column].iloc[line - 2]!r} is not a time")
        frame[column] = parsed
    return frame


def _integers(frame: pd.DataFrame, columns: list[str], table: str) -> pd.DataFrame:
    for column in columns:
        parsed = _numbers(frame[column])
        broken = parsed.isna() | (parsed != np.floor(parsed))
        if broken.any():
            line = int(np.flatnonzero(broken)[0]) + 2
            raise MimicError(f"{table} line {line}: {column.upper()} {frame[column].iloc[line - 2]!r} is not an id")
        frame[column] = parsed.astype("int64")
    return frame


def load_stays(source: Path, strict: bool = False) -> tuple[pd.DataFrame, dict[str, Path]]:
    """ICU stays joined with their admission and patient: one row per ICUSTAY_ID, with age, LOS and mortality.
    ``strict``: a stay that ends before it begins is an error naming its line (else ``select_stays`` drops it)."""
    icustays, icu_path = read_small_table(source, "ICUSTAYS")
    admissions, adm_path = read_small_table(source, "ADMISSIONS")
    patients, pat_path = read_small_table(source, "PATIENTS")
    icustays = _datetimes(
        _integers(icustays, ["subject_id", "hadm_id", "icustay_id"], "ICUSTAYS"), ["intime", "outtime"], "ICUSTAYS"
    )
    backwards = np.flatnonzero((icustays["outtime"] < icustays["intime"]).to_numpy())
    if strict and len(backwards):
        stay = icustays.iloc[backwards[0]]
        raise MimicError(
            f"{icu_path} line {backwards[0] + 2}: ICUSTAY_ID {stay['icustay_id']} ends (OUTTIME "
            f"{stay['outtime']}) before it begins (INTIME {stay['intime']}) (--strict stops at the first "
            "one)"
        )
    admissions = _datetimes(
        _integers(admissions, ["hadm_id"], "ADMISSIONS"), ["admittime", "dischtime", "deathtime"], "ADMISSIONS"
    )
    patients = _datetimes(_integers(patients, ["subject_id"], "PATIENTS"), ["dob", "dod"], "PATIENTS")
    stays = icustays.merge(admissions, on="hadm_id", how="inner").merge(patients, on="subject_id", how="inner")

    age = (stays["intime"] - stays["dob"]).dt.total_seconds() / (365.25 * 24 * 3600)
    stays["age"] = age.where(age <= 89.99, SHIFTED_AGE)
    stays["los_hours"] = _numbers(stays["los"]) * 24.0
    died = (
        stays["deathtime"].notna()
        & (stays["admittime"] <= stays["deathtime"])
        & (stays["dischtime"] >= stays["deathtime"])
    )
    died |= stays["dod"].notna() & (stays["admittime"] <= stays["dod"]) & (stays["dischtime"] >= stays["dod"])
    stays["label"] = died.astype("int8")
    stays["gender"] = stays["gender"].str.upper().map({"M": 1.0, "F": 0.0})
    return stays.sort_values("icustay_id", ignore_index=True), {
        "ICUSTAYS": icu_path,
        "ADMISSIONS": adm_path,
        "PATIENTS": pat_path,
    }


# ---------------------------------------------------------------------------------------------------------------
# Cohorts


@dataclass(frozen=True)
class Cohort:
    name: str
    rule: str
    variables: list[Variable]
    range_filter: bool
    single_stay_admissions: bool


COHORTS = {
    "benchmark": Cohort(
        "benchmark",
        "mimic3-benchmarks in-hospital mortality: ICU stays without transfer, in admissions with exactly one such "
        "stay, age >= 18 at INTIME, LOS >= 48 h, >= 1 event of the 17 variables in [INTIME, INTIME + 48 h]; "
        "label: death in hospital (DEATHTIME or DOD within ADMITTIME..DISCHTIME)",
        BENCHMARK_VARIABLES,
        range_filter=False,
        single_stay_admissions=True,
    ),
    "garlic": Cohort(
        "garlic",
        "Warpformer/STraTS-style: ICU stays with age >= 18 at INTIME, LOS >= 48 h, >= 1 event of the variables "
        "(after unit harmonisation and range filters) in [INTIME, INTIME + 48 h]; label: death in hospital "
        "(DEATHTIME or DOD within ADMITTIME..DISCHTIME)",
        GARLIC_VARIABLES,
        range_filter=True,
        single_stay_admissions=False,
    ),
}


def select_stays(stays: pd.DataFrame, cohort: Cohort) -> tuple[pd.DataFrame, dict[str, list[int]]]:
    """Apply the cohort's stay rules in order; every excluded stay is listed under the first rule it fails."""
    rules: list[tuple[str, Callable[[pd.DataFrame], pd.Series]]] = [
        ("OUTTIME before INTIME", lambda s: s["outtime"] < s["intime"]),  # a damaged row: neither time can be trusted
    ]
    if cohort.single_stay_admissions:
        rules.append(
            (
                "ICU transfer (first and last care unit or ward differ)",
                lambda s: (s["first_careunit"] != s["last_careunit"]) | (s["first_wardid"] != s["last_wardid"]),
            )
        )
        rules.append(
            (
                "admission has more than one ICU stay without transfer",
                lambda s: s.groupby("hadm_id")["icustay_id"].transform("size") > 1,
            )
        )
    rules.append((f"age < {ADULT_AGE:g} at INTIME", lambda s: ~(s["age"] >= ADULT_AGE)))
    rules.append((f"LOS < {WINDOW_HOURS:g} h or unknown", lambda s: ~(s["los_hours"] >= WINDOW_HOURS)))
    dropped = {}
    for reason, excluded in rules:
        mask = excluded(stays)
        dropped[reason] = stays.loc[mask, "icustay_id"].tolist()
        stays = stays[~mask]
    return stays.reset_index(drop=True), dropped


# ---------------------------------------------------------------------------------------------------------------
# Streaming the event tables


@dataclass
class ItemLookup:
    """ITEMID -> variable code and conversion, as sorted arrays for vectorised lookup."""

    itemids: np.ndarray
    codes: np.ndarray
    conversions: np.ndarray
    units: np.ndarray  # target unit per variable code (input amounts only)
    harmonise_units: bool
    lows: np.ndarray
    highs: np.ndarray

    @classmethod
    def build(cls, variables: list[Variable], source: str, range_filter: bool) -> "ItemLookup":
        rows = []
        for code, variable in enumerate(variables):
            for itemid in variable.items.get(source, ()):
                rows.append((itemid, code, variable.convert.get(itemid, "")))
        rows.sort()
        itemids = np.array([r[0] for r in rows], dtype=np.int64)
        if len(np.unique(itemids)) != len(itemids):
            raise ValueError(f"an ITEMID of source {source} is mapped to two variables")
        bounds = [(v.low, v.high) if range_filter else (None, None) for v in variables]
        return cls(
            itemids=itemids,
            codes=np.array([r[1] for r in rows], dtype=np.int16),
            conversions=np.array([r[2] for r in rows], dtype=object),
            units=np.array([v.unit if source in v.items else None for v in variables], dtype=object),
            harmonise_units=any(v.unit and source in v.items for v in variables),
            lows=np.array([-np.inf if b[0] is None else b[0] for b in bounds]),
            highs=np.array([np.inf if b[1] is None else b[1] for b in bounds]),
        )


@dataclass
class TableReport:
    """Counts for one streamed table: rows read, malformed rows (with examples), rows dropped and why.

    ``strict``: a malformed row is a ``MimicError`` naming ``origin`` (the table's file) instead of a count.
    """

    origin: str = ""
    strict: bool = False
    rows_read: int = 0
    malformed: int = 0
    examples: list[str] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    repeated: int = 0  # rows read once already: their ROW_ID came earlier in the table

    def add_malformed(self, count: int, example: str) -> None:
        if self.strict and count:
            raise MimicError(f"{self.origin}: malformed row, {example} (--strict stops at the first one)")
        self.malformed += count
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(example)

    def add_dropped(self, reason: str, count: int) -> None:
        if count:
            self.dropped[reason] = self.dropped.get(reason, 0) + int(count)

    def to_json(self) -> dict:
        return {
            "rows_read": self.rows_read,
            "malformed_rows": self.malformed,
            "malformed_examples": self.examples,
            "repeated_rows": self.repeated,
            "dropped_rows": self.dropped,
        }


def iter_batches(path: Path, names: dict[str, str], block_size: int, report: TableReport) -> Iterator[pa.RecordBatch]:
    """Stream the file's ``names`` columns as strings, batch by batch; unsplittable rows are counted and skipped
    (or, when ``report.strict``, stop the read: pyarrow then names the row)."""

    def on_invalid_row(row) -> str:
        report.add_malformed(
            1,
            f"line {row.number}: expected {row.expected_columns} fields, got {row.actual_columns}: {row.text[:120]!r}",
        )
        return "skip"

    # pyarrow decodes a malformed row before the handler sees it; a row that is not UTF-8 fails there, and pyarrow
    # reports that failure as 'ignored' (sys.unraisablehook) before it stops with ArrowInvalid: keep it as the cause.
    undecodable: list[BaseException] = []
    previous_hook = sys.unraisablehook

    def keep_undecodable(unraisable) -> None:
        if unraisable.object is on_invalid_row and isinstance(unraisable.exc_value, UnicodeDecodeError):
            undecodable.append(unraisable.exc_value)
        else:
            previous_hook(unraisable)

    rename = {actual: lower for lower, actual in names.items()}
    sys.unraisablehook = keep_undecodable
    try:
        reader = pacsv.open_csv(
            pa.input_stream(str(path), compression="detect"),
            read_options=pacsv.ReadOptions(block_size=block_size),
            parse_options=pacsv.ParseOptions(invalid_row_handler=None if report.strict else on_invalid_row),
            convert_options=pacsv.ConvertOptions(
                include_columns=list(names.values()),
                column_types={n: pa.string() for n in names.values()},
                strings_can_be_null=True,
            ),
        )
        for batch in reader:
            report.rows_read += batch.num_rows
            yield batch.rename_columns([rename[c] for c in batch.schema.names])
    except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
        # What pyarrow cannot even hand to the row handler (bytes that are not UTF-8, a broken gzip stream).
        cause = f"a malformed row that is not UTF-8: {undecodable[0]}" if undecodable else str(exc)
        raise MimicError(f"{path}: unreadable CSV after {report.rows_read} rows ({cause})") from exc
    finally:
        sys.unraisablehook = previous_hook


def _prefilter(batch: pa.RecordBatch, table: EventTable, itemids: pa.Array, subjects: pa.Array, report) -> pa.Table:
    """Vectorised: keep the rows of the cohort's patients and the variables' items, not flagged as errors."""
    keep = pc.and_(pc.is_in(batch["itemid"], value_set=itemids), pc.is_in(batch["subject_id"], value_set=subjects))
    keep = pc.fill_null(keep, False)
    if table.error:
        flagged = pc.fill_null(pc.equal(pc.utf8_trim_whitespace(batch[table.error]), "1"), False)
        report.add_dropped(f"{table.error.upper()} = 1", pc.sum(pc.and_(keep, flagged)).as_py() or 0)
        keep = pc.and_(keep, pc.invert(flagged))
    if table.status:
        rewritten = pc.fill_null(pc.equal(batch[table.status], "Rewritten"), False)
        report.add_dropped("STATUSDESCRIPTION Rewritten", pc.sum(pc.and_(keep, rewritten)).as_py() or 0)
        keep = pc.and_(keep, pc.invert(rewritten))
    return pa.Table.from_batches([batch]).filter(keep)


def _parse_rows(rows: pa.Table, table: EventTable, report: TableReport) -> pd.DataFrame:
    """Strings -> numbers and seconds; rows whose ROW_ID, time or ICUSTAY_ID cannot be read are malformed."""
    row_text = pc.utf8_trim_whitespace(rows["row_id"])
    row_readable = pc.fill_null(pc.match_substring_regex(row_text, r"^[0-9]{1,18}$"), False)  # fits an int64
    frame = pd.DataFrame(
        {
            "row_id": pc.cast(pc.if_else(row_readable, row_text, "0"), pa.int64()).to_numpy(),
            "subject_id": pc.cast(rows["subject_id"], pa.int64()).to_numpy(),
            "itemid": pc.cast(rows["itemid"], pa.int64()).to_numpy(),
            "number": _numbers(rows[table.number].to_pandas()),
        }
    )
    broken = ~row_readable.to_numpy(zero_copy_only=False)
    for role, column in (("time", table.time), ("end_time", table.end_time)):
        if column:
            seconds = pc.strptime(rows[column], format=TIME_FORMAT, unit="s", error_is_null=True)
            frame[role] = pc.cast(seconds, pa.int64()).to_pandas()
            broken |= frame[role].isna().to_numpy()
    if table.icustay:
        text = rows["icustay_id"].to_pandas()
        frame["icustay_id"] = _numbers(text)
        broken |= (text.notna() & frame["icustay_id"].isna()).to_numpy()
    for role, column in (("text", table.text), ("unit", table.unit)):
        if column:
            frame[role] = rows[column].to_pandas()
    if broken.any():
        first = int(np.flatnonzero(broken)[0])
        example = {c: rows[c][first].as_py() for c in rows.column_names}
        report.add_malformed(int(broken.sum()), f"unreadable ROW_ID, time or ICUSTAY_ID: {example}")
        frame = frame[~broken]
    return frame


def _attach_to_stays(frame: pd.DataFrame, stays: pd.DataFrame, table: EventTable) -> pd.DataFrame:
    """Vectorised join on SUBJECT_ID, then the window and ICUSTAY_ID tests."""
    frame = frame.merge(stays, on="subject_id", how="inner", suffixes=("", "_stay"))
    hours = (frame["time"].to_numpy("float64") - frame["intime_s"].to_numpy("float64")) / 3600.0
    inside = (hours >= 0) & (hours <= WINDOW_HOURS)
    if table.end_time:
        end_hours = (frame["end_time"].to_numpy("float64") - frame["intime_s"].to_numpy("float64")) / 3600.0
        inside &= end_hours <= WINDOW_HOURS
    if table.icustay:
        other_stay = frame["icustay_id"].notna().to_numpy() & (frame["icustay_id"] != frame["stay_id"]).to_numpy()
        inside &= ~other_stay
    frame = frame[inside].assign(hours=hours[inside])
    return frame


def _values(frame: pd.DataFrame, lookup: ItemLookup, report: TableReport) -> pd.DataFrame:
    """Number (VALUENUM, else VALUE as a number), then the item's conversion, unit harmonisation, range filter."""
    position = np.searchsorted(lookup.itemids, frame["itemid"].to_numpy())
    code = lookup.codes[position]
    conversion = lookup.conversions[position]
    value = frame["number"]
    # Plain Python strings, "" where absent: the conversions' text tests then give plain booleans.
    text = frame["text"].fillna("").astype(object) if "text" in frame else pd.Series("", index=frame.index)
    value = value.fillna(_numbers(text))
    for name in np.unique(conversion):
        if name:
            rows = conversion == name
            value.loc[rows] = CONVERSIONS[name](value[rows], text[rows])
    if lookup.harmonise_units:
        value = _harmonise_input_units(value, frame["unit"], code, lookup, report)
    missing = value.isna().to_numpy()
    report.add_dropped("no numeric value", missing.sum())
    in_range = (value.to_numpy() >= lookup.lows[code]) & (value.to_numpy() <= lookup.highs[code])
    report.add_dropped("outside the variable's range", (~missing & ~in_range).sum())
    keep = ~missing & in_range
    return pd.DataFrame(
        {
            "row_id": frame["row_id"].to_numpy()[keep],
            "stay_id": frame["stay_id"].to_numpy()[keep],
            "time": frame["hours"].to_numpy("float32")[keep],
            "code": code[keep],
            "value": value.to_numpy("float32")[keep],
        }
    )


def _harmonise_input_units(value: pd.Series, unit: pd.Series, code: np.ndarray, lookup: ItemLookup, report):
    lowered = unit.fillna("").str.strip().str.lower()
    canonical = lowered.map(lambda u: INPUT_UNITS.get(u, (None, np.nan))[0])
    factor = lowered.map(lambda u: INPUT_UNITS.get(u, (None, np.nan))[1]).to_numpy("float64")
    matches = canonical.to_numpy() == lookup.units[code]
    report.add_dropped("input amount in another unit", (value.notna().to_numpy() & ~matches).sum())
    return (value * factor).where(matches)


def stream_table(
    path: Path, table: EventTable, stays: pd.DataFrame, lookup: ItemLookup, block_size: int, strict: bool = False
) -> tuple[pd.DataFrame, TableReport]:
    """One event table -> the cohort's observations from it (stay_id, time, code, value) and its report;
    ``strict``: a malformed row is an error instead of a counted skip."""
    report = TableReport(origin=str(path), strict=strict)
    names = column_names(path, table.name, table.columns)
    itemids = pa.array([str(i) for i in lookup.itemids], pa.string())
    subjects = pa.array([str(s) for s in np.unique(stays["subject_id"])], pa.string())
    join = stays[["subject_id", "icustay_id", "intime"]].rename(columns={"icustay_id": "stay_id"})
    join = join.assign(intime_s=join.pop("intime").astype("datetime64[s]").astype("int64"))
    kept = []
    with reading(path):
        for batch in iter_batches(path, names, block_size, report):
            rows = _prefilter(batch, table, itemids, subjects, report)
            if rows.num_rows == 0:
                continue
            frame = _attach_to_stays(_parse_rows(rows, table, report), join, table)
            if len(frame):
                kept.append(_values(frame, lookup, report))
    columns = {"row_id": "int64", "stay_id": "int64", "time": "float32", "code": "int16", "value": "float32"}
    observations = pd.concat(kept, ignore_index=True) if kept else pd.DataFrame(columns=list(columns))
    # A repeat may come any number of blocks after its first reading, so it is looked for among the kept rows, once
    # the table is read: their ROW_IDs cost 8 bytes a row beside the 14 the rows take anyway (a set of every ROW_ID
    # read would grow with CHARTEVENTS' 330 million rows). A row attached to two stays is one (ROW_ID, stay) each.
    repeated = observations.duplicated(["row_id", "stay_id"]).to_numpy()
    report.repeated = int(repeated.sum())
    observations = observations.astype(columns)[~repeated].drop(columns="row_id")
    return observations.reset_index(drop=True), report


# ---------------------------------------------------------------------------------------------------------------
# Entry point


def preprocess(
    source: Path,
    destination: Path,
    cohort: str = "benchmark",
    block_size: int = DEFAULT_BLOCK_SIZE,
    hash_sources: bool = True,
    strict: bool = False,
) -> dict:
    """Read MIMIC-III from ``source``, build ``cohort`` and write the processed tables; return the manifest.

    ``hash_sources=False`` skips the SHA-256 of the source tables (reading 33 GB twice is slow); the manifest
    then records sizes only. ``strict`` stops at the first malformed row (one the CSV parser cannot split into the
    header's fields, or whose id or time cannot be read) instead of counting and skipping it.
    """
    if cohort not in COHORTS:
        raise MimicError(f"unknown cohort {cohort!r}; choose one of {sorted(COHORTS)}")
    definition = COHORTS[cohort]
    source = Path(source)
    if not source.is_dir():
        raise MimicError(f"{source}: no such folder (expected the MIMIC-III tables)")
    sources_needed = {s for v in definition.variables for s in v.items}
    event_tables = [t for t in EVENT_TABLES if t.source in sources_needed]
    paths = {t.name: find_table(source, t.name) for t in event_tables}  # fail early, before any long read
    stays, stay_paths = load_stays(source, strict)
    paths.update(stay_paths)
    cohort_stays, dropped = select_stays(stays, definition)

    parts, reports = [], {}
    for table in event_tables:
        lookup = ItemLookup.build(definition.variables, table.source, definition.range_filter)
        observations, report = stream_table(paths[table.name], table, cohort_stays, lookup, block_size, strict)
        parts.append(observations)
        reports[table.name] = report.to_json()
        log.info(
            "mimic3/%s: %s: %d rows read, %d kept, %d malformed",
            cohort,
            table.name,
            report.rows_read,
            len(observations),
            report.malformed,
        )
    observations = pd.concat(parts, ignore_index=True)

    observed = np.unique(observations["stay_id"].to_numpy())
    no_events = np.setdiff1d(cohort_stays["icustay_id"].to_numpy(), observed)
    dropped[f"no event of the variables in the first {WINDOW_HOURS:g} h"] = no_events.tolist()
    kept = cohort_stays[cohort_stays["icustay_id"].isin(observed)]

    variables = [v.name for v in definition.variables]
    volumes = [v.name for v in definition.variables if "output" in v.items]  # two outputs at one time add up
    observations = pd.DataFrame(
        {
            "stay_id": observations["stay_id"].to_numpy(),
            "time": observations["time"].to_numpy(),
            "variable": pd.Categorical.from_codes(observations["code"].to_numpy(), categories=variables),
            "value": observations["value"].to_numpy(),
        }
    )
    observations = sum_simultaneous(observations, volumes)
    labels = pd.DataFrame(
        {
            "stay_id": kept["icustay_id"].to_numpy(),
            "label": kept["label"].to_numpy(),
            "subject_id": kept["subject_id"].to_numpy(),
            "hadm_id": kept["hadm_id"].to_numpy(),
            "los_hours": kept["los_hours"].to_numpy(),
        }
    )
    static = pd.DataFrame(
        {"stay_id": kept["icustay_id"].to_numpy(), "Age": kept["age"].to_numpy(), "Gender": kept["gender"].to_numpy()}
    )
    per_variable = observations["variable"].value_counts().reindex(variables).astype(int)
    positives = int(labels["label"].sum())
    manifest = {
        "dataset": "mimic3",
        "cohort": cohort,
        "cohort_rule": definition.rule,
        "window_hours": WINDOW_HOURS,
        "summed_variables": volumes,
        "label": "in-hospital mortality",
        "source": {
            "tables": {name: path.name for name, path in paths.items()},
            "files_sha256": {p.name: sha256_of(p) for p in paths.values()} if hash_sources else {},
            "files_bytes": {p.name: p.stat().st_size for p in paths.values()},
        },
        "counts": {
            "icu_stays_read": int(len(stays)),
            "dropped_stays": {reason: len(ids) for reason, ids in dropped.items()},
            "prevalence": round(positives / max(len(labels), 1), 6),
            "observations_per_variable": per_variable.to_dict(),
            "variables_found": int((per_variable > 0).sum()),
        },
        "tables": reports,
        "dropped_stays": {reason: [int(s) for s in ids] for reason, ids in dropped.items()},
    }
    write_processed(destination, observations, static, labels, variables, manifest)
    log.info("mimic3/%s: %d stays kept (%d deaths)", cohort, len(labels), positives)
    return read_manifest(destination)  # as written: with the stay, observation and positive counts


SOURCE = Source(
    "mimic3",
    lambda destination, source, cohort, strict=False: preprocess(source, destination, cohort=cohort, strict=strict),
    options=frozenset({"source", "strict"}),
    required=frozenset({"source"}),
    cohorts=tuple(COHORTS),
    source_help="the folder with the MIMIC-III v1.4 tables (TABLE.csv or TABLE.csv.gz)",
)
