"""Recorded stays streamed into the live service as FHIR resources, at N times real time (``garlic feed``).

Each bed is one of the run's test stays (its record id is the bed's Encounter id), admitted when the feed starts
(``Encounter`` with ``period.start``: now, or as long ago as the longest stay lasts when played faster than real
time, so that no reading is dated after the service's clock). Its static descriptors are sent at admission, then each time of its
record is sent as one ``Bundle`` of the Observations taken then (a chart row, a laboratory panel), when
``speed`` times real time has reached it; the beds' readings interleave as they would on a ward. A request the
service does not acknowledge (it is restarting, or too busy) is sent again until it is: a repeat counts once in the
store, so nothing is lost and nothing counted twice.
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

import numpy as np
import pandas as pd

from garlic.live.codes import UCUM, Codes

DEFAULT_URL = "http://127.0.0.1:8600"
RETRY_SECONDS = 120  # how long a request is sent again before the feed gives up
ENCOUNTER_CLASS = {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode", "code": "IMP"}


@dataclass
class Fed:
    beds: int = 0
    sent: int = 0  # readings acknowledged by the service
    stored: int = 0
    repeats: int = 0


def recorded_stays(run_id: str, store: Path, data_root: Path, beds: int) -> tuple[str, pd.DataFrame, pd.DataFrame]:
    """The run's dataset, and the observations and static rows of the first ``beds`` test stays of its split, from
    the dataset under ``data_root`` (refused when that is not the dataset and split the run was trained on)."""
    from garlic.data.datasets import processed_folder
    from garlic.io.tables import read_manifest, read_processed
    from garlic.tracking import run_contract
    from garlic.tracking.store import get_run, use_store

    if beds < 1:  # [:beds] would take all but the last -beds stays
        raise ValueError(f"--beds must be at least 1, got {beds}")
    use_store(store)
    params = get_run(run_id).data.params
    if run_contract.DATASET not in params:
        raise ValueError(f"run {run_id} does not name its dataset: it cannot be fed from")
    folder = processed_folder(params[run_contract.DATASET], data_root)
    split = run_contract.verify_split(run_id, params, folder, read_manifest(folder))
    chosen = np.sort(split.test)[:beds]
    tables = read_processed(folder)
    observations = tables.observations[tables.observations["stay_id"].isin(chosen)]
    return params[run_contract.DATASET], observations, tables.static[tables.static["stay_id"].isin(chosen)]


def instant(at: datetime) -> str:
    return at.astimezone(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def encounter(bed: str, start: datetime) -> dict:
    return {
        "resourceType": "Encounter",
        "id": bed,
        "status": "in-progress",
        "class": ENCOUNTER_CLASS,
        "period": {"start": instant(start)},
    }


def observation(codes: Codes, bed: str, variable: str, at: datetime, value: float) -> dict:
    code = codes.of_variable[variable]
    quantity = {"value": float(f"{value:.6g}")}
    if code.unit:  # the table's, under any system: a hospital's own codes too
        quantity |= {"unit": code.unit, "system": UCUM, "code": code.unit}
    return {
        "resourceType": "Observation",
        "status": "final",
        "code": {
            "coding": [
                {"system": code.system, "code": code.code, **({"display": code.display} if code.display else {})}
            ]
        },
        "encounter": {"reference": f"Encounter/{bed}"},
        "effectiveDateTime": instant(at),
        "valueQuantity": quantity,
    }


def bundle(resources: list[dict]) -> dict:
    return {"resourceType": "Bundle", "type": "batch", "entry": [{"resource": resource} for resource in resources]}


def chart_rows(
    observations: pd.DataFrame, static: pd.DataFrame, codes: Codes, start: datetime
) -> list[tuple[float, str, dict]]:
    """(hours after admission, bed, Bundle) for every time of every stay, in time order: the static descriptors
    with the first row. Times are sent to the second, as a monitor stamps them."""
    rows: dict[tuple[float, str], list[dict]] = {}
    seconds = np.round(observations["time"].to_numpy(dtype=float) * 3600)
    for second, stay, variable, value in zip(
        seconds, observations["stay_id"], observations["variable"].astype(str), observations["value"]
    ):
        at = start + timedelta(seconds=float(second))
        rows.setdefault((second / 3600, str(stay)), []).append(observation(codes, str(stay), variable, at, value))
    for record in static.to_dict("records"):
        bed = str(record.pop("stay_id"))
        known = [
            observation(codes, bed, name, start, value)
            for name, value in record.items()
            if name in codes.of_variable and not pd.isna(value)
        ]
        rows.setdefault((0.0, bed), [])[:0] = known
    return [(hours, bed, bundle(resources)) for (hours, bed), resources in sorted(rows.items())]


class Client:
    """One kept-alive HTTP connection to the service, sending each request again until it is answered."""

    def __init__(self, url: str, token: str | None = None, say: Callable[[str], None] = lambda message: None):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--url {url!r} is not an http(s) address such as {DEFAULT_URL}")
        self.parts, self.connection, self.say, self.unanswered = parts, None, say, False
        self.headers = {"Content-Type": "application/fhir+json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"

    def _connect(self) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self.parts.scheme == "https" else http.client.HTTPConnection
        return kind(self.parts.hostname, self.parts.port or (443 if self.parts.scheme == "https" else 80), timeout=60)

    def send(self, method: str, path: str, payload: dict) -> dict:
        """The service's JSON answer to ``payload``; a 4xx refusal raises ValueError with its message."""
        body = json.dumps(payload).encode()
        deadline = time.monotonic() + RETRY_SECONDS
        while True:
            try:
                self.connection = self.connection or self._connect()
                self.connection.request(method, self.parts.path.rstrip("/") + path, body, self.headers)
                response = self.connection.getresponse()
                answer = response.read()
                if response.status < 300:
                    self.unanswered = False
                    return json.loads(answer)
                if 400 <= response.status < 500 and response.status != 429:
                    raise ValueError(f"the service refused {method} {path}: {response.status} {_diagnostics(answer)}")
            except (OSError, http.client.HTTPException) as exc:
                if self.connection is not None:
                    self.connection.close()
                self.connection = None
                if not self.unanswered:  # said once an outage, not every half second
                    self.say(f"no answer from {self.parts.geturl()} ({exc}); sending again for up to {RETRY_SECONDS} s")
                    self.unanswered = True
            if time.monotonic() > deadline:
                raise ConnectionError(f"no answer from {self.parts.geturl()} for {RETRY_SECONDS} s")
            time.sleep(0.5)


