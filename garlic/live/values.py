"""What a sent value means in the model's unit, and whether it can be a real reading at all.

Units: a value's unit is read from ``valueQuantity.code`` and ``valueQuantity.unit``, whatever ``system`` they come
under (a local unit system's ``degF`` is still Fahrenheit): both, where both are sent, must name the same unit. A
unit that is the model's (or another spelling of it, ``SAME_NUMBER``) is taken as it is; one UCUM relates to it by a
fixed factor or offset (``CONVERSIONS``: Fahrenheit and Kelvin to Celsius, a percentage to a fraction and back, kPa
to mm[Hg], pounds to kilograms, inches to centimetres) is converted; any other is refused, since a number read in
the wrong unit would be scored as a real, wrong risk. A value sent without a unit is taken in the model's.

Ranges: ``ranges.csv`` beside this module gives, per variable (in the model's unit), the lowest and highest value a
reading can have, and why (its ``source`` column); a value outside is refused (422) naming the range. A site's own
table (``garlic monitor --ranges FILE``, the same columns, ``source`` optional) replaces the rows of the variables it
names. A variable the tables do not name (a MEDS code of a hospital's own model) is not range-checked.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from garlic.config import ConfigError

RANGES = Path(__file__).resolve().parent / "ranges.csv"
MAX_TABLE_BYTES = 1 << 20
# Other spellings of UCUM codes that give the same number: what monitors and laboratory systems send.
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
    "[degF]": ("degF", "°F"),
    "K": ("Kelvin",),
    "%": ("percent",),
    "1": ("{fraction}",),
    "kPa": (),
    "[lb_av]": ("lb", "lbs"),
    "[in_i]": ("in", "inch"),
    "cm": (),
    "kg": (),
    "mmol/L": (),
    "mg/dL": (),
    "g/dL": (),
    "mL": (),
    "s": (),
    "h": (),
}
# (from, to): (scale, offset): the value in ``to`` is value * scale + offset, as UCUM defines the units.
CONVERSIONS = {
    ("[degF]", "Cel"): (5 / 9, -32 * 5 / 9),
    ("K", "Cel"): (1.0, -273.15),
    ("%", "1"): (0.01, 0.0),
    ("1", "%"): (100.0, 0.0),
    ("kPa", "mm[Hg]"): (1000 / 133.322, 0.0),  # UCUM: mm[Hg] = 133.322 Pa (13.5951 g/cm3 * 9.80665 m/s2 * 1 mm)
    ("[lb_av]", "kg"): (0.45359237, 0.0),
    ("[in_i]", "cm"): (2.54, 0.0),
}
RANGE_COLUMNS = ("variable", "low", "high")


class UnitError(ValueError):
    """A unit that cannot be read as the model's; the message says which unit was expected."""


def ucum(sent: str, expected: str) -> str | None:
    """The UCUM code ``sent`` spells (the expected unit's own spellings first: ``ng/mL`` is ``ug/L``'s), None
    when it is none this service knows."""
    if sent == expected or sent in SAME_NUMBER.get(expected, ()):
        return expected
    return next((code for code, spellings in SAME_NUMBER.items() if sent == code or sent in spellings), None)


def to_model_unit(variable: str, value: float, expected: str, code: str | None, unit: str | None) -> float:
    """``value``, sent with the unit ``code`` and/or ``unit`` (text), in ``expected``, the model's unit of
    ``variable``; a unit that cannot be read as it raises ``UnitError``."""
    sent = [text for text in (code, unit) if text]
    if not sent or not expected:
        return value
    named = {ucum(text, expected) for text in sent}
    if None in named:
        unknown = next(text for text in sent if ucum(text, expected) is None)
        raise UnitError(
            f"{unknown!r:.40} is not a unit this service reads for {variable} (it reads {variable} in "
            f"{expected}{_spelt(expected)}, and converts {_convertible(expected)})"
        )
    if len(named) > 1:
        raise UnitError(f"code {code!r:.40} and unit {unit!r:.40} name different units; send one unit")
    (sent_unit,) = named
    if sent_unit == expected:
        return value
    if (sent_unit, expected) not in CONVERSIONS:
        raise UnitError(
            f"{sent_unit!r} is not the unit of {variable}, which this model reads in {expected}"
            f"{_spelt(expected)}; UCUM gives no fixed conversion from {sent_unit} to it"
        )
    scale, offset = CONVERSIONS[(sent_unit, expected)]
    return value * scale + offset


def _spelt(expected: str) -> str:
    spellings = SAME_NUMBER.get(expected, ())
    return f" (accepted as {', '.join(repr(s) for s in (expected, *spellings))})" if spellings else ""


def _convertible(expected: str) -> str:
    units = [source for source, target in CONVERSIONS if target == expected]
    return ", ".join(units) + f" to {expected}" if units else "nothing to it"


@dataclass(frozen=True)
class Range:
    low: float
    high: float
    source: str


class Ranges:
    """The plausible range of each variable: ``ranges.csv``, with a site's own rows (``site``) instead of its
    rows of the same variables."""

    def __init__(self, site: Path | None = None):
        self.of_variable = {row["variable"]: _range(row, RANGES, line) for line, row in _rows(RANGES)}
        self.listed_in = "garlic/live/ranges.csv"
        if site is not None:
            own = {row["variable"]: _range(row, Path(site), line) for line, row in _rows(Path(site))}
            self.of_variable |= own
            self.listed_in += " and the monitor's --ranges table"

    def refusal(self, variable: str, value: float, unit: str) -> str | None:
        """Why ``value`` of ``variable`` (in the model's ``unit``) cannot be a reading, None when it can."""
        bounds = self.of_variable.get(variable)
        if bounds is None or bounds.low <= value <= bounds.high:
            return None
        shown = f" {unit}" if unit else ""
        return (
            f"{variable} {value:.6g}{shown} is outside its plausible range {bounds.low:g} to {bounds.high:g}"
            f"{shown} ({self.listed_in})"
        )


def _range(row: dict, table: Path, line: int) -> Range:
    try:
        low, high = float(row["low"]), float(row["high"])
    except ValueError:
        raise ConfigError(f"{table} line {line}: low and high must be numbers") from None
    if not (math.isfinite(low) and math.isfinite(high) and low <= high):
        raise ConfigError(
            f"{table} line {line}: expected finite low <= high, got {row['low']!r:.20} and {row['high']!r:.20}"
        )
    return Range(low, high, row.get("source") or "")


def _rows(table: Path) -> list[tuple[int, dict]]:
    """A range table's rows with their line numbers; one that cannot be read as one is a ``ConfigError``."""
    try:
        if not table.is_file() or table.stat().st_size > MAX_TABLE_BYTES:
            raise ConfigError(f"the range table {table} is not a file of at most {MAX_TABLE_BYTES} bytes")
        with open(table, newline="", encoding="utf-8") as lines:
            reader = csv.DictReader(lines)
            missing = [column for column in RANGE_COLUMNS if column not in (reader.fieldnames or [])]
            if missing:
                raise ConfigError(
                    f"the range table {table} has no column {', '.join(missing)} (expected a header "
                    f"of {', '.join(RANGE_COLUMNS)}, and optionally unit, source)"
                )
            return [
                (reader.line_num, {key: (value or "").strip() for key, value in row.items() if key}) for row in reader
            ]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"the range table {table} cannot be read: {exc}") from None
