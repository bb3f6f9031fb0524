"""How many CPU threads torch runs on: one or torch's own count, whichever the work at hand measures faster, checked
again as it goes.

Torch's threads meet at the end of every small parallel operation, and one that the system has given to another
process holds up the others. On this project's 2-core machine the first 40 batches of a ``physionet2012-fast``
epoch took 3.9 s on two threads idle and 5.9 s on one (issue #56), but beside other work two threads were 2 to 30
times slower than one (issue #72: 80.3 s against 7.2 s with other jobs running; 13.0 s against 6.2 s beside one
other training on one thread). A snapshot of what other processes used of the CPUs (Linux's ``/proc/stat``, the
chooser of #56) held beside busy loops but not beside real work, whose use comes in bursts. So the loops that do the
work (a training epoch's batches, ``garlic.training.trainer.EpochPass``; inference's, ``in_length_order``) run
through ``ThreadChooser.run``, which times each batch and compares the two counts per unit of work (a batch's stays
times its padded steps):

- a process starts on one thread, never the slow one by much (at most the 1.5 times of an idle machine);
- a check runs the other count on a few batches (``TRIAL_BATCHES``) after a few on the current one and keeps the
  faster; a trial batch that is ``ABANDON`` times slower ends the check at once, so a check that loses costs about
  one batch, and a check begins on a batch no larger than the loop's median so far (or after ``WAIT_BATCHES``: an
  inference loop's batches grow), so that batch is a short one;
- a check of more threads first times small parallel operations on each count for a moment (``PROBE_SECONDS``),
  this process's own work too: beside heavy load one took 500 to 1500 times as long on two threads as on one (their
  threads meet at its end, and one of them waits for the system), while a batch on two threads cost as much as 18 on
  one; where they are ``GATE`` times slower the check ends there, before a batch;
- checks come back every ``RECHECK_SECONDS``, or later after a check that lost time, so that checks cost at most
  ``MOST_LOST`` of the time (beside heavy load, one batch on two threads can take as long as 20 on one).

Torch is left alone where the user chose (``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS``, or ``torch.set_num_threads``
after a choice of ours) and where torch runs one thread anyway.

OpenMP's wait is left at its default (spin a while, then sleep): a passive wait (``OMP_WAIT_POLICY=PASSIVE``) made
an idle epoch's first 40 batches 4.4-5.1 s against 3.8 s, and where two threads are slow this module runs one, which
waits for no other (``docs/results/speed.md``, "Under load").
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, TypeVar

import torch

log = logging.getLogger(__name__)
Batch = TypeVar("Batch")
CHOSEN_BY_USER = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # torch reads these for its own count
FIRST_COUNT = 1  # where a process starts: one thread is never far from the fastest, two can be 20 times slower
WARMUP_BATCHES = 1  # a loop's first batch (allocations, first calls) is not measured
BASELINE_BATCHES = 2  # batches on the current count that a loop measures before a check
TRIAL_BATCHES = 2  # batches on the other count in a check
ABANDON = 2.0  # a trial batch this many times slower per unit of work than the current count ends the check
RECHECK_SECONDS = 10.0  # the time between checks that lost nothing
MOST_LOST = 0.05  # a check that lost time comes back once that time is this share of the time since
RECENT_BATCHES = 8  # the current count's rate is that of its last batches
WAIT_BATCHES = 4  # a due check waits at most this many batches for one no larger than the median
GATE = 2.0  # a check of more threads runs batches where small parallel operations are at most this much slower on them
PROBE_SECONDS = 0.02  # the small parallel operations are timed this long on each count
SMALL_OPERATION = (
    1 << 16
)  # numbers multiplied in place: above torch's grain (32768), one parallel region on two threads


@dataclass
class Timings:
    """Batches timed on one thread count: their seconds and their work."""

    seconds: deque = field(default_factory=lambda: deque(maxlen=RECENT_BATCHES))
    work: deque = field(default_factory=lambda: deque(maxlen=RECENT_BATCHES))

    def add(self, seconds: float, work: float) -> None:
        self.seconds.append(seconds)
        self.work.append(work)

    def __len__(self) -> int:
        return len(self.seconds)

    def rate(self) -> float:
        """Seconds per unit of work."""
        return sum(self.seconds) / max(sum(self.work), 1e-12)


@dataclass
class Loop:
    """One loop's measurements (a training pass and an inference pass cost differently per unit of work)."""

    current: Timings = field(default_factory=Timings)
    trial: Timings | None = None  # while a check runs
    works: list[float] = field(default_factory=list)  # every batch's so far
    waited: int = 0  # batches since a check was due


