"""Each bed's step state (``garlic.models.steps``), so that a new reading costs one step of the model, not its bed's
whole stay again: the live ward's bookkeeping for a per-stay GARLIC of the compact architecture.

A bed's steps are its times with a time-varying reading (float32 hours, as ``garlic.io.tensors.tensorize`` groups
them); the cut at time t holds its readings up to t. Per bed, in memory only (the store stays the truth):

    state        after its last step, for the cut it was last scored at
    undo         the state before that step
    last_step    the last step's time (float32), with how many readings were in it and how many came before it

A scoring round, for each bed, from the earliest time asked on:

    a reading after the last step           one step more from ``state``
    more readings at the last step's time   that step again from ``undo``
    a reading before the last step (out of order), a time asked before it, or a bed without a state (new, evicted,
    the service restarted)                  the bed's steps again from the first, over its stored readings (a step
                                            at a time, the round's rebuilt beds in one batch), then on from there

The bed's readings before its last step are known unchanged when there are as many as when the state was made: the
store only ever adds readings, but for a withdrawn one, whose bed's state is dropped (``forget``). A bed that goes
on from its state is read from its last step on (``reads_after``), so that a round's cost does not grow with its
beds' stays; a reading before that step is one the round has pending (the store marks every new reading so), so such
a bed is read whole. The beds of a round take their steps together, one batch per step. The states are sized to the
ward, bounded by memory: at most ``STEP_MEMORY`` bytes (``garlic monitor --step-memory``) and ``MAX_BEDS`` beds keep
a state, the most recently scored ones; another bed's state is made again when it is next scored
(``WardSteps.capacity``, said at start-up).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch

from garlic.inference import tensors_for_model
from garlic.methods.saved import SavedMethod
from garlic.models import steps
from garlic.models.steps import StepState

# Beds whose step state is kept. A state is the lag window's features (W D F numbers) and a few D- and H-vectors, in
# float64, twice (with its undo), each a tensor of its own: for P12 (D = 36, F = 16, W = 3, H = 128) 2,551 numbers,
# 41 kB a bed: the memory bound keeps 26,000 such beds; the tiny synthetic run's (H = 16) 3 kB beds reach the
# bed bound (a health system's ward, 300 MB).
MAX_BEDS = 100_000
STEP_MEMORY = 1 << 30  # bytes of step states at most


@dataclass
class BedSteps:
    """What a bed keeps between rounds (its states ``garlic.models.steps.packed``: one tensor each)."""

    state: torch.Tensor
    undo: torch.Tensor
    last_step: float  # float32 hours of the last step
    in_last: int  # readings in the last step
    before_last: int  # readings before it


@dataclass
class _Op:
    """One step of one bed in a round: ``redo`` (the last step again, from undo) or a new step; the readings of the
    step are rows ``rows`` of the bed's series; ``reads`` the asked rows answered after it."""

    redo: bool
    rows: slice
    reads: list[int]


