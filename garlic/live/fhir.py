"""HL7 FHIR R4 resources in, readings out: an ``Observation`` (or a ``Bundle`` of them) is one reading of one bed,
an ``Encounter`` admits a bed or discharges it.

The resources are validated by ``fhir.resources`` (its R4B models, which read R4's ``Observation``, ``Bundle`` and
``Encounter`` unchanged): a kept library rather than a schema of our own. On top of that, what the model needs: an
Observation must name its bed (``encounter``: ``Encounter/ID``), a code this model reads
(``garlic.live.codes``), a time with its time zone (``effectiveDateTime`` or ``effectiveInstant``) and a number
(``valueQuantity.value``) in the unit the model reads it in, when a unit is sent (``valueQuantity.code`` under
UCUM, else ``valueQuantity.unit``); an Encounter must have an id, a status and, to admit, ``period.start``: the bed's
time zero, from which every reading's time is counted in hours, as in the datasets. Anything else is refused with a
``FhirError`` whose ``status`` is the HTTP answer and whose message says which field is wrong.

An Observation's ``id``, where it has one, names its reading for later: the same id sent again with another value,
time or code (``amended``, ``corrected``) replaces the reading, and sent with the status ``entered-in-error`` (its
bed and id suffice) withdraws it, as FHIR marks a reading that should never have been made.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError

from garlic.live.codes import UCUM, Codes

MAX_ENTRIES = 5000  # a Bundle: an ICU stay's hour of every monitor is a few hundred readings
# A Bundle of Observations nests about ten deep; past a few hundred, the FHIR models' validation runs out of stack.
MAX_DEPTH = 64
ADMITTING = {"planned", "arrived", "triaged", "in-progress", "onleave"}
DISCHARGING = {"finished", "cancelled"}
BED_ID = re.compile(r"^[A-Za-z0-9\-.]{1,64}$")  # a FHIR id
KEPT_STATUSES = {"registered", "preliminary", "final", "amended", "corrected"}  # not cancelled
WITHDRAWING = "entered-in-error"


class FhirError(ValueError):
    """A request that cannot be taken, with its HTTP status: 400 not JSON, 404 an unknown bed, 409 a discharged bed
    or a conflicting admission, 413 too large, 422 not the FHIR resource or the code expected."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Observed:
    """One reading as sent: its bed (the Encounter's id), the model's variable, when, and the value; ``source``, the
    Observation's id where it has one."""

    bed: str
    variable: str
    at: datetime
    value: float
    source: str | None = None


@dataclass(frozen=True)
class Withdrawal:
    """An Observation sent as entered in error: the reading of ``bed`` sent with the id ``source`` is withdrawn."""

    bed: str
    source: str


@dataclass(frozen=True)
class Stay:
    """An Encounter's news: ``bed`` admitted at ``start`` (``end`` None), or discharged at ``end``."""

    bed: str
    admitted: bool
    start: datetime | None
    end: datetime | None


def _resource_class(kind: str):
    if kind == "Observation":
        from fhir.resources.R4B.observation import Observation

        return Observation
    if kind == "Bundle":
        from fhir.resources.R4B.bundle import Bundle

        return Bundle
    if kind == "Encounter":
        from fhir.resources.R4B.encounter import Encounter

        return Encounter
    raise FhirError(422, f"resourceType {kind!r} is not taken here: send an Observation, a Bundle of them or an "
                         "Encounter")  # fmt: skip


def parse_json(body: bytes) -> dict:
    try:
        payload = json.loads(body)
    except RecursionError:
        raise FhirError(400, f"the body nests deeper than the {MAX_DEPTH} levels a FHIR resource is read to") from None
    except ValueError as exc:  # not JSON, not UTF-8, or a number of more digits than Python reads
        raise FhirError(400, f"the body is not JSON: {exc}") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("resourceType"), str):
        raise FhirError(422, "expected a FHIR resource: a JSON object with a resourceType")
    if _depth(payload) > MAX_DEPTH:
        raise FhirError(400, f"the body nests deeper than the {MAX_DEPTH} levels a FHIR resource is read to")
    return payload


def _depth(payload) -> int:
    """How deep objects and arrays nest in ``payload``, counted without recursion."""
    deepest, level = 0, [(payload, 1)]
    while level:
        node, depth = level.pop()
        deepest = max(deepest, depth)
        if depth <= MAX_DEPTH:
            children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
            level.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def validated(payload: dict, expected: tuple[str, ...]):
    """``payload`` as its FHIR R4 resource, one of the ``expected`` resource types."""
    kind = payload["resourceType"]
    if kind not in expected:
        raise FhirError(422, f"expected {' or '.join(expected)}, got resourceType {kind!r}")
    try:
        return _resource_class(kind).model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or kind
        raise FhirError(422, f"not a valid FHIR R4 {kind}: {where}: {first['msg']}") from None


