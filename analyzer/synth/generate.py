"""`synthesize`: plan the stories, simulate in batches, stream the writers."""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from json.encoder import encode_basestring_ascii as _encode_string  # type: ignore[attr-defined]
from pathlib import Path
from typing import Any

from analyzer.outputs import Outputs
from analyzer.synth.constants import DEFAULT_MIX, EPOCH, LOG_FORMATS, US
from analyzer.synth.database import _Database, _fmt_db
from analyzer.synth.logs import _Logs
from analyzer.synth.stories import Simulation
from analyzer.synth.templates import Templates, _dumps


@dataclass
class SynthSummary:
    """What ``synthesize`` wrote."""

    out: Path
    runs: int
    seed: int
    scenarios: dict[str, int]
    categories: dict[str, int]
    rows: dict[str, int]
    log_records: int
    log_lines: dict[str, int]
    paths: dict[str, Path]
    seconds: float
    start: datetime
    end: datetime
    victims: int = 0
    broad_victims: int = 0
    timings: dict[str, float] = field(default_factory=dict)


OPEN_ENDED = frozenset({"steady", "task-running"})
TWO_RUN_STORIES = frozenset({"resubmit", "same-name-concurrent"})
TIME_COLUMNS = {
    "runs": ("submitted_at", "last_processed_at"),
    "jobs": ("submitted_at", "last_processed_at", "remove_at", "running_at"),
    "instances": (
        "created_at",
        "deleted_at",
        "started_at",
        "finished_at",
        "last_job_processed_at",
        "termination_deadline",
        "last_processed_at",
    ),
    "probes": ("due",),
}


def _plan_stories(rng: random.Random, runs: int, mix: dict[str, float]) -> list[str]:
    """Story names whose runs add up to `runs` (a re-submission makes two runs); every story
    with a weight appears once before the weights take over."""
    names = [n for n, w in mix.items() if w > 0]
    unknown = set(names) - set(DEFAULT_MIX)
    if unknown:
        raise ValueError(f"unknown scenarios in mix: {sorted(unknown)}")
    first = list(names)
    rng.shuffle(first)
    weights = [mix[n] for n in names]
    stories: list[str] = []
    count = 0
    while count < runs:
        name = first.pop() if first else rng.choices(names, weights=weights)[0]
        size = 2 if name in TWO_RUN_STORIES else 1
        if count + size > runs:
            singles = [n for n in names if n not in TWO_RUN_STORIES]
            name = rng.choice(singles) if singles else "steady"
            size = 1
        stories.append(name)
        count += size
    return stories


