"""The FHIR R4 resources the service answers with: the Observations it holds (as stored: the model's variable,
its code and unit), the answer to a POST (the Observation with the id and version it is held under), and the
``CapabilityStatement`` (``GET /fhir/metadata``) listing exactly what the service takes.

An Observation sent with an ``id`` is held under that id; one sent without is held under ``r`` and the row id of
its (first) reading, which its answer's ``Location`` names. Its ``meta.versionId`` is the row id of its newest
reading: a correction (the same id sent again with another value) gives a new one.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pandas as pd

from garlic.live.codes import UCUM, Codes
from garlic.live.fhir import MAX_ENTRIES, Sent, Withdrawal

FHIR_VERSION = "4.0.1"


def _instant(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def stored_observation(sent: Sent, held: dict, started: float) -> tuple[int, str | None, dict]:
    """(status, location, resource) of one Observation of a POST: 201 where a reading of it was stored by this
    request (received at or after ``started``), 200 where all were held already (a repeat) or it withdrew.
    ``held``: each reading's (row id, received) as held now."""
    if isinstance(sent.readings, Withdrawal):
        return 200, None, sent.resource
    rows = [held.get(reading) for reading in sent.readings]
    ids = [row[0] for row in rows if row is not None]
    if not ids:  # replaced meanwhile by another request: answered as sent
        return 200, None, sent.resource
    logical = sent.readings[0].source or f"r{ids[0]}"
    version = str(max(ids))
    newest = max(row[1] for row in rows if row is not None)
    resource = {**sent.resource, "id": logical, "meta": {"versionId": version, "lastUpdated": _instant(newest)}}
    created = any(row is not None and row[1] >= started for row in rows)
    return (201 if created else 200), f"Observation/{logical}/_history/{version}", resource


def observation_bundle(rows: pd.DataFrame, codes: Codes, single: bool) -> dict:
    """The Observations ``rows`` (``LiveStore.observation``'s columns) hold: one (``single``: the readings of one
    id, the held ones, else the withdrawn ones as entered-in-error), or a searchset Bundle of them."""
    groups = rows.assign(
        logical=[s if isinstance(s, str) and s else f"r{i}" for s, i in zip(rows["source"], rows["id"])]
    )
    resources = []
    for logical, group in groups.groupby("logical", sort=False):
        held = group[~group["withdrawn"].astype(bool)]
        resources.append(_observation(logical, held if not held.empty else group, codes, held.empty))
    if single:
        return resources[0]
    return {
        "resourceType": "Bundle",
        "type": "searchset",
        "total": len(resources),
        "entry": [{"fullUrl": f"Observation/{r['id']}", "resource": r, "search": {"mode": "match"}} for r in resources],
    }


def _observation(logical: str, rows: pd.DataFrame, codes: Codes, withdrawn: bool) -> dict:
    first = rows.iloc[0]
    values = [
        _coded(codes, row.variable) | {"valueQuantity": _quantity(codes, row.variable, row.value)}
        for row in rows.itertuples()
    ]
    resource = {
        "resourceType": "Observation",
        "id": logical,
        "meta": {"versionId": str(int(rows["id"].max())), "lastUpdated": _instant(rows["received"].max())},
        "status": "entered-in-error" if withdrawn else "final",
        "encounter": {"reference": f"Encounter/{first.bed}"},
        "effectiveDateTime": _instant(first.admitted + first.time * 3600),
    }
    if isinstance(first.patient, str) and first.patient:
        resource["subject"] = {"reference": f"Patient/{first.patient}"}
    if len(values) == 1:
        return resource | values[0]
    return resource | {"code": {"text": "readings sent together under one id"}, "component": values}


def _coded(codes: Codes, variable: str) -> dict:
    code = codes.of_variable.get(variable)
    coding = {"system": code.system, "code": code.code} if code else {"text": variable}
    return {"code": {"coding": [coding | ({"display": code.display} if code and code.display else {})]}}


def _quantity(codes: Codes, variable: str, value: float) -> dict:
    unit = codes.of_variable[variable].unit if variable in codes.of_variable else ""
    return {"value": float(value), **({"unit": unit, "system": UCUM, "code": unit} if unit else {})}


def capability(base: str, codes: Codes) -> dict:
    """What this service takes, exactly: Observation create, read and search (encounter, _since), Encounter
    update, batch and transaction Bundles of Observations; JSON only."""
    return {
        "resourceType": "CapabilityStatement",
        "status": "active",
        "kind": "instance",
        "date": _instant(0)[:10],
        "fhirVersion": FHIR_VERSION,
        "format": ["application/fhir+json", "json"],
        "software": {"name": "GARLIC-ICU live ward (garlic monitor)"},
        "implementation": {"description": f"risk scoring of a ward; reads {len(codes.names)} inputs", "url": base},
        "rest": [
            {
                "mode": "server",
                "documentation": f"Bundles: batch or transaction, of Observations POSTed (or PUT), at most {MAX_ENTRIES} "
                "entries, stored all or none. Units converted where UCUM gives a fixed conversion, "
                "values outside their plausible range refused (docs/live.md).",
                "interaction": [{"code": "batch"}, {"code": "transaction"}],
                "resource": [
                    {
                        "type": "Observation",
                        "interaction": [{"code": "create"}, {"code": "read"}, {"code": "search-type"}],
                        "versioning": "versioned",
                        "readHistory": False,
                        "updateCreate": False,
                        "searchParam": [
                            {
                                "name": "encounter",
                                "type": "reference",
                                "documentation": "required: Encounter/ID, the bed",
                            },
                            {
                                "name": "_since",
                                "type": "date",
                                "documentation": "readings received at or after this instant",
                            },
                        ],
                    },
                    {
                        "type": "Encounter",
                        "interaction": [{"code": "update"}],
                        "updateCreate": True,
                        "documentation": "admits a bed (in-progress ..., period.start) or discharges it (finished)",
                    },
                ],
            }
        ],
    }
