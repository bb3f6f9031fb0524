"""The dashboard's charts as (data, Vega-Lite specification) pairs for ``st.vega_lite_chart``: risk curve,
importance-shaded observations, importance bars.

Written as plain dictionaries rather than built with Altair: the bedside view draws four charts at every replayed
hour, and building them with Altair took about 90 ms of CPU per hour (validation and conversion), more than the
model's forward pass and explanation together (measured in-process on a busy 2-core machine). The data travel apart from
the specification, so that from one hour to the next the browser mostly gets new data for an unchanged chart.

The time axis of every chart spans the whole stay, so that the charts do not rescale while a stay is replayed.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

ALERT_COLOUR = "#d62728"
RISK_COLOUR = "#1f77b4"
WINDOW_COLOUR = "#2ca02c"  # the utility window and the onset of a septic stay
Spec = dict


def _quantitative(field: str, title: str | None, **options) -> dict:
    return {"field": field, "type": "quantitative", "title": title, **options}


def risk_chart(
    hours: np.ndarray,
    risk: np.ndarray,
    threshold: float,
    now: int,
    onset: float | None = None,
    alarms: np.ndarray | None = None,
) -> tuple[pd.DataFrame, Spec]:
    """The risk up to position ``now``, the alert threshold as a dashed line, the hours the alert is on in red
    (``alarms``, the alert policy's; default: the risk at or above the threshold); with a sepsis ``onset`` (hours),
    the onset as a line and the hours an alarm earns the Sepsis Challenge's utility (12 h before it to 3 h after)
    shaded, so that a warning in time shows."""
    alarms = np.asarray(risk) >= threshold if alarms is None else np.asarray(alarms, dtype=bool)
    seen = pd.DataFrame(
        {"hour": hours[: now + 1].astype(float), "risk": risk[: now + 1].astype(float), "on": alarms[: now + 1]}
    ).dropna()
    seen["alert"] = np.where(seen.pop("on"), "above threshold", "below threshold")
    x = _quantitative("hour", "hours since ICU admission", scale={"domain": [0, float(hours[-1])]})
    y = _quantitative("risk", "predicted risk", scale={"domain": [0, 1]})
    limit = {"values": [{"threshold": float(threshold), "text": f"alert threshold {threshold:.2f}"}]}
    scale = {"domain": ["above threshold", "below threshold"], "range": [ALERT_COLOUR, RISK_COLOUR]}
    colour = {"field": "alert", "type": "nominal", "legend": None, "scale": scale}
    tooltip = [{"field": "hour", "type": "quantitative"}, {"field": "risk", "type": "quantitative", "format": ".3f"}]
    window = (
        []
        if onset is None
        else [
            {
                "data": {"values": [{"start": max(onset - 12, 0.0), "end": onset + 3}]},
                "mark": {"type": "rect", "color": WINDOW_COLOUR, "opacity": 0.25},
                "encoding": {"x": _quantitative("start", None), "x2": {"field": "end"}},
            },
            {
                "data": {"values": [{"onset": onset, "text": f"sepsis onset, hour {onset:g}"}]},
                "mark": {"type": "rule", "color": WINDOW_COLOUR},
                "encoding": {"x": _quantitative("onset", None)},
            },
            {
                "data": {"values": [{"onset": onset, "text": f"sepsis onset, hour {onset:g}"}]},
                "mark": {"type": "text", "align": "right", "dx": -4, "y": 8, "color": WINDOW_COLOUR},
                "encoding": {"x": _quantitative("onset", None), "text": {"field": "text", "type": "nominal"}},
            },
        ]
    )
    return seen, {
        "height": 260,
        "layer": [
            *window,
            {
                "data": limit,
                "mark": {"type": "rule", "color": ALERT_COLOUR, "strokeDash": [6, 4]},
                "encoding": {"y": _quantitative("threshold", None)},
            },
            {
                "data": limit,
                "mark": {"type": "text", "align": "left", "dx": 4, "dy": -7, "color": ALERT_COLOUR},
                "encoding": {
                    "x": {"value": 0},
                    "y": _quantitative("threshold", None),
                    "text": {"field": "text", "type": "nominal"},
                },
            },
            {"mark": {"type": "line", "color": RISK_COLOUR}, "encoding": {"x": x, "y": y}},
            {"mark": {"type": "circle", "size": 45}, "encoding": {"x": x, "y": y, "color": colour, "tooltip": tooltip}},
        ],
    }


def observations_chart(observations: pd.DataFrame, variables: list[str], last_hour: float) -> tuple[pd.DataFrame, Spec]:
    """One strip per variable: its values over time, each observation shaded by its importance to the risk."""
    shown = observations[observations["variable"].isin(variables)].astype({"variable": str})
    x = _quantitative("time", "hours since ICU admission", scale={"domain": [0, float(last_hour)]})
    y = _quantitative("value", None, scale={"zero": False})
    tooltip = [
        {"field": "variable", "type": "nominal"},
        {"field": "time", "type": "quantitative", "format": ".1f"},
        {"field": "value", "type": "quantitative", "format": ".4g"},
        {"field": "importance", "type": "quantitative", "format": ".4f"},
    ]
    return shown[["time", "variable", "value", "importance"]], {
        "facet": {
            "row": {
                "field": "variable",
                "type": "nominal",
                "sort": list(variables),
                "title": None,
                "header": {"labelAngle": 0},
            }
        },
        "spec": {
            "height": 70,
            "width": 760,
            "layer": [
                {"mark": {"type": "line", "color": "#bbbbbb"}, "encoding": {"x": x, "y": y}},
                {
                    "mark": {"type": "circle", "size": 60, "stroke": "#555555", "strokeWidth": 0.3},
                    "encoding": {
                        "x": x,
                        "y": y,
                        "tooltip": tooltip,
                        "color": _quantitative("importance", "importance", scale={"scheme": "orangered"}),
                    },
                },
            ],
        },
        "resolve": {"scale": {"y": "independent"}},
    }


def bar_chart(table: pd.DataFrame, label: str, value: str, title: str) -> tuple[pd.DataFrame, Spec]:
    """Horizontal bars, largest on top."""
    return table[[label, value]].astype({label: str}), {
        "mark": {"type": "bar", "color": ALERT_COLOUR, "opacity": 0.8},
        "encoding": {
            "x": _quantitative(value, title),
            "y": {
                "field": label,
                "type": "nominal",
                "sort": "-x",
                "title": None,
                "axis": {"labelOverlap": False, "labelLimit": 200},
            },
            "tooltip": [{"field": label, "type": "nominal"}, {"field": value, "type": "quantitative", "format": ".4f"}],
        },
        "height": 24 * max(len(table), 3),
    }
