"""The speed benchmark on the synthetic cohort: one epoch, and inference throughput as a median of passes."""
from experiments import benchmark_training
from garlic.config import Config
from garlic.reference_model import ReferenceGarlic


def test_speed_benchmark_reports_an_epoch_and_the_median_inference_rate(tmp_path, monkeypatch):
    monkeypatch.setattr(benchmark_training, "INFERENCE_PASSES", 3)
    config = Config.for_dataset("synthetic").override({"hidden_dim": 16, "feature_dim": 4, "device": "cpu"})
    speed = benchmark_training.measure_speed(config, tmp_path)
    assert speed["training_stays"] == 1600 and speed["predicted_stays"] == 400  # 80/10/10 of 2,000 stays
    assert speed["epoch_seconds"] > 0
    slowest, fastest = speed["stays_per_second_range"]
    assert 0 < slowest <= speed["stays_per_second"] <= fastest


def test_speed_benchmark_times_the_first_batches_of_a_reference_model_prepared_as_a_fit_prepares_it(tmp_path,
                                                                                                    monkeypatch):
    monkeypatch.setattr(benchmark_training, "INFERENCE_PASSES", 1)
    prepared = []
    fit_scales = ReferenceGarlic.fit_scales
    monkeypatch.setattr(ReferenceGarlic, "fit_scales",
                        lambda model, times, lengths: prepared.append(len(times)) or fit_scales(model, times, lengths))
    config = Config.for_dataset("synthetic").override({"hidden_dim": 8, "feature_dim": 4, "device": "cpu",
                                                       "architecture": "reference", "signal_layout": "code"})
    speed = benchmark_training.measure_speed(config, tmp_path, batches=2)
    assert prepared == [1600]  # the training stays, before the timed batches
    assert speed["batches"] == 2 and speed["epoch_batches"] == 1600 // config.batch_size
    assert speed["epoch_seconds"] > 0
