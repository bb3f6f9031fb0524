"""The live ward's HTTP service (``garlic monitor``): FHIR R4 readings in, each bed's risk, alert and drivers out.

    PUT  /fhir/Encounter/{bed}     admit a bed (status in-progress and period.start) or discharge it (finished)
    POST /fhir/Observation         one Observation: 201 Created, Location and the Observation as held (its id and
                                   meta.versionId); 200 for a repeat or a withdrawal (entered-in-error)
    POST /fhir, /fhir/Bundle       a batch or transaction Bundle of Observations, taken all or none: a
                                   batch-response or transaction-response Bundle (or a single Observation, as above)
    GET  /fhir/metadata            the CapabilityStatement: exactly what is taken
    GET  /fhir/Observation/{id}    an Observation as held (in the model's unit)
    GET  /fhir/Observation?encounter=Encounter/ID[&_since=INSTANT]   a searchset Bundle of a bed's Observations
    GET  /ward                     every bed with its newest risk, its change over the last hour and its alert,
                                   highest risk first
    GET  /beds/{bed}               a bed's readings and its risk, alert and drivers at each reading time
    GET  /health                   counts: beds, readings, scored, withdrawn, pending

FHIR answers are ``application/fhir+json``; a POST or PUT must be too (or ``application/json``), else 415. A reading
is answered 201 only once it is committed to the store; the scoring loop (``garlic.live.monitor``) then scores it.
Every refusal is a 4xx (5xx: the store is behind or failing) with a FHIR ``OperationOutcome`` saying what was wrong,
and changes nothing: 400 not JSON, 401 no or a wrong token, 404 an unknown bed or path, 405 a method not taken, 408 a
body slower than ``BODY_SECONDS``, 409 a discharged bed, another patient or another bed's Observation id, 413 a body
over ``MAX_BODY_BYTES``, 415 not FHIR JSON, 422 not the FHIR resource, code, unit, range or time expected, 429 too
many wrong tokens from the address, 500 a failure of the service's own, 503 the scoring loop too far behind or
``MAX_IN_FLIGHT`` requests being answered. Each refusal is logged in one line (status,
reason, bed), never with a value sent.

Listening on 127.0.0.1 by default; any other address needs a token in ``GARLIC_MONITOR_TOKEN``
(``garlic.live.access``), which every request must then bring as ``Authorization: Bearer TOKEN``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from garlic.live.access import MONITOR_TOKEN, Attempts, token_matches
from garlic.live.codes import Codes
from garlic.live.fhir import FhirError, Withdrawal, is_id, observations_in, parse_json, stay_of
from garlic.live.monitor import Monitor
from garlic.live.resources import capability, observation_bundle, stored_observation
from garlic.live.watch import FolderWatcher

MAX_BODY_BYTES = 1 << 20  # a Bundle of an hour of every monitor of a bed is under 100 kB
MAX_IN_FLIGHT = 500  # requests being answered at once; beyond, a 503 OperationOutcome
MAX_CONNECTIONS = 600  # open at once, idle kept-alive ones too; beyond, uvicorn answers a plain 503
BODY_SECONDS = 10.0  # a body still arriving after this is refused (408): a client that stalls holds a connection
MAX_DIAGNOSTICS = 500  # characters of a refusal's message: a bad input is never echoed whole
TRUSTED_SECONDS = 600.0  # an address that gave the right token is trusted this long, whatever guesses it shares
MAX_TRUSTED = 10_000  # trusted addresses kept before those of over TRUSTED_SECONDS ago are dropped
FHIR_JSON = "application/fhir+json"
TAKEN_TYPES = {FHIR_JSON, "application/json", "application/json+fhir"}  # the last: DSTU2's, still sent by clients
log = logging.getLogger("garlic.live")


class FhirResponse(JSONResponse):
    media_type = FHIR_JSON


def outcome(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    message = message if len(message) <= MAX_DIAGNOSTICS else message[:MAX_DIAGNOSTICS] + "... (cut)"
    code = {
        401: "login",
        404: "not-found",
        405: "not-supported",
        408: "timeout",
        409: "conflict",
        413: "too-long",
        415: "not-supported",
        429: "throttled",
        503: "transient",
    }.get(status, "invalid")
    issue = {"severity": "error", "code": code, "diagnostics": message}
    headers = {**({"WWW-Authenticate": "Bearer"} if status == 401 else {}), **(headers or {})}
    return FhirResponse(
        {"resourceType": "OperationOutcome", "issue": [issue]}, status_code=status, headers=headers or None
    )


def refusal(request: Request, status: int, message: str, reason: str, headers: dict | None = None) -> JSONResponse:
    """The OperationOutcome of a refused request, logged in one line: its status, reason and bed, never a value."""
    bed = getattr(request.state, "bed", None)
    log.warning(
        "refused %s %s: %d %s%s", request.method, _route(request), status, reason, f" (bed {bed})" if bed else ""
    )
    return outcome(status, message, headers)


def _route(request: Request) -> str:
    """The request's route as declared (``/fhir/Encounter/{bed}``), not its path, which may hold anything sent."""
    route = request.scope.get("route")
    return getattr(route, "path", None) or "(no such path)"


