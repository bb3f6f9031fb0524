"""What a GARLIC architecture offers its callers, and the architectures there are (``NetworkConfig.architecture``, the
run config's ``architecture``).

The trainers, ``garlic.models.predict``, the explanations and the dashboard use a model only through ``Architecture``;
what differs between architectures they ask (``explanation_unavailable``), never the class. Both implement it:
``compact`` (``garlic.models.compact.Garlic``, the paper's model as this project writes it) and ``reference``
(``garlic.models.reference.ReferenceGarlic``, the authors' code). A new architecture implements these members, and
``tests/test_architectures.py`` checks every entry of ``ARCHITECTURES`` against them.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor, nn

from garlic.config import ConfigError
from garlic.models.compact import Garlic
from garlic.models.network_config import NetworkConfig
from garlic.models.reference import ReferenceGarlic


@runtime_checkable
class Architecture(Protocol):
    """Shapes as in ``garlic.models.compact``: B stays, T steps, D variables, H hidden, S static features."""

    # Why the built-in explanation (``garlic.explain.built_in``) is not defined for the model; None where it is.
    explanation_unavailable: str | None
    # A constant added to every logit: the training odds where the loss weighted both outcomes equally, else 0.
    logit_offset: Tensor

    def prepare(self, times: Tensor, lengths: Tensor) -> None:
        """Take what the model needs from the training stays' times [N, T] and lengths [N] before the first batch."""

    def forward(self, values: Tensor, mask: Tensor, times: Tensor, lengths: Tensor, static: Tensor):
        """Everything training and the explanations read: ``logits`` [B], ``step_mask`` [B, T] and the rest."""

    def predict_logits(self, values: Tensor, mask: Tensor, times: Tensor, lengths: Tensor, static: Tensor) -> Tensor:
        """The logits [B] alone: the inference path."""

    def encode(self, values: Tensor, mask: Tensor, times: Tensor):
        """Every step through the GRU (``states`` [B, T, H], ``summaries``), a step from itself and earlier ones."""

    def classify(self, states: Tensor, real: Tensor, static: Tensor, summary: Tensor | None = None):
        """(logits [B], temporal weights [B, T]) from the states of the real steps: with ``encode``, the risk after
        every prefix of a stay from one pass."""

    def reconstruction_loss(self, output, values: Tensor, mask: Tensor) -> Tensor:
        """The architecture's reconstruction error of ``forward``'s output against the observed values."""

    def prediction_parameters(self) -> list[nn.Parameter]:
        """The parameters the prediction stage trains; the others are ``reconstruction_parameters``."""

    def reconstruction_parameters(self) -> list[nn.Parameter]:
        """Every parameter not in ``prediction_parameters``."""


ARCHITECTURES: dict[str, type[nn.Module]] = {"compact": Garlic, "reference": ReferenceGarlic}


def build_model(num_variables: int, num_static: int, config: NetworkConfig) -> Garlic | ReferenceGarlic:
    """A fresh model of ``config.architecture`` (a run config's network: ``NetworkConfig.from_run``)."""
    if config.architecture not in ARCHITECTURES:
        raise ConfigError(f"architecture must be one of {', '.join(ARCHITECTURES)}, got {config.architecture!r}")
    return ARCHITECTURES[config.architecture](num_variables, num_static, config)
