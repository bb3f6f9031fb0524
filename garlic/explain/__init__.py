"""Explanations: read off the model itself (``built_in``: observation, signal and edge importance), by Integrated
Gradients for any differentiable model (``integrated_gradients``, Captum), a scikit-learn model's additive
contributions (``contributions``: exact tree SHAP values, coefficient x value), and as tables, figures and MLflow
artifacts (``report``)."""
