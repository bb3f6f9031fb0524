"""Config values are checked when a config is built: type, range and choice, with the key in the message."""

import json
import re

import pytest

from garlic.config import CHECKS, CONFIG_DIR, Config, ConfigError
from garlic.data.datasets import DATASETS
from garlic.data.splits import PROTOCOLS


@pytest.mark.parametrize(
    "assignment, message",
    [
        ("dropout=2", "config key 'dropout' must be at least 0 and below 1, got 2.0"),
        ("window_size=-1", "config key 'window_size' must be from 1 to 512, got -1"),
        ("window_size=100000", "config key 'window_size' must be from 1 to 512, got 100000"),
        ("hidden_dim=200000", "config key 'hidden_dim' must be from 1 to 4096, got 200000"),
        ("split_protocol=ten-split", "config key 'split_protocol' must be one of"),
        ("lr_cls=-1e-3", "config key 'lr_cls' must be from 0 to 10, got -0.001"),
        ("lr_cls=inf", "config key 'lr_cls' must be from 0 to 10, got inf"),
        ("lr_rec=nan", "config key 'lr_rec' must be from 0 to 10, got nan"),
        ("wd_cls=1e308", "config key 'wd_cls' must be from 0 to 10, got 1e+308"),
        ("seed=12345678901234567890", "config key 'seed' must be from 0 to 4294967295, got 12345678901234567890"),
        ("max_epochs=0", "config key 'max_epochs' must be from 1 to 100000"),
        ("batch_size=0", "config key 'batch_size' must be from 1 to 65536"),
        ("stage_tolerance=1.5", "config key 'stage_tolerance' must be at least 0 and below 1"),
        ("device=gpu", "config key 'device' must be auto, cpu, cuda or cuda:N"),
        (
            "dataset=physionet2020",
            "config key 'dataset' must be one of meds, mimic3-benchmark, mimic3-garlic, physionet2012",
        ),
        ("hidden_dim=lots", "config key 'hidden_dim' expects an integer, got 'lots'"),
        ("use_graph=maybe", "config key 'use_graph' expects true or false, got 'maybe'"),
    ],
)
def test_a_bad_value_is_refused_when_the_config_is_built_naming_its_key(assignment, message):
    with pytest.raises(ConfigError) as refused:
        Config().override([assignment])
    assert message in str(refused.value)


def test_the_protocol_choice_is_read_from_the_splits_module():
    for protocol in PROTOCOLS:
        assert Config().override({"split_protocol": protocol}).split_protocol == protocol
    with pytest.raises(ConfigError) as refused:
        Config(split_protocol="ten-split")
    assert all(protocol in str(refused.value) for protocol in PROTOCOLS)


def test_a_config_file_with_a_bad_value_is_named_in_the_message(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"dataset": "synthetic", "window_size": 2.5}))
    with pytest.raises(ConfigError, match=r"mine\.json: config key 'window_size' expects an integer, got 2\.5"):
        Config.load(path)
    path.write_text(json.dumps([1, 2]))
    with pytest.raises(ConfigError, match=r"mine\.json: expected a JSON object"):
        Config.load(path)
    path.write_text('{"dataset": "synthetic", "lr_cls": Infinity}')  # Python's json reads it
    with pytest.raises(ConfigError, match=r"mine\.json: config key 'lr_cls' must be from 0 to 10, got inf"):
        Config.load(path)
    path.write_bytes('{"dataset": "synthetic", "seed": 1} # café'.encode("latin-1"))
    with pytest.raises(ConfigError, match=r"mine\.json: not UTF-8 text \(byte 41\); a config is a JSON file"):
        Config.load(path)


def test_valid_values_and_every_shipped_preset_pass():
    assert Config().override({"lr_cls": 1, "device": "cuda:1", "dropout": 0}).lr_cls == 1.0
    for dataset in DATASETS:
        assert Config.for_dataset(dataset).dataset == dataset


def test_every_check_belongs_to_a_config_key():
    assert set(CHECKS) <= set(Config().to_dict())


def test_the_model_and_schedule_choices_are_those_the_factories_know():
    from garlic.models.architectures import ARCHITECTURES
    from garlic.models.reference import SIGNAL_LAYOUTS
    from garlic.training.schedules import TRAINERS

    for key, known in (("architecture", ARCHITECTURES), ("signal_layout", SIGNAL_LAYOUTS), ("schedule", TRAINERS)):
        for choice in known:
            assert Config().override({key: choice}).to_dict()[key] == choice
        with pytest.raises(ConfigError, match=f"config key '{key}' must be one of {', '.join(sorted(known))}"):
            Config().override({key: "other"})


def test_a_shipped_preset_is_named_by_its_stem_and_a_missing_file_lists_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # as from any folder: the preset is found where the package ships it
    assert Config.load("physionet2012-fast") == Config.load(CONFIG_DIR / "physionet2012-fast.json")
    assert Config.load("physionet2012-fast").hidden_dim == 64
    shipped = ", ".join(sorted(path.stem for path in CONFIG_DIR.glob("*.json")))
    assert "physionet2012-fast, " in shipped and "synthetic" in shipped
    for missing in ("physionet2012-fastest", "elsewhere/physionet2012-fast", "physionet2012-fast.json"):
        with pytest.raises(ConfigError, match=f"does not exist .*: {re.escape(shipped)}\\)"):
            Config.load(missing)
    (tmp_path / "physionet2012-fast").write_text(json.dumps({"dataset": "synthetic"}))
    assert Config.load("physionet2012-fast").dataset == "synthetic"  # a file of that name comes first


def test_a_cuda_device_that_torch_does_not_see_is_refused_naming_the_ones_it_sees(monkeypatch):
    import torch

    from garlic.training.device import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(
        ValueError,
        match=r"device 'cuda:7' was asked for, but torch sees 2 CUDA device\(s\), cuda:0 "
        r"to cuda:1",
    ):
        resolve_device("cuda:7")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="device 'cuda:0' was asked for, but torch sees no CUDA device"):
        resolve_device("cuda:0")
