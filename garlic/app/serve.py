"""Start the dashboard server: check who may reach it, load what the page needs, then serve ``garlic/app/dashboard.py``.

    python -m garlic.app.serve [--host 127.0.0.1] [--port 8501] [--mlruns STORE] [--data-root DATA] [--run RUN_ID]
        [--ward URL]

``garlic dashboard`` runs this. The heavy imports (torch, MLflow: 8.5 s) and opening the MLflow store (2-3 s) were
most of a first visit's 16 s (measured in-process on a busy 2-core machine); done here, before the server listens,
the first visitor finds them done. Streamlit then runs in this process with the settings the page needs: bound
to ``--host`` (loopback by default), uploads capped at 1 MB, no developer toolbar, no error details in the page,
no file watcher; with a login token, behind ``garlic.app.access.Gate``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from garlic.app.access import AccessError, Gate, required_token
from garlic.live.access import port_number
from garlic.tracking.local_store import database_error
from garlic.training.workers import die_with_parent

PAGE = Path(__file__).resolve().parent / "dashboard.py"
MAX_UPLOAD_MB = 1  # a PhysioNet 2012 record is under 100 kB, a 2019 one under 50 kB
log = logging.getLogger("garlic.dashboard")


def settings(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="garlic dashboard", description="serve the GARLIC-ICU bedside dashboard")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default 127.0.0.1: this machine only); any other needs GARLIC_DASHBOARD_TOKEN",
    )
    parser.add_argument("--port", type=port_number, default=8501)
    parser.add_argument("--mlruns", default="mlruns", help="the local MLflow store")
    parser.add_argument("--data-root", default="data", help="where processed datasets live")
    parser.add_argument("--run", help="MLflow run id (default: the newest run with a model)")
    parser.add_argument("--ward", help="SQLAlchemy URL of a live ward's store (garlic monitor), for the ward view")
    parser.add_argument("--profile", help="a site profile of the run (garlic calibrate): alert by its policy")
    return parser.parse_args(argv)


def streamlit_arguments(options: argparse.Namespace) -> list[str]:
    """``streamlit run`` arguments for the page (the settings of garlic/app/.streamlit/config.toml, made explicit)."""
    page = ["--mlruns", str(options.mlruns), "--data-root", str(options.data_root)]
    page += ["--run", options.run] if options.run else []
    page += ["--ward", options.ward] if options.ward else []
    page += ["--profile", options.profile] if options.profile else []
    return [
        "run",
        str(PAGE),
        "--server.address",
        options.host,
        "--server.port",
        str(options.port),
        "--server.headless",
        "true",
        "--server.fileWatcherType",
        "none",
        "--server.maxUploadSize",
        str(MAX_UPLOAD_MB),
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "minimal",
        "--client.showErrorDetails",
        "none",
        "--",
        *page,
    ]


def warm_up(options: argparse.Namespace) -> None:
    """Import what the page imports and open the store once, so that the first visit does not wait for them.

    What cannot be read here (no store yet, a broken run) is left for the page to report: it says so to the user.
    """
    import torch

    from garlic.app import charts, replay, sources  # noqa: F401  (imported for the page)
    from garlic.tracking.store import RunNotFoundError

    torch.set_num_threads(1)  # as the page runs
    try:
        sources.runs_with_models(Path(options.mlruns))
    except Exception as exc:  # the page reports a missing or damaged store to the user, and keeps running
        if not (isinstance(exc, (RunNotFoundError, OSError)) or database_error(exc) is not None):
            raise
        log.info("warm-up: %s", exc)


def guard(token: str | None) -> None:
    """With a login token set, put ``garlic.app.access.Gate`` in front of every request Streamlit's server takes."""
    if token is None:
        return
    from starlette.middleware import Middleware
    from streamlit.web.server.starlette import starlette_app

    streamlit_middleware = starlette_app.create_streamlit_middleware
    starlette_app.create_streamlit_middleware = lambda: [Middleware(Gate), *streamlit_middleware()]


def main(argv: list[str] | None = None) -> int:
    die_with_parent()  # started by `garlic dashboard`: a SIGKILL of it stops this server too, freeing the port
    options = settings(argv)
    try:
        guard(required_token(options.host))
    except AccessError as exc:
        print(f"garlic dashboard: error: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    print(f"GARLIC-ICU dashboard: loading the model code and the MLflow store {options.mlruns} …", flush=True)
    warm_up(options)
    print(f"ready in {time.perf_counter() - started:.1f} s; serving http://{options.host}:{options.port}/", flush=True)
    from streamlit.web import cli as streamlit_cli

    streamlit_cli.main(args=streamlit_arguments(options), prog_name="streamlit")  # exits when the server stops
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
