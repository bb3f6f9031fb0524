"""What the MLflow stores hold, asked in one place: which runs match a unit's settings, whether a unit is done (or
stopped half-way, to be resumed), a run's split runs, a split run's model folder and test predictions, and the runs
the dashboard lists. The comparison table (``garlic.studies.comparison``), the studies (``garlic.studies``, ``experiments/``), ``garlic.runs`` and
the dashboard (``garlic.app``) ask these rather than search the stores themselves.

A unit is one method on one split (and model seed), on one dataset (``run_contract.UnitIdentity``); its run carries
the unit's tags in whichever experiment of whichever store it was trained, and any path finds it by them
(``finished_unit_run``, ``interrupted_unit_run``). GARLIC's split runs that ``garlic train`` finished before units
were tagged are found by their logged params (``unit_runs``, ``finished_unit``, ``interrupted_unit``); a study's own
units (an ablation's variant, a fidelity condition) are runs tagged with what identifies them in the study's
experiment (``finished_run``). A unit counts as done only when its
run FINISHED (``is_finished``): a run killed, failed or left RUNNING by a dead process is done again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import mlflow
import pandas as pd
from mlflow.exceptions import MlflowException

from garlic.config import Config
from garlic.data.datasets import ensure_processed
from garlic.data.splits import protocol
from garlic.io.tables import read_manifest
from garlic.tracking import run_contract
from garlic.tracking.local_store import DATABASE, DEFAULT_STORE, MODEL_ARTIFACT
from garlic.tracking.store import RunNotFoundError, get_run, use_store

FINISHED = "FINISHED"  # MLflow's status of a run that ended well
IGNORED_PARAMS = {"device"}  # where a run was trained does not change what it is
# Config keys added after units were archived, with the value that trains as before: at that value they stay out of
# the settings digest, so that the archived units of unchanged presets are still found.
LATER_KEYS = {"lr_schedule": "plateau", "hours_input": False, "hourly_target": "label"}


def is_finished(run: mlflow.entities.Run) -> bool:
    return run.info.status == FINISHED


def settings_digest(settings: dict) -> str:
    """A short digest of the settings a result depends on, so that changed settings are never mistaken for done.

    Where a unit was trained does not change what it is: a ``device`` counts as the default one, so that a unit
    trained on a GPU is found by the same command on a CPU (and units archived before keep their digests)."""
    if "device" in settings:
        settings = settings | {"device": Config.device}
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]


def identifying_config(config: Config) -> dict:
    """A GARLIC config as its units are told apart: later keys at their old value (``LATER_KEYS``) left out."""
    return {k: v for k, v in config.to_dict().items() if not (k in LATER_KEYS and LATER_KEYS[k] == v)}


def config_digest(config: Config) -> str:
    """The settings digest of a GARLIC config (``settings_digest``), as the run archive keys its units: keys that
    do not change what a run is (``IGNORED_PARAMS``) and later keys at their old value (``LATER_KEYS``) left out."""
    return settings_digest({k: v for k, v in identifying_config(config).items() if k not in IGNORED_PARAMS})


def matches(params: dict[str, str], config: Config) -> bool:
    """Whether a run's logged params are ``config`` (keys the run predates must be at their default)."""
    defaults = Config().to_dict()
    for key, value in config.to_dict().items():
        if key in IGNORED_PARAMS:
            continue
        if key not in params:
            if value != defaults[key]:
                return False
        elif params[key] != str(value):
            return False
    return True


def has_database(store: Path) -> bool:
    """Whether ``store`` holds an MLflow database yet (a store never written to holds no run)."""
    return (Path(store) / DATABASE).is_file()


def _tagged(tags: dict[str, str], status: str) -> str:
    """An MLflow filter: runs carrying all of ``tags`` whose status compares by ``status`` (e.g. "= 'FINISHED'")."""
    return " and ".join([f"tags.{key} = '{value}'" for key, value in tags.items()] + [f"attributes.status {status}"])


