"""The dashboard's charts (Altair, drawn by Streamlit): risk curve, importance-shaded observations, importance bars.

The time axis of every chart spans the whole stay, so that the charts do not rescale while a stay is replayed.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

ALERT_COLOUR = "#d62728"
RISK_COLOUR = "#1f77b4"


def risk_chart(hours: np.ndarray, risk: np.ndarray, threshold: float, now: int) -> alt.LayerChart:
    """The risk up to position ``now``, the alert threshold as a dashed line, hours above it in red."""
    seen = pd.DataFrame({"hour": hours[: now + 1], "risk": risk[: now + 1]}).dropna()
    seen["alert"] = np.where(seen["risk"] >= threshold, "above threshold", "below threshold")
    x = alt.X("hour:Q", title="hours since ICU admission", scale=alt.Scale(domain=[0, float(hours[-1])]))
    y = alt.Y("risk:Q", title="predicted risk", scale=alt.Scale(domain=[0, 1]))
    line = alt.Chart(seen).mark_line(color=RISK_COLOUR).encode(x=x, y=y)
    points = alt.Chart(seen).mark_circle(size=45).encode(
        x=x,
        y=y,
        color=alt.Color("alert:N", scale=alt.Scale(domain=["above threshold", "below threshold"],
                                                   range=[ALERT_COLOUR, RISK_COLOUR]), legend=None),  # fmt: skip
        tooltip=[alt.Tooltip("hour:Q"), alt.Tooltip("risk:Q", format=".3f")],
    )
    limit = pd.DataFrame({"threshold": [threshold], "text": [f"alert threshold {threshold:.2f}"]})
    rule = alt.Chart(limit).mark_rule(color=ALERT_COLOUR, strokeDash=[6, 4]).encode(y="threshold:Q")
    label = alt.Chart(limit).mark_text(align="left", dx=4, dy=-7, color=ALERT_COLOUR).encode(
        x=alt.value(0), y="threshold:Q", text="text:N"
    )
    return alt.layer(rule, label, line, points).properties(height=260)


def observations_chart(observations: pd.DataFrame, variables: list[str], last_hour: float) -> alt.FacetChart:
    """One strip per variable: its values over time, each observation shaded by its importance to the risk."""
    shown = observations[observations["variable"].isin(variables)]
    x = alt.X("time:Q", title="hours since ICU admission", scale=alt.Scale(domain=[0, last_hour]))
    y = alt.Y("value:Q", title=None, scale=alt.Scale(zero=False))
    line = alt.Chart().mark_line(color="#bbbbbb").encode(x=x, y=y)
    points = alt.Chart().mark_circle(size=60, stroke="#555555", strokeWidth=0.3).encode(
        x=x,
        y=y,
        color=alt.Color("importance:Q", scale=alt.Scale(scheme="orangered"), title="importance"),
        tooltip=["variable:N", alt.Tooltip("time:Q", format=".1f"), alt.Tooltip("value:Q", format=".4g"),
                 alt.Tooltip("importance:Q", format=".4f")],  # fmt: skip
    )
    return (
        alt.layer(line, points, data=shown)
        .properties(height=70, width=760)
        .facet(row=alt.Row("variable:N", sort=variables, title=None, header=alt.Header(labelAngle=0)))
        .resolve_scale(y="independent")
    )


def bar_chart(table: pd.DataFrame, label: str, value: str, title: str) -> alt.Chart:
    """Horizontal bars, largest on top."""
    return (
        alt.Chart(table)
        .mark_bar(color=ALERT_COLOUR, opacity=0.8)
        .encode(
            x=alt.X(f"{value}:Q", title=title),
            y=alt.Y(f"{label}:N", sort="-x", title=None, axis=alt.Axis(labelOverlap=False, labelLimit=200)),
            tooltip=[f"{label}:N", alt.Tooltip(f"{value}:Q", format=".4f")],
        )
        .properties(height=24 * max(len(table), 3))
    )
