"""Where the live ward keeps everything: the beds, every reading and every risk computed, in one database.

SQLite in WAL mode by default (a file beside the service, each commit on disk before it returns:
``synchronous=FULL``); any SQLAlchemy URL names a shared server instead. Tables:

    meta      the run whose model scores this store (a store scored by one run is never scored by another)
    beds      bed (the FHIR Encounter id), admitted and discharged (UTC seconds), patient (the Patient id its
              Encounter, or its first Observation, named: a bed holds one patient's readings)
    readings  id, bed, variable, time (hours since the bed's admission), value, received (UTC seconds), scored,
              source (the Observation's id, where it had one), withdrawn; one row per (bed, variable, time, value):
              a repeated reading counts once. A withdrawn reading (entered in error, or replaced by a reading sent
              with its source) is kept, marked, and no longer read
    scores    id, bed, time, risk, alert, drivers (JSON list of variable names), scored_at (UTC seconds); rows are
              only added: a reading that arrives out of time order adds new rows for its time and every later one,
              and a bed's history is the newest row at each time (``history``), the older ones kept for audit

A reading is committed before the service acknowledges it; ``scored`` turns true in the same transaction that adds
its risk, so a service restarted after a crash scores exactly what it had not (``pending``). A reading withdrawn is
marked unscored again, so that its bed is scored again from its time on without it.

Several scorers share a PostgreSQL store by claiming beds, not rows (``claim``): a round's transaction takes a
transaction-scoped advisory lock per bed (``pg_try_advisory_xact_lock``, skipping beds another scorer holds), reads
the claimed beds' pending readings after the lock is held, and commits their scores with the readings marked, which
releases the locks. So each bed's readings are scored by one scorer at a time, in order, and none twice: a reading
is marked scored only while it is still unscored and as withdrawn or not as it was claimed, and a round that finds
otherwise is rolled back. SQLite has a single writer: one scorer.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone

import numpy as np
import pandas as pd
import sqlalchemy as sa

from garlic.live.fhir import MAX_AHEAD_SECONDS, FhirError, Observed, Stay, Withdrawal
from garlic.metrics.alert_policy import AlertState

SCHEMA_VERSION = "3"  # 2: readings' source and withdrawn; 3: beds' patient (older layouts are brought up when opened)
# A reading dated further from its bed's admission has a wrong date (a year or a time zone typed wrong); the model's
# float32 hours also lose their minutes past it (a year is 8,784 hours: float32 steps of 0.001 hours there).
LONGEST_STAY_HOURS = 366 * 24
metadata = sa.MetaData()
META = sa.Table(
    "meta",
    metadata,
    sa.Column("key", sa.String(32), primary_key=True),
    sa.Column("value", sa.String(200), nullable=False),
)
BEDS = sa.Table(
    "beds",
    metadata,
    sa.Column("bed", sa.String(64), primary_key=True),
    sa.Column("admitted", sa.Float, nullable=False),
    sa.Column("discharged", sa.Float),
    sa.Column("patient", sa.String(64)),
)
READINGS = sa.Table(
    "readings",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("bed", sa.String(64), nullable=False),
    sa.Column("variable", sa.String(64), nullable=False),
    sa.Column("time", sa.Float, nullable=False),
    sa.Column("value", sa.Float, nullable=False),
    sa.Column("received", sa.Float, nullable=False),
    sa.Column("scored", sa.Boolean, nullable=False, default=False, index=True),
    sa.Column("source", sa.String(64)),
    sa.Column("withdrawn", sa.Boolean, nullable=False, default=False, server_default=sa.false()),
    sa.UniqueConstraint("bed", "variable", "time", "value", name="one_reading"),
    sa.Index("readings_of_bed", "bed", "time"),
)
# Partial indexes (the sourced readings, the withdrawn ones): the feeds' readings have no source and are not
# withdrawn, so that adding them touches neither.
SOURCED = READINGS.c.source.is_not(None)
WITHDRAWN = READINGS.c.withdrawn == sa.true()
HELD = READINGS.c.withdrawn.is_(False)
LAYOUT_2_INDEXES = [
    sa.Index("readings_of_source", READINGS.c.bed, READINGS.c.source, sqlite_where=SOURCED, postgresql_where=SOURCED),
    sa.Index("readings_withdrawn", READINGS.c.bed, sqlite_where=WITHDRAWN, postgresql_where=WITHDRAWN),
]
# Layout 3: an Observation id belongs to one bed, found from the id alone.
LAYOUT_3_INDEXES = [sa.Index("readings_by_source", READINGS.c.source, sqlite_where=SOURCED, postgresql_where=SOURCED)]
SCORES = sa.Table(
    "scores",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("bed", sa.String(64), nullable=False),
    sa.Column("time", sa.Float, nullable=False),
    sa.Column("risk", sa.Float),
    sa.Column("alert", sa.Boolean, nullable=False),
    sa.Column("drivers", sa.String(400), nullable=False),
    sa.Column("scored_at", sa.Float, nullable=False),
    sa.Index("scores_of_bed", "bed", "time"),
)


class StoreError(ValueError):
    """A store that cannot serve this run (made for another run's model, or a newer layout)."""


class StaleRound(RuntimeError):
    """A scoring round whose readings changed while it scored them (withdrawn meanwhile): rolled back, scored again."""


@contextmanager
def _nothing(db: sa.Connection) -> Iterator[sa.Connection]:
    """An open transaction, as ``engine.begin`` would give one, left for its owner to end."""
    yield db


def _sqlite_settings(connection, _record) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")  # readers (the ward) never block the writer
    cursor.execute("PRAGMA synchronous=FULL")  # a commit is on disk before the reading is acknowledged
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def _insert_ignoring_repeats(engine: sa.Engine, table: sa.Table):
    """An INSERT that skips rows breaking a uniqueness constraint, in the dialects that have one, returning the rows
    it stored (their id and received time, by their key): how many it stored, and which id each reading got, in one
    statement."""
    if engine.dialect.name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    elif engine.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        return None
    return insert(table).on_conflict_do_nothing().returning(table.c.id, table.c.received, *_KEY(table))


def _KEY(table: sa.Table) -> tuple:  # noqa: N802  (the uniqueness index's columns)
    return table.c.bed, table.c.variable, table.c.time, table.c.value


def _inserted(db: sa.Connection, insert, rows: list[dict], held: dict | None = None) -> int:
    """How many of ``rows`` the insert that skips repeats stored; ``held`` gets each stored reading's (id, received)
    by its key (bed, variable, time, value)."""
    stored = db.execute(insert, rows).all()
    if held is not None:
        held.update({tuple(row[2:]): (row[0], row[1]) for row in stored})
    return len(stored)


def _add_layout_2(db: sa.Connection) -> None:
    """Layout 1 -> 2, in the transaction that opens the store: the readings' source and withdrawn columns."""
    false = sa.false().compile(dialect=db.dialect)
    db.execute(sa.text(f"ALTER TABLE readings ADD COLUMN source {sa.String(64).compile(dialect=db.dialect)}"))
    db.execute(
        sa.text(
            f"ALTER TABLE readings ADD COLUMN withdrawn {sa.Boolean().compile(dialect=db.dialect)} "
            f"NOT NULL DEFAULT {false}"
        )
    )
    for index in LAYOUT_2_INDEXES:
        db.execute(sa.schema.CreateIndex(index))
    db.execute(META.update().where(META.c.key == "schema").values(value="2"))


def _add_layout_3(db: sa.Connection) -> None:
    """Layout 2 -> 3, in the transaction that opens the store: the beds' patient, and the index of sources alone."""
    db.execute(sa.text(f"ALTER TABLE beds ADD COLUMN patient {sa.String(64).compile(dialect=db.dialect)}"))
    for index in LAYOUT_3_INDEXES:
        db.execute(sa.schema.CreateIndex(index))
    db.execute(META.update().where(META.c.key == "schema").values(value=SCHEMA_VERSION))


def _seconds(at: datetime) -> float:
    return at.timestamp()


def _table(rows: list[sa.Row], columns: list[str]) -> pd.DataFrame:
    """Rows of a query as a table. As plain tuples: pandas inspects every ``Row`` it is given for fields, which took
    most of the time of reading a ward's readings."""
    return pd.DataFrame([tuple(row) for row in rows], columns=columns)


def _add_group(db: sa.Connection, rows: list[dict], insert, held_ids: dict | None = None) -> tuple[int, int, int]:
    """Store the readings of one Observation (or one reading without an id, or a withdrawal) in the open
    transaction: how many readings it (stored, repeated, withdrew). ``insert``: the store's insert that skips a
    repeat (another process may add the same reading meanwhile), where its database has one."""
    first, held = rows[0], []
    if first["source"]:
        held = db.execute(
            sa.select(
                READINGS.c.id, READINGS.c.variable, READINGS.c.time, READINGS.c.value, READINGS.c.withdrawn
            ).where(READINGS.c.bed == first["bed"], READINGS.c.source == first["source"], SOURCED)
        ).all()
    if first["withdrawn"]:
        if not held:
            raise FhirError(
                404, f"bed {first['bed']} holds no reading sent with the id {first['source']}", "unknown id"
            )
        live = [r.id for r in held if not r.withdrawn]
        _withdraw(db, live)
        return 0, 0 if live else 1, len(live)  # nothing left to withdraw: a withdrawal sent again
    sent = {(row["variable"], row["time"], row["value"]) for row in rows}
    replaced = [r.id for r in held if not r.withdrawn and (r.variable, r.time, r.value) not in sent]
    _withdraw(db, replaced)
    counts = np.zeros(3, dtype=int)
    for row in map(_columns, rows):
        if insert is not None:
            stored = _inserted(db, insert, [row], held_ids)
        else:
            stored = int(not db.execute(sa.select(sa.func.count()).where(_same(row))).scalar_one())
            if stored:
                db.execute(READINGS.insert(), row)
        taken_back = 0 if stored else _repeated(db, [row])
        counts += (stored + taken_back, 1 - stored - taken_back, 0)
    return int(counts[0]), int(counts[1]), len(replaced)


def _by_source(rows: list[dict]) -> list[list[dict]]:
    """``rows`` in groups of one Observation each: its first reading and the further ones of its components."""
    groups: list[list[dict]] = []
    for row in rows:
        if row.get("part"):
            groups[-1].append(row)
        else:
            groups.append([row])
    return groups


def _columns(row: dict) -> dict:
    """A reading's row as the table has it (without which of its Observation's readings it was)."""
    return {key: value for key, value in row.items() if key != "part"}


def _repeats_a_source(rows: list[dict]) -> bool:
    """Whether any (bed, source) comes twice among ``rows`` (an Observation of several readings, or sent twice)."""
    sources = [(row["bed"], row["source"]) for row in rows if row["source"]]
    return len(set(sources)) < len(sources)


def _sources_of_one_bed(db: sa.Connection, sources: list[tuple[str, str]]) -> None:
    """Refuse an Observation id held by another bed: an id names one reading of one bed (and so of one patient)."""
    by_source: dict[str, str] = {}
    for bed, source in sources:
        if by_source.setdefault(source, bed) != bed:
            raise FhirError(
                409,
                f"one Observation id is sent for two beds ({by_source[source]} and {bed}); an id belongs to one bed",
                "id of another bed",
            )
    if not sources:
        return
    elsewhere = sa.or_(
        *(sa.and_(READINGS.c.source == source, READINGS.c.bed != bed) for source, bed in by_source.items())
    )
    other = db.execute(sa.select(READINGS.c.bed, READINGS.c.source).where(SOURCED, elsewhere).limit(1)).first()
    if other is not None:
        raise FhirError(
            409,
            f"an Observation id sent for bed {by_source[other.source]} is held by bed {other.bed}; "
            "an id belongs to one bed (send a new id)",
            "id of another bed",
        )


def _same(row: dict):
    """The reading held as ``row`` (its bed, variable, time and value: the uniqueness index's columns)."""
    return sa.and_(*(READINGS.c[key] == row[key] for key in ("bed", "variable", "time", "value")))


def _repeated(db: sa.Connection, rows: list[dict]) -> int:
    """For readings of ``rows`` held already: a withdrawn one sent again is taken back (with the id it comes with,
    if any), a held one without an id takes the one it comes with. How many were taken back."""
    taken_back = 0
    for row in rows:
        source = sa.func.coalesce(sa.literal(row["source"], sa.String), READINGS.c.source)
        taken_back += db.execute(
            READINGS.update()
            .where(_same(row), WITHDRAWN)
            .values(withdrawn=False, scored=False, source=source, received=row["received"])
        ).rowcount
        if row["source"]:
            db.execute(READINGS.update().where(_same(row), READINGS.c.source.is_(None)).values(source=row["source"]))
    return taken_back


def _held_under(db: sa.Connection, sources: list[tuple[str, str]]) -> bool:
    """Whether any reading is held under one of these (bed, source) pairs."""
    pairs = sa.tuple_(READINGS.c.bed, READINGS.c.source).in_(sources)
    return bool(sources) and db.execute(sa.select(READINGS.c.id).where(SOURCED, pairs).limit(1)).first() is not None


def _withdraw(db: sa.Connection, ids: list[int]) -> None:
    """Withdraw readings, unscored again so that their bed is scored again from their time on."""
    if ids:
        db.execute(READINGS.update().where(READINGS.c.id.in_(ids)).values(withdrawn=True, scored=False))


class LiveStore:
    """The ward's database, for the model of ``run_id``; with ``create`` False (a reader: the dashboard's ward
    view), an existing one only."""

    def __init__(self, url: str, run_id: str, create: bool = True):
        try:
            self.engine = sa.create_engine(url)
        except (ImportError, sa.exc.NoSuchModuleError) as exc:  # before ArgumentError: it is one
            raise StoreError(f"the live store's database needs a driver that is not installed: {exc}") from None
        except sa.exc.ArgumentError:  # not quoted: a URL that does not parse may still hold a password
            raise StoreError("the live store is not a database URL (sqlite:///PATH, postgresql://...)") from None
        if self.engine.dialect.name == "sqlite":
            sa.event.listen(self.engine, "connect", _sqlite_settings)
        shown = self.engine.url.render_as_string(hide_password=True)
        try:
            self._open(run_id, create, shown)
        except sa.exc.DBAPIError as exc:  # not a database, not reachable, not writable
            self.engine.dispose()
            raise StoreError(f"the live store {shown} cannot be used: {exc.orig}") from None

    def _open(self, run_id: str, create: bool, shown: str) -> None:
        if create:
            metadata.create_all(self.engine)
        elif not sa.inspect(self.engine).has_table(META.name):
            self.engine.dispose()
            raise StoreError(f"no live ward in {shown}: start garlic monitor --run {run_id} on it first")
        self.insert_reading = _insert_ignoring_repeats(self.engine, READINGS)
        with self.engine.begin() as db:
            kept = dict(db.execute(sa.select(META.c.key, META.c.value)).all())
            if not kept and create:
                db.execute(
                    META.insert(), [{"key": "run_id", "value": run_id}, {"key": "schema", "value": SCHEMA_VERSION}]
                )
            elif kept.get("run_id") != run_id:
                raise StoreError(
                    f"the live store {shown} holds the scores of run {kept.get('run_id')}, not "
                    f"{run_id}: give another --store"
                )
            elif kept.get("schema") in ("1", "2"):
                if kept["schema"] == "1":
                    _add_layout_2(db)
                _add_layout_3(db)
            elif kept.get("schema") != SCHEMA_VERSION:
                raise StoreError(f"the live store has layout {kept.get('schema')}; this version reads {SCHEMA_VERSION}")

    def close(self) -> None:
        self.engine.dispose()

    # Writes -------------------------------------------------------------------------------------------------------

    def admit(self, stay: Stay) -> bool:
        """Admit or discharge a bed; True when it changed anything. Refused: discharging an unknown bed, admitting an
        admitted bed from another time (its readings' times count from its admission), and an Encounter whose
        subject is not the bed's patient (a bed holds one patient's readings)."""
        with self.engine.begin() as db:
            row = db.execute(sa.select(BEDS).where(BEDS.c.bed == stay.bed)).first()
            if row is not None and stay.subject and row.patient and row.patient != stay.subject:
                raise FhirError(
                    409,
                    f"Encounter.subject is not the patient of bed {stay.bed}: a bed holds one "
                    "patient; a new stay needs a new Encounter id",
                    "subject",
                )
            if stay.admitted:
                start = _seconds(stay.start)
                if row is None:
                    db.execute(
                        BEDS.insert().values(bed=stay.bed, admitted=start, discharged=None, patient=stay.subject)
                    )
                    return True
                if row.admitted != start:
                    raise FhirError(
                        409, f"bed {stay.bed} was admitted at another time; a new stay needs a new Encounter id"
                    )
                changed = row.discharged is not None or (stay.subject is not None and row.patient is None)
                if changed:
                    db.execute(
                        BEDS.update()
                        .where(BEDS.c.bed == stay.bed)
                        .values(discharged=None, patient=row.patient or stay.subject)
                    )
                return changed
            if row is None:
                raise FhirError(404, f"bed {stay.bed} was never admitted")
            if row.discharged is not None:
                return False
            end = _seconds(stay.end) if stay.end else time.time()
            db.execute(BEDS.update().where(BEDS.c.bed == stay.bed).values(discharged=end))
            return True

    def add(self, observed: list[Observed | Withdrawal], held: dict | None = None) -> tuple[int, int, int]:
        """Store the readings, all or none, committed before this returns: (stored, repeats already held, readings
        withdrawn). The readings sent with one source (an Observation's id: its value and components) replace
        (withdraw) those held under that source that differ; a withdrawal withdraws them all. Refused: a bed never
        admitted (404) or discharged (409), a time before the bed's admission or more than a year after it (422),
        a withdrawal of a source the bed never sent (404), a subject that is not the bed's patient and a source
        held by another bed (409). ``held``, where given, gets the (row id, received) of each reading this stored,
        by its key (bed, variable, time in hours, value); ``ids_of`` finds the others'."""
        if not observed:
            return 0, 0, 0
        by_key: dict = {}
        keys: list[tuple[Observed, tuple]] = []
        counts = self._add(observed, by_key, keys)
        if held is not None:
            held.update({reading: by_key[key] for reading, key in keys if key in by_key})
        return counts

    def _add(self, observed: list[Observed | Withdrawal], held: dict, keys: list) -> tuple[int, int, int]:
        """``add``'s work: ``held`` gets the (id, received) of each reading stored by its key, ``keys`` each
        reading's key."""
        received = time.time()
        with self.engine.begin() as db:
            wanted = sorted({reading.bed for reading in observed})
            beds = {row.bed: row for row in db.execute(sa.select(BEDS).where(BEDS.c.bed.in_(wanted)))}
            rows = []
            for reading in observed:
                bed = beds.get(reading.bed)
                if bed is None:
                    raise FhirError(404, f"bed {reading.bed} is not admitted: send its Encounter first", "unknown bed")
                if bed.discharged is not None:
                    raise FhirError(409, f"bed {reading.bed} was discharged; its readings are closed", "discharged")
                if isinstance(reading, Withdrawal):
                    rows.append({"bed": reading.bed, "source": reading.source, "withdrawn": True})
                    continue
                hours = (_seconds(reading.at) - bed.admitted) / 3600
                if hours < 0:
                    raise FhirError(
                        422, f"a reading of bed {reading.bed} is dated before the bed's admission", "before admission"
                    )
                if hours > LONGEST_STAY_HOURS:
                    raise FhirError(
                        422,
                        f"a reading of bed {reading.bed} is dated {hours / 24:.0f} days after "
                        "the bed's admission; a stay is taken up to a year: is its date right?",
                        "after a year",
                    )
                keys.append((reading, (reading.bed, reading.variable, hours, reading.value)))
                rows.append(
                    {
                        "bed": reading.bed,
                        "variable": reading.variable,
                        "time": hours,
                        "value": reading.value,
                        "received": received,
                        "scored": False,
                        "source": reading.source,
                        "withdrawn": False,
                        "part": reading.part,
                    }
                )
            self._one_patient_a_bed(db, beds, [r for r in observed if isinstance(r, Observed) and r.subject])
            sources = sorted({(row["bed"], row["source"]) for row in rows if row["source"]})
            _sources_of_one_bed(db, sources)
            # New readings (new ids, or none), as feeds send them: one statement; else one Observation at a time
            if (
                self.insert_reading is not None
                and not any(row["withdrawn"] for row in rows)
                and not _repeats_a_source(rows)
                and not _held_under(db, sources)
            ):
                stored = _inserted(db, self.insert_reading, [_columns(row) for row in rows], held)
                if stored < len(rows):  # some were held already
                    stored += _repeated(db, rows)
                return stored, len(rows) - stored, 0
            counts = np.zeros(3, dtype=int)
            for group in _by_source(rows):
                counts += _add_group(db, group, self.insert_reading, held)
        return int(counts[0]), int(counts[1]), int(counts[2])

    @staticmethod
    def _one_patient_a_bed(db: sa.Connection, beds: dict, readings: list[Observed]) -> None:
        """Refuse readings whose subject is not their bed's patient; a bed without one takes the first named."""
        patients = {bed: row.patient for bed, row in beds.items()}
        for reading in readings:
            if patients[reading.bed] is None:  # only where still none: another request may have named one meanwhile
                db.execute(
                    BEDS.update()
                    .where(BEDS.c.bed == reading.bed, BEDS.c.patient.is_(None))
                    .values(patient=reading.subject)
                )
                patients[reading.bed] = db.execute(
                    sa.select(BEDS.c.patient).where(BEDS.c.bed == reading.bed)
                ).scalar_one()
            if patients[reading.bed] != reading.subject:
                raise FhirError(
                    409,
                    f"Observation.subject is not the patient of bed {reading.bed} (its Encounter's "
                    "or its first Observation's subject): a bed holds one patient's readings",
                    "subject",
                )

    def ids_of(self, observed: list[Observed]) -> list[tuple[int, float] | None]:
        """The row id and received time of each reading as held now (None where it is not, a withdrawn one)."""
        if not observed:
            return []
        with self.engine.connect() as db:
            admitted = dict(
                db.execute(
                    sa.select(BEDS.c.bed, BEDS.c.admitted).where(BEDS.c.bed.in_({r.bed for r in observed}))
                ).all()
            )
            keys = [(r.bed, r.variable, (_seconds(r.at) - admitted[r.bed]) / 3600, r.value) for r in observed]
            columns = _KEY(READINGS)
            found = {
                tuple(row[2:]): (row.id, row.received)
                for row in db.execute(
                    sa.select(READINGS.c.id, READINGS.c.received, *columns).where(sa.tuple_(*columns).in_(keys), HELD)
                )
            }
        return [found.get(key) for key in keys]

    def observation(self, logical_id: str) -> pd.DataFrame:
        """The readings held under an Observation's id: a source, or ``r`` and a reading's row id (one sent
        without an id): id, bed, variable, time, value, received, source, withdrawn, admitted, patient."""
        by = (
            READINGS.c.id == int(logical_id[1:])
            if re.fullmatch(r"r[0-9]{1,18}", logical_id)
            else sa.and_(SOURCED, READINGS.c.source == logical_id)
        )
        return self._observations(by)

    def observations(self, bed: str, since: float | None = None, limit: int = 1000) -> pd.DataFrame:
        """A bed's readings held, received at or after ``since`` (UTC seconds), oldest first, at most ``limit``."""
        by = sa.and_(READINGS.c.bed == bed, HELD, *([READINGS.c.received >= since] if since is not None else []))
        return self._observations(by, limit)

    def _observations(self, where, limit: int = 1000) -> pd.DataFrame:
        columns = ["id", "bed", "variable", "time", "value", "received", "source", "withdrawn", "admitted", "patient"]
        query = (
            sa.select(
                READINGS.c.id,
                READINGS.c.bed,
                READINGS.c.variable,
                READINGS.c.time,
                READINGS.c.value,
                READINGS.c.received,
                READINGS.c.source,
                READINGS.c.withdrawn,
                BEDS.c.admitted,
                BEDS.c.patient,
            )
            .join(BEDS, BEDS.c.bed == READINGS.c.bed)
            .where(where)
            .order_by(READINGS.c.id)
            .limit(limit)
        )
        with self.engine.connect() as db:
            return _table(db.execute(query).all(), columns)

    def save_scores(
        self,
        scores: list[dict],
        scored_ids: list[int],
        withdrawn_ids: list[int] = (),
        claim: sa.Connection | None = None,
    ) -> dict[str, int]:
        """Add scores (bed, time, risk, alert, drivers) and mark the readings they answer as scored, at once: in the
        transaction of a ``claim`` where given (committed with it). ``withdrawn_ids``: those of ``scored_ids`` that
        were withdrawn when read. A reading is marked only while unscored and as withdrawn or not as it was read; one
        that changed meanwhile (withdrawn, or scored by another) rolls the whole round back (``StaleRound``). Each
        bed's newest score id as added."""
        now = time.time()
        rows = [{**score, "drivers": json.dumps(score["drivers"]), "scored_at": now} for score in scores]
        withdrawn = set(withdrawn_ids)
        with self.engine.begin() if claim is None else _nothing(claim) as db:
            newest: dict[str, int] = {}
            if rows:
                if self.engine.dialect.name == "postgresql":
                    ids = (
                        db.execute(SCORES.insert().returning(SCORES.c.id, sort_by_parameter_order=True), rows)
                        .scalars()
                        .all()
                    )
                    newest = {row["bed"]: score_id for row, score_id in zip(rows, ids)}
                else:
                    db.execute(SCORES.insert(), rows)
            marked = 0
            for ids, was in (([i for i in scored_ids if i not in withdrawn], False), (sorted(withdrawn), True)):
                for part in range(0, len(ids), 10_000):
                    marked += db.execute(
                        READINGS.update()
                        .where(
                            READINGS.c.id.in_(ids[part : part + 10_000]),
                            READINGS.c.scored.is_(False),
                            READINGS.c.withdrawn == was,
                        )
                        .values(scored=True)
                    ).rowcount
            if marked != len(scored_ids):
                raise StaleRound(f"{len(scored_ids) - marked} of a round's readings changed while it scored them")
        return newest

    @contextmanager
    def claim(
        self, limit: int, shard: tuple[int, int] = (0, 1), takeover: float = 0.0
    ) -> Iterator[tuple[pd.DataFrame, sa.Connection]]:
        """A round of a shared PostgreSQL store: up to ``limit`` pending readings (as ``pending``) of the beds this
        scorer could lock, and the open transaction that holds the locks (give it to ``save_scores``; it commits on
        leaving, or rolls back on an error). Beds of this scorer's ``shard`` (number, of how many: by the hash of the
        bed) come first; another shard's are taken once their oldest pending reading waited ``takeover`` seconds (its
        scorer is gone or behind), so that a bed mostly stays with one scorer and its step state."""
        number, shards = shard
        candidates = sa.text(
            "WITH waiting AS MATERIALIZED ("
            " SELECT bed, min(id) AS first FROM readings WHERE NOT scored GROUP BY bed"
            " HAVING mod(abs(hashtext(bed)::bigint), :shards) = :number OR min(received) <= :before"
            " ORDER BY (mod(abs(hashtext(bed)::bigint), :shards) = :number) DESC, min(id) LIMIT :limit)"
            " SELECT bed FROM waiting WHERE pg_try_advisory_xact_lock(hashtext(bed))"
        )
        with self.engine.begin() as db:
            beds = (
                db.execute(
                    candidates, {"shards": shards, "number": number, "limit": limit, "before": time.time() - takeover}
                )
                .scalars()
                .all()
            )
            pending = pd.DataFrame(columns=["id", "bed", "time", "withdrawn"])
            if beds:  # read once the locks are held: what another scorer committed before is seen as scored
                query = (
                    sa.select(READINGS.c.id, READINGS.c.bed, READINGS.c.time, READINGS.c.withdrawn)
                    .where(READINGS.c.scored.is_(False), READINGS.c.bed.in_(beds))
                    .order_by(READINGS.c.id)
                    .limit(limit)
                )
                pending = _table(db.execute(query).all(), ["id", "bed", "time", "withdrawn"])
            yield pending, db

    def newest_scores(self, beds: list[str]) -> dict[str, int]:
        """Each bed's newest score id (beds without one left out): which scorer scored it last is known by it."""
        if not beds:
            return {}
        query = sa.select(SCORES.c.bed, sa.func.max(SCORES.c.id)).where(SCORES.c.bed.in_(beds)).group_by(SCORES.c.bed)
        with self.engine.connect() as db:
            return dict(db.execute(query).all())

    def pending_count(self) -> int:
        """Readings not scored yet (withdrawn ones among them)."""
        with self.engine.connect() as db:
            return db.execute(sa.select(sa.func.count()).where(READINGS.c.scored.is_(False))).scalar_one()

    # Reads --------------------------------------------------------------------------------------------------------

    def admitted(self, bed: str) -> datetime | None:
        """When ``bed`` was admitted (UTC), None when it never was."""
        with self.engine.connect() as db:
            seconds = db.execute(sa.select(BEDS.c.admitted).where(BEDS.c.bed == bed)).scalar_one_or_none()
        return None if seconds is None else datetime.fromtimestamp(seconds, timezone.utc)

    def pending(self, limit: int) -> pd.DataFrame:
        """Up to ``limit`` readings not scored yet (withdrawn ones among them, whose bed is to be scored again
        without them), oldest first: id, bed, time, withdrawn."""
        query = (
            sa.select(READINGS.c.id, READINGS.c.bed, READINGS.c.time, READINGS.c.withdrawn)
            .where(READINGS.c.scored.is_(False))
            .order_by(READINGS.c.id)
            .limit(limit)
        )
        with self.engine.connect() as db:
            return _table(db.execute(query).all(), ["id", "bed", "time", "withdrawn"])

    def readings(
        self,
        beds: list[str],
        after: dict[str, float] | None = None,
        always: list[str] = (),
        round_ids: list[int] | None = None,
    ) -> pd.DataFrame:
        """Every reading of ``beds`` not withdrawn: bed, variable, time, value, in time order. A bed in ``after`` only
        from just after that time on, with every reading of the variables ``always`` (the static descriptors,
        whatever their time). With ``round_ids`` (a round's pending readings), of the unscored readings only those:
        one that arrived since the round took its readings waits for the next round, which scores its time."""
        asked = set(beds)
        after = {bed: time for bed, time in (after or {}).items() if bed in asked}
        held = (
            HELD
            if round_ids is None
            else sa.and_(HELD, sa.or_(READINGS.c.scored.is_(True), READINGS.c.id.in_(round_ids)))
        )
        columns = (READINGS.c.bed, READINGS.c.variable, READINGS.c.time, READINGS.c.value, READINGS.c.id)
        parts = [sa.select(*columns).where(held, READINGS.c.bed.in_([bed for bed in beds if bed not in after]))]
        if after:  # joined to each bed's time, so that the index on (bed, time) finds its later readings
            since = (
                sa.values(sa.column("bed", sa.String), sa.column("after", sa.Float), name="since")
                .data(list(after.items()))
                .cte("since")
            )
            of_bed = since.c.bed == READINGS.c.bed
            parts += [
                sa.select(*columns).join(since, of_bed & (READINGS.c.time > since.c.after)).where(held),
                sa.select(*columns)
                .join(since, of_bed & (READINGS.c.time <= since.c.after) & READINGS.c.variable.in_(list(always)))
                .where(held),
            ]
        union = sa.union_all(*parts).subquery()
        query = sa.select(union.c.bed, union.c.variable, union.c.time, union.c.value).order_by(
            union.c.bed, union.c.time, union.c.id
        )
        with self.engine.connect() as db:
            return _table(db.execute(query).all(), ["bed", "variable", "time", "value"])

    def alert_states_before(self, times: dict[str, float], quiet_hours: float) -> dict[str, AlertState]:
        """Each bed's alert state at its latest scored time before ``times[bed]``: on or off, and the last time it
        was on, looked for only as far back as ``quiet_hours`` (earlier, it no longer keeps a new alert quiet). All
        beds in two statements (the scores within the quiet hours; for beds with none, the latest before), whatever
        their number."""
        if not times:
            return {}
        since = (
            sa.values(sa.column("bed", sa.String), sa.column("before", sa.Float), name="asked")
            .data(list(times.items()))
            .cte("asked")
        )
        columns = (SCORES.c.bed, SCORES.c.time, SCORES.c.alert, SCORES.c.id)
        within = sa.select(*columns).join(
            since,
            (since.c.bed == SCORES.c.bed)
            & (SCORES.c.time < since.c.before)
            & (SCORES.c.time >= since.c.before - quiet_hours),
        )
        newest: dict[str, dict[float, tuple[int, bool]]] = {}  # bed -> time -> (id, alert) of its newest score
        with self.engine.connect() as db:
            for bed, at, alert, score_id in db.execute(within):
                kept = newest.setdefault(bed, {}).get(at)
                if kept is None or score_id > kept[0]:
                    newest[bed][at] = (score_id, bool(alert))
            states = {}
            for bed, by_time in newest.items():
                last_on = max((at for at, (_, alert) in by_time.items() if alert), default=-math.inf)
                states[bed] = AlertState(by_time[max(by_time)][1], last_on)
            rest = [(bed, before) for bed, before in times.items() if bed not in states]
            if rest:  # nothing scored within the quiet hours: the latest score's alert, whenever it was
                earlier = (
                    sa.values(sa.column("bed", sa.String), sa.column("before", sa.Float), name="rest")
                    .data(rest)
                    .cte("rest")
                )
                older = SCORES.alias("older")
                latest = (
                    sa.select(sa.func.max(older.c.time))
                    .where(older.c.bed == earlier.c.bed, older.c.time < earlier.c.before)
                    .scalar_subquery()
                )
                found: dict[str, tuple[int, float, bool]] = {}
                for bed, at, alert, score_id in db.execute(
                    sa.select(*columns).join(earlier, (earlier.c.bed == SCORES.c.bed) & (SCORES.c.time == latest))
                ):
                    if bed not in found or score_id > found[bed][0]:
                        found[bed] = (score_id, at, bool(alert))
                for bed, _ in rest:
                    _, at, alert = found.get(bed, (0, 0.0, False))
                    states[bed] = AlertState(True, at) if alert else AlertState()
        return {bed: states[bed] for bed in times}

    def history(self, bed: str) -> pd.DataFrame:
        """A bed's risk at each time it has a reading (the newest score of each time; a time whose readings were all
        withdrawn is left out): time, risk, alert, drivers, scored_at."""
        held = sa.select(READINGS.c.time).where(READINGS.c.bed == bed, HELD)
        newest = (
            sa.select(sa.func.max(SCORES.c.id))
            .where(SCORES.c.bed == bed, SCORES.c.time.in_(held))
            .group_by(SCORES.c.time)
        )
        query = (
            sa.select(SCORES.c.time, SCORES.c.risk, SCORES.c.alert, SCORES.c.drivers, SCORES.c.scored_at)
            .where(SCORES.c.id.in_(newest))
            .order_by(SCORES.c.time)
        )
        with self.engine.connect() as db:
            table = _table(db.execute(query).all(), ["time", "risk", "alert", "drivers", "scored_at"])
        table["drivers"] = table["drivers"].map(json.loads)
        return table

    def beds(self) -> pd.DataFrame:
        """Every bed: bed, admitted, discharged, readings, and its newest score (time, risk, alert, drivers) at a time
        not after the clock: a reading dated in the future (a store filled before such readings were refused, or a
        watched file's) never stands for the bed's present."""
        present = SCORES.c.time * 3600 + BEDS.c.admitted <= time.time() + MAX_AHEAD_SECONDS
        newest = (
            sa.select(sa.func.max(SCORES.c.id).label("id"))
            .join(BEDS, BEDS.c.bed == SCORES.c.bed)
            .where(present)
            .group_by(SCORES.c.bed)
        ).subquery()
        latest = (sa.select(SCORES).join(newest, SCORES.c.id == newest.c.id)).subquery()
        counts = (
            sa.select(READINGS.c.bed, sa.func.count().label("readings")).where(HELD).group_by(READINGS.c.bed)
        ).subquery()
        query = (
            sa.select(
                BEDS.c.bed,
                BEDS.c.admitted,
                BEDS.c.discharged,
                counts.c.readings,
                latest.c.time,
                latest.c.risk,
                latest.c.alert,
                latest.c.drivers,
            )
            .outerjoin(counts, counts.c.bed == BEDS.c.bed)
            .outerjoin(latest, latest.c.bed == BEDS.c.bed)
        )
        with self.engine.connect() as db:
            table = _table(
                db.execute(query).all(),
                ["bed", "admitted", "discharged", "readings", "time", "risk", "alert", "drivers"],
            )
        table["drivers"] = table["drivers"].map(lambda text: json.loads(text) if isinstance(text, str) else [])
        return table

    def ward(self) -> pd.DataFrame:
        """The admitted beds, highest risk first (the ward's view, the service's and the dashboard's): bed, time
        (hours since admission of the newest risk), risk, trend (its change over the last hour; NaN without a risk
        an hour before), alert, readings and drivers."""
        beds = self.beds()
        beds = beds[beds["discharged"].isna()].sort_values("risk", ascending=False, na_position="last")
        hour_ago = self.hour_ago(dict(zip(beds["bed"], beds["time"])))
        beds["trend"] = beds["risk"] - beds["bed"].map(hour_ago)
        beds["alert"] = beds["alert"].fillna(False).astype(bool)
        beds["readings"] = beds["readings"].fillna(0).astype(int)
        return beds[["bed", "time", "risk", "trend", "alert", "readings", "drivers"]].reset_index(drop=True)

    def hour_ago(self, times: dict[str, float]) -> dict[str, float]:
        """Each bed's risk an hour before ``times[bed]`` (its newest score at or before then), where it had one."""
        risks = {}
        with self.engine.connect() as db:
            for bed, now in times.items():
                if now is None or pd.isna(now):
                    continue
                row = db.execute(
                    sa.select(SCORES.c.risk)
                    .where(SCORES.c.bed == bed, SCORES.c.time <= now - 1, SCORES.c.risk.is_not(None))
                    .order_by(SCORES.c.time.desc(), SCORES.c.id.desc())
                    .limit(1)
                ).first()
                if row is not None:
                    risks[bed] = row.risk
        return risks

    def counts(self) -> dict[str, int]:
        """beds; readings held (not withdrawn), of which scored; withdrawn; pending: unscored, withdrawn ones too."""
        unscored = READINGS.c.scored.is_(False)
        with self.engine.connect() as db:  # each count an index's, the withdrawn ones' partial: no scan of readings
            stored = db.execute(sa.select(sa.func.count()).select_from(READINGS)).scalar_one()
            pending = db.execute(sa.select(sa.func.count()).where(unscored)).scalar_one()
            withdrawn = db.execute(sa.select(sa.func.count()).where(WITHDRAWN)).scalar_one()
            withdrawn_pending = db.execute(sa.select(sa.func.count()).where(WITHDRAWN, unscored)).scalar_one()
            beds = db.execute(sa.select(sa.func.count()).select_from(BEDS)).scalar_one()
        readings = stored - withdrawn
        return {
            "beds": beds,
            "readings": readings,
            "scored": readings - (pending - withdrawn_pending),
            "withdrawn": withdrawn,
            "pending": pending,
        }