def _diagnostics(answer: bytes) -> str:
    try:
        return "; ".join(issue["diagnostics"] for issue in json.loads(answer)["issue"])
    except (ValueError, KeyError, TypeError):
        return answer[:200].decode(errors="replace")


def feed(
    client: Client,
    observations: pd.DataFrame,
    static: pd.DataFrame,
    codes: Codes,
    speed: float,
    say: Callable[[str], None] = lambda message: None,
) -> Fed:
    """Admit every stay's bed now, then send its chart rows at ``speed`` times real time; what was fed."""
    if not speed > 0:
        raise ValueError(f"--speed must be above 0 (times real time), got {speed}")
    # Admitted as long ago as the longest stay lasts: a record played faster than real time is never dated after the
    # service's clock, which refuses readings from the future.
    last = max([float(observations["time"].max()) if len(observations) else 0.0, 0.0])
    start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=last if speed > 1 else 0)
    fed = Fed()
    for stay in static["stay_id"]:
        client.send("PUT", f"/fhir/Encounter/{stay}", encounter(str(stay), start))
        fed.beds += 1
    began, shown = time.monotonic(), time.monotonic()
    for hours, bed, resources in chart_rows(observations, static, codes, start):
        wait = began + hours * 3600 / speed - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        answer = client.send("POST", "/fhir", resources)  # a batch-response: an entry per Observation
        statuses = [entry["response"]["status"] for entry in answer["entry"]]
        fed.sent += len(resources["entry"])
        fed.stored += sum(status.startswith("201") for status in statuses)
        fed.repeats += sum(not status.startswith("201") for status in statuses)
        if time.monotonic() - shown > 10:
            say(f"hour {hours:.1f} of the stays: {fed.sent} readings sent")
            shown = time.monotonic()
    return fed
