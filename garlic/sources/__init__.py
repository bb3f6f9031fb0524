"""Where data come from: one module per source (``synthetic``, ``physionet2012``, ``physionet2019``, ``mimic3``,
``meds``, ``uea``), each reading its raw records into the processed tables of ``garlic.io.tables``, with the parsers' shared
helpers in ``raw``.

A source module declares itself with one ``SOURCE = Source(...)`` at its end: how ``garlic preprocess`` builds it,
which options it takes, its cohorts, and what else it offers (one-stay record files that ``garlic predict`` reads,
the hospital system of each stay). ``discovered()`` finds every module here that has one, so a new source is one
new module in this folder (``docs/adding-a-source.md``). Imports only ``garlic.io``.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from functools import cache
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Source:
    """One source of data. ``write(destination, **options)`` builds its processed tables and returns the manifest;
    ``options`` names the keyword options it takes besides ``cohort`` (``source``, ``strict``, ``stays``, ``seed``),
    ``required`` those without which it cannot run, and ``cohorts`` its cohort names (the first is the default).
    A cohort's dataset is named ``SOURCE-COHORT``; with ``plain_default``, the default cohort's keeps the source's
    own name (``physionet2012``: the per-stay task it was before it had another cohort).

    ``named``: the user names each dataset it writes (``garlic preprocess meds --name NAME`` -> ``meds-NAME``),
    beside the plain ``name``.

    ``record_suffix`` and ``read_record_files(files, left_out=...)`` (both or neither): the suffix of its one-stay
    record files and the reader that turns such files into observation and static tables. ``hospital_systems``
    maps stay ids to the hospital system each stay came from, for the protocols that draw by hospital.
    """

    name: str
    write: Callable[..., dict]
    options: frozenset[str]
    required: frozenset[str] = frozenset()
    cohorts: tuple[str, ...] = ()
    plain_default: bool = False
    source_help: str = ""
    named: bool = False
    record_suffix: str | None = None
    read_record_files: Callable | None = None
    hospital_systems: Callable[[np.ndarray], np.ndarray] | None = None

    def dataset(self, cohort: str | None) -> str:
        """The dataset name of one of this source's cohorts (the default cohort when None)."""
        if not self.cohorts or (self.plain_default and cohort in (None, self.cohorts[0])):
            return self.name
        return f"{self.name}-{cohort or self.cohorts[0]}"

    @property
    def datasets(self) -> tuple[str, ...]:
        return tuple(self.dataset(c) for c in self.cohorts) if self.cohorts else (self.name,)


@cache
def discovered() -> dict[str, Source]:
    """Every source of this package by name, in the order of their module names."""
    found = {}
    for module in sorted(info.name for info in pkgutil.iter_modules(__path__)):
        source = getattr(importlib.import_module(f"{__name__}.{module}"), "SOURCE", None)
        if isinstance(source, Source):
            found[source.name] = source
    return found