class WardSteps:
    """The step states of up to ``capacity`` beds for one saved compact GARLIC (per stay)."""

    def __init__(self, trained: SavedMethod, explains: bool, capacity: int | None = None, memory: int = STEP_MEMORY):
        """``capacity``: beds kept at most (default: as many as ``memory`` bytes hold, up to ``MAX_BEDS``)."""
        self.trained, self.model, self.explains = trained, trained.model, explains
        row = steps.packed(steps.start(self.model))[0]
        self.bed_bytes = 2 * row.numel() * row.element_size() + 200  # state and undo, and their bookkeeping
        self.capacity = capacity if capacity is not None else max(1, min(MAX_BEDS, memory // self.bed_bytes))
        self.beds: OrderedDict[str, BedSteps] = OrderedDict()

    def forget(self, beds: set[str]) -> None:
        for bed in beds:
            self.beds.pop(bed, None)

    def reads_after(self, earliest: dict[str, float]) -> dict[str, float]:
        """For each bed that goes on from its state (its earliest time asked at or after its last step), the time
        after which a round needs its readings: just before its last step, whose readings a redo takes again. The
        others need every reading."""
        after = {}
        for bed, time in earliest.items():
            known = self.beds.get(bed)
            if known is not None and np.float32(time) >= known.last_step:
                # float32 step times: a reading of the last step lies above the float32 just below it
                after[bed] = float(np.nextafter(np.float32(known.last_step), np.float32(-np.inf)))
        return after

    @torch.no_grad()
    def score(
        self, series: pd.DataFrame, static: pd.DataFrame, asked: pd.DataFrame, partial: set[str] = frozenset()
    ) -> tuple[pd.Series, dict]:
        """As ``BedScorer.score`` for the rows of ``asked``: the risk by row (rows without a step left out), and the
        importance [D] by row where the model explains. The beds in ``partial`` come with their readings from
        ``reads_after`` on only."""
        self.model.eval()
        if asked.empty:
            return pd.Series(dtype=float), {}
        series = series.sort_values(["bed", "time"], kind="stable")  # a bed's readings in time order, as stored
        hours = series["time"].to_numpy("float64")
        beds, first = np.unique(series["bed"].to_numpy(), return_index=True)
        bounds = dict(zip(beds, zip(first, [*first[1:], len(series)])))
        asked_beds, asked_times = asked["bed"].to_numpy(), asked["time"].to_numpy("float64")
        order = np.lexsort((asked_times, asked_beds))
        beds, first = np.unique(asked_beds[order], return_index=True)
        plans, offsets = {}, {}
        for bed, begin, end in zip(beds, first, [*first[1:], len(order)]):
            rows = order[begin:end]
            offsets[bed], stop = bounds.get(bed, (0, 0))
            plans[bed] = self._plan(
                bed, hours[offsets[bed] : stop], asked.index.to_numpy()[rows], asked_times[rows], bed in partial
            )
        values, mask, times = self._step_inputs(plans, offsets, series)
        static_rows = self._static(static, list(plans))
        # The round's beds as one batch (row i: the i-th bed of ``plans``), their state and undo stepped in place.
        beds = list(plans)
        known = [self.beds[bed] if plans[bed][0] else None for bed in beds]
        fresh = steps.packed(steps.start(self.model))[0]
        current = steps.unpacked(
            self.model, torch.stack([fresh if bed_steps is None else bed_steps.state for bed_steps in known])
        )
        undo = steps.unpacked(
            self.model, torch.stack([fresh if bed_steps is None else bed_steps.undo for bed_steps in known])
        )
        # Where each bed's state and undo are at the end: the kept objects while unchanged ("undo": the kept undo,
        # "state": the kept state, after one step from it), else copied out of the batch (``_keep_round``).
        state_kept = [bed_steps is not None for bed_steps in known]
        undo_from = ["batch" if bed_steps is None else "undo" for bed_steps in known]
        last = [BedSteps(fresh, fresh, 0.0, 0, 0) if bed_steps is None else replace(bed_steps) for bed_steps in known]
        has_step = list(state_kept)
        risk, importance = {}, {}
        for position in range(max((len(ops) for _, ops, _ in plans.values()), default=0)):
            movers = [(row, plans[bed][1][position]) for row, bed in enumerate(beds) if position < len(plans[bed][1])]
            stepping = [(row, op) for row, op in movers if op.rows.stop > op.rows.start]
            if stepping:
                index = torch.tensor([row for row, _ in stepping])
                base = steps.select(current, index)
                redo = torch.tensor([op.redo for _, op in stepping])
                if redo.any():
                    steps.place(base, redo.nonzero()[:, 0], steps.select(undo, index[redo]))
                keys = [(beds[row], op.rows.start, op.rows.stop) for row, op in stepping]
                after = steps.advance(self.model, base, values[keys], mask[keys], times[keys], explain=self.explains)
                if (~redo).any():  # a new step: the state before it is the undo
                    steps.place(undo, index[~redo], steps.select(base, (~redo).nonzero()[:, 0]))
                steps.place(current, index, after)
                for row, op in stepping:
                    if not op.redo:
                        undo_from[row] = "state" if state_kept[row] else "batch"
                    state_kept[row], has_step[row] = False, True
                    last[row].last_step = float(np.float32(hours[offsets[beds[row]] + op.rows.start]))
                    skipped = plans[beds[row]][2]
                    last[row].in_last, last[row].before_last = op.rows.stop - op.rows.start, skipped + op.rows.start
            readers = [(row, op) for row, op in movers if op.reads and has_step[row]]
            if readers:
                state = steps.select(current, torch.tensor([row for row, _ in readers]))
                stay_static = torch.stack([static_rows[beds[row]] for row, _ in readers])
                bed_risk = torch.sigmoid(steps.logits(self.model, state, stay_static)).cpu().numpy()
                bed_importance = steps.signal_importance(state).cpu().numpy() if self.explains else None
                for reader, (_, op) in enumerate(readers):
                    for asked_row in op.reads:
                        risk[asked_row] = float(bed_risk[reader])
                        if bed_importance is not None:
                            importance[asked_row] = bed_importance[reader]
        self._keep_round(beds, known, last, current, undo, has_step, state_kept, undo_from)
        rows = np.fromiter(risk, dtype=int, count=len(risk))
        return pd.Series(list(risk.values()), index=rows, dtype=float), importance

    def _plan(
        self, bed: str, hours: np.ndarray, rows: np.ndarray, times: np.ndarray, partial: bool
    ) -> tuple[bool, list[_Op], int]:
        """(whether the bed goes on from its state, its steps this round, how many of its first readings ``hours``
        leaves out) for the asked ``rows`` at ``times``, from the hours of its readings in time order (a step's
        readings: rows of them): all of them, or (``partial``) those from ``reads_after`` on."""
        step_of = hours.astype("float32")
        known = self.beds.get(bed)
        before = 0 if known is None else int((step_of < known.last_step).sum())
        goes_on = (
            known is not None
            and len(times)
            and np.float32(times[0]) >= known.last_step
            and (partial or before == known.before_last)
        )
        if partial and not goes_on:
            raise RuntimeError(f"bed {bed}: asked before its last step with only its later readings read")
        skipped = known.before_last - before if partial else 0
        if goes_on:
            last, in_last, taken = known.last_step, known.in_last, known.before_last - skipped + known.in_last
        else:
            last, in_last, taken = None, 0, 0
        ops: list[_Op] = [_Op(False, slice(0, 0), [])]  # answers asked before any new step
        for row, time in zip(rows, times):
            upto = int(np.searchsorted(hours, time, side="right"))  # readings in the cut at ``time``
            while True:
                if last is not None and _in_step(step_of, last, upto) != in_last:  # more readings at the last step
                    first = int(np.searchsorted(step_of, last, side="left"))
                    in_last = _in_step(step_of, last, upto)
                    ops.append(_Op(True, slice(first, first + in_last), []))
                    taken = first + in_last
                elif taken < upto:  # a step after it
                    last = step_of[taken]
                    in_last = _in_step(step_of, last, upto)
                    ops.append(_Op(False, slice(taken, taken + in_last), []))
                    taken += in_last
                else:
                    break
            ops[-1].reads.append(int(row))
        return goes_on, ops, skipped

    def _step_inputs(self, plans: dict, offsets: dict, series: pd.DataFrame) -> tuple:
        """Each step's values, mask and time as the model reads them, keyed by (bed, first reading, reading past the
        last): its readings made one stay each, normalised by ``tensors_for_model`` and the method's dataset as a cut
        is."""
        chosen, stay, keys = [], [], {}
        for bed, (_, ops, _) in plans.items():
            for op in ops:
                if op.rows.stop > op.rows.start:
                    chosen.append(np.arange(op.rows.start, op.rows.stop) + offsets[bed])
                    stay.append(np.full(op.rows.stop - op.rows.start, len(keys)))
                    keys[(bed, op.rows.start, op.rows.stop)] = len(keys)
        if not keys:
            return _Keyed({}), _Keyed({}), _Keyed({})
        observations = series.iloc[np.concatenate(chosen)].assign(stay_id=np.concatenate(stay))
        observations = observations[["stay_id", "time", "variable", "value"]].astype(
            {"time": "float32", "value": "float32"}
        )
        no_static = pd.DataFrame(
            {"stay_id": np.arange(len(keys)), **{name: np.nan for name in self.trained.static_features}}
        )  # read from ``static``
        dataset = self.trained.dataset(tensors_for_model(self.trained, observations, no_static))
        device = next(self.model.parameters()).device
        return (
            _Keyed(keys, dataset.values[:, 0].to(device)),
            _Keyed(keys, dataset.mask[:, 0].to(device)),
            _Keyed(keys, dataset.times[:, 0].to(device)),
        )

    def _static(self, static: pd.DataFrame, beds: list[str]) -> dict[str, torch.Tensor]:
        """Each bed's static features, normalised as the model's input."""
        raw = static.reindex(beds).to_numpy("float32")
        normalised = torch.from_numpy(self.trained.normalisation.standardise_static(raw))
        device = next(self.model.parameters()).device
        return {bed: row.to(device) for bed, row in zip(beds, normalised)}

    def _keep_round(
        self,
        beds: list[str],
        known: list,
        last: list[BedSteps],
        current: StepState,
        undo: StepState,
        has_step: list[bool],
        state_kept: list[bool],
        undo_from: list[str],
    ) -> None:
        """Keep each bed of the round that has a step: its state and undo copied out of the round's batch (a copy of
        its own, so that a bed kept holds no other bed's memory), or the objects it had where they did not change."""

        def copied(batch: StepState, chosen: list[int]) -> dict[int, torch.Tensor]:
            rows = steps.packed(steps.select(batch, torch.tensor(chosen, dtype=torch.long)))
            return {row: packed.clone() for row, packed in zip(chosen, rows)}

        states = copied(current, [row for row in range(len(beds)) if has_step[row] and not state_kept[row]])
        undos = copied(undo, [row for row in range(len(beds)) if has_step[row] and undo_from[row] == "batch"])
        for row, bed in enumerate(beds):
            if has_step[row]:
                last[row].state = known[row].state if state_kept[row] else states[row]
                last[row].undo = {
                    "batch": undos.get(row),
                    "undo": getattr(known[row], "undo", None),
                    "state": getattr(known[row], "state", None),
                }[undo_from[row]]
                self._keep(bed, last[row])

    def _keep(self, bed: str, bed_steps: BedSteps) -> None:
        self.beds[bed] = bed_steps
        self.beds.move_to_end(bed)
        while len(self.beds) > self.capacity:
            self.beds.popitem(last=False)


def _in_step(step_of: np.ndarray, last: float, upto: int) -> int:
    """Readings of the step at ``last`` among the first ``upto``."""
    return int((step_of[:upto] == np.float32(last)).sum())


class _Keyed:
    """Rows of a tensor by key, and a batch of them by a list of keys."""

    def __init__(self, position: dict, tensor: torch.Tensor | None = None):
        self.position, self.tensor = position, tensor

    def __getitem__(self, keys: list) -> torch.Tensor:
        return self.tensor[[self.position[key] for key in keys]]