async def bounded_body(request: Request) -> bytes:
    """The request's body, refused (413) past ``MAX_BODY_BYTES`` before more of it is read, and (408) when it is
    not all there within ``BODY_SECONDS``."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise FhirError(413, f"the body is {int(declared)} bytes; at most {MAX_BODY_BYTES} are taken")
    chunks, size = [], 0
    deadline = time.monotonic() + BODY_SECONDS
    stream = request.stream().__aiter__()
    while True:
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), max(deadline - time.monotonic(), 0.001))
        except StopAsyncIteration:
            return b"".join(chunks)
        except TimeoutError:  # asyncio.TimeoutError since Python 3.11
            raise FhirError(408, f"the body did not arrive within {BODY_SECONDS:g} s") from None
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise FhirError(413, f"the body is over {MAX_BODY_BYTES} bytes, the most taken")
        chunks.append(chunk)


def _content_type(request: Request) -> None:
    given = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if given not in TAKEN_TYPES:
        raise FhirError(415, f"Content-Type {given or '(none)'!s:.60} is not taken: send {FHIR_JSON}", "content type")


def _bed_named(payload: dict) -> str | None:
    """The bed a posted resource names (an Observation's, a Bundle's first entry's), for the log; None when none
    or not an id."""
    resource = payload
    if payload.get("resourceType") == "Bundle":
        entries = payload.get("entry")
        resource = (
            entries[0].get("resource")
            if isinstance(entries, list) and entries and isinstance(entries[0], dict)
            else None
        )
    encounter = resource.get("encounter") if isinstance(resource, dict) else None
    reference = encounter.get("reference") if isinstance(encounter, dict) else None
    bed = reference[len("Encounter/") :] if isinstance(reference, str) and reference.startswith("Encounter/") else ""
    return bed if is_id(bed) else None


def _number(value) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def create_app(monitor: Monitor, codes: Codes, token: str | None, attempts: Attempts | None = None) -> FastAPI:
    """The service for ``monitor``'s store, reading ``codes``; with ``token``, only for requests that bring it."""
    app = FastAPI(title="GARLIC-ICU live ward", docs_url=None, redoc_url=None, openapi_url=None)
    attempts = attempts or Attempts()
    trusted: dict[str, float] = {}  # address -> when it last gave the right token
    store = monitor.store

    @app.exception_handler(FhirError)
    async def refused(request: Request, exc: FhirError) -> JSONResponse:
        return refusal(request, exc.status, str(exc), exc.reason)

    @app.exception_handler(HTTPException)
    async def not_here(request: Request, exc: HTTPException) -> JSONResponse:
        allowed = ", ".join(methods_of(request))
        headers = {**(exc.headers or {}), **({"Allow": allowed} if exc.status_code == 405 else {})}
        message = (
            f"{request.method} is not taken here (this path takes {allowed})"
            if exc.status_code == 405
            else "no such resource or path (GET /fhir/metadata lists what this service takes)"
        )
        return refusal(
            request, exc.status_code, message, "method" if exc.status_code == 405 else "no such path", headers
        )

    def methods_of(request: Request) -> list[str]:
        """Every method some route of this request's path takes (Starlette's 405 names the first route's only)."""
        scope = {**request.scope, "method": "GET"}
        return sorted(
            {
                method
                for route in app.routes
                if getattr(route, "methods", None) and route.matches(scope)[0] != Match.NONE
                for method in route.methods
            }
            - {"HEAD"}
        )

    @app.exception_handler(ClientDisconnect)
    async def hung_up(request: Request, exc: ClientDisconnect) -> JSONResponse:
        return refusal(request, 400, "the client hung up before the end of its body", "client hung up")

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception) -> JSONResponse:  # logged with its traceback by uvicorn
        return refusal(request, 500, "the service failed on this request; nothing was stored", "failed")

    in_flight = [0]  # requests being answered (one event loop: no lock needed)

    @app.middleware("http")
    async def bounded_and_only_with_the_token(request: Request, call_next):
        """One middleware (each costs a task and a stream per request): the token, then the requests in flight."""
        refused = None if token is None else allowed(request)
        if refused is not None:
            return refused
        if in_flight[0] >= MAX_IN_FLIGHT:
            return refusal(
                request, 503, f"{MAX_IN_FLIGHT} requests are being answered; send again in a few seconds", "busy"
            )
        in_flight[0] += 1
        try:
            return await call_next(request)
        finally:
            in_flight[0] -= 1

    def allowed(request: Request) -> JSONResponse | None:
        """None for a request with the right token, else its refusal (401, or 429 from an address guessing)."""
        client = request.client.host if request.client else "unknown"
        given = request.headers.get("authorization", "")
        right = given.startswith("Bearer ") and token_matches(given[len("Bearer ") :], token)
        now = time.monotonic()
        if right and (now - trusted.get(client, -math.inf) < TRUSTED_SECONDS or not attempts.blocked_client(client)):
            trusted[client] = now  # a client of the right token is never locked out by another's guesses
            if len(trusted) > MAX_TRUSTED:  # addresses seen long ago forgotten, that the table stays small
                for address in [a for a, seen in trusted.items() if now - seen >= TRUSTED_SECONDS]:
                    del trusted[address]
            return None
        if given and attempts.blocked_client(client):  # not even checked: guessing on is pointless
            return refusal(request, 429, "too many wrong tokens from this address; wait a minute", "throttled")
        if given and not right:
            attempts.failed(client)  # no token at all (a probe) is no guess
        return refusal(
            request,
            401,
            f"this service needs its token: send Authorization: Bearer ${MONITOR_TOKEN}",
            "no token" if not given else "wrong token",
        )

    def take(posted, started: float) -> tuple[list[tuple[int, str | None, dict]], dict]:
        """Store what was posted: each Observation's (status, location, resource), and the readings' counts."""
        ids: dict = {}
        stored, repeats, withdrawn = monitor.take(posted.all(), ids)
        readings = [r for sent in posted.sent if not isinstance(sent.readings, Withdrawal) for r in sent.readings]
        missing = [reading for reading in readings if reading not in ids]  # repeats: held before this request
        held = ids | dict(zip(missing, store.ids_of(missing)))
        answers = [stored_observation(sent, held, started) for sent in posted.sent]
        return answers, {"stored": stored, "repeats": repeats, "withdrawn": withdrawn}

    async def post(request: Request) -> JSONResponse:
        _content_type(request)
        payload = parse_json(await bounded_body(request))
        request.state.bed = _bed_named(payload)
        posted = observations_in(payload, codes)
        answers, counts = await run_in_threadpool(take, posted, time.time())
        counted = {
            "X-Garlic-Stored": str(counts["stored"]),
            "X-Garlic-Repeats": str(counts["repeats"]),
            "X-Garlic-Withdrawn": str(counts["withdrawn"]),
        }
        base = str(request.base_url).rstrip("/") + "/fhir/"
        if posted.kind == "Observation":
            status, location, resource = answers[0]
            return FhirResponse(
                resource,
                status_code=status,
                headers={
                    **counted,
                    **({"Location": base + location} if location else {}),
                    **({"ETag": f'W/"{resource["meta"]["versionId"]}"'} if "meta" in resource else {}),
                },
            )
        entries = [
            {
                "response": {
                    "status": f"{status} {'Created' if status == 201 else 'OK'}",
                    **({"location": location} if location else {}),
                },
                "resource": resource,
            }
            for status, location, resource in answers
        ]
        return FhirResponse(
            {"resourceType": "Bundle", "type": f"{posted.kind}-response", "entry": entries},
            status_code=200,
            headers=counted,
        )

    for path in ("/fhir", "/fhir/Observation", "/fhir/Bundle"):
        app.add_api_route(path, post, methods=["POST"])

    @app.put("/fhir/Encounter/{bed}")
    async def encounter(bed: str, request: Request) -> JSONResponse:
        if not is_id(bed):
            raise FhirError(422, "a bed is a FHIR id: letters, digits, '-' and '.' (not dots only), at most 64")
        request.state.bed = bed
        _content_type(request)
        payload = parse_json(await bounded_body(request))
        stay = stay_of(payload, bed)
        await run_in_threadpool(store.admit, stay)
        return FhirResponse(payload)

    @app.get("/fhir/metadata")
    def metadata(request: Request) -> JSONResponse:
        return FhirResponse(capability(str(request.base_url).rstrip("/") + "/fhir", codes))

    @app.get("/fhir/Observation/{logical_id}")
    def read_observation(logical_id: str) -> JSONResponse:
        rows = store.observation(logical_id) if is_id(logical_id) else None
        if rows is None or rows.empty:
            raise FhirError(404, "no Observation of that id here", "unknown id")
        resource = observation_bundle(rows, codes, single=True)
        return FhirResponse(resource, headers={"ETag": f'W/"{resource["meta"]["versionId"]}"'})

    @app.get("/fhir/Observation")
    def search_observations(request: Request) -> JSONResponse:
        params = dict(request.query_params)
        unknown = sorted(set(params) - {"encounter", "_since", "_count", "_format"})
        if unknown:
            raise FhirError(
                400,
                f"search parameter {unknown[0]!s:.40} is not supported: encounter (Encounter/ID) "
                "and _since (an instant) are",
                "search parameter",
            )
        bed = params.get("encounter", "").removeprefix("Encounter/")
        if not is_id(bed):
            raise FhirError(
                400, "encounter=Encounter/ID (the bed) is required to search Observations", "search parameter"
            )
        request.state.bed = bed
        since = _since(params.get("_since"))
        rows = store.observations(bed, since)
        return FhirResponse(observation_bundle(rows, codes, single=False))

    @app.get("/ward")
    def ward() -> list[dict]:
        return [
            {
                "bed": row.bed,
                "time": _number(row.time),
                "risk": _number(row.risk),
                "trend": _number(row.trend),
                "alert": bool(row.alert),
                "readings": int(row.readings),
                "drivers": row.drivers,
            }
            for row in store.ward().itertuples()
        ]

    @app.get("/beds/{bed}")
    def bed_history(bed: str) -> dict:
        if not is_id(bed) or bed not in set(store.beds()["bed"]):
            raise FhirError(404, "no such bed", "unknown bed")
        history = store.history(bed)
        readings = store.readings([bed])
        return {
            "bed": bed,
            "threshold": monitor.alerts.threshold,
            "policy": monitor.alerts.settings(),
            "scores": [
                {"time": r.time, "risk": _number(r.risk), "alert": bool(r.alert), "drivers": r.drivers}
                for r in history.itertuples()
            ],
            "readings": [{"time": r.time, "variable": r.variable, "value": r.value} for r in readings.itertuples()],
        }

    @app.get("/health")
    def health() -> dict:
        return store.counts()

    return app


def _since(text: str | None) -> float | None:
    """``_since``'s instant as UTC seconds; one without its time zone is refused."""
    if text is None:
        return None
    from datetime import datetime

    try:
        at = datetime.fromisoformat(text)  # Python 3.11 reads a trailing Z
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        raise FhirError(400, "_since must be an instant with its time zone (2026-01-01T10:00:00Z)", "search parameter")
    return at.timestamp()


def serve(
    monitor: Monitor, codes: Codes, host: str, port: int, token: str | None, watcher: FolderWatcher | None = None
) -> None:
    """Serve until stopped (SIGINT, SIGTERM); the scoring loop (and the folder ``watcher``, given one) runs beside
    it, and stops with it."""
    import uvicorn

    config = uvicorn.Config(
        create_app(monitor, codes, token),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        limit_concurrency=MAX_CONNECTIONS,
        timeout_keep_alive=30,
    )
    workers = [(monitor, monitor.start())] + ([(watcher, watcher.start())] if watcher else [])
    try:
        uvicorn.Server(config).run()
    finally:
        for worker, thread in reversed(workers):
            worker.stop()
            thread.join(timeout=30)
