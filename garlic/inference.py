"""Risk for stays that come as raw tables (new records, uploads), with a saved method (GARLIC or another:
``garlic.methods.saved.SavedMethod``)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from garlic.data.batches import IrregularDataset
from garlic.methods.saved import SavedMethod
from garlic.io.tables import ProcessedDataset
from garlic.io.tensors import IrregularTensors, tensorize
from garlic.sources.meds import MedsTables

TOP_DRIVERS = 3  # the drivers an alarm names, as the live ward shows them (``garlic.live.scoring``)
ALARM_DRIVERS = "alarm-drivers.csv"  # beside the prediction files of ``garlic predict --hourly``


def tensors_for_model(
    trained: SavedMethod, observations: pd.DataFrame, static: pd.DataFrame, tasks: pd.DataFrame | None = None
) -> IrregularTensors:
    """Tables of unlabelled stays -> tensors laid out as the model's training data (variables, static columns), with
    the prediction times of ``tasks`` when given; every stay must have an observation."""
    unknown = sorted(set(observations["variable"].astype(str)) - set(trained.variables))
    if unknown:
        raise ValueError(
            f"the records hold variables the model does not know: {unknown}; the model was trained on the "
            f"{trained.config.dataset} dataset and reads {', '.join(trained.variables)}. Records of another dataset "
            f"need a model trained on it, e.g. `garlic train --dataset physionet2012` for PhysioNet 2012 records"
        )
    stay_ids = np.sort(static["stay_id"].unique())
    static = static.set_index("stay_id").reindex(index=stay_ids, columns=trained.static_features)
    dataset = ProcessedDataset(
        observations=observations,
        static=static.rename_axis("stay_id").reset_index(),
        labels=pd.DataFrame({"stay_id": stay_ids, "label": np.nan}),
        variables=trained.variables,
        tasks=tasks,
    )
    tensors = tensorize(dataset)
    empty = tensors.stay_ids[tensors.lengths == 0]
    if len(empty):  # the model would make a risk out of nothing (or divide by zero when no stay has a step)
        raise ValueError(f"stay(s) {', '.join(map(str, empty.tolist()))} have no observation: no risk can be computed")
    return tensors


def predict_tables(trained: SavedMethod, observations: pd.DataFrame, static: pd.DataFrame) -> pd.DataFrame:
    """One row per stay: stay_id and predicted risk."""
    tensors = tensors_for_model(trained, observations, static)
    risk = trained.predict_proba(trained.dataset(tensors))
    return pd.DataFrame({"stay_id": tensors.stay_ids, "risk": risk})


def predict_hourly(
    trained: SavedMethod, observations: pd.DataFrame, static: pd.DataFrame, tasks: pd.DataFrame, drivers: int = 0
) -> pd.DataFrame:
    """One row per prediction time of ``tasks``: stay_id, time and the risk from the stay's record up to then; the
    model must answer prediction times (an hourly method). With ``drivers`` > 0, a model that says what drove each
    risk (``garlic.explain.drivers.has_row_importance``: one explained by its variables' contributions, GARLIC)
    adds a column ``drivers``: at each time, that many of the variables that drove the risk most (``driver_lists``)."""
    from garlic.explain.drivers import has_row_importance
    from garlic.methods.contract import check_answers_prediction_times

    check_answers_prediction_times(trained.method, f"the run's model ({trained.name})")
    tensors = tensors_for_model(trained, observations, static, tasks)
    times = tensors.prediction_times()
    dataset = trained.dataset(tensors)
    risks = pd.DataFrame({"stay_id": tensors.stay_ids[times.stay], "time": times.time,
                          "risk": trained.predict_proba(dataset)})  # fmt: skip
    if drivers > 0 and has_row_importance(trained.method):
        risks["drivers"] = driver_lists(trained, dataset, drivers)
    return risks


def driver_lists(trained: SavedMethod, dataset: IrregularDataset, top: int) -> list[list[str]]:
    """At each of the dataset's prediction times, the ``top`` variables that drove the risk most by the model's own
    explanation (``garlic.explain.drivers``), highest first: for a model explained by contributions, those that
    raised it."""
    from garlic.explain.drivers import drivers

    return drivers(trained.method, dataset, trained.variables, top)


def write_hourly_predictions(folder: Path, risks: pd.DataFrame, threshold: float) -> list[Path]:
    """The Sepsis Challenge's prediction files of ``predict_hourly``'s risks: one ``pNNNNNN.psv`` per stay, a row
    per hour, ``PredictedProbability|PredictedLabel`` (alarm where the risk reaches ``threshold``)."""
    from garlic.metrics.utility import write_predictions

    return [write_predictions(folder, int(stay_id), group["risk"].to_numpy(),
                              (group["risk"].to_numpy() >= threshold).astype(int))
            for stay_id, group in risks.groupby("stay_id", sort=True)]  # fmt: skip


def write_alarm_drivers(path: Path, risks: pd.DataFrame, threshold: float) -> int:
    """``predict_hourly``'s alarmed hours (risk >= ``threshold``) with their drivers, as CSV (stay_id, time, risk,
    drivers: "HR, Temp, Lactate"), atomically; how many hours it lists."""
    from garlic.io.atomic import atomic_file

    alarmed = risks[risks["risk"] >= threshold].assign(drivers=lambda t: t["drivers"].map(", ".join))
    with atomic_file(path, "w") as out:
        alarmed[["stay_id", "time", "risk", "drivers"]].to_csv(out, index=False)
    return len(alarmed)


def predict_meds(trained: SavedMethod, tables: MedsTables) -> pd.DataFrame:
    """One row per label row of ``tables`` (``garlic.sources.meds.read_tables``): subject_id, prediction_time, label
    and the risk from the subject's window up to that time (per stay, or at each prediction time of a tasks table)."""
    if tables.tasks is None:
        risks = predict_tables(trained, tables.observations, tables.static)
        return tables.label_rows.merge(risks.rename(columns={"stay_id": "subject_id"}), on="subject_id")
    tasks = tables.tasks.drop(columns="label")
    risks = predict_hourly(trained, tables.observations, tables.static, tasks)
    rows = tables.label_rows.assign(time=tables.tasks["time"].to_numpy())  # the tasks table's rows are these rows
    return rows.merge(risks.rename(columns={"stay_id": "subject_id"}), on=["subject_id", "time"]).drop(columns="time")