class ThreadChooser:
    """Chooses torch's thread count for each batch of the loops it runs (``run``), between one and ``most`` (torch's
    count when the first loop starts), from the batches' times on ``clock``."""

    def __init__(
        self,
        clock: Callable[[], float] = time.perf_counter,
        most: int | None = None,
        probe: Callable[[int], float] | None = None,
    ):
        """``probe(threads)``: the seconds of a small parallel operation on ``threads`` (``seconds_per_operation``)."""
        self.clock, self.most, self.probe = clock, most, probe or seconds_per_operation
        self.current = FIRST_COUNT
        self.set: int | None = None  # the count this chooser last set
        self.next_check = -math.inf
        self.program_chose = False

    def other(self) -> int:
        return self.most if self.current == 1 else 1

    def left_alone(self) -> bool:
        """Whether torch's count is the user's or the program's (see the module)."""
        if any(os.environ.get(name) for name in CHOSEN_BY_USER) or self.program_chose:
            return True
        if self.set is not None and torch.get_num_threads() != self.set:
            self.program_chose = True
            return True
        if self.most is None:
            self.most = torch.get_num_threads()
        return self.most <= 1

    def run(self, batches: Iterable[Batch], work: Callable[[Batch], float] = lambda batch: 1.0) -> Iterator[Batch]:
        """``batches``, each run (between two steps of the iteration) on the count chosen for it and timed;
        ``work(batch)`` is its size (a batch's time grows with it)."""
        loop = Loop()
        for index, batch in enumerate(batches):
            if self.left_alone():
                yield batch
                continue
            count = self.count_for(loop, work(batch))
            if count != torch.get_num_threads():
                torch.set_num_threads(count)
            self.set = count
            start = self.clock()
            yield batch
            if index >= WARMUP_BATCHES:
                self.measured(loop, count, self.clock() - start, work(batch))

    def count_for(self, loop: Loop, work: float) -> int:
        """The count for a loop's next batch, of ``work``: the other one while a check runs or when one is due."""
        if loop.trial is None and len(loop.current) >= BASELINE_BATCHES and self.clock() >= self.next_check:
            loop.waited += 1
            if work <= statistics.median(loop.works) or loop.waited > WAIT_BATCHES:
                loop.waited = 0
                if self.other() > self.current and self.probe(self.other()) > GATE * self.probe(self.current):
                    log.debug(
                        "%d threads: small parallel operations over %g times as slow as on %d",
                        self.other(),
                        GATE,
                        self.current,
                    )
                    self.next_check = self.clock() + RECHECK_SECONDS
                else:
                    loop.trial = Timings()
        loop.works.append(work)
        return self.current if loop.trial is None else self.other()

    def measured(self, loop: Loop, count: int, seconds: float, work: float) -> None:
        if count == self.current:
            loop.current.add(seconds, work)
            return
        loop.trial.add(seconds, work)
        if len(loop.trial) >= TRIAL_BATCHES or seconds / max(work, 1e-12) > ABANDON * loop.current.rate():
            self.decide(loop)

    def decide(self, loop: Loop) -> None:
        """End a check: keep the faster count; the next check after ``RECHECK_SECONDS`` or the time this one lost."""
        trial, current = loop.trial.rate(), loop.current.rate()
        lost = max(0.0, sum(loop.trial.seconds) - current * sum(loop.trial.work))
        log.debug(
            "%d thread(s) on %d batch(es): %.2f times the time per unit of work of %d, %.2f s lost",
            self.other(),
            len(loop.trial),
            trial / current,
            self.current,
            lost,
        )
        if trial < current:
            log.info(
                "%d CPU thread(s): batches %.2f times as fast as on %d", self.other(), current / trial, self.current
            )
            self.current, loop.current = self.other(), loop.trial
        loop.trial = None
        self.next_check = self.clock() + max(RECHECK_SECONDS, lost / MOST_LOST)


def seconds_per_operation(threads: int) -> float:
    """The seconds of a small parallel operation (an in-place multiply of ``SMALL_OPERATION`` numbers) on
    ``threads``, timed over about ``PROBE_SECONDS``; torch's count is left as it was."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    numbers, done, start = torch.ones(SMALL_OPERATION), 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < PROBE_SECONDS:
        numbers.mul_(1.0)
        done += 1
    torch.set_num_threads(before)
    return elapsed / done


PROCESS_CHOOSER = ThreadChooser()  # this process's (torch's thread count is the process's)


def on_chosen_threads(batches: Iterable[Batch], work: Callable[[Batch], float] = lambda batch: 1.0) -> Iterator[Batch]:
    """``batches``, each on the thread count the process's chooser picks for it (``ThreadChooser.run``)."""
    return PROCESS_CHOOSER.run(batches, work)
