"""The ward's scoring loop: take readings into the store, and score every bed that has new ones.

``take`` stores readings (committed before it returns) and wakes the loop; the loop (``run``, one thread) scores
what is pending in rounds: each round takes up to ``ROUND`` unscored readings, and for each of their beds asks
the model for the risk at every reading time from the earliest new one on (its readings as held when the round
took them: one that arrived since waits for the next round, so that no time is scored twice for it). A bed that
goes on from its step state (``garlic.live.steps``) is read from its last step on, the others whole. A reading that
arrived in time order costs its own time only; one that arrived late is placed at its time, and every later time of
its bed is scored again from there. A reading withdrawn (entered in error, or replaced) is pending too: its bed is
scored again from its time on without it, from its first reading (its step state, made with the reading, is
dropped), and at its last time held (a bed with none left: at the withdrawn time, with no risk), so that the bed's
newest score never keeps it. The alerts follow in time order from the bed's alert state before that time (the run's
alert policy, ``garlic.metrics.alert_policy``), and the risks, alerts and drivers are stored with the readings marked
as scored, in one transaction. A round's beds are scored as one batch, so that a busy ward costs a pass per round, not
per reading.

The loop remembers each bed's newest scored time and alert as it stored them (``newest``, for at most ``REMEMBERED``
beds): a bed whose new readings all come after that time continues from there without asking the store; a late
reading, a bed it does not remember (or a restart) asks the store.

Several scorers (``garlic monitor --scorers K``: this loop in the service and K - 1 processes running only it) share
a PostgreSQL store, each a ``shard`` of the beds: a round claims beds (``LiveStore.claim``: its shard's first, another
shard's once their readings waited ``TAKEOVER_SECONDS``), so that each bed is scored by one scorer at a time, in
order. A bed another scorer scored since this one last did (its newest score in the store is not the one this scorer
added) is taken as unknown: its step state is dropped and its alert read from the store. A scorer that the service
does not wake looks for work every ``POLL_SECONDS``.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict

import pandas as pd

from garlic.live.fhir import FhirError, Observed, Withdrawal
from garlic.live.scoring import BedScorer
from garlic.live.store import LiveStore, StaleRound
from garlic.metrics.alert_policy import AlertPolicy, AlertState

ROUND = 2000  # readings a round takes at most
MAX_PENDING = 50_000  # unscored readings beyond which new ones are refused (503) until the loop catches up
REMEMBERED = 100_000  # beds whose newest scored time and alert state the loop keeps (about 200 bytes each)
TAKEOVER_SECONDS = 2.0  # a reading of another scorer's shard waiting this long is taken by any scorer
POLL_SECONDS = 0.1  # how often a scorer of a shared store looks for readings when nothing wakes it
log = logging.getLogger("garlic.live")


class Monitor:
    def __init__(
        self,
        store: LiveStore,
        scorer: BedScorer,
        alerts: AlertPolicy,
        max_pending: int = MAX_PENDING,
        shard: tuple[int, int] | None = None,
        takeover: float = TAKEOVER_SECONDS,
    ):
        """``shard``: (this scorer's number, of how many) where several scorers share a PostgreSQL store."""
        self.store, self.scorer, self.alerts, self.max_pending = store, scorer, alerts, max_pending
        self.shard, self.takeover = shard, takeover
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.pending = store.counts()["pending"]  # what a previous service left unscored is scored first
        self.lock = threading.Lock()
        # bed -> (time, state, score id), as this scorer stored them (the score id: its newest score's, shared stores)
        self.newest: OrderedDict[str, tuple[float, AlertState, int | None]] = OrderedDict()

    def take(self, observed: list[Observed | Withdrawal], held: dict | None = None) -> tuple[int, int, int]:
        """Store ``observed`` (committed on return): (stored, repeats, withdrawn); ``held`` gets the row ids of
        those stored (``LiveStore.add``). Refused with 503 while the loop is ``max_pending`` readings behind."""
        if self.pending + len(observed) > self.max_pending:
            raise FhirError(503, f"{self.pending} readings are waiting to be scored; send again in a few seconds")
        stored, repeats, withdrawn = self.store.add(observed, held)
        with self.lock:
            self.pending += stored + withdrawn
        self.wake.set()
        return stored, repeats, withdrawn

    def score_round(self) -> int:
        """Score up to ``ROUND`` pending readings (of the beds this scorer claims, in a shared store); how many."""
        if self.shard is None:
            return self._score(self.store.pending(ROUND))
        with self.store.claim(ROUND, self.shard, self.takeover) as (pending, claim):
            if not pending.empty:
                self._known_here(list(pending["bed"].unique()))
            return self._score(pending, claim)

    def _known_here(self, beds: list[str]) -> None:
        """Forget what this scorer keeps of the ``beds`` that another scorer scored since it last did."""
        newest = self.store.newest_scores(beds)
        moved = {bed for bed in beds if newest.get(bed) != self.newest.get(bed, (None, None, None))[2]}
        self.scorer.forget(moved)
        for bed in moved:
            self.newest.pop(bed, None)

    def _score(self, pending, claim=None) -> int:
        if pending.empty:
            return 0
        earliest = pending.groupby("bed")["time"].min()
        withdrawn = pending[pending["withdrawn"].astype(bool)]
        self.scorer.forget(set(withdrawn["bed"]))
        after = self.scorer.reads_after(earliest.to_dict())
        readings = self.store.readings(list(earliest.index), after, self.scorer.static_features, pending["id"].tolist())
        times = readings[["bed", "time"]].drop_duplicates()
        asked = times[times["time"] >= times["bed"].map(earliest)]
        if not withdrawn.empty:  # each such bed's last time asked too, that its newest score be at a time it has
            last = times.groupby("bed")["time"].max()
            emptied = withdrawn[~withdrawn["bed"].isin(last.index)].groupby("bed")["time"].max()  # nothing held
            asked = pd.concat(
                [asked, last[last.index.isin(withdrawn["bed"])].reset_index(), emptied.reset_index()]
            ).drop_duplicates()
        asked = asked.sort_values(["bed", "time"], ignore_index=True)
        risk, drivers = self.scorer.score(readings, asked, set(after))
        state = self.alerts_before(earliest.to_dict())
        scores, states = [], []
        for row, (bed, time) in enumerate(zip(asked["bed"], asked["time"])):
            value = None if pd.isna(risk[row]) else float(risk[row])
            state[bed] = self.alerts.next(state[bed], float(time), value)
            states.append(state[bed])
            scores.append(
                {"bed": bed, "time": float(time), "risk": value, "alert": state[bed].on, "drivers": drivers[row]}
            )
        withdrawn_ids = pending.loc[pending["withdrawn"].astype(bool), "id"].tolist()
        try:
            ids = self.store.save_scores(scores, pending["id"].tolist(), withdrawn_ids, claim)
        except Exception:  # not stored: what this round kept in memory is not what the store holds
            self.scorer.forget(set(earliest.index))
            raise
        for score, after in zip(scores, states):  # a bed's rows in time order: its last one is its newest time
            self.newest[score["bed"]] = (score["time"], after, ids.get(score["bed"]))
            self.newest.move_to_end(score["bed"])
        while len(self.newest) > REMEMBERED:
            self.newest.popitem(last=False)
        with self.lock:
            self.pending -= len(pending)
        return len(pending)

    def alerts_before(self, times: dict[str, float]) -> dict[str, AlertState]:
        """Each bed's alert state at its latest scored time before ``times[bed]``: remembered where that is its
        newest scored time, else from the store."""
        known = {
            bed: self.newest[bed][1] for bed, time in times.items() if bed in self.newest and self.newest[bed][0] < time
        }
        asked = {bed: time for bed, time in times.items() if bed not in known}
        return known | (self.store.alert_states_before(asked, self.alerts.quiet_hours) if asked else {})

    def run(self) -> None:
        """Score until ``stop``: at once while readings are pending, else when ``take`` wakes it."""
        while not self.stopping.is_set():
            self.wake.clear()
            try:
                scored = self.score_round()
            except StaleRound:  # a reading withdrawn while it was scored: its bed is scored again at once
                continue
            except Exception:  # a round that fails is retried; the readings stay pending, nothing is lost
                log.exception("a scoring round failed; retrying in a second")
                self.stopping.wait(1.0)
                continue
            if self.shard is not None:  # other scorers score too: what waits is the store's count
                with self.lock:
                    self.pending = self.store.pending_count()
            if not scored:
                self.wake.wait(0.5 if self.shard is None else POLL_SECONDS)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="garlic-live-scoring", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()