def finished_run(experiment_id: str, tags: dict[str, str]) -> mlflow.entities.Run | None:
    """The newest FINISHED run of the experiment carrying all of ``tags``, or None."""
    found = mlflow.search_runs(
        experiment_ids=[experiment_id],
        filter_string=_tagged(tags, f"= '{FINISHED}'"),
        order_by=["attributes.start_time DESC"],
        max_results=1,
        output_format="list",
    )
    return found[0] if found else None


def _unit_runs(store: Path, unit: run_contract.UnitIdentity, status: str) -> list[mlflow.entities.Run]:
    """The runs of ``unit`` in any experiment of ``store`` whose status compares by ``status``, the newest first."""
    if not has_database(store):
        return []
    use_store(store)
    return mlflow.search_runs(
        search_all_experiments=True,
        filter_string=_tagged(unit.tags(), status),
        order_by=["attributes.start_time DESC"],
        output_format="list",
    )


def finished_unit_run(stores: list[Path], unit: run_contract.UnitIdentity) -> tuple[Path, mlflow.entities.Run] | None:
    """The newest FINISHED run of ``unit`` in the first of ``stores`` that holds one, with that store; or None."""
    for store in stores:
        found = _unit_runs(store, unit, f"= '{FINISHED}'")
        if found:
            return Path(store), found[0]
    return None


def interrupted_unit_run(store: Path, unit: run_contract.UnitIdentity) -> str | None:
    """The newest run of ``unit`` in ``store`` that stopped before it finished and kept its training state there,
    to go on from it; None when there is none."""
    for run in _unit_runs(store, unit, f"!= '{FINISHED}'"):
        if run_contract.training_state_path(store, run.info.run_id).is_file():
            return run.info.run_id
    return None


def interrupted_run(experiment_id: str, tags: dict[str, str], store: Path) -> str | None:
    """The newest run of the experiment carrying all of ``tags`` that stopped before it finished (killed, failed, or
    left RUNNING by a process that died with its machine) and kept its training state in ``store``
    (``run_contract.training_state_path``), to be continued rather than trained again; None when there is none."""
    stopped = mlflow.search_runs(
        experiment_ids=[experiment_id],
        filter_string=_tagged(tags, f"!= '{FINISHED}'"),
        order_by=["attributes.start_time DESC"],
        output_format="list",
    )
    for run in stopped:
        if run_contract.training_state_path(store, run.info.run_id).is_file():
            return run.info.run_id
    return None


def unit_runs(store: Path, config: Config, split_name: str, data_digest: str, finished: bool) -> list:
    """GARLIC's runs of ``config`` on ``split_name`` of the data ``data_digest`` in ``store``, the newest first: the
    FINISHED ones, or (``finished`` False) those that stopped before the end."""
    if not has_database(store):
        return []
    use_store(store)
    status = "=" if finished else "!="
    query = (
        f"params.split = '{split_name}' and params.{run_contract.DATA_DIGEST} = '{data_digest}' "
        f"and params.seed = '{config.seed}' and attributes.status {status} '{FINISHED}'"
    )
    found = mlflow.search_runs(
        search_all_experiments=True, filter_string=query, output_format="list", order_by=["attributes.start_time DESC"]
    )
    # a run tagged with another method is that method's (garlic train --method), not GARLIC's
    return [
        run for run in found if run_contract.method_of(run) == run_contract.GARLIC and matches(run.data.params, config)
    ]


def interrupted_unit(store: Path, config: Config, split_name: str, data_digest: str) -> str | None:
    """The newest run of ``config`` on ``split_name`` in ``store`` that stopped before it finished (killed, failed,
    or left RUNNING by a process that died with its machine) and kept its training state, to be resumed where it
    stopped rather than trained from its first epoch; None when there is none."""
    for run in unit_runs(store, config, split_name, data_digest, finished=False):
        if (
            "mlflow.parentRunId" not in run.data.tags
            and run_contract.training_state_path(store, run.info.run_id).is_file()
        ):
            return run.info.run_id
    return None


