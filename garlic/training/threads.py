"""How many CPU threads torch runs on: all it would use while this process's CPUs are free, one fewer for each CPU
that other processes keep busy, never fewer than one.

Torch's threads meet at the end of every small parallel operation, and one that the system has given to another
process holds up the others: on this project's 2-core machine the first 40 batches of an epoch took 4.1 s on two
threads idle, 13.4 s beside one busy process and 70-108 s beside two, while one thread took 6.4-6.5 s in all three
conditions (issue #56). So the count is chosen from what other processes used of this process's CPUs since the
last choice: Linux's ``/proc/stat`` gives the CPUs' busy time, less this process's own. ``garlic`` starts the
measure as a command starts (``watch_cpus``), so that the first choice covers its imports; the fit loop chooses
again before each epoch, ``evaluate`` and ``predict`` before they score (``adapt_threads``). Torch is left alone
where the user chose (``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS``, or ``torch.set_num_threads`` after a choice of
ours) and where there is no ``/proc/stat``.

OpenMP's wait is left at its default (spin a while, then sleep): a passive wait (``OMP_WAIT_POLICY=PASSIVE``) made
an idle epoch's first 40 batches 4.4-5.1 s against 3.8 s, and beside busy processes this module leaves one thread,
which waits for no other (``docs/results/speed.md``, "Under load").

Imports nothing heavy (torch only inside ``ThreadChooser.adapt``): ``watch_cpus`` runs before torch is loaded.
"""
from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)
PROC_STAT = Path("/proc/stat")
CHOSEN_BY_USER = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # torch reads these for its own count
# A CPU counts as free while other processes use less than this share of it: a shell or a log writer leaves a run
# its threads, a process that computes takes one away (beside two threads of ours it gets about two thirds of a CPU).
FREE_BELOW = 0.25
SAMPLE_SECONDS = 0.2  # the window of a first choice that no ``watch_cpus`` started
# Fields of a /proc/stat CPU line (user nice system idle iowait irq softirq steal ...): idle and iowait are free time.
IDLE_FIELDS = (3, 4)


@dataclass(frozen=True)
class CpuTimes:
    """CPU seconds so far: ``busy`` on the CPUs this process may run on (all but idle and I/O wait; time a hypervisor
    stole included), ``own`` this process's (all its threads), at ``at`` on the monotonic clock."""

    busy: float
    own: float
    at: float


def allowed_cpus() -> frozenset[int]:
    """The CPUs this process may run on (its affinity; every CPU where the system does not say)."""
    if hasattr(os, "sched_getaffinity"):
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))


def read_cpu_times(cpus: frozenset[int]) -> CpuTimes | None:
    """The busy time of ``cpus`` and this process's own, now; None where Linux's ``/proc/stat`` is not."""
    try:
        lines = PROC_STAT.read_text().splitlines()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    busy = 0
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            counts = [int(field) for field in fields[:8]]  # guest time is inside user time already
            busy += sum(counts) - sum(counts[i] for i in IDLE_FIELDS)
    return CpuTimes(busy=busy / ticks, own=time.process_time(), at=time.monotonic())


def busy_elsewhere(before: CpuTimes, after: CpuTimes) -> float:
    """The CPUs' worth that other processes kept busy between two readings (0 when no time passed)."""
    seconds = after.at - before.at
    if seconds <= 0:
        return 0.0
    return max(0.0, ((after.busy - before.busy) - (after.own - before.own)) / seconds)


def choose_threads(most: int, cpus: int, elsewhere: float) -> int:
    """Threads for torch on ``cpus`` CPUs of which other processes keep ``elsewhere`` busy: as many as are free, at
    most ``most`` (torch's own count: physical cores) and at least one."""
    return max(1, min(most, math.floor(cpus - elsewhere + FREE_BELOW)))


class ThreadChooser:
    """Sets torch's thread count at each ``adapt`` from the CPU use since the last reading (``start`` or ``adapt``).
    ``most`` defaults to torch's count at the first ``adapt``, before any choice."""

    def __init__(self, read: Callable[[frozenset[int]], CpuTimes | None] = read_cpu_times,
                 cpus: frozenset[int] | None = None, most: int | None = None):  # fmt: skip
        self.read, self.most = read, most
        self.cpus = allowed_cpus() if cpus is None else cpus
        self.last: CpuTimes | None = None
        self.chosen: int | None = None

    def start(self) -> None:
        self.last = self.read(self.cpus)

    def adapt(self) -> int | None:
        """Choose and set the thread count; returns it, or None when torch is left as it is (see the module)."""
        if any(os.environ.get(name) for name in CHOSEN_BY_USER):
            return None
        import torch

        current = torch.get_num_threads()
        if self.chosen is not None and current != self.chosen:  # set since our choice, by the program: its choice
            return None
        now = self.read(self.cpus)
        if now is None:
            return None
        if self.last is None:
            time.sleep(SAMPLE_SECONDS)
            self.last, now = now, self.read(self.cpus)
        if self.most is None:
            self.most = current
        elsewhere = busy_elsewhere(self.last, now)
        self.last, self.chosen = now, choose_threads(self.most, len(self.cpus), elsewhere)
        if self.chosen != current:
            torch.set_num_threads(self.chosen)
            log.info("%d CPU thread(s): other processes kept %.1f of this process's %d CPUs busy", self.chosen,
                     elsewhere, len(self.cpus))  # fmt: skip
        return self.chosen


PROCESS_CHOOSER = ThreadChooser()  # this process's (torch's thread count is the process's)


def watch_cpus() -> None:
    """Start measuring the CPUs' use for the process's first choice (a command's start, before its imports)."""
    PROCESS_CHOOSER.start()


def adapt_threads() -> int | None:
    """Set torch's thread count for the CPUs free since the last call or ``watch_cpus`` (``ThreadChooser.adapt``)."""
    return PROCESS_CHOOSER.adapt()
