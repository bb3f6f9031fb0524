"""HL7 FHIR R4 resources in, readings out: an ``Observation`` (or a ``batch`` or ``transaction`` Bundle of them)
holds readings of one bed, an ``Encounter`` admits a bed or discharges it.

The resources are validated by ``fhir.resources`` (its R4B models, which read R4's ``Observation``, ``Bundle`` and
``Encounter`` unchanged): a kept library rather than a schema of our own. On top of that, what the model needs: an
Observation must name its bed (``encounter``: ``Encounter/ID``), a code this model reads (``garlic.live.codes``),
coded as one input only, a time with its time zone (``effectiveDateTime`` or ``effectiveInstant``) no more than
``MAX_AHEAD_SECONDS`` after the service's clock, and a number (``valueQuantity.value``, no ``comparator``) in a unit
that is, or converts to, the model's, inside the variable's plausible range (``garlic.live.values``). Its
``component``s are readings too (a blood pressure panel's systolic and diastolic), each checked the same way. A
``subject`` must be ``Patient/ID``; the store holds a bed to one patient. An Encounter must have an id, a status
and, to admit, ``period.start`` not in the future: the bed's time zero, from which every reading's time is counted
in hours, as in the datasets. Anything else is refused with a ``FhirError`` whose ``status`` is the HTTP answer,
whose message says which field is wrong and whose ``reason`` (a few words, never a value) is what the log says.

An Observation's ``id``, where it has one, names its readings for later: the same id sent again with another value,
time or code (``amended``, ``corrected``) replaces them, and sent with the status ``entered-in-error`` (its bed and
id suffice) withdraws them, as FHIR marks a reading that should never have been made.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError

from garlic.live.codes import Codes
from garlic.live.values import UnitError, to_model_unit

MAX_ENTRIES = 5000  # a Bundle: an ICU stay's hour of every monitor is a few hundred readings
# A Bundle of Observations nests about ten deep; past a few hundred, the FHIR models' validation runs out of stack.
MAX_DEPTH = 64
ADMITTING = {"planned", "arrived", "triaged", "in-progress", "onleave"}
DISCHARGING = {"finished", "cancelled"}
BED_ID = re.compile(r"[A-Za-z0-9\-.]{1,64}")  # a FHIR id (matched whole: fullmatch, no trailing newline)
MAX_AHEAD_SECONDS = 300  # a monitor's clock a few minutes ahead of the service's; a later time is a wrong date
BUNDLE_TYPES = {"batch", "transaction"}
ABSOLUTE = re.compile(r"https?://")
TAKEN_METHODS = {"POST", "PUT"}
KEPT_STATUSES = {"registered", "preliminary", "final", "amended", "corrected"}  # not cancelled
WITHDRAWING = "entered-in-error"


REASONS = {
    400: "not JSON",
    401: "no token",
    404: "not found",
    405: "method",
    408: "body too slow",
    409: "conflict",
    413: "too large",
    415: "content type",
    422: "invalid",
    429: "throttled",
    503: "busy",
}


class FhirError(ValueError):
    """A request that cannot be taken, with its HTTP status: 400 not JSON, 404 an unknown bed, 409 a discharged bed
    or a conflicting admission, 413 too large, 422 not the FHIR resource or the code expected."""

    def __init__(self, status: int, message: str, reason: str = ""):
        """``reason``: a few words for the log, which never holds a value sent (the message may)."""
        super().__init__(message)
        self.status, self.reason = status, reason or REASONS.get(status, "refused")


@dataclass(frozen=True)
class Observed:
    """One reading as sent: its bed (the Encounter's id), the model's variable, when, and the value; ``source``, the
    Observation's id where it has one."""

    bed: str
    variable: str
    at: datetime
    value: float
    source: str | None = None
    subject: str | None = None  # the Patient's id, where the Observation names one
    part: int = 0  # which of its Observation's readings (a panel's components: 0, 1, ...), that they stay one


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
    subject: str | None = None  # the Patient's id, where the Encounter names one


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
    raise FhirError(
        422, f"resourceType {kind!r} is not taken here: send an Observation, a Bundle of them or an Encounter"
    )


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
        raise FhirError(
            422, f"{field} must be a date and time with its time zone (2026-01-01T10:00:00Z), got {value!s:.40}"
        )
    return value


def _reference(reference, kind: str, field: str) -> str:
    """The id in ``reference`` (``kind/ID``, or an absolute URL ending so), refused unless it is one."""
    text = reference.reference if reference is not None else None
    if text and ABSOLUTE.match(text):  # http://ehr.example/fhir/Patient/123: the same Patient/123
        text = "/".join(text.rsplit("/", 2)[-2:])
    if not text or not text.startswith(f"{kind}/") or not is_id(text[len(kind) + 1 :]):
        raise FhirError(
            422,
            f"{field}.reference must be {kind}/ID (an id of letters, digits, '-' and '.', at most 64, not dots only)",
            "reference",
        )
    return text[len(kind) + 1 :]


def _subject(reference, field: str) -> str | None:
    """The Patient a ``subject`` names, None where it names none by reference (absent, or an identifier only, which
    cannot be compared with the bed's)."""
    return _reference(reference, "Patient", field) if reference is not None and reference.reference else None


def is_id(text: str) -> bool:
    """A FHIR id, and not ``.``, ``..`` or any id of dots only, which a path or a proxy may read as a folder."""
    return BED_ID.fullmatch(text) is not None and text.strip(".") != ""


def _codes_read(concept, codes: Codes, where: str) -> str | None:
    """The one model variable ``concept`` is coded as, None when none; two different ones are refused."""
    codings = (concept.coding or []) if concept is not None else []
    known = sorted({name for name in (codes.variable(c.system, c.code) for c in codings) if name is not None})
    if len(known) > 1:
        raise FhirError(
            422,
            f"{where}.code is coded as {len(known)} different inputs of this model ("
            f"{', '.join(known[:4])}); an Observation is one reading: code it as one",
            "code",
        )
    return known[0] if known else None


def _unknown_code(concept, codes: Codes, where: str) -> FhirError:
    codings = (concept.coding or []) if concept is not None else []
    sent = ", ".join(f"{c.system!s:.80}|{c.code!s:.40}" for c in codings[:3]) or "no coding"
    sent += f" (and {len(codings) - 3} more codings)" if len(codings) > 3 else ""
    return FhirError(
        422, f"{where}.code: {sent} is not an input of this model ({codes.listed_in} lists the codes it reads)", "code"
    )


def _value(quantity, variable: str, codes: Codes, where: str) -> float:
    """A quantity's value in the model's unit of ``variable``, refused unless it is a plausible one."""
    if quantity is None or quantity.value is None:
        raise FhirError(422, f"{where}: valueQuantity.value is required (a number)", "value")
    if quantity.comparator is not None:
        raise FhirError(
            422,
            f"{where}.valueQuantity.comparator: a value bounded by {quantity.comparator!s:.2} is "
            "not a measured value; send the number measured, without comparator",
            "comparator",
        )
    value = float(quantity.value)
    if not abs(value) < 1e30:  # float32's range, and no NaN
        raise FhirError(422, f"{where}.valueQuantity.value is out of range", "value")
    try:
        value = to_model_unit(variable, value, codes.unit(variable), quantity.code, quantity.unit)
    except UnitError as exc:
        raise FhirError(422, f"{where}.valueQuantity: {exc}", "unit") from None
    refusal = codes.ranges.refusal(variable, value, codes.unit(variable))
    if refusal:
        raise FhirError(422, f"{where}.valueQuantity: {refusal}", "range")
    return value


def observed(
    observation, codes: Codes, where: str = "Observation", now: float | None = None
) -> list[Observed] | Withdrawal:
    """The readings an Observation resource holds (its value, and each of its components: a blood pressure panel's
    systolic and diastolic), for a model reading ``codes``, or the withdrawal it sends. ``now``: the service's
    clock (UTC seconds), past which a reading is refused."""
    if observation.status not in KEPT_STATUSES | {WITHDRAWING}:
        raise FhirError(
            422,
            f"{where}.status {observation.status!s:.40} is not a reading to keep (expected one of "
            f"{', '.join(sorted(KEPT_STATUSES))}) nor one to withdraw ({WITHDRAWING})",
            "status",
        )
    bed = _reference(observation.encounter, "Encounter", f"{where}.encounter")
    subject = _subject(observation.subject, f"{where}.subject")
    if observation.status == WITHDRAWING:
        if not observation.id:
            raise FhirError(
                422, f"{where}.id is required to withdraw a reading ({WITHDRAWING}): the id it was sent with", "id"
            )
        return Withdrawal(bed, observation.id)
    at = observation.effectiveDateTime or observation.effectiveInstant
    if at is None:
        raise FhirError(422, f"{where}: effectiveDateTime (or effectiveInstant) is required", "time")
    at = _instant(at, f"{where}.effectiveDateTime")
    _not_ahead(at, now, f"{where}.effectiveDateTime")
    readings = []
    variable = _codes_read(observation.code, codes, where)
    if observation.valueQuantity is not None or not observation.component:
        if variable is None:
            raise _unknown_code(observation.code, codes, where)
        readings.append((variable, _value(observation.valueQuantity, variable, codes, where)))
    for index, component in enumerate(observation.component or []):
        part = f"{where}.component[{index}]"
        if component.valueQuantity is None and component.dataAbsentReason is not None:
            continue  # a panel's member not measured this time, said so
        name = _codes_read(component.code, codes, part)
        if name is None:
            raise _unknown_code(component.code, codes, part)
        readings.append((name, _value(component.valueQuantity, name, codes, part)))
    names = [name for name, _ in readings]
    if len(set(names)) < len(names):
        raise FhirError(422, f"{where}: the same input is sent twice in one Observation (value and components)", "code")
    if not readings:
        raise FhirError(422, f"{where}: every component is absent (dataAbsentReason); nothing to read", "value")
    return [
        Observed(bed, name, at, value, observation.id, subject, part) for part, (name, value) in enumerate(readings)
    ]


def _not_ahead(at: datetime, now: float | None, field: str) -> None:
    """Refuse a time more than ``MAX_AHEAD_SECONDS`` after the service's clock: a wrong date or time zone."""
    now = time.time() if now is None else now
    if at.timestamp() > now + MAX_AHEAD_SECONDS:
        raise FhirError(
            422,
            f"{field} is {(at.timestamp() - now) / 60:.0f} minutes after the service's clock; at "
            f"most {MAX_AHEAD_SECONDS // 60} minutes ahead is taken (is its date or time zone "
            "right?)",
            "future",
        )


@dataclass(frozen=True)
class Sent:
    """One Observation as sent (``resource``, its JSON) and what it holds: its readings, or a withdrawal."""

    resource: dict
    readings: tuple[Observed, ...] | Withdrawal

    @property
    def bed(self) -> str:
        return self.readings.bed if isinstance(self.readings, Withdrawal) else self.readings[0].bed


@dataclass(frozen=True)
class Posted:
    """What a POST holds: ``kind`` Observation, or the Bundle's type (batch, transaction), and its Observations."""

    kind: str
    sent: list[Sent]

    def all(self) -> list[Observed | Withdrawal]:
        """Every reading and withdrawal, in the order sent."""
        return [one for s in self.sent for one in ([s.readings] if isinstance(s.readings, Withdrawal) else s.readings)]


def observations_in(payload: dict, codes: Codes, now: float | None = None) -> Posted:
    """The Observations of an Observation, or of a ``batch`` or ``transaction`` Bundle whose every entry is an
    Observation POSTed (or PUT): their readings and withdrawals."""
    if payload.get("resourceType") == "Bundle":
        _bundle_shape(payload)
    resource = validated(payload, ("Observation", "Bundle"))
    if payload["resourceType"] == "Observation":
        return Posted("Observation", [Sent(payload, _held(observed(resource, codes, now=now)))])
    sent = []
    for index, entry in enumerate(resource.entry or []):
        where = f"Bundle.entry[{index}]"
        if entry.request is not None and entry.request.method not in TAKEN_METHODS:
            raise FhirError(
                422,
                f"{where}.request.method {entry.request.method!s:.10} is not taken here: a Bundle "
                f"here only adds Observations ({' or '.join(sorted(TAKEN_METHODS))})",
                "method",
            )
        if entry.resource is None or entry.resource.get_resource_type() != "Observation":
            raise FhirError(422, f"{where}.resource must be an Observation", "resource")
        raw = payload["entry"][index]["resource"]
        sent.append(Sent(raw, _held(observed(entry.resource, codes, f"{where}.resource", now))))
    return Posted(resource.type, sent)


def _held(readings: list[Observed] | Withdrawal) -> tuple[Observed, ...] | Withdrawal:
    return readings if isinstance(readings, Withdrawal) else tuple(readings)


def _bundle_shape(payload: dict) -> None:
    """A Bundle's type and size, checked before its entries are validated (which takes a while for thousands)."""
    entries = payload.get("entry") or []
    if isinstance(entries, list) and len(entries) > MAX_ENTRIES:
        raise FhirError(
            413, f"the Bundle holds {len(entries)} entries; at most {MAX_ENTRIES} are taken at once", "too many entries"
        )
    kind = payload.get("type")
    if kind not in BUNDLE_TYPES:
        raise FhirError(
            422,
            f"Bundle.type {kind!s:.20} is not taken here: send a batch or a transaction of "
            "Observations (a searchset or a history is an answer, not new readings)",
            "bundle type",
        )


def stay_of(payload: dict, bed: str, now: float | None = None) -> Stay:
    """An Encounter update of ``bed`` (its id must be ``bed``): admitted from ``period.start``, in the past, or
    discharged."""
    encounter = validated(payload, ("Encounter",))
    if encounter.id != bed:
        raise FhirError(422, f"Encounter.id {encounter.id!s:.64} differs from the bed {bed} it is sent to", "id")
    subject = _subject(encounter.subject, "Encounter.subject")
    period = encounter.period
    start = _instant(period.start, "Encounter.period.start") if period and period.start else None
    end = _instant(period.end, "Encounter.period.end") if period and period.end else None
    if encounter.status in ADMITTING:
        if start is None:
            raise FhirError(
                422, "Encounter.period.start is required to admit a bed: the time its readings count from", "start"
            )
        _not_ahead(start, now, "Encounter.period.start")
        return Stay(bed, True, start, None, subject)
    if encounter.status in DISCHARGING:
        return Stay(bed, False, start, end, subject)
    raise FhirError(422, f"Encounter.status {encounter.status!s:.20} neither admits nor discharges a bed", "status")
