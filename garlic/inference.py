"""Risk for stays that come as raw tables (new records, uploads), with a saved method (GARLIC or another:
``garlic.methods.saved.SavedMethod``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from garlic.data.batches import IrregularDataset
from garlic.methods.saved import SavedMethod
from garlic.io.tables import ProcessedDataset
from garlic.io.tensors import IrregularTensors, tensorize
from garlic.sources.meds import MedsTables

if TYPE_CHECKING:  # the metrics package imports scikit-learn, which a one-stay predict never needs
    from garlic.metrics.alert_policy import AlertPolicy

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
    risk (``garlic.methods.drivers.has_row_importance``: one explained by its variables' contributions, GARLIC)
    adds a column ``drivers``: at each time, that many of the variables that drove the risk most (``driver_lists``)."""
    from garlic.methods.drivers import has_row_importance
    from garlic.methods.contract import check_answers_prediction_times

    check_answers_prediction_times(trained.method, f"the run's model ({trained.name})")
    tensors = tensors_for_model(trained, observations, static, tasks)
    times = tensors.prediction_times()
    dataset = trained.dataset(tensors)
    risks = pd.DataFrame(
        {"stay_id": tensors.stay_ids[times.stay], "time": times.time, "risk": trained.predict_proba(dataset)}
    )
    if drivers > 0 and has_row_importance(trained.method):
        risks["drivers"] = driver_lists(trained, dataset, drivers)
    return risks


def driver_lists(trained: SavedMethod, dataset: IrregularDataset, top: int) -> list[list[str]]:
    """At each of the dataset's prediction times, the ``top`` variables that drove the risk most by the model's own
    explanation (``garlic.methods.drivers``), highest first: for a model explained by contributions, those that
    raised it."""
    from garlic.methods.drivers import drivers

    return drivers(trained.method, dataset, trained.variables, top)


def every_hour(observations: pd.DataFrame) -> pd.DataFrame:
    """Prediction times at every whole ICU hour of each stay, from its first observation's hour (at least 1) to its
    last observation: what a bedside sees hour by hour (label 0: unknown here)."""
    span = observations.groupby("stay_id")["time"].agg(["min", "max"])
    first = np.maximum(np.ceil(span["min"].to_numpy()), 1).astype(np.int64)
    last = np.floor(span["max"].to_numpy()).astype(np.int64)
    counts = np.maximum(last - first + 1, 0)
    starts = np.repeat(first, counts)
    hours = starts + np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    return pd.DataFrame(
        {
            "stay_id": np.repeat(span.index.to_numpy(), counts),
            "time": hours.astype("float32"),
            "label": np.zeros(counts.sum(), np.int8),
        }
    )


def predict_each_hour(
    trained: SavedMethod, observations: pd.DataFrame, static: pd.DataFrame, tasks: pd.DataFrame | None = None
) -> pd.DataFrame:
    """One row per prediction time of ``tasks`` (default: ``every_hour``): stay_id, time, risk. An hourly model is
    asked there (``predict_hourly``); a model of whole stays scores the record cut there, as the live ward and the
    dashboard's replay score it."""
    from garlic.methods.contract import answers_prediction_times

    tasks = every_hour(observations) if tasks is None else tasks
    if answers_prediction_times(trained.method):
        return predict_hourly(trained, observations, static, tasks)
    tensors = tensors_for_model(trained, observations, static, tasks)
    times = tensors.prediction_times()
    risk = trained.predict_proba(trained.dataset(tensors.cut_at_prediction_times()))
    return pd.DataFrame({"stay_id": tensors.stay_ids[times.stay], "time": times.time, "risk": risk})


def write_hourly_predictions(folder: Path, risks: pd.DataFrame, policy: AlertPolicy) -> list[Path]:
    """The Sepsis Challenge's prediction files of ``predict_hourly``'s risks: one ``pNNNNNN.psv`` per stay, a row
    per hour, ``PredictedProbability|PredictedLabel``, the label 1 where ``policy``'s alert is on (the alert policy
    the live ward and the tables apply, ``garlic.metrics.alert_policy``)."""
    from garlic.metrics.utility import write_predictions

    risks, alarms = policy_alarms(risks, policy)
    return [
        write_predictions(folder, int(stay_id), group["risk"].to_numpy(), alarms[group.index].astype(int))
        for stay_id, group in risks.groupby("stay_id", sort=True)
    ]


def policy_alarms(risks: pd.DataFrame, policy: AlertPolicy) -> tuple[pd.DataFrame, np.ndarray]:
    """``risks`` in stay and time order (index 0 ..) and, at each of its rows, whether ``policy``'s alert is on."""
    from garlic.metrics.utility import stay_lengths

    risks = risks.sort_values(["stay_id", "time"], kind="stable").reset_index(drop=True)
    lengths = stay_lengths(risks["stay_id"].to_numpy())
    return risks, np.asarray(policy.alarms(risks["risk"].to_numpy(), risks["time"].to_numpy(), lengths), dtype=bool)


def write_alarm_drivers(path: Path, risks: pd.DataFrame, policy: AlertPolicy) -> int:
    """``predict_hourly``'s hours with ``policy``'s alert on (those its prediction files alarm at) with their
    drivers, as CSV (stay_id, time, risk, drivers: "HR, Temp, Lactate"), atomically; how many hours it lists."""
    from garlic.io.atomic import atomic_file

    risks, alarms = policy_alarms(risks, policy)
    alarmed = risks[alarms].assign(drivers=lambda t: t["drivers"].map(", ".join))
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
