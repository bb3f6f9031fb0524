"""The live ward's HTTP service (``garlic monitor``): FHIR R4 readings in, each bed's risk, alert and drivers out.

    PUT  /fhir/Encounter/{bed}   admit a bed (status in-progress and period.start) or discharge it (finished)
    POST /fhir/Observation       one reading (or, entered-in-error, the withdrawal of the reading sent with its id)
    POST /fhir/Bundle            a Bundle of Observations, taken all or none
    POST /fhir                   either of the two above, by its resourceType
    GET  /ward                   every bed with its newest risk, its change over the last hour and its alert,
                                 highest risk first
    GET  /beds/{bed}             a bed's readings and its risk, alert and drivers at each reading time
    GET  /health                 counts: beds, readings, scored, withdrawn, pending

A reading is answered 201 only once it is committed to the store; the scoring loop (``garlic.live.monitor``) then
scores it. Every refusal is a 4xx (5xx: the store is behind or failing) with a FHIR ``OperationOutcome`` saying
what was wrong, and changes nothing: 400 not JSON, 401 no or a wrong token, 404 an unknown bed, 409 a discharged
bed, 413 a body over ``MAX_BODY_BYTES``, 422 not the FHIR resource or code expected, 429 too many wrong tokens,
503 the scoring loop too far behind.

Listening on 127.0.0.1 by default; any other address needs a token in ``GARLIC_MONITOR_TOKEN``
(``garlic.live.access``), which every request must then bring as ``Authorization: Bearer TOKEN``.
"""
from __future__ import annotations

import logging
import math

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from garlic.live.access import MONITOR_TOKEN, Attempts, token_matches
from garlic.live.codes import Codes
from garlic.live.fhir import BED_ID, FhirError, observations_in, parse_json, stay_of
from garlic.live.monitor import Monitor
from garlic.live.watch import FolderWatcher

MAX_BODY_BYTES = 1 << 20  # a Bundle of an hour of every monitor of a bed is under 100 kB
MAX_CONNECTIONS = 500  # open at once; beyond, uvicorn answers 503
log = logging.getLogger("garlic.live")


def outcome(status: int, message: str) -> JSONResponse:
    issue = {"severity": "error", "code": "security" if status in (401, 429) else "invalid", "diagnostics": message}
    return JSONResponse({"resourceType": "OperationOutcome", "issue": [issue]}, status_code=status,
                        headers={"WWW-Authenticate": "Bearer"} if status == 401 else None)  # fmt: skip


async def bounded_body(request: Request) -> bytes:
    """The request's body, refused (413) past ``MAX_BODY_BYTES`` before more of it is read."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise FhirError(413, f"the body is {int(declared)} bytes; at most {MAX_BODY_BYTES} are taken")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise FhirError(413, f"the body is over {MAX_BODY_BYTES} bytes, the most taken")
        chunks.append(chunk)
    return b"".join(chunks)


def _number(value) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def create_app(monitor: Monitor, codes: Codes, token: str | None, attempts: Attempts | None = None) -> FastAPI:
    """The service for ``monitor``'s store, reading ``codes``; with ``token``, only for requests that bring it."""
    app = FastAPI(title="GARLIC-ICU live ward", docs_url=None, redoc_url=None, openapi_url=None)
    attempts = attempts or Attempts()
    store = monitor.store

    @app.exception_handler(FhirError)
    async def refused(request: Request, exc: FhirError) -> JSONResponse:
        return outcome(exc.status, str(exc))

    @app.middleware("http")
    async def only_with_the_token(request: Request, call_next):
        if token is None:
            return await call_next(request)
        client = request.client.host if request.client else "unknown"
        if attempts.blocked(client):
            return outcome(429, "too many wrong tokens; wait a minute")
        given = request.headers.get("authorization", "")
        if not (given.startswith("Bearer ") and token_matches(given[len("Bearer "):], token)):
            failures = attempts.failed(client)
            log.warning("refused a request without the right token (%d in the last minute)", failures)
            return outcome(401, f"this service needs its token: send Authorization: Bearer ${MONITOR_TOKEN}")
        return await call_next(request)

    def take(payload: dict) -> dict:
        stored, repeats, withdrawn = monitor.take(observations_in(payload, codes))
        return {"stored": stored, "repeats": repeats, "withdrawn": withdrawn}

    async def post(request: Request) -> JSONResponse:
        payload = parse_json(await bounded_body(request))
        return JSONResponse(await run_in_threadpool(take, payload), status_code=201)

    for path in ("/fhir", "/fhir/Observation", "/fhir/Bundle"):
        app.add_api_route(path, post, methods=["POST"])

    @app.put("/fhir/Encounter/{bed}")
    async def encounter(bed: str, request: Request) -> JSONResponse:
        if not BED_ID.match(bed):
            raise FhirError(422, "a bed is a FHIR id: letters, digits, '-' and '.', at most 64")
        stay = stay_of(parse_json(await bounded_body(request)), bed)
        changed = await run_in_threadpool(store.admit, stay)
        return JSONResponse({"bed": bed, "admitted": stay.admitted, "changed": changed})

    @app.get("/ward")
    def ward() -> list[dict]:
        beds = store.beds()
        beds = beds[beds["discharged"].isna()].sort_values("risk", ascending=False, na_position="last")
        trend = store.hour_ago(dict(zip(beds["bed"], beds["time"])))
        return [{"bed": row.bed, "time": _number(row.time), "risk": _number(row.risk),
                 "trend": None if _number(row.risk) is None or trend.get(row.bed) is None
                 else float(row.risk) - trend[row.bed],
                 "alert": bool(row.alert) if row.alert is not None else False,
                 "readings": int(_number(row.readings) or 0),
                 "drivers": row.drivers} for row in beds.itertuples()]  # fmt: skip

    @app.get("/beds/{bed}")
    def bed_history(bed: str) -> dict:
        if not BED_ID.match(bed) or bed not in set(store.beds()["bed"]):
            raise FhirError(404, "no such bed")
        history = store.history(bed)
        readings = store.readings([bed])
        return {"bed": bed, "threshold": monitor.alerts.threshold, "policy": monitor.alerts.settings(),
                "scores": [{"time": r.time, "risk": _number(r.risk), "alert": bool(r.alert), "drivers": r.drivers}
                           for r in history.itertuples()],
                "readings": [{"time": r.time, "variable": r.variable, "value": r.value}
                             for r in readings.itertuples()]}  # fmt: skip

    @app.get("/health")
    def health() -> dict:
        return store.counts()

    return app


def serve(monitor: Monitor, codes: Codes, host: str, port: int, token: str | None,
          watcher: FolderWatcher | None = None) -> None:  # fmt: skip
    """Serve until stopped (SIGINT, SIGTERM); the scoring loop (and the folder ``watcher``, given one) runs beside
    it, and stops with it."""
    import uvicorn

    config = uvicorn.Config(create_app(monitor, codes, token), host=host, port=port, log_level="warning",
                            access_log=False, limit_concurrency=MAX_CONNECTIONS, timeout_keep_alive=30)  # fmt: skip
    workers = [(monitor, monitor.start())] + ([(watcher, watcher.start())] if watcher else [])
    try:
        uvicorn.Server(config).run()
    finally:
        for worker, thread in reversed(workers):
            worker.stop()
            thread.join(timeout=30)
