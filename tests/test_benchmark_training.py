"""The speed benchmark on the synthetic cohort: one epoch, and inference throughput as a median of passes."""

import pandas as pd
import pytest

from experiments import benchmark_training
from garlic.config import Config
from garlic.data.datasets import processed_folder
from garlic.models.reference import ReferenceGarlic
from garlic.sources import synthetic
from garlic.training import speed


def test_speed_benchmark_reports_an_epoch_and_the_median_inference_rate(tmp_path, monkeypatch):
    monkeypatch.setattr(speed, "INFERENCE_PASSES", 3)
    config = Config.for_dataset("synthetic").override({"hidden_dim": 16, "feature_dim": 4, "device": "cpu"})
    measured = speed.measure_speed(config, tmp_path)
    assert measured["training_stays"] == 1600 and measured["predicted_stays"] == 400  # 80/10/10 of 2,000 stays
    assert measured["epoch_seconds"] > 0
    slowest, fastest = measured["stays_per_second_range"]
    assert 0 < slowest <= measured["stays_per_second"] <= fastest


def test_speed_benchmark_times_the_first_batches_of_a_reference_model_prepared_as_a_fit_prepares_it(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(speed, "INFERENCE_PASSES", 1)
    prepared = []
    prepare = ReferenceGarlic.prepare
    monkeypatch.setattr(
        ReferenceGarlic,
        "prepare",
        lambda model, times, lengths: prepared.append(len(times)) or prepare(model, times, lengths),
    )
    config = Config.for_dataset("synthetic").override(
        {"hidden_dim": 8, "feature_dim": 4, "device": "cpu", "architecture": "reference", "signal_layout": "code"}
    )
    measured = speed.measure_speed(config, tmp_path, batches=2)
    assert prepared == [1600]  # the training stays, before the timed batches
    assert measured["batches"] == 2 and measured["epoch_batches"] == 1600 // config.batch_size
    assert measured["epoch_seconds"] > 0


def test_the_speed_table_keeps_a_row_per_preset_with_its_work_and_whole_run(tmp_path, monkeypatch):
    monkeypatch.setattr(speed, "INFERENCE_PASSES", 1)
    monkeypatch.setattr(benchmark_training, "matmul_gflops", lambda: 100.0)  # the machine's rate is not under test
    monkeypatch.setattr(speed, "FLOP_SAMPLE_BATCHES", 2)
    data = tmp_path / "data"
    synthetic.generate(processed_folder("synthetic", data), n_stays=600, seed=0)  # a third of the default: faster
    common = [
        "--data-root",
        str(data),
        "--mlruns",
        str(tmp_path / "mlruns"),
        "--out",
        str(tmp_path / "out"),
        "--set",
        "hidden_dim=8",
        "--set",
        "feature_dim=4",
        "--set",
        "max_epochs=2",
        "--set",
        "device=cpu",
    ]
    benchmark_training.main(["--presets", "synthetic", "--full-run", *common])
    benchmark_training.main(["--presets", "physionet2012-fast", "--dataset", "synthetic", *common])  # or --set dataset=
    table = pd.read_csv(tmp_path / "out" / "speed.csv")
    assert table["preset"].tolist() == ["synthetic", "physionet2012-fast"]  # the second run kept the first's row
    first, second = table.itertuples()
    assert first.epochs_run == 2 and 1 <= first.best_epoch <= 2 and first.run_seconds > first.epoch_seconds > 0
    assert 0.5 < first.test_auroc <= 1.0, first.test_auroc
    assert pd.isna(second.run_seconds)  # no --full-run
    assert first.gflop_per_epoch > 0 and first.floor_seconds == pytest.approx(first.gflop_per_epoch / 100.0)
    assert "python -m experiments.benchmark_training --presets synthetic --full-run" in first.command
    report = (tmp_path / "out" / "speed.md").read_text()
    assert first.cpu == speed.cpu_name() and first.cpu  # rows of different machines stay apart
    assert f"| synthetic | synthetic | five-split / 0 | {first.cpu} |" in report
    assert "| physionet2012-fast | synthetic | five-split / 0 |" in report


def test_a_speed_row_replaces_only_the_row_of_the_same_machine(tmp_path):
    base = {
        "preset": "physionet2012-fast",
        "dataset": "physionet2012",
        "protocol": "raindrop",
        "split": 0,
        "threads": 2,
    }
    path = tmp_path / "speed.csv"
    benchmark_training.keep_rows(path, [base | {"cpu": "EPYC", "epoch_seconds": 17.2}]).to_csv(path, index=False)
    kept = benchmark_training.keep_rows(path, [base | {"cpu": "Xeon", "epoch_seconds": 18.7}])
    assert kept[["cpu", "epoch_seconds"]].values.tolist() == [["EPYC", 17.2], ["Xeon", 18.7]]
    kept.to_csv(path, index=False)
    again = benchmark_training.keep_rows(path, [base | {"cpu": "Xeon", "epoch_seconds": 18.0}])
    assert again[["cpu", "epoch_seconds"]].values.tolist() == [["EPYC", 17.2], ["Xeon", 18.0]]


def test_compare_kernels_alternates_pytorch_layers_and_fused_kernels(tmp_path, monkeypatch, capsys):
    from garlic.models import fused

    if fused.kernels() is None:
        pytest.skip("the fused CPU kernels could not be built here (no C++ compiler or ninja)")
    monkeypatch.setattr(speed, "INFERENCE_PASSES", 1)
    synthetic.generate(processed_folder("synthetic", tmp_path), n_stays=300, seed=0)
    calls = []
    layer_norm = fused._LayerNorm.apply
    monkeypatch.setattr(fused._LayerNorm, "apply", lambda *a: calls.append(1) or layer_norm(*a))
    config = Config(dataset="synthetic", hidden_dim=8, feature_dim=4, device="cpu")
    frame = benchmark_training.compare_kernels(config, tmp_path, batches=1, split_index=0, rounds=2)
    assert frame["kernels"].tolist() == ["pytorch", "fused"] * 2 and (frame["epoch_seconds"] > 0).all()
    runs_with_kernels = len(calls)
    assert runs_with_kernels > 0
    with fused.fused_kernels(False):
        speed.measure_speed(config, tmp_path, batches=1)
    assert len(calls) == runs_with_kernels  # PyTorch's layer norm only
    benchmark_training.main(
        [
            "--presets",
            "synthetic",
            "--data-root",
            str(tmp_path),
            "--batches",
            "1",
            "--compare-kernels",
            "1",
            "--set",
            "hidden_dim=8",
            "--set",
            "device=cpu",
        ]
    )
    assert "fused / pytorch, medians: training time x" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        benchmark_training.main(["--presets", "synthetic", "--compare-kernels", "1", "--full-run"])