def synthesize(
    out: Path | str,
    runs: int,
    seed: int = 0,
    *,
    log_formats: Iterable[str] = LOG_FORMATS,
    rich_width: int = 80,
    log_tz: str = "UTC",
    start: datetime | None = None,
    days: float | None = None,
    projects: int | None = None,
    users: int | None = None,
    mix: dict[str, float] | None = None,
    events_ttl_days: float | None = None,
    unique_names: bool = False,
    templates: Templates | Path | None = None,
    batch_runs: int = 2000,
) -> SynthSummary:
    """Write a synthetic dstack 0.22.5 server into `out`: server.db, logs/server.<fmt>.log
    (INFO, local time of `log_tz`) and truth.json, with `runs` runs.

    `days` (default 30-90, growing with `runs`) is the period the runs are spread over from
    `start` (default 2026-10-01 UTC); `projects`/`users` default to a size that fits `runs`;
    `mix` weighs the stories (DEFAULT_MIX); `events_ttl_days` drops events older than that
    from the database as dstack's TTL would (the log keeps them); `unique_names` makes run
    names unique across projects except where a story reuses a name on purpose after the
    first run ended (no two ACTIVE runs of different projects share a name, which a log alone
    cannot tell apart: it names jobs by run name and a 6-hex prefix only); `templates` is the
    capture set (or its folder) the schema, rows and documents come from.
    """
    began = time.perf_counter()
    began_cpu = time.thread_time()
    timings: dict[str, float] = {}
    if runs < 1:
        raise ValueError("runs must be >= 1")
    out = Path(out)
    tpl = templates if isinstance(templates, Templates) else Templates(templates)
    Outputs([tpl.root]).folder(out, replace=False)  # never written into the captures it copies
    out.mkdir(parents=True, exist_ok=True)
    start = start or datetime(2026, 10, 1, tzinfo=UTC)
    if start.tzinfo is None:
        start = start.replace(tzinfo=UTC)
    if days is None:
        days = float(min(90, max(30, runs // 200)))
    start_us = int((start - EPOCH).total_seconds()) * US + start.microsecond
    end_us = start_us + int(days * 86400 * US)
    n_projects = projects or min(20, max(5, runs // 50))
    n_users = users or min(30, max(4, n_projects + 3))

    rng = random.Random(seed)
    sim = Simulation(tpl, rng.getrandbits(64), start_us, end_us)
    db_path = out / "server.db"
    for stale in (db_path, out / "server.db-journal", out / "truth.json"):
        stale.unlink(missing_ok=True)
    db = _Database(db_path, tpl, seed)
    logs = _Logs(out / "logs", log_formats, rich_width, log_tz)
    truth_path = out / "truth.json"
    truth = truth_path.open("w", encoding="utf-8", newline="\n")
    header = {
        "scenario": "synthetic-fleet",
        "description": (
            f"Synthetic dstack 0.22.5 server: {runs} runs over {days:g} days in {n_projects} "
            f"projects (analyzer/synth.py, seed {seed})."
        ),
        "dstack_version": "0.22.5",
        "generated_by": f"analyzer/synth.py synthesize(runs={runs}, seed={seed})",
        "database": "server.db",
    }
    truth.write(json.dumps(header, indent=2)[:-2] + ',\n  "runs": [')

    sim.unique_names = unique_names
    sim.setup(n_projects, n_users)
    mix = dict(mix or DEFAULT_MIX)
    if unique_names:
        mix.pop("same-name-concurrent", None)
    stories = _plan_stories(rng, runs, mix)
    first_t = sim.setup_done + 600 * US
    reserve = int((3 * sim.mid + sim.long + min(2 * 3600, days * 8640)) * US)
    latest = max(first_t + US, end_us - reserve)
    latest_open = max(first_t + US, end_us - 2 * 3600 * US)
    schedule = sorted(
        (
            rng.randint(first_t, latest_open if name in OPEN_ENDED else latest),
            i,
            name,
        )
        for i, name in enumerate(stories)
    )
    keep_after = end_us - int(events_ttl_days * 86400 * US) if events_ttl_days else None

    scenario_counts: Counter[str] = Counter()
    categories: Counter[str] = Counter()
    victims = broad = 0
    pending: list[tuple[int, int, int, str]] = []
    first_entry = True
    simulated = written = 0.0
    for b in range(0, len(schedule), batch_runs):
        tick = time.perf_counter()
        batch = schedule[b : b + batch_runs]
        for t0, _, name in batch:
            made = getattr(sim, "sc_" + name.replace("-", "_"))(t0)
            for run in made:
                entry = sim.finalize(run)
                scenario_counts[run.scenario] += 1
                categories[entry["category"]] += 1
                victims += len(entry["victims"])
                broad += len(entry["broad_victims"])
                text = pretty_json(entry, "    ")
                truth.write(("\n    " if first_entry else ",\n    ") + text)
                first_entry = False
        tock = time.perf_counter()
        simulated += tock - tick
        # the database takes every row of the batch; the log only what no later run precedes
        for table, times in TIME_COLUMNS.items():
            db.insert(table, sim.rows.pop(table, []), times)
        db.events(sim.ev_t, sim.ev_msg, sim.ev_actor, sim.tg_ev, sim.tg, keep_after)
        sim.ev_t, sim.ev_msg, sim.ev_actor, sim.tg_ev, sim.tg = [], [], [], [], []
        pending.extend(sim.logq)
        sim.logq = []
        pending.sort()
        horizon = schedule[b + batch_runs][0] if b + batch_runs < len(schedule) else None
        if horizon is None:
            ready, pending = pending, []
        else:
            cut = _bisect_time(pending, horizon)
            ready, pending = pending[:cut], pending[cut:]
        logs.write(ready)
        written += time.perf_counter() - tock
    timings["simulate"] = simulated
    timings["write_batches"] = written

    tick = time.perf_counter()
    _static_rows(sim, db)
    db.events(sim.ev_t, sim.ev_msg, sim.ev_actor, sim.tg_ev, sim.tg, keep_after)
    db.close()
    logs.close()
    truth.write("\n  ]\n}\n")
    truth.close()
    timings["finish"] = time.perf_counter() - tick
    timings["main_thread_cpu"] = time.thread_time() - began_cpu
    timings["db_thread_cpu"] = db.cpu
    return SynthSummary(
        out=out,
        runs=sum(scenario_counts.values()),
        seed=seed,
        scenarios=dict(sorted(scenario_counts.items())),
        categories=dict(sorted(categories.items())),
        rows=dict(sorted(db.counts.items())),
        log_records=logs.records,
        log_lines=dict(logs.lines),
        paths={
            "database": db_path,
            "truth": truth_path,
            **{f"log_{k}": v for k, v in logs.paths.items()},
        },
        seconds=time.perf_counter() - began,
        start=start,
        end=EPOCH + timedelta(microseconds=end_us),
        victims=victims,
        broad_victims=broad,
        timings=timings,
    )


_KEYS: dict[str, str] = {}


def _scalar(value: Any) -> str:
    kind = type(value)
    if kind is str:
        return _encode_string(value)
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return str(value)
    return json.dumps(value)


def pretty_json(value: Any, indent: str = "") -> str:
    """json.dumps(value, indent=2) continued at `indent` (the C encoder has no indent mode)."""
    kind = type(value)
    if kind is dict:
        if not value:
            return "{}"
        inner = indent + "  "
        parts = []
        for key, item in value.items():
            name = _KEYS.get(key)
            if name is None:
                name = _KEYS[key] = f"{_encode_string(key)}: "
            if type(item) in (dict, list):
                parts.append(inner + name + pretty_json(item, inner))
            else:
                parts.append(inner + name + _scalar(item))
        return "{\n" + ",\n".join(parts) + "\n" + indent + "}"
    if kind is list:
        if not value:
            return "[]"
        inner = indent + "  "
        return (
            "[\n"
            + ",\n".join(inner + pretty_json(item, inner) for item in value)
            + "\n"
            + indent
            + "]"
        )
    return _scalar(value)


def _bisect_time(records: list[tuple[int, int, int, str]], horizon: int) -> int:
    low, high = 0, len(records)
    while low < high:
        mid = (low + high) // 2
        if records[mid][0] < horizon:
            low = mid + 1
        else:
            high = mid
    return low


def _static_rows(sim: Simulation, db: _Database) -> None:
    """Users, projects, members, backends, repos and fleets (final state at the end)."""
    tpl = sim.tpl
    fmt = _fmt_db
    rows: dict[str, list[dict]] = {
        k: [] for k in ("users", "projects", "members", "backends", "repos", "fleets")
    }
    for user in sim.users:
        row = dict(tpl.user_admin if user.role == "ADMIN" else tpl.user)
        token = user.token
        row.update(
            id=user.id,
            name=user.name,
            token=f"enc:identity:noname:{token}",
            token_hash=hashlib.sha256(token.encode()).hexdigest(),
            global_role=user.role,
            created_at=fmt(user.created),
            ssh_private_key=user.priv,
            ssh_public_key=user.pub,
        )
        rows["users"].append(row)
    for project in sim.projects:
        row = dict(tpl.project)
        row.update(
            id=project.id,
            name=project.name,
            ssh_private_key=project.priv,
            ssh_public_key=project.pub,
            owner_id=project.owner.id,
            created_at=fmt(project.created),
        )
        rows["projects"].append(row)
        for i, user in enumerate(project.members):
            row = dict(tpl.member_admin if i == 0 else tpl.member_user)
            row.update(id=sim.new_id(), project_id=project.id, user_id=user.id)
            rows["members"].append(row)
        if project.name == "main":
            continue
        row = dict(tpl.backend)
        row.update(id=sim.new_id(), project_id=project.id)
        rows["backends"].append(row)
        row = dict(tpl.repo)
        row.update(id=project.repo_id, project_id=project.id)
        rows["repos"].append(row)
    for fleet in sim.fleets:
        row = dict(tpl.fleet)
        nodes = dict(tpl.fleet_nodes, max=sim.rng.choice((4, 8, 16, 32)))
        last = sim.end - sim.d(0, 10)
        row.update(
            id=fleet.id,
            name=fleet.name,
            project_id=fleet.project.id,
            created_at=fmt(fleet.created),
            last_processed_at=fmt(last),
            last_consolidated_at=fmt(last - sim.d(5, 60)),
            spec=tpl.fleet_spec.render(_dumps(fleet.name), _dumps(nodes)),
        )
        rows["fleets"].append(row)
    for table, values in rows.items():
        db.insert(table, values)
