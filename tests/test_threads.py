"""Torch's CPU threads chosen from the CPUs other processes leave free, and OpenMP's passive wait (issue #56: beside
one busy process, two spinning threads made an epoch 3.3 times slower; beside two, 17 to 26 times; one thread was
never slower than 6.5 s)."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from garlic.training import threads
from garlic.training.threads import CpuTimes, ThreadChooser, busy_elsewhere, choose_threads

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "most, cpus, elsewhere, expected",
    [
        (2, 2, 0.0, 2),  # idle: all torch would use, as before
        (2, 2, 0.2, 2),  # a shell, a log writer: still all
        (2, 2, 0.6, 1),  # one busy process beside two threads of ours (it gets about two thirds of a CPU)
        (2, 2, 1.0, 1),  # the same beside one thread of ours
        (2, 2, 1.4, 1),  # two busy processes
        (2, 2, 2.0, 1),  # every CPU taken: never fewer than one
        (8, 16, 0.0, 8),  # torch's own count (physical cores) is the most, never the logical CPUs
        (8, 16, 10.0, 6),  # six CPUs left free
        (4, 4, 3.2, 1),
    ],
)
def test_the_thread_count_follows_the_cpus_left_free(most, cpus, elsewhere, expected):
    assert choose_threads(most, cpus, elsewhere) == expected


def test_what_other_processes_used_is_the_cpus_busy_time_less_this_processs():
    # Over 2 s, the CPUs were busy 3 CPU-seconds, 2 of them ours: others kept half a CPU busy.
    assert busy_elsewhere(CpuTimes(busy=100.0, own=10.0, at=50.0), CpuTimes(busy=103.0, own=12.0, at=52.0)) == 0.5
    # Our own time counted at another tick than the CPUs' is never a negative use.
    assert busy_elsewhere(CpuTimes(100.0, 10.0, 50.0), CpuTimes(101.0, 11.5, 51.0)) == 0.0


class Readings:
    """Scripted ``read_cpu_times``: 2 CPUs, a second between readings, in which our process keeps ``own`` CPUs busy
    and other processes ``others``."""

    def __init__(self):
        self.times = CpuTimes(busy=0.0, own=0.0, at=0.0)
        self.own, self.others = 2.0, 0.0

    def __call__(self, cpus):
        assert cpus == frozenset({0, 1})
        t = self.times
        self.times = CpuTimes(t.busy + self.own + self.others, t.own + self.own, t.at + 1.0)
        return self.times  # the second that ends now, with the use set before this call


@pytest.fixture
def free_choice(monkeypatch):
    """No OMP_NUM_THREADS (pytest runs with one) and torch's thread count restored afterwards."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_chooser_drops_to_one_thread_beside_a_busy_process_and_comes_back(free_choice):
    readings = Readings()
    chooser = ThreadChooser(read=readings, cpus=frozenset({0, 1}), most=2)
    chooser.start()
    assert chooser.adapt() == 2 and torch.get_num_threads() == 2  # idle
    readings.others, readings.own = 0.7, 1.3  # a busy process arrives, beside our two threads
    assert chooser.adapt() == 1 and torch.get_num_threads() == 1
    readings.others, readings.own = 1.0, 1.0  # it stays (now with a whole CPU): we stay on one
    assert chooser.adapt() == 1
    readings.others = 0.0  # it is gone
    assert chooser.adapt() == 2 and torch.get_num_threads() == 2


def test_the_first_choice_without_a_start_measures_a_short_window(free_choice):
    readings = Readings()
    readings.others = 1.5
    assert ThreadChooser(read=readings, cpus=frozenset({0, 1}), most=2).adapt() == 1


def test_a_users_thread_count_is_kept(free_choice, monkeypatch):
    readings = Readings()
    readings.others = 1.5  # the chooser would pick one thread
    torch.set_num_threads(2)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    chooser = ThreadChooser(read=readings, cpus=frozenset({0, 1}), most=2)
    assert chooser.adapt() is None and torch.get_num_threads() == 2
    # set in the program, after a choice of ours: kept as well
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert chooser.adapt() == 1
    torch.set_num_threads(2)
    assert chooser.adapt() is None and torch.get_num_threads() == 2


def test_without_cpu_times_torch_is_left_as_it_is(free_choice):
    torch.set_num_threads(2)
    assert ThreadChooser(read=lambda cpus: None, cpus=frozenset({0, 1}), most=2).adapt() is None
    assert torch.get_num_threads() == 2


@pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="reads Linux's /proc/stat")
def test_this_machines_cpu_times_are_read():
    cpus = threads.allowed_cpus()
    first = threads.read_cpu_times(cpus)
    # CPU time of our own, for long enough that /proc/stat's 10 ms ticks cannot make the others' share look larger
    # than the CPUs (busy_elsewhere 2.05 of 2 over a 13 ms window, with both CPUs busy)
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        sum(i * i for i in range(10_000))
    second = threads.read_cpu_times(cpus)
    assert second.own > first.own and second.busy >= first.busy and second.at > first.at
    assert 0 <= busy_elsewhere(first, second) <= len(cpus)


@pytest.mark.parametrize("given, spin_count", [(None, "300000"), ("PASSIVE", "0")])
def test_the_garlic_command_leaves_openmps_wait_as_openmp_or_the_user_sets_it(tmp_path, given, spin_count):
    # libgomp reports the wait it was given as torch loaded it (GOMP_SPINCOUNT 300000: its default, spinning a while;
    # 0: passive); the command stops at the device check, just after importing torch. Idle, a passive wait made an
    # epoch slower (docs/results/speed.md); beside busy processes garlic runs one thread, which waits for none.
    environment = {key: value for key, value in os.environ.items() if key not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    environment |= {"OMP_DISPLAY_ENV": "VERBOSE"} | ({"OMP_WAIT_POLICY": given} if given else {})
    result = subprocess.run([sys.executable, "-m", "garlic.cli", "--data-root", str(tmp_path), "--mlruns",
                             str(tmp_path / "mlruns"), "train", "--set", "device=cuda:7"], capture_output=True,
                            text=True, timeout=120, cwd=ROOT, env=environment)  # fmt: skip
    if "OPENMP DISPLAY ENVIRONMENT" not in result.stderr:
        pytest.skip("this torch does not load GNU OpenMP (libgomp), which reports its settings")
    assert f"GOMP_SPINCOUNT = '{spin_count}'" in result.stderr, result.stderr
    assert "device 'cuda:7' was asked for" in result.stderr
