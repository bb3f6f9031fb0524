"""Explanations: read off the model itself (``built_in``: observation, signal and edge importance), by Integrated
Gradients for any differentiable model (``integrated_gradients``, Captum), and as tables, figures and MLflow
artifacts (``report``)."""