def finished_unit(
    stores: list[Path], config: Config, split_name: str, data_digest: str
) -> tuple[Path, mlflow.entities.Run] | None:
    """A FINISHED split run of ``config`` on ``split_name`` of the data ``data_digest`` in any of ``stores`` (the
    newest), or None."""
    for store in stores:
        for run in unit_runs(store, config, split_name, data_digest, finished=True):
            if "test_auroc" in run.data.metrics:
                return Path(store), run
    return None


def model_seeds(protocol_name: str, config: Config, seeds: list[int] | None = None) -> tuple[int, ...]:
    """The model seeds a preset trains on each split of the protocol: ``seeds`` if given, else the protocol's, else
    the config's one."""
    return tuple(seeds or protocol(protocol_name).seeds or (config.seed,))


def stored_runs(
    config: Config, protocol_name: str, stores: list[Path], data_root: Path
) -> list[tuple[int, int, Path, mlflow.entities.Run]]:
    """(split, seed, store, run) of every finished run of the GARLIC ``config`` (a preset) on the protocol's splits
    and seeds that ``stores`` hold, found as the comparison table finds them: for the studies that read the trained
    models."""
    digest = run_contract.manifest_digest(read_manifest(ensure_processed(config.dataset, data_root)))
    found = []
    for index in protocol(protocol_name).splits:
        for seed in model_seeds(protocol_name, config):
            unit = config.override({"split_protocol": protocol_name, "seed": seed})
            held = finished_unit(stores, unit, f"{protocol_name}/split_{index}", digest)
            if held is not None:
                found.append((index, seed, *held))
    return found


def existing_experiment(name: str, store: Path) -> str | None:
    """The id of experiment ``name`` in ``store``, or None where it has none (nothing is created: a store read only
    for its runs is left as it was)."""
    use_store(store)
    experiment = mlflow.MlflowClient().get_experiment_by_name(name)
    return None if experiment is None else experiment.experiment_id


def split_runs(run: mlflow.entities.Run) -> list[mlflow.entities.Run]:
    """The split runs nested under ``run`` (a run that groups several splits or seeds); none under a split run."""
    return mlflow.search_runs(
        experiment_ids=[run.info.experiment_id],
        output_format="list",
        filter_string=f"tags.mlflow.parentRunId = '{run.info.run_id}'",
    )


def runs_with_models() -> list[mlflow.entities.Run]:
    """Every run of the store MLflow points at that logged a model (``MODEL_ARTIFACT``), the newest first."""
    client = mlflow.MlflowClient()
    runs = mlflow.search_runs(
        search_all_experiments=True, order_by=["attributes.start_time DESC"], output_format="list"
    )
    return [run for run in runs if client.list_artifacts(run.info.run_id, MODEL_ARTIFACT)]


def test_predictions(store: Path, run_id: str, part: str = "test") -> pd.DataFrame:
    """The test predictions (``stay_id, label, risk``; on a task of prediction times with their ``time``) a run
    logged (``garlic.evaluation.fit_and_test.fit_and_test``), or those of its ``part`` 'validation'."""
    use_store(store)
    local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=run_contract.predictions(part))
    return pd.read_csv(local)


def download_run_model(run_id: str, store: Path = DEFAULT_STORE) -> Path:
    """The local folder of the model that split run ``run_id`` logged (``MODEL_ARTIFACT``, a saved method:
    ``garlic.methods.saved``)."""
    use_store(store)
    run = get_run(run_id)
    children = split_runs(run)
    if children:
        names = ", ".join(f"{c.info.run_id} ({c.info.run_name})" for c in children)
        raise RunNotFoundError(f"run {run_id} groups several splits; pick one of its split runs: {names}")
    try:
        return Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=MODEL_ARTIFACT))
    except (MlflowException, OSError) as exc:
        method = run.data.tags.get(run_contract.METHOD)
        if method:
            raise RunNotFoundError(
                f"run {run_id} is a {method} run that saved no model: only `garlic train --method` "
                "saves one, and not for the severity scores (new records carry no score)"
            ) from exc
        raise RunNotFoundError(f"run {run_id} has no model artifact (did it finish?)") from exc