def _instant(value, field: str) -> datetime:
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise FhirError(422, f"{field} must be a date and time with its time zone (2026-01-01T10:00:00Z), got "
                             f"{value!s:.40}")  # fmt: skip
    return value


def observed(observation, codes: Codes, where: str = "Observation") -> Observed | Withdrawal:
    """The reading an Observation resource holds, for a model reading ``codes``, or the withdrawal it sends."""
    if observation.status not in KEPT_STATUSES | {WITHDRAWING}:
        raise FhirError(422, f"{where}.status {observation.status!r} is not a reading to keep (expected one of "
                             f"{', '.join(sorted(KEPT_STATUSES))}) nor one to withdraw ({WITHDRAWING})")  # fmt: skip
    reference = observation.encounter.reference if observation.encounter else None
    if not reference or not reference.startswith("Encounter/") or not BED_ID.match(reference[len("Encounter/"):]):
        raise FhirError(422, f"{where}.encounter.reference must name the bed's Encounter (Encounter/ID, an id of "
                             "letters, digits, '-' and '.')")  # fmt: skip
    bed = reference.removeprefix("Encounter/")
    if observation.status == WITHDRAWING:
        if not observation.id:
            raise FhirError(422, f"{where}.id is required to withdraw a reading ({WITHDRAWING}): the id it was sent "
                                 "with")  # fmt: skip
        return Withdrawal(bed, observation.id)
    codings = observation.code.coding or []
    names = [codes.variable(c.system, c.code) for c in codings]
    known = [name for name in names if name is not None]
    if not known:
        sent = ", ".join(f"{c.system}|{c.code}" for c in codings[:3]) or "no coding"
        sent += f" (and {len(codings) - 3} more codings)" if len(codings) > 3 else ""
        raise FhirError(422, f"{where}.code: {sent} is not an input of this model ({codes.listed_in} lists "
                             "the codes it reads)")  # fmt: skip
    at = observation.effectiveDateTime or observation.effectiveInstant
    if at is None:
        raise FhirError(422, f"{where}: effectiveDateTime (or effectiveInstant) is required")
    quantity = observation.valueQuantity
    if quantity is None or quantity.value is None:
        raise FhirError(422, f"{where}: valueQuantity.value is required (a number)")
    value = float(quantity.value)
    if not abs(value) < 1e30:  # float32's range, and no NaN
        raise FhirError(422, f"{where}.valueQuantity.value {value} is out of range")
    unit = quantity.code if quantity.code and quantity.system == UCUM else quantity.unit
    refusal = codes.unit_refusal(known[0], unit)
    if refusal:
        raise FhirError(422, f"{where}.valueQuantity: {refusal}")
    return Observed(bed, known[0], _instant(at, f"{where}.effectiveDateTime"), value, observation.id)


def observations_in(payload: dict, codes: Codes) -> list[Observed | Withdrawal]:
    """The readings (and withdrawals) of an Observation, or of a Bundle whose every entry is an Observation."""
    resource = validated(payload, ("Observation", "Bundle"))
    if payload["resourceType"] == "Observation":
        return [observed(resource, codes)]
    entries = resource.entry or []
    if len(entries) > MAX_ENTRIES:
        raise FhirError(413, f"the Bundle holds {len(entries)} entries; at most {MAX_ENTRIES} are taken at once")
    readings = []
    for index, entry in enumerate(entries):
        where = f"Bundle.entry[{index}].resource"
        if entry.resource is None or entry.resource.get_resource_type() != "Observation":
            raise FhirError(422, f"{where} must be an Observation")
        readings.append(observed(entry.resource, codes, where))
    return readings


def stay_of(payload: dict, bed: str) -> Stay:
    """An Encounter update of ``bed`` (its id must be ``bed``): admitted from ``period.start``, or discharged."""
    encounter = validated(payload, ("Encounter",))
    if encounter.id != bed:
        raise FhirError(422, f"Encounter.id {encounter.id!r} differs from the bed {bed!r} it is sent to")
    period = encounter.period
    start = _instant(period.start, "Encounter.period.start") if period and period.start else None
    end = _instant(period.end, "Encounter.period.end") if period and period.end else None
    if encounter.status in ADMITTING:
        if start is None:
            raise FhirError(422, "Encounter.period.start is required to admit a bed: the time its readings count from")
        return Stay(bed, True, start, None)
    if encounter.status in DISCHARGING:
        return Stay(bed, False, start, end)
    raise FhirError(422, f"Encounter.status {encounter.status!r} neither admits nor discharges a bed")
