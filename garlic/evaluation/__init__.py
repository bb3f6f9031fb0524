"""Evaluation of a method on a split: fit on the training part, select on validation, test once, score and log
(``fit_and_test``), with temperature scaling fitted on validation (``calibration``); and the PhysioNet 2019
Challenge's scores of hourly alarms (``utility``); hidden values imputed (``imputation``)."""
