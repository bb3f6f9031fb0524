"""garlic.studies' configuration: a study runs the dataset's config, or a shipped preset with --preset."""

from __future__ import annotations

import argparse

import pytest

from garlic import studies
from garlic.tracking import queries


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    studies.add_common_arguments(parser)
    return parser.parse_args(list(argv))


def test_a_study_trains_the_preset_it_is_given_with_its_overrides():
    config = studies.study_config(
        parsed(
            "--dataset", "physionet2012", "--preset", "physionet2012-fast", "--max-epochs", "3", "--set", "dropout=0.1"
        )
    )
    assert (config.dataset, config.lr_schedule, config.hidden_dim) == ("physionet2012", "cosine", 64)
    assert (config.max_epochs, config.dropout) == (3, 0.1)
    assert studies.study_config(parsed("--dataset", "physionet2012")).lr_schedule == "plateau"  # the paper config


def test_a_preset_for_another_dataset_is_refused():
    with pytest.raises(ValueError, match="preset 'physionet2012-fast' is for dataset 'physionet2012'"):
        studies.study_config(parsed("--dataset", "synthetic", "--preset", "physionet2012-fast"))


def test_a_unit_trained_on_a_gpu_has_the_digest_of_the_same_unit_on_a_cpu():
    from experiments.ablations import unit_tags
    from garlic.config import Config

    config = Config.for_dataset("physionet2012")
    on_gpu = unit_tags(config.override({"device": "cuda"}), "no_graph", 0)
    assert on_gpu == unit_tags(config, "no_graph", 0) == unit_tags(config.override({"device": "cpu"}), "no_graph", 0)
    assert on_gpu != unit_tags(config.override({"device": "cuda", "window_size": 7}), "no_graph", 0)
    assert queries.settings_digest({"lr": 1}) != queries.settings_digest({"lr": 2})
