"""The datasets the project knows: how each is preprocessed, and where its processed tables live.

``SOURCES`` is the registry, one entry per module of ``garlic.sources`` (its ``SOURCE``), saying which options of
``garlic preprocess`` it takes (``--source``, ``--cohort`` and its choices, ``--strict``, the generator's ``--stays``
and ``--seed``). A source with cohorts gives one dataset per cohort, named ``SOURCE-COHORT``
(``physionet2019-early``), each in its own folder, so that preprocessing one cohort never replaces another; the plain
source name (``physionet2019``) is not a dataset, and training must name the cohort, except where the default cohort
keeps the plain name (``physionet2012``, beside ``physionet2012-hourly``). ``DATASETS`` lists every dataset
name. A new source of data is one module in ``garlic/sources/``.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from garlic.io.tables import MANIFEST, DatasetNotFoundError, recover
from garlic.sources import Source, discovered, synthetic

DEFAULT_DATA_ROOT = Path(os.environ.get("GARLIC_DATA_ROOT", "data"))


class PreprocessOptionError(ValueError):
    """An option of ``garlic preprocess`` that the chosen source does not take, or a required one left out."""


SOURCES = discovered()
DATASETS = tuple(name for source in SOURCES.values() for name in source.datasets)
NAMED = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")  # the NAME of a named source's dataset SOURCE-NAME: a folder name


def is_dataset(dataset: str) -> bool:
    """Whether ``dataset`` names a dataset: one of ``DATASETS``, or ``SOURCE-NAME`` for a source whose datasets the
    user names (``Source.named``: ``meds-mimic_iv``)."""
    source, _, name = dataset.partition("-")
    return dataset in DATASETS or (source in SOURCES and SOURCES[source].named and bool(NAMED.fullmatch(name)))


def dataset_names() -> str:
    """Every dataset name, for a message: ``DATASETS`` and ``SOURCE-NAME`` for each named source."""
    return ", ".join([*DATASETS, *(f"{name}-NAME" for name, source in SOURCES.items() if source.named)])


def _not_a_dataset(dataset: str) -> str:
    """Why ``dataset`` names no dataset, listing the names (the cohorts' of a source with cohorts)."""
    source = SOURCES.get(dataset)
    if source is not None and source.cohorts:
        return f"{dataset} has one dataset per cohort; name one of {', '.join(source.datasets)}"
    return f"unknown dataset {dataset!r}; choose one of {dataset_names()}"


def dataset_name(text: str) -> str:
    """An argparse type: ``text`` when it names a dataset (``is_dataset``), else an error saying why."""
    if not is_dataset(text):
        raise argparse.ArgumentTypeError(_not_a_dataset(text))
    return text


def source_of(dataset: str) -> Source:
    """The source a dataset was built from (``physionet2019-early`` -> ``physionet2019``'s)."""
    return SOURCES[dataset.partition("-")[0]]


def processed_folder(dataset: str, data_root: Path = DEFAULT_DATA_ROOT) -> Path:
    if not is_dataset(dataset):
        raise DatasetNotFoundError(_not_a_dataset(dataset))
    return Path(data_root) / "processed" / dataset


def preprocess(
    name: str, data_root: Path = DEFAULT_DATA_ROOT, cohort: str | None = None, named: str | None = None, **options
) -> tuple[str, Path, dict]:
    """Build source ``name``'s processed tables (of ``cohort`` where it has cohorts; as dataset ``name-named`` for a
    source whose datasets the user names) under ``data_root``.

    ``options`` are those the user gave (``source``, ``strict``, ``stays``, ``seed``; None or False = not given);
    one that the source does not take is refused, as is a missing required one. Returns the dataset name, its
    folder and the manifest.
    """
    if name not in SOURCES:
        raise PreprocessOptionError(f"unknown source {name!r}; choose one of {', '.join(SOURCES)}")
    source = SOURCES[name]
    given = {key: value for key, value in options.items() if value is not None and value is not False}
    if cohort is not None:
        if not source.cohorts:
            raise PreprocessOptionError(f"--cohort does not apply to {name}: it has a single cohort")
        if cohort not in source.cohorts:
            choices = ", ".join(source.cohorts)
            raise PreprocessOptionError(f"unknown cohort {cohort!r} for {name}; choose one of {choices}")
    unknown = sorted(set(given) - source.options)
    if unknown:
        flags = ", ".join(_flag(key) for key in unknown)
        takes = ", ".join(_flag(key) for key in sorted(source.options | ({"cohort"} if source.cohorts else set())))
        raise PreprocessOptionError(f"{flags} does not apply to {name} (it takes {takes or 'no option'})")
    missing = sorted(source.required - set(given))
    if missing:
        raise PreprocessOptionError(f"{_flag(missing[0])} is required for {name}: {source.source_help}")
    if named is not None and not source.named:
        raise PreprocessOptionError(f"--name does not apply to {name}: its datasets are {', '.join(source.datasets)}")
    if named is not None and not NAMED.fullmatch(named):
        raise PreprocessOptionError(
            f"--name {named!r}: expected letters, digits, _ and -, starting with a letter or digit"
        )
    dataset = source.dataset(cohort) if named is None else f"{name}-{named}"
    folder = processed_folder(dataset, data_root)
    if source.cohorts:
        given["cohort"] = cohort or source.cohorts[0]
    return dataset, folder, source.write(folder, **given)


def _flag(option: str) -> str:
    """The command-line flag of a source's option: ``window_hours`` -> ``--window-hours``."""
    return "--" + option.replace("_", "-")


def ensure_processed(dataset: str, data_root: Path = DEFAULT_DATA_ROOT) -> Path:
    """The dataset's processed folder; the synthetic cohort is generated when absent, real data must be prepared.

    A folder that a killed ``garlic preprocess`` left retired is put back first, never replaced by a new cohort.
    """
    folder = processed_folder(dataset, data_root)
    recover(folder)
    if (folder / MANIFEST).is_file():
        return folder
    if dataset == "synthetic":
        synthetic.generate(folder)
        return folder
    source, _, cohort = dataset.partition("-")
    others = "".join(f" {_flag(key)} {key.upper()}" for key in sorted(SOURCES[source].required - {"source"}))
    command = f"garlic preprocess {source} --source PATH_TO_RAW_DATA{others}" + (
        f" --cohort {cohort}" if cohort else ""
    )
    raise DatasetNotFoundError(f"dataset {dataset!r} has not been preprocessed into {folder}; run `{command}` first")
