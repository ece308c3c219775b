"""Synthetic dstack 0.22.5 servers: many runs, in dstack's exact formats, with ground truth.

The real captures (``tests/data/captures/v0.22.5``) hold one run each. Benchmarks and fleet-wide
audits need servers with thousands of runs, so ``synthesize`` writes one: a ``server.db`` whose
schema is copied statement by statement from a capture's ``sqlite_master`` and whose rows are
the captures' rows with ids, names, times and projects rewritten (reference section 2
encodings; JSON documents rendered from the captures' own documents, every key present), the
server log of the same history in the three layouts of reference 9.2, and a ``truth.json`` in
the captures' format.

Every run follows one of the captured stories (reference 7, 11.4), with the event messages of
reference 8.2 and the delays seen in the 0.22.5 captures: rolling deployments that succeed or
fail (no capacity, container crash, retry limit), healthy replicas killed by a newer
deployment's failure (1..6 victims, with and without probes), two successive updates, in-place
bumps and scale-ups, old replicas failing by themselves, user stops, tasks, runs re-submitted
under the same name, instances idling out, and runs still active when the snapshot ends.

Everything is drawn from one seed: the same seed gives the same bytes. Generation streams:
runs are simulated in submission order in batches, and log records are sorted and written as
soon as no later run can produce an earlier one.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import queue
import random
import re
import sqlite3
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from json.encoder import encode_basestring_ascii as _encode_string  # type: ignore[attr-defined]
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from analyzer.outputs import Outputs

US = 1_000_000


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


DB_TIME = "%Y-%m-%d %H:%M:%S%.6f"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# Loggers and line numbers of the 0.22.5 records (reference 9.2, 9.4; the captures' rich logs).
EVENTS_LOGGER = ("dstack._internal.server.services.events", 244)
SUBMITTED_LOGGER = ("dstack._internal.server.background.pipeline_tasks.jobs_submitted", 1660)
RUNNING_LOGGER = ("dstack._internal.server.background.pipeline_tasks.jobs_running", 1815)
TERMINATING_LOGGER = ("dstack._internal.server.background.pipeline_tasks.jobs_terminating", 698)
_LOGGERS = (EVENTS_LOGGER, SUBMITTED_LOGGER, RUNNING_LOGGER, TERMINATING_LOGGER)
_LEVEL_OF = {
    k: ("WARNING" if logger is TERMINATING_LOGGER else "INFO") for k, logger in enumerate(_LOGGERS)
}
_LOGGER_OF = {k: logger[0] for k, logger in enumerate(_LOGGERS)}

LOG_FORMATS = ("standard", "json", "rich")
FINISHED = frozenset({"TERMINATED", "ABORTED", "FAILED", "DONE"})
NO_CAPACITY_MESSAGE = "Fleet is at capacity"
COULD_NOT_STOP = (
    "could not stop container, possibly due to a communication error. See debug logs for "
    "details. Ignoring, can attempt to remove the container later"
)

# How often each story is drawn (weights; every story is drawn once before weights apply).
DEFAULT_MIX: dict[str, float] = {
    "steady": 12,
    "rolling-ok": 16,
    "in-place-bump": 6,
    "scale-up-ok": 4,
    "user-stop": 8,
    "user-stop-mid-rollout": 3,
    "seed": 5,
    "multi-replica-crash": 4,
    "crash-after-ready": 2,
    "rollout-partial-fails": 2,
    "retry-limit-exceeded": 3,
    "two-updates": 3,
    "old-replica-fails": 4,
    "old-fails-mid-rollout": 1,
    "unhealthy-old": 2,
    "scale-up-fails": 2,
    "resubmit": 3,
    "same-name-elsewhere": 2,
    "same-name-concurrent": 1,
    "task-fails": 5,
    "task-done": 12,
    "task-running": 3,
}

RUN_NAMES = _words(
    """
    web api svc chat embed llm vllm tgi rerank search gateway inference backend ocr whisper
    sd
    """
)
TASK_NAMES = ("train", "finetune", "eval", "bench", "etl", "sweep", "preprocess", "export")
PROJECT_NAMES = _words(
    """
    acme globex initech hooli wayne cyberdyne massive soylent tyrell umbrella stark wonka
    oscorp aperture gringotts monarch vandelay dunder pied-piper nakatomi weyland octan zorg
    kramerica
    """
)
USER_NAMES = _words(
    """
    alice bob carol dave erin frank grace heidi ivan judy kim leo mallory niaj olivia peggy
    rupert sybil trent victor walter xena yusuf zoe
    """
)
NAME_SUFFIXES = ("v2", "prod", "dev", "eu", "us", "canary", "a", "b")
FLEET_NAMES = ("cpu-fleet", "gpu-fleet", "a10-fleet", "h100-fleet", "spot-fleet")
SERVICE_COMMANDS = (
    "python -m http.server 8000",
    "python -m http.server 8000 --bind 0.0.0.0",
    "python /app.py",
    "uvicorn main:app --host 0.0.0.0 --port 8000",
    "gunicorn -b 0.0.0.0:8000 app:app",
    "python serve.py --port 8000",
    "vllm serve Qwen/Qwen2.5-1.5B-Instruct --port 8000",
    "text-generation-launcher --port 8000",
)
TASK_COMMANDS = (
    "python train.py",
    "python train.py --epochs 3",
    "python eval.py",
    "python etl.py --date today",
    "bash run.sh",
)
IMAGES = ("python:3.12-slim", "python:3.11-slim", "python:3.12", "python:3.13-slim")


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


# ---------------------------------------------------------------------------------------------
# templates: the captures' schema, rows and JSON documents


def default_captures() -> Path:
    """A folder of dstack 0.22.5 captures (each scenario with its server.db)."""
    candidates = []
    if os.environ.get("DSTACK_AUDIT_CAPTURES"):
        candidates.append(Path(os.environ["DSTACK_AUDIT_CAPTURES"]))
    root = Path(__file__).resolve().parents[1]
    candidates += [
        root / "tests" / "data" / "captures" / "v0.22.5",
        Path.cwd() / "tests" / "data" / "captures" / "v0.22.5",  # installed, run from the repo
    ]
    for candidate in candidates:
        if (candidate / "seed" / "server.db").is_file():
            return candidate
    raise FileNotFoundError(
        "no dstack 0.22.5 capture set found (looked in "
        + ", ".join(str(c) for c in candidates)
        + "); set DSTACK_AUDIT_CAPTURES or pass templates="
    )


def _ro(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def _rows(con: sqlite3.Connection, sql: str, params: Sequence = ()) -> list[dict[str, Any]]:
    cur = con.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _dumps(value: Any) -> str:
    """JSON as pydantic's model_dump_json writes it (compact, UTF-8)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class _Doc:
    """A captured JSON document with some values turned into slots, rendered by joining text.

    Rendering is string concatenation of pre-serialised pieces, so a 1.5 kB job spec costs a
    few microseconds while keeping the capture's key order and every key."""

    def __init__(self, doc: dict, slots: Sequence[tuple[str, ...]]):
        work = json.loads(json.dumps(doc))
        for index, path in enumerate(slots):
            node = work
            for key in path[:-1]:
                node = node[key]
            if path[-1] not in node:
                raise KeyError(f"capture document has no {'.'.join(path)}")
            node[path[-1]] = f"@@slot{index}@@"
        text = _dumps(work)
        parts = re.split(r'"@@slot(\d+)@@"', text)
        self.chunks = parts[0::2]
        self.order = [int(i) for i in parts[1::2]]

    def render(self, *pieces: str) -> str:
        out = [self.chunks[0]]
        for position, index in enumerate(self.order):
            out.append(pieces[index])
            out.append(self.chunks[position + 1])
        return "".join(out)


class Templates:
    """Schema, rows and documents of a dstack 0.22.5 capture set, read once."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root else default_captures()
        seed = _ro(self.root / "seed" / "server.db")
        self.schema = [
            (kind, name, sql)
            for kind, name, sql in seed.execute(
                "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid"
            )
        ]
        self.alembic_version = seed.execute("SELECT version_num FROM alembic_version").fetchone()[0]
        tables = [name for kind, name, _ in self.schema if kind == "table"]
        self.columns = {
            t: [c[1] for c in seed.execute(f'PRAGMA table_info("{t}")').fetchall()] for t in tables
        }
        self.user_admin = _rows(seed, "SELECT * FROM users WHERE global_role = 'ADMIN'")[0]
        self.user = _rows(seed, "SELECT * FROM users WHERE global_role = 'USER'")[0]
        self.project = _rows(seed, "SELECT * FROM projects WHERE name != 'main'")[0]
        self.member_admin = _rows(seed, "SELECT * FROM members WHERE project_role = 'ADMIN'")[0]
        self.member_user = _rows(seed, "SELECT * FROM members WHERE project_role = 'USER'")[0]
        self.backend = _rows(seed, "SELECT * FROM backends")[0]
        self.repo = _rows(seed, "SELECT * FROM repos")[0]
        self.fleet = _rows(seed, "SELECT * FROM fleets")[0]
        self.instance = _rows(seed, "SELECT * FROM instances")[0]
        self.run_service = _rows(seed, "SELECT * FROM runs")[0]
        self.job_service = _rows(
            seed, "SELECT * FROM jobs WHERE job_provisioning_data IS NOT NULL"
        )[0]
        task = _ro(self.root / "task-fails" / "server.db")
        self.run_task = _rows(task, "SELECT * FROM runs")[0]
        self.job_task = _rows(task, "SELECT * FROM jobs")[0]
        crash = _ro(self.root / "multi-replica-crash" / "server.db")
        self.probe = _rows(crash, "SELECT * FROM probes")[0]
        crash_spec = json.loads(crash.execute("SELECT run_spec FROM runs").fetchone()[0])
        self.run_probe = crash_spec["configuration"]["probes"][0]
        crash_job = json.loads(crash.execute("SELECT job_spec_data FROM jobs").fetchone()[0])
        self.job_probe = crash_job["probes"][0]

        # key pairs of every user and project of every capture (no key generation here)
        self.user_keys: list[tuple[str, str]] = []
        self.project_keys: list[tuple[str, str]] = []
        for db in sorted(self.root.glob("*/server.db")):
            con = _ro(db)
            for priv, pub in con.execute(
                "SELECT ssh_private_key, ssh_public_key FROM users ORDER BY name"
            ):
                if priv and (priv, pub) not in self.user_keys:
                    self.user_keys.append((priv, pub))
            for priv, pub in con.execute(
                "SELECT ssh_private_key, ssh_public_key FROM projects ORDER BY name"
            ):
                if (priv, pub) not in self.project_keys:
                    self.project_keys.append((priv, pub))
            con.close()

        run_spec = json.loads(self.run_service["run_spec"])
        task_spec = json.loads(self.run_task["run_spec"])
        conf = ("configuration",)
        self.run_spec_service = _Doc(
            run_spec,
            [
                ("run_name",),
                (*conf, "name"),
                (*conf, "commands"),
                (*conf, "image"),
                (*conf, "replicas"),
                (*conf, "probes"),
                (*conf, "priority"),
                (*conf, "retry"),
                (*conf, "env"),
                ("ssh_key_pub",),
            ],
        )
        self.run_spec_task = _Doc(
            task_spec,
            [
                ("run_name",),
                (*conf, "name"),
                (*conf, "commands"),
                (*conf, "image"),
                (*conf, "replicas"),
                (*conf, "probes"),
                (*conf, "priority"),
                (*conf, "retry"),
                (*conf, "env"),
                ("ssh_key_pub",),
            ]
            if "replicas" in task_spec["configuration"]
            else [
                ("run_name",),
                (*conf, "name"),
                (*conf, "commands"),
                (*conf, "image"),
                (*conf, "priority"),
                (*conf, "retry"),
                (*conf, "env"),
                ("ssh_key_pub",),
            ],
        )
        self.task_spec_has_replicas = "replicas" in task_spec["configuration"]
        job_slots = [
            ("replica_num",),
            ("job_name",),
            ("commands",),
            ("image_name",),
            ("probes",),
            ("retry",),
            ("env",),
        ]
        self.job_spec_service = _Doc(json.loads(self.job_service["job_spec_data"]), job_slots)
        self.job_spec_task = _Doc(json.loads(self.job_task["job_spec_data"]), job_slots)
        jpd = json.loads(self.job_service["job_provisioning_data"])
        self.jpd = _Doc(jpd, [("instance_id",), ("hostname",), ("internal_ip",)])
        self.jrd_text = self.job_service["job_runtime_data"]
        self.offer_text = self.instance["offer"]
        self.fleet_spec = _Doc(
            json.loads(self.fleet["spec"]), [("configuration", "name"), ("configuration", "nodes")]
        )
        self.service_spec = json.loads(self.run_service["service_spec"])
        self.fleet_nodes = json.loads(self.fleet["spec"])["configuration"]["nodes"]
        seed.close()
        task.close()
        crash.close()


# ---------------------------------------------------------------------------------------------
# entities


def _uuid4(bits: int) -> int:
    """Random 128 bits as a version-4, RFC 4122 variant UUID (what uuid.uuid4() stores)."""
    return (bits & ~(0xF << 76) & ~(0x3 << 62)) | (0x4 << 76) | (0x2 << 62)


def dashed(hex32: str) -> str:
    return f"{hex32[:8]}-{hex32[8:12]}-{hex32[12:16]}-{hex32[16:20]}-{hex32[20:]}"


class _User:
    __slots__ = ("created", "id", "log", "name", "priv", "pub", "role", "tgt", "token")


class _Project:
    __slots__ = _words(
        """
        created fleets id members name names_used owner priv pub repo_id tgt weight
        """
    )


class _Fleet:
    __slots__ = ("created", "creator", "id", "name", "next_num", "project", "tgt")


class _Instance:
    __slots__ = _words(
        """
        busy created deadline deleted finished fleet id jpd last_job last_processed name
        num prov_job started status term_msg term_reason tgt
        """
    )


class _Run:
    __slots__ = _words(
        """
        category commands culprits deleted dep desired env fleet id image jobs killed
        kind log name notes priority probes project reason replicas_field retry scenario
        snapshot spec_text status t_last t_sub tgt user
        """
    )


class _Job:
    __slots__ = _words(
        """
        assigned deleted_row dep exit_status gta id inst jpd log msg name plan plan_pos
        probe_rows ready ready_at reason registered remove_at replica_num run runner_ts
        running_at spec_text status submission_num t_last t_sub t_term tgt used_inst was
        """
    )


def _target(kind: str, ident: str, name: str, project, run, fleet) -> tuple:
    """(entity_type NAME, id, name, project id, run id, fleet id, log form) of an event target."""
    value = kind.lower().replace("_", "-")
    return (kind, ident, name, project, run, fleet, f"{value}({ident[:6]}){name}")


# ---------------------------------------------------------------------------------------------
# the simulation: what dstack 0.22.5 writes, run by run


class _Sim:
    """Emits events, log records and final rows of every run; the writers drain them."""

    def __init__(self, tpl: Templates, seed: int, start_us: int, end_us: int):
        self.tpl = tpl
        self.rng = random.Random(seed)
        self.random = self.rng.random
        self.start = start_us
        self.end = end_us
        self.prefixes: set[str] = set()
        # events of the current batch (columnar) and their targets
        self.ev_t: list[int] = []
        self.ev_msg: list[str] = []
        self.ev_actor: list[str | None] = []
        self.tg_ev: list[int] = []
        self.tg: list[tuple] = []
        # log records not yet written: (time, seq, kind, message); kind indexes _LOGGERS
        self.logq: list[tuple[int, int, int, str]] = []
        self.seq = 0
        # finished rows per table (dicts), drained by the database writer
        self.rows: dict[str, list[dict]] = {}
        self.runs_done: list[_Run] = []
        self.users: list[_User] = []
        self.projects: list[_Project] = []
        self.fleets: list[_Fleet] = []
        self.admin: _User | None = None
        self.next_run_identity: tuple | None = None
        self.json_cache: dict[tuple, str] = {}
        self.unique_names = False
        self.global_names: set[str] = set()
        self.name_counter: dict[str, int] = {}
        self.finished_names: deque[tuple[int, str, _Project]] = deque(maxlen=400)
        period = end_us - start_us
        self.mid = min(6 * 3600, period / US / 10)  # typical gap before a user acts again (s)
        self.long = min(24 * 3600, period / US / 6)  # longest gap before a stop (s)

    # -- randomness and time ------------------------------------------------------------------

    def d(self, low: float, high: float) -> int:
        """A delay in microseconds, uniform in [low, high] seconds."""
        return int((low + (high - low) * self.random()) * US)

    def step(self) -> int:
        """The gap between two events written in one transaction (microseconds)."""
        return 4 + int(87 * self.random())

    def new_id(self, unique_prefix: bool = False) -> str:
        while True:
            ident = f"{_uuid4(self.rng.getrandbits(128)):032x}"
            if not unique_prefix:
                return ident
            if ident[:6] not in self.prefixes:
                self.prefixes.add(ident[:6])
                return ident

    # -- events and log records ---------------------------------------------------------------

    def ev(self, t: int, message: str, targets: Sequence[tuple], actor: _User | None = None):
        index = len(self.ev_t)
        self.ev_t.append(t)
        self.ev_msg.append(message)
        if len(targets) == 1:
            target = targets[0]
            self.tg_ev.append(index)
            self.tg.append(target)
            shown = target[6]
        else:
            for target in targets:
                self.tg_ev.append(index)
                self.tg.append(target)
            shown = ", ".join([target[6] for target in targets])
        if actor is None:
            self.ev_actor.append(None)
            who = "system"
        else:
            self.ev_actor.append(actor.id)
            who = actor.log
        self.logq.append(
            (t, self.seq, 0, f"Emitting event: {message}. Event targets: {shown}. Actor: {who}")
        )
        self.seq += 1

    def log(self, t: int, kind: int, message: str) -> None:
        self.logq.append((t, self.seq, kind, message))
        self.seq += 1

    def row(self, table: str, values: dict) -> None:
        self.rows.setdefault(table, []).append(values)

    # -- the server's principals --------------------------------------------------------------

    def add_user(self, name: str, role: str, t: int) -> _User:
        user = _User()
        user.id = self.new_id()
        user.name = name
        user.role = role
        user.created = t
        user.token = dashed(f"{_uuid4(self.rng.getrandbits(128)):032x}")
        keys = self.tpl.user_keys[len(self.users) % len(self.tpl.user_keys)]
        user.priv = keys[0]
        user.pub = " ".join([*keys[1].split(" ")[:2], name])
        user.log = f"user({user.id[:6]}){name}"
        user.tgt = ("USER", user.id, name, None, None, None, user.log)
        self.users.append(user)
        return user

    def add_project(self, name: str, owner: _User, t: int) -> _Project:
        project = _Project()
        project.id = self.new_id()
        project.name = name
        project.owner = owner
        project.created = t
        project.members = []
        project.fleets = []
        project.names_used = set()
        project.repo_id = self.new_id()
        keys = self.tpl.project_keys[len(self.projects) % len(self.tpl.project_keys)]
        project.priv = keys[0]
        project.pub = " ".join([*keys[1].split(" ")[:2], f"{name}@dstack"])
        project.tgt = _target("PROJECT", project.id, name, project.id, None, None)
        project.weight = 1.0
        self.projects.append(project)
        return project

    def add_fleet(self, project: _Project, name: str, creator: _User, t: int) -> _Fleet:
        fleet = _Fleet()
        fleet.id = self.new_id()
        fleet.name = name
        fleet.project = project
        fleet.creator = creator
        fleet.created = t
        fleet.next_num = 0
        fleet.tgt = _target("FLEET", fleet.id, name, project.id, None, fleet.id)
        project.fleets.append(fleet)
        self.fleets.append(fleet)
        self.ev(t, "Fleet created. Status: ACTIVE", [fleet.tgt], creator)
        return fleet

    def setup(self, n_projects: int, n_users: int) -> None:
        """Users, projects, memberships and fleets, created in the first hour (reference 8.2:
        'User created', 'Project created', 'Fleet created' events)."""
        rng = self.rng
        t = self.start
        admin = self.add_user("admin", "ADMIN", t)
        self.admin = admin
        self.ev(t, "User created", [admin.tgt], admin)
        main = self.add_project("main", admin, t)
        main.members.append(admin)
        self.ev(t + self.step(), "Project created", [main.tgt], admin)
        t += self.d(20, 120)
        names = list(USER_NAMES)
        rng.shuffle(names)
        people = []
        for i in range(n_users):
            name = names[i % len(names)] + (f"{i // len(names) + 1}" if i >= len(names) else "")
            user = self.add_user(name, "USER", t)
            self.ev(t, "User created", [user.tgt], admin)
            people.append(user)
            t += self.d(1, 40)
        pnames = list(PROJECT_NAMES)
        rng.shuffle(pnames)
        for i in range(n_projects):
            name = pnames[i % len(pnames)] + (
                f"-{i // len(pnames) + 1}" if i >= len(pnames) else ""
            )
            project = self.add_project(name, admin, t)
            self.ev(t, "Project created", [project.tgt], admin)
            project.members.append(admin)
            k = min(len(people), rng.randint(1, 4))
            for user in rng.sample(people, k):
                project.members.append(user)
            project.weight = rng.paretovariate(1.2)
            t += self.d(1, 60)
        for project in self.projects[1:]:
            for j in range(rng.choice((1, 1, 2, 2, 3))):
                creator = rng.choice(project.members[1:])
                t += self.d(5, 90)
                self.add_fleet(project, FLEET_NAMES[j], creator, t)
        self.setup_done = t

    # -- runs and jobs ------------------------------------------------------------------------

    def pick_name(self, project: _Project, kind: str) -> str:
        """A run name not used before in the project (with unique_names: in the server)."""
        pool = RUN_NAMES if kind == "service" else TASK_NAMES
        used = self.global_names if self.unique_names else project.names_used
        rng = self.rng
        for _ in range(8):
            base = rng.choice(pool)
            name = base if rng.random() < 0.5 else f"{base}-{rng.choice(NAME_SUFFIXES)}"
            if name not in used:
                break
        else:
            n = self.name_counter.get(base, 2)
            while f"{base}-{n}" in used:
                n += 1
            self.name_counter[base] = n + 1
            name = f"{base}-{n}"
        used.add(name)
        project.names_used.add(name)
        self.global_names.add(name)
        return name

    def new_run(
        self,
        kind: str,
        t0: int,
        *,
        scenario: str,
        replicas: int = 1,
        probes: tuple[int, int] | None = None,
        retry: int | None = None,
        project: _Project | None = None,
        name: str | None = None,
        user: _User | None = None,
        fleet: _Fleet | None = None,
    ) -> _Run:
        rng = self.rng
        run = _Run()
        if self.next_run_identity is not None:
            project, name, user, fleet = self.next_run_identity
            self.next_run_identity = None
        if project is None:
            projects = self.projects[1:]
            project = rng.choices(projects, weights=[p.weight for p in projects])[0]
        run.project = project
        run.user = user or rng.choice(project.members[1:])
        run.fleet = fleet or rng.choice(project.fleets)
        run.kind = kind
        run.name = name or self.pick_name(project, kind)
        run.id = self.new_id(unique_prefix=True)
        run.t_sub = t0
        run.t_last = t0
        run.status = "SUBMITTED"
        run.reason = None
        run.dep = 0
        run.desired = replicas
        run.replicas_field = replicas
        run.priority = rng.choice((0, 0, 0, 0, 10, 20, 50))
        run.commands = rng.choice(SERVICE_COMMANDS if kind == "service" else TASK_COMMANDS)
        run.image = rng.choice(IMAGES)
        run.env = {}
        run.probes = probes
        run.retry = retry
        run.deleted = False
        run.jobs = []
        run.culprits = []
        run.killed = []
        run.snapshot = None
        run.scenario = scenario
        run.category = None
        run.notes = ""
        run.tgt = _target("RUN", run.id, run.name, project.id, run.id, None)
        run.log = f"run({run.id[:6]}){run.name}"
        self.render_run_spec(run)
        return run

    def cached(self, key: tuple, build) -> str:
        """JSON text of a small value that many rows share (probes, retry, replicas, ...)."""
        text = self.json_cache.get(key)
        if text is None:
            text = self.json_cache[key] = _dumps(build())
        return text

    def probes_json(self, probes: tuple[int, int] | None, job_level: bool) -> str:
        tpl = self.tpl

        def build():
            if not probes:
                return [] if job_level else None
            base = tpl.job_probe if job_level else tpl.run_probe
            return [dict(base, ready_after=probes[0], interval=probes[1])]

        return self.cached(("probes", probes, job_level), build)

    def retry_json(self, duration: int | None) -> str:
        return self.cached(
            ("retry", duration),
            lambda: {"on_events": ["no-capacity"], "duration": duration} if duration else None,
        )

    def env_json(self, env: dict) -> str:
        return self.cached(("env", *env.items()), lambda: env)

    def render_run_spec(self, run: _Run) -> None:
        tpl = self.tpl
        replicas = run.replicas_field
        name = _encode_string(run.name)
        common = (name, name, f"[{_encode_string(run.commands)}]", _encode_string(run.image))
        tail = (
            str(run.priority),
            self.retry_json(run.retry),
            self.env_json(run.env),
            self.cached(("pub", run.user.id), lambda: run.user.pub + "\n"),
        )
        if run.kind == "service":
            run.spec_text = tpl.run_spec_service.render(
                *common,
                self.cached(
                    ("replicas", replicas),
                    lambda: {"min": replicas, "max": replicas} if replicas != 1 else None,
                ),
                self.probes_json(run.probes, False),
                *tail,
            )
        elif tpl.task_spec_has_replicas:
            run.spec_text = tpl.run_spec_task.render(*common, "null", "null", *tail)
        else:
            run.spec_text = tpl.run_spec_task.render(*common, *tail)

    def job_spec(self, run: _Run, replica_num: int, name: str) -> str:
        tpl = self.tpl
        doc = tpl.job_spec_service if run.kind == "service" else tpl.job_spec_task
        return doc.render(
            str(replica_num),
            _encode_string(name),
            f'["/bin/sh","-i","-c",{_encode_string(run.commands)}]',
            _encode_string(run.image),
            self.probes_json(run.probes, True),
            self.retry_json(run.retry),
            self.env_json(run.env),
        )

    def submit(self, run: _Run, t0: int) -> list[_Job]:
        """'Run submitted' (+ 'Service assigned ...') and the first jobs, one transaction."""
        self.ev(t0, "Run submitted. Status: SUBMITTED", [run.tgt], run.user)
        t = t0
        if run.kind == "service":
            t += self.step()
            self.ev(t, "Service assigned to run without a gateway", [run.tgt])
        jobs = []
        for replica in range(run.desired):
            t += self.step()
            jobs.append(self.create_job(run, replica, t, "on run submission"))
        return jobs

    def create_job(
        self, run: _Run, replica_num: int, t: int, how: str, submission_num: int = 0
    ) -> _Job:
        job = _Job()
        job.id = self.new_id(unique_prefix=True)
        job.run = run
        job.replica_num = replica_num
        job.submission_num = submission_num
        job.name = f"{run.name}-0-{replica_num}"
        job.dep = run.dep
        job.t_sub = t
        job.t_last = t
        job.t_term = None
        job.status = "SUBMITTED"
        job.was = None
        job.reason = None
        job.msg = None
        job.spec_text = self.job_spec(run, replica_num, job.name)
        job.jpd = None
        job.inst = None
        job.used_inst = None
        job.assigned = 0
        job.exit_status = None
        job.registered = 0
        job.gta = None
        job.ready = 0
        job.ready_at = None
        job.running_at = None
        job.runner_ts = None
        job.remove_at = None
        job.deleted_row = False
        job.plan = []
        job.plan_pos = 0
        job.probe_rows = None
        job.tgt = _target("JOB", job.id, job.name, run.project.id, run.id, None)
        job.log = f"job({job.id[:6]}){job.name}"
        run.jobs.append(job)
        self.ev(t, f"Job created {how}. Status: SUBMITTED", [job.tgt])
        return job

    # -- a job's way up: instance, provisioning, pulling, running, ready ----------------------

    def plan_start(self, job: _Job, t_instance: int) -> None:
        """Times of the job's start-up (0.22.5 captures: instance placeholder, provisioning a
        few hundred ms later, pulling and BUSY 35-50 s later, RUNNING 13-30 s after both; ready
        at once without probes, after ready_after probe intervals with them)."""
        tp = t_instance + self.d(0.08, 0.35)
        pull = tp + self.d(34, 50)
        busy = tp + self.d(34, 50)
        running = max(pull, busy) + self.d(13, 30)
        plan = [
            (t_instance, "instance"),
            (tp, "provisioning"),
            (pull, "pulling"),
            (busy, "busy"),
        ]
        plan.sort()
        plan.append((running, "running"))
        if job.run.kind == "service":
            if job.run.probes:
                ready_after, interval = job.run.probes
                plan.append((running + ready_after * interval * US + self.d(3, 20), "ready"))
            else:
                plan.append((running + self.step(), "ready"))
        job.plan = plan
        job.plan_pos = 0

    def plan_time(self, job: _Job, stage: str) -> int:
        for t, name in job.plan:
            if name == stage:
                return t
        raise KeyError(stage)

    def advance(self, job: _Job, until: int = 1 << 62) -> None:
        """Emit the job's start-up steps that happen before `until`."""
        plan = job.plan
        while job.plan_pos < len(plan) and (
            plan[job.plan_pos][0] < until
            # the placeholder instance and the provisioning are one step of the jobs pipeline
            or (job.plan_pos and plan[job.plan_pos - 1][1] == "instance")
        ):
            t, stage = plan[job.plan_pos]
            job.plan_pos += 1
            getattr(self, f"_stage_{stage}")(job, t)

    def _stage_instance(self, job: _Job, t: int) -> None:
        fleet = job.run.fleet
        inst = _Instance()
        inst.id = self.new_id(unique_prefix=True)
        inst.num = fleet.next_num
        fleet.next_num += 1
        inst.name = f"{fleet.name}-{inst.num}"
        inst.fleet = fleet
        inst.created = t
        inst.started = None
        inst.status = "PENDING"
        inst.finished = None
        inst.deleted = 0
        inst.term_reason = None
        inst.term_msg = None
        inst.last_job = None
        inst.last_processed = None
        inst.busy = 0
        inst.prov_job = job.id
        inst.deadline = None
        rng = self.rng
        inst.jpd = self.tpl.jpd.render(
            f'"i-0{rng.getrandbits(60):015x}"',
            f'"203.0.113.{rng.randint(1, 254)}"',
            f'"10.0.{rng.randint(0, 255)}.{rng.randint(1, 254)}"',
        )
        inst.tgt = _target("INSTANCE", inst.id, inst.name, fleet.project.id, None, fleet.id)
        job.inst = inst
        self.ev(t, "Instance created for job. Instance status: PENDING", [inst.tgt, job.tgt])

    def _stage_provisioning(self, job: _Job, t: int) -> None:
        inst = job.inst
        inst.status = "PROVISIONING"
        inst.started = t
        inst.busy = 1
        job.status = "PROVISIONING"
        job.jpd = inst.jpd
        job.used_inst = inst
        job.assigned = 1
        self.ev(t, "Job status changed SUBMITTED -> PROVISIONING", [job.tgt])
        t += self.step()
        self.ev(
            t,
            "Instance provisioned for job. Instance status: PROVISIONING",
            [inst.tgt, job.tgt],
        )
        self.log(t + self.step(), 1, f"{job.log}: provisioned 1 new instance(s)")

    def _stage_pulling(self, job: _Job, t: int) -> None:
        job.status = "PULLING"
        self.ev(t, "Job status changed PROVISIONING -> PULLING", [job.tgt])

    def _stage_busy(self, job: _Job, t: int) -> None:
        inst = job.inst
        if inst is None or inst.status != "PROVISIONING":
            return
        inst.status = "BUSY"
        self.ev(t, "Instance status changed PROVISIONING -> BUSY", [inst.tgt])

    def _stage_running(self, job: _Job, t: int) -> None:
        job.status = "RUNNING"
        job.running_at = t
        job.runner_ts = (t + self.d(0.7, 1.6)) // 1000
        self.ev(t, "Job status changed PULLING -> RUNNING", [job.tgt])

    def _stage_ready(self, job: _Job, t: int) -> None:
        job.ready = 1
        job.registered = 1
        job.ready_at = t
        self.ev(t, "Service replica ready to receive requests", [job.tgt])

    def healthy(self, job: _Job) -> bool:
        return job.status == "RUNNING" and bool(job.ready)

    # -- a job's way down ---------------------------------------------------------------------

    def terminating(
        self,
        job: _Job,
        t: int,
        reason: str,
        message: str | None = None,
        exit_status: int | None = None,
    ) -> None:
        if exit_status is not None:
            self.log(t, 2, f"{job.log}: non-zero exit status {exit_status}")
            t += self.step()
            job.exit_status = exit_status
        text = f"Job status changed {job.status} -> TERMINATING. Termination reason: {reason}"
        if message:
            text += f" ({message})"
        self.ev(t, text, [job.tgt])
        job.was = job.status
        job.status = "TERMINATING"
        job.reason = reason
        job.msg = message
        job.t_term = t
        job.plan_pos = len(job.plan)

    def graceful(self, job: _Job, t: int) -> None:
        self.ev(t, "Graceful job stop requested", [job.tgt])
        job.gta = 1
        job.remove_at = t + 30 * US
        job.runner_ts = t // 1000

    def finish(self, job: _Job, t: int, final: str) -> None:
        """TERMINATING -> final: the job's instance is released in the same transaction."""
        inst = job.inst
        if inst is not None and inst.status == "PROVISIONING":
            self.log(t, 3, f"{job.log}: {COULD_NOT_STOP}")
        self.ev(t, f"Job status changed TERMINATING -> {final}", [job.tgt])
        if inst is not None:
            t += self.step()
            if inst.status == "PROVISIONING":
                self.ev(
                    t,
                    "Instance status changed PROVISIONING -> TERMINATING. Termination reason: "
                    "JOB_FINISHED",
                    [inst.tgt],
                )
                t += self.step()
                self.ev(
                    t,
                    "Job unassigned from instance. Instance blocks: 0/1 busy",
                    [job.tgt, inst.tgt],
                )
                inst.status = "TERMINATING"
                inst.busy = 0
                inst.last_job = t
                inst.term_reason = "JOB_FINISHED"
                inst.deadline = inst.started + 20 * 60 * US + self.d(0.3, 0.9)
                done = t + self.d(0.15, 0.3)
                self.ev(done, "Instance status changed TERMINATING -> TERMINATED", [inst.tgt])
                self.instance_gone(inst, done)
            else:
                self.ev(t, f"Instance status changed {inst.status} -> IDLE", [inst.tgt])
                t += self.step()
                self.ev(
                    t,
                    "Job unassigned from instance. Instance blocks: 0/1 busy",
                    [job.tgt, inst.tgt],
                )
                inst.status = "IDLE"
                inst.busy = 0
                inst.last_job = t
                self.idle(inst, t)
            job.inst = None
        if job.was == "RUNNING" and job.remove_at is None:
            job.remove_at = t - self.d(2.7, 3.4) + 30 * US
        job.status = final
        job.registered = 0
        job.t_last = t

    def idle(self, inst: _Instance, t: int) -> None:
        """An idle instance of a `nodes: 0..` fleet ends after its 300 s idle time."""
        ends = t + 300 * US + self.d(12, 25)
        if ends + 12 * US >= self.end:
            inst.last_processed = self.end - self.d(0, 60)
            return
        idle_for = (ends - t - self.d(0.1, 0.9)) // US
        self.ev(
            ends,
            "Instance status changed IDLE -> TERMINATING. Termination reason: IDLE_TIMEOUT "
            f"(Instance idle for {idle_for}s)",
            [inst.tgt],
        )
        inst.status = "TERMINATING"
        inst.term_reason = "IDLE_TIMEOUT"
        inst.term_msg = f"Instance idle for {idle_for}s"
        done = ends + self.d(8, 10)
        self.ev(done, "Instance status changed TERMINATING -> TERMINATED", [inst.tgt])
        self.instance_gone(inst, done)

    def instance_gone(self, inst: _Instance, t: int) -> None:
        inst.status = "TERMINATED"
        inst.deleted = 1
        inst.finished = t
        inst.last_processed = t

    # -- run-level steps ----------------------------------------------------------------------

    def run_status(
        self, run: _Run, t: int, new: str, reason: str | None = None, actor: _User | None = None
    ) -> None:
        text = f"Run status changed {run.status} -> {new}"
        if reason:
            text += f". Termination reason: {reason}"
            run.reason = reason
        self.ev(t, text, [run.tgt], actor)
        run.status = new
        run.t_last = t

    def active(self, run: _Run) -> list[_Job]:
        return [j for j in run.jobs if j.status not in FINISHED and j.status != "TERMINATING"]

    def take_snapshot(self, run: _Run, t: int) -> None:
        """Healthy replicas at this moment (truth: healthy_replicas_before_failure)."""
        if run.snapshot is None:
            run.snapshot = (t, [(j, j.dep) for j in self.active(run) if self.healthy(j)], run.dep)

    def bring_up(self, run: _Run, jobs: list[_Job], t0: int, until: int = 1 << 62) -> int:
        """Start the run's first jobs (the jobs pipeline takes the first one within seconds,
        the others in its next batch ~15 s later) and move the run to PROVISIONING and
        RUNNING. Returns the time every job is ready (or running, for tasks)."""
        first = t0 + self.d(0.03, 6)
        later = t0 + self.d(12, 16)
        for i, job in enumerate(jobs):
            at = first if i == 0 else later + i * self.d(0.02, 0.2)
            self.plan_start(job, at)
        t_prov = max(
            t0 + self.d(6.5, 9.5), self.plan_time(jobs[0], "provisioning") + self.d(0.4, 3)
        )
        t_run = min(self.plan_time(j, "running") for j in jobs) + self.d(0.03, 0.5)
        for job in jobs:
            self.advance(job, until)
        if t_prov < until:
            self.run_status(run, t_prov, "PROVISIONING")
        if t_run < until:
            self.run_status(run, t_run, "RUNNING")
        return max(j.plan[-1][0] for j in jobs)

    def update(self, run: _Run, t: int, fields: str, **changes: Any) -> None:
        """`dstack apply` of an in-place update: a new deployment (reference 6.1, S0)."""
        self.take_snapshot(run, t)
        for key, value in changes.items():
            setattr(run, key, value)
        run.dep += 1
        self.render_run_spec(run)
        self.ev(
            t, f"Run updated. Deployment: {run.dep}. Changed fields: {fields}", [run.tgt], run.user
        )

    def rolling_change(self, run: _Run) -> tuple[str, dict]:
        """A change of the job spec (triggers a rolling deployment)."""
        rng = self.rng
        roll = rng.random()
        pool = SERVICE_COMMANDS
        commands = rng.choice([c for c in pool if c != run.commands])
        if roll < 0.7:
            return "configuration.commands", {"commands": commands}
        if roll < 0.85:
            image = rng.choice([i for i in IMAGES if i != run.image])
            return "configuration.image", {"image": image}
        if roll < 0.93:
            revision = run.env.get("MODEL_REVISION", "r1")
            while f"r{(number := rng.randint(2, 99))}" == revision:
                pass
            return "configuration.env", {"env": {"MODEL_REVISION": f"r{number}"}}
        image = rng.choice([i for i in IMAGES if i != run.image])
        return "configuration.commands, configuration.image", {"commands": commands, "image": image}

    def bump_in_place(self, run: _Run) -> None:
        """The run pass writes jobs.deployment_num = runs.deployment_num for replicas whose job
        spec is unchanged (reference 6.2): no event, no new job."""
        for job in self.active(run):
            job.dep = run.dep

    def stop_by_user(self, run: _Run, t: int) -> int:
        """`dstack stop`: run TERMINATING (actor user), jobs TERMINATED_BY_USER, graceful stop
        of running jobs, run TERMINATED (user-stop-mid-rollout capture)."""
        self.take_snapshot(run, t)
        self.run_status(run, t, "TERMINATING", "STOPPED_BY_USER", run.user)
        t_jobs = t + self.d(0.08, 0.2)
        ends = [t_jobs]
        jobs = self.active(run)
        tt = t_jobs
        for job in jobs:
            self.terminating(job, tt, "TERMINATED_BY_USER")
            tt += self.step()
        tg = t_jobs + self.d(0.08, 0.2)
        for job in jobs:
            if job.was == "RUNNING":
                self.graceful(job, tg)
                end = tg + self.d(3.2, 3.6)
                tg += self.d(0.03, 0.2)
            elif job.was in ("PROVISIONING", "PULLING"):
                end = t_jobs + self.d(0.2, 0.45)
            else:
                end = t_jobs + self.d(2, 4)
            self.finish(job, end, "TERMINATED")
            ends.append(end)
        for job in run.jobs:
            if job.status == "TERMINATING" and job.t_term is not None:
                ends.append(job.t_term + self.d(4, 6))
        final = max(ends) + self.d(2, 2.6)
        self.run_status(run, final, "TERMINATED")
        return final

    def cascade(self, run: _Run, t3: int) -> int:
        """S4/S5 (reference 7): every job neither finished nor terminating is stopped with
        TERMINATED_BY_SERVER in one pass; running ones get a graceful stop."""
        t4 = t3 + self.d(6, 9)
        jobs = self.active(run)
        t = t4
        for job in jobs:
            run.killed.append((job, self.healthy(job), job.dep))
            self.terminating(job, t, "TERMINATED_BY_SERVER")
            t += self.step()
        ends = [t4]
        tg = t4 + self.d(0.09, 0.2)
        for job in jobs:
            if job.was == "RUNNING":
                self.graceful(job, tg)
                end = tg + self.d(2.8, 3.3)
                tg += self.d(0.03, 0.2)
            elif job.was == "PROVISIONING":
                end = t4 + self.d(0.2, 0.5)
            else:
                end = t4 + self.d(2.5, 4)
            self.finish(job, end, "TERMINATED")
            ends.append(end)
        return max(ends)

    def fail_run(
        self, run: _Run, t_fail: int, reason: str = "JOB_FAILED", quick: bool = False
    ) -> int:
        """S3 -> S6: the run fails on its next pass, the cascade stops the rest, the run ends
        FAILED once every job is finished."""
        t3 = t_fail + (self.d(1, 2.5) if quick else self.d(9.5, 12))
        self.run_status(run, t3, "TERMINATING", reason)
        last = self.cascade(run, t3)
        ends = [last, t3 + self.d(6, 9)]
        ends += [j.t_last for j in run.jobs if j.status in FINISHED]
        final = max(ends) + self.d(3.9, 6)
        self.run_status(run, final, "FAILED")
        return final

    # -- failures of one job ------------------------------------------------------------------

    def no_capacity(self, job: _Job, t: int) -> int:
        """S2a + S2c: the jobs pipeline finds no capacity ('Fleet is at capacity')."""
        self.terminating(job, t, "FAILED_TO_START_DUE_TO_NO_CAPACITY", NO_CAPACITY_MESSAGE)
        self.finish(job, t + self.d(4.5, 6), "FAILED")
        return t

    def crash(self, job: _Job, t: int, code: int | None = None) -> int:
        """S2b + S2c: the runner reports the container exited with an error."""
        code = code if code is not None else self.rng.choice((1, 1, 1, 2, 2, 127, 137, 139))
        self.advance(job, t)
        if job.running_at is not None and t - job.running_at > 60 * US:
            job.runner_ts = (t - self.d(20, 26)) // 1000  # the runner's last log cursor
        self.terminating(job, t, "CONTAINER_EXITED_WITH_ERROR", "", exit_status=code)
        self.finish(job, t + self.d(7, 9), "FAILED")
        return t

    def scale_down(self, job: _Job, t: int) -> int:
        was = job.status
        self.terminating(job, t, "SCALED_DOWN")
        end = t + (self.d(8, 9.5) if was == "RUNNING" else self.d(5.5, 6.5))
        if was in ("SUBMITTED",):
            end = t + self.d(1, 3)
        self.finish(job, end, "TERMINATED")
        return end

    # -- rolling deployment -------------------------------------------------------------------

    def free_slot(self, run: _Run) -> tuple[int, int]:
        """Where the next up-to-date replica goes: an inactive replica slot of the run is
        re-run (same replica_num, submission_num + 1), else a new replica_num (reference 6.3)."""
        latest: dict[int, _Job] = {}
        for job in run.jobs:
            if (
                job.replica_num not in latest
                or job.submission_num > latest[job.replica_num].submission_num
            ):
                latest[job.replica_num] = job
        for replica in sorted(latest):
            job = latest[replica]
            if job.status in FINISHED or job.status == "TERMINATING":
                return replica, job.submission_num + 1
        return max(latest) + 1, 0

    def fail_surge(
        self, run: _Run, surge: _Job, t: int, kind: str, serving: list[_Job]
    ) -> tuple[int, bool]:
        """The new replica fails: no capacity (S2a), a crash before it is ready (S2b), or a
        crash after it served and one old replica was scaled down. Returns (time, quick)."""
        run.culprits.append(surge)
        if kind == "no-capacity":
            return self.no_capacity(surge, t + self.d(0.6, 2.1)), False
        self.plan_start(surge, t + self.d(0.4, 5.5))
        running = self.plan_time(surge, "running")
        if kind == "crash-after-ready" and serving:
            self.advance(surge)
            t_sd = surge.ready_at + self.d(4, 9.5)
            old = max(serving, key=lambda j: j.replica_num)
            serving.remove(old)
            self.scale_down(old, t_sd)
            return self.crash(surge, t_sd + self.d(1, 6)), True
        if run.probes:
            ready = self.plan_time(surge, "ready")
            limit = min(20.0, (ready - running) / US - 1)
            t_crash = running + self.d(2, max(2.5, limit))
        else:
            t_crash = running + self.d(0.5, 3.5)
        return self.crash(surge, t_crash), True

    def rollout(
        self,
        run: _Run,
        t1: int,
        *,
        fail_at: int | None = None,
        fail_kind: str = "no-capacity",
        stop_after: int | None = None,
    ) -> tuple[str, int, bool]:
        """Rolling deployment of run.dep, max surge 1 (reference 6.3): one up-to-date replica
        at a time ('Job created on retry'); when it serves, the next pass scales down the
        out-of-date serving replica with the highest replica_num; out-of-date replicas that do
        not serve are scaled down at once. Returns (outcome, time, quick failure)."""
        old = sorted((j for j in self.active(run) if j.dep < run.dep), key=lambda j: j.replica_num)
        for job in old:
            self.advance(job, t1)
        serving = [j for j in old if self.healthy(j)]
        not_serving = [j for j in old if not self.healthy(j)]
        t = t1
        k = 0
        while True:
            slot, sub = self.free_slot(run)
            surge = self.create_job(run, slot, t, "on retry", sub)
            if k == 0:
                for job in not_serving:
                    self.scale_down(job, t + self.step())
            if k == fail_at:
                t_fail, quick = self.fail_surge(run, surge, t, fail_kind, serving)
                return "failed", t_fail, quick
            self.plan_start(surge, t + self.d(0.4, 5.5))
            self.advance(surge)
            if not serving:
                return "done", surge.ready_at, False
            t_sd = surge.ready_at + self.d(4, 9.5)
            old_job = max(serving, key=lambda j: j.replica_num)
            serving.remove(old_job)
            self.scale_down(old_job, t_sd)
            k += 1
            if not serving or k == stop_after:
                return ("done" if not serving else "stopped"), t_sd, False
            t = t_sd + self.d(8, 12)

    # -- the stories --------------------------------------------------------------------------

    def log_delay(self, low: float, high: float) -> int:
        return int(math.exp(self.rng.uniform(math.log(low), math.log(high))) * US)

    def draw_replicas(self, low: int = 1) -> int:
        choices = [n for n in (1, 2, 3, 4, 5, 6) if n >= low]
        weights = [(45, 25, 15, 7, 5, 3)[n - 1] for n in choices]
        return self.rng.choices(choices, weights=weights)[0]

    def draw_probes(self, share: float = 0.4) -> tuple[int, int] | None:
        if self.rng.random() < share:
            return (self.rng.choice((1, 2, 2, 3)), self.rng.choice((5, 10, 10, 15)))
        return None

    def start_service(
        self, t0: int, scenario: str, *, replicas: int | None = None, probes: Any = "draw", **kw
    ) -> tuple[_Run, int]:
        run = self.new_run(
            "service",
            t0,
            scenario=scenario,
            replicas=replicas or self.draw_replicas(),
            probes=self.draw_probes() if probes == "draw" else probes,
            **kw,
        )
        jobs = self.submit(run, t0)
        return run, self.bring_up(run, jobs, t0)

    def later(self, t: int) -> int:
        """When a user comes back to a running service: minutes to hours later."""
        return t + self.log_delay(120, self.mid)

    def maybe_stop(self, run: _Run, t: int, share: float = 0.4) -> None:
        if self.rng.random() < share:
            self.stop_by_user(run, t + self.log_delay(300, self.long))

    def sc_steady(self, t0: int) -> list[_Run]:
        run, _ = self.start_service(t0, "steady")
        run.notes = "Service submitted and serving until the end of the capture."
        return [run]

    def sc_rolling_ok(self, t0: int) -> list[_Run]:
        run, ready = self.start_service(t0, "rolling-ok")
        fields, change = self.rolling_change(run)
        tu = self.later(ready)
        self.update(run, tu, fields, **change)
        _, t_end, _ = self.rollout(run, tu + self.d(1.3, 16))
        run.notes = (
            f"Update of {fields} rolls out replica by replica: every old replica is SCALED_DOWN "
            "after a new one serves; the run stays RUNNING."
        )
        self.maybe_stop(run, t_end)
        return [run]

    def sc_in_place_bump(self, t0: int) -> list[_Run]:
        run, ready = self.start_service(t0, "in-place-bump")
        tu = self.later(ready)
        priority = self.rng.choice([p for p in (0, 5, 10, 20, 50, 100) if p != run.priority])
        self.update(run, tu, "configuration.priority", priority=priority)
        t1 = tu + self.d(1.3, 16)
        self.bump_in_place(run)
        run.notes = (
            "Update of `priority` only: deployment_num bumped in place on the running jobs (no "
            "event for the bump), nothing else happens."
        )
        self.maybe_stop(run, t1)
        return [run]

    def scale_up(self, run: _Run, tu: int, more: int) -> tuple[int, list[_Job]]:
        replicas = run.desired + more
        self.update(run, tu, "configuration.replicas", replicas_field=replicas, desired=replicas)
        t1 = tu + self.d(1.3, 16)
        self.bump_in_place(run)
        new = []
        t = t1
        for _ in range(more):
            slot, sub = self.free_slot(run)
            new.append(self.create_job(run, slot, t, "on retry", sub))
            t += self.step()
        return t1, new

    def sc_scale_up_ok(self, t0: int) -> list[_Run]:
        run, ready = self.start_service(t0, "scale-up-ok", replicas=self.draw_replicas())
        t1, new = self.scale_up(run, self.later(ready), self.rng.choice((1, 1, 2)))
        for i, job in enumerate(new):
            self.plan_start(job, t1 + self.d(0.4, 5.5) + i * self.d(10, 15))
            self.advance(job)
        run.notes = (
            "In-place `replicas` increase: running replicas bumped to the new deployment, the "
            "new replicas start and serve."
        )
        self.maybe_stop(run, max(j.plan[-1][0] for j in new))
        return [run]

    def sc_user_stop(self, t0: int) -> list[_Run]:
        run, ready = self.start_service(t0, "user-stop")
        self.stop_by_user(run, ready + self.log_delay(300, self.long))
        run.notes = "The user stops the service (`dstack stop`): every job TERMINATED_BY_USER."
        return [run]

    def update_until_surge_provisions(
        self, run: _Run, ready: int, fields, change: dict, start_after: float
    ) -> tuple[_Job, int]:
        """Apply the update, create the surge replica, and return it with a moment while it
        provisions (advanced to it): where a user stop or an old replica's crash lands."""
        tu = self.later(ready)
        self.update(run, tu, fields, **change)
        t1 = tu + self.d(1.3, 16)
        slot, sub = self.free_slot(run)
        surge = self.create_job(run, slot, t1, "on retry", sub)
        self.plan_start(surge, t1 + self.d(start_after, 5.5))
        provisioning = self.plan_time(surge, "provisioning")
        running = self.plan_time(surge, "running")
        moment = provisioning + self.d(1, max(1.5, (running - provisioning) / US - 1))
        self.advance(surge, moment)
        return surge, moment

    def sc_user_stop_mid_rollout(self, t0: int) -> list[_Run]:
        run, ready = self.start_service(t0, "user-stop-mid-rollout")
        fields, change = self.rolling_change(run)
        surge, t_stop = self.update_until_surge_provisions(run, ready, fields, change, 0.3)
        self.stop_by_user(run, t_stop)
        run.notes = (
            f"Update of {fields}; while the new replica is still {surge.was.lower()} the user "
            "stops the run: every job TERMINATED_BY_USER, the old replica dies because of the "
            "user, not because of a failure."
        )
        return [run]

    def incident(
        self,
        run: _Run,
        ready: int,
        *,
        fail_at: int = 0,
        kind: str = "no-capacity",
        tu: int | None = None,
    ) -> int:
        fields, change = self.rolling_change(run)
        tu = tu or self.later(ready)
        self.update(run, tu, fields, **change)
        _, t_fail, quick = self.rollout(run, tu + self.d(1.3, 16), fail_at=fail_at, fail_kind=kind)
        run.notes = (
            f"Update of {fields} -> rolling deployment {run.dep}; new replica "
            f"{run.culprits[-1].name} fails ({run.culprits[-1].reason}); the run fails with "
            "JOB_FAILED and the cascade stops the replicas still running."
        )
        return self.fail_run(run, t_fail, quick=quick)

    def sc_seed(self, t0: int) -> list[_Run]:
        run, ready = self.start_service(t0, "seed")
        self.incident(run, ready, kind="no-capacity")
        return [run]

    def sc_multi_replica_crash(self, t0: int) -> list[_Run]:
        run, ready = self.start_service(
            t0, "multi-replica-crash", replicas=self.draw_replicas(), probes=self.draw_probes(0.7)
        )
        self.incident(run, ready, kind="crash")
        return [run]

    def sc_crash_after_ready(self, t0: int) -> list[_Run]:
        run, ready = self.start_service(t0, "crash-after-ready", probes=None)
        self.incident(run, ready, kind="crash-after-ready")
        run.notes += (
            " Without probes the new replica served at once, so one old replica had already "
            "been SCALED_DOWN before the crash."
        )
        return [run]

    def sc_rollout_partial_fails(self, t0: int) -> list[_Run]:
        run, ready = self.start_service(
            t0, "rollout-partial-fails", replicas=self.draw_replicas(low=2)
        )
        done = self.rng.randint(1, run.desired - 1)
        kind = self.rng.choice(("no-capacity", "crash"))
        self.incident(run, ready, fail_at=done, kind=kind)
        run.notes += (
            f" {done} new replica(s) had already replaced old ones; they are stopped too (same "
            "deployment as the failing one)."
        )
        return [run]

    def sc_retry_limit_exceeded(self, t0: int) -> list[_Run]:
        duration = self.rng.choice((600, 1200, 1800, 3600))
        run, ready = self.start_service(t0, "retry-limit-exceeded", retry=duration)
        immediate = self.rng.random() < 0.5 or ready - t0 > duration * US - 90 * US
        if immediate:
            tu = max(self.later(ready), t0 + duration * US + self.d(5, 600))
        else:
            tu = t0 + duration * US - self.d(20, 75)
        fields, change = self.rolling_change(run)
        self.update(run, tu, fields, **change)
        t = tu + self.d(1.3, 16)
        slot, sub = self.free_slot(run)
        while True:
            job = self.create_job(run, slot, t, "on retry", sub)
            t_fail = self.no_capacity(job, t + self.d(0.6, 2.1))
            t = t_fail + self.d(9.5, 12)
            if t - run.t_sub > duration * US:
                break
            # 0.20.29+: superseded no-capacity submissions are deleted (not the predecessor)
            for older in run.jobs:
                if (
                    older.replica_num == slot
                    and older.submission_num <= sub - 1
                    and older.reason == "FAILED_TO_START_DUE_TO_NO_CAPACITY"
                    and older.jpd is None
                ):
                    older.deleted_row = True
            sub += 1
        run.culprits.append(job)
        self.run_status(run, t, "TERMINATING", "RETRY_LIMIT_EXCEEDED")
        last = self.cascade(run, t)
        final = max([last, t + self.d(6, 9)] + [j.t_last for j in run.jobs]) + self.d(3.9, 6)
        self.run_status(run, final, "FAILED")
        tries = job.submission_num + 1
        run.notes = (
            f"Update of {fields}; the new replica finds no capacity and `retry` on no-capacity "
            f"(duration {duration}s) is measured from the run's submission: after {tries} "
            "attempt(s) the run fails with RETRY_LIMIT_EXCEEDED and the old replicas are "
            "stopped. Superseded no-capacity submissions are deleted from jobs."
        )
        return [run]

    def sc_two_updates(self, t0: int) -> list[_Run]:
        variant = self.rng.choice(("completed", "completed", "mid-rollout", "bump"))
        low = 2 if variant == "mid-rollout" else 1
        run, ready = self.start_service(t0, "two-updates", replicas=self.draw_replicas(low=low))
        tu1 = self.later(ready)
        if variant == "bump":
            priority = self.rng.choice([p for p in (5, 10, 20, 50) if p != run.priority])
            self.update(run, tu1, "configuration.priority", priority=priority)
            self.bump_in_place(run)
            t_after = tu1 + self.d(1.3, 16)
            first = "an in-place `priority` update (deployment 1, jobs bumped)"
        else:
            fields, change = self.rolling_change(run)
            self.update(run, tu1, fields, **change)
            stop_after = self.rng.randint(1, run.desired - 1) if variant == "mid-rollout" else None
            _, t_after, _ = self.rollout(run, tu1 + self.d(1.3, 16), stop_after=stop_after)
            first = f"a rolling update of {fields} (deployment 1, " + (
                "completed)" if variant == "completed" else "interrupted mid-rollout)"
            )
        if variant == "mid-rollout":
            tu2 = t_after + self.d(0.5, 6)
        else:
            tu2 = t_after + self.log_delay(120, self.mid)
        fields, change = self.rolling_change(run)
        self.update(run, tu2, fields, **change)
        kind = self.rng.choice(("no-capacity", "crash"))
        _, t_fail, quick = self.rollout(run, tu2 + self.d(1.3, 16), fail_at=0, fail_kind=kind)
        self.fail_run(run, t_fail, quick=quick)
        run.notes = (
            f"Two successive updates: {first}, then an update of {fields} (deployment "
            f"{run.dep}) whose new replica fails ({run.culprits[-1].reason}); the replicas of "
            "the older deployments are stopped by the cascade."
        )
        return [run]

    def sc_old_replica_fails(self, t0: int) -> list[_Run]:
        run, ready = self.start_service(t0, "old-replica-fails")
        t_crash = self.later(ready)
        self.take_snapshot(run, t_crash)
        culprit = self.rng.choice(run.jobs)
        run.culprits.append(culprit)
        self.crash(culprit, t_crash)
        self.fail_run(run, t_crash, quick=True)
        run.category = "sibling_victim"
        run.notes = (
            f"No update: replica {culprit.name} (deployment 0) crashes and the run fails with "
            "JOB_FAILED; the other replicas of the same deployment are stopped (#2660 pattern)."
        )
        return [run]

    def sc_old_fails_mid_rollout(self, t0: int) -> list[_Run]:
        run, ready = self.start_service(t0, "old-fails-mid-rollout")
        fields, change = self.rolling_change(run)
        _, t_crash = self.update_until_surge_provisions(run, ready, fields, change, 0.4)
        culprit = self.rng.choice([j for j in run.jobs if j.dep < run.dep])
        run.culprits.append(culprit)
        self.crash(culprit, t_crash)
        self.fail_run(run, t_crash, quick=True)
        run.category = "sibling_victim"
        run.notes = (
            f"Update of {fields}; while the new replica is still starting, the OLD replica "
            f"{culprit.name} (deployment 0) crashes: the failing job is the older deployment, "
            "so the killed new replica is not a victim; other old replicas are same-deployment "
            "collateral."
        )
        return [run]

    def sc_unhealthy_old(self, t0: int) -> list[_Run]:
        probes = self.draw_probes(0.5)
        run = self.new_run(
            "service",
            t0,
            scenario="unhealthy-old",
            replicas=self.rng.choice((1, 1, 2)),
            probes=probes,
        )
        jobs = self.submit(run, t0)
        # plan the start-up, then apply the update while no replica serves yet: the image
        # pull is slow (capture), or the probes do not pass yet
        self.bring_up(run, jobs, t0, until=t0)  # plans only
        stuck = "ready" if probes and self.rng.random() < 0.5 else "running"
        for job in jobs:
            delay = self.d(90, 900)
            job.plan = [
                (t + delay if stage in (stuck, "ready") else t, stage) for t, stage in job.plan
            ]
        before = "running" if stuck == "ready" else "pulling"
        low = max(self.plan_time(j, before) for j in jobs) + US
        high = min(self.plan_time(j, stuck) for j in jobs) - 20 * US
        tu = low + int((high - low) * self.rng.uniform(0.1, 0.9))
        for job in jobs:
            self.advance(job, tu)
        t_prov = t0 + self.d(6.5, 9.5)
        t_prov = max(t_prov, self.plan_time(jobs[0], "provisioning") + self.d(0.4, 3))
        self.run_status(run, t_prov, "PROVISIONING")
        if any(j.status == "RUNNING" for j in jobs):
            t_run = min(j.running_at for j in jobs if j.running_at) + self.d(0.03, 0.5)
            self.run_status(run, t_run, "RUNNING")
        fields, change = self.rolling_change(run)
        self.update(run, tu, fields, **change)
        _, t_fail, quick = self.rollout(run, tu + self.d(1.3, 16), fail_at=0)
        self.fail_run(run, t_fail, quick=quick)
        run.category = "unhealthy_victim"
        states = ", ".join(sorted({j.was.lower() for j in jobs if j.was}))
        run.notes = (
            f"The old replica(s) were not serving yet ({states}, never ready) when the user "
            f"re-applied with changed {fields}: the rolling deployment SCALED_DOWN them at once "
            "and the new replica failed with no capacity; the run failed with no healthy victim."
        )
        return [run]

    def sc_scale_up_fails(self, t0: int) -> list[_Run]:
        run, ready = self.start_service(t0, "scale-up-fails")
        tu = self.later(ready)
        t1, new = self.scale_up(run, tu, 1)
        run.culprits.append(new[0])
        t_fail = self.no_capacity(new[0], t1 + self.d(0.6, 2.1))
        self.fail_run(run, t_fail)
        run.category = "scale_up_victim"
        run.notes = (
            "In-place `replicas` increase: the running replicas are bumped to the new "
            "deployment (same job spec), the new replica cannot be placed (no capacity) and the "
            "run fails: the healthy replicas are killed by a replica of their own (bumped) "
            "deployment."
        )
        return [run]

    def sc_resubmit(self, t0: int) -> list[_Run]:
        old, ready = self.start_service(t0, "resubmit-old")
        t_end = self.stop_by_user(old, ready + self.log_delay(300, self.mid))
        old.notes = (
            "Stopped by the user, then a run with the same name is submitted in the same project: "
            "this row is marked deleted (event 'Run deleted')."
        )
        t = t_end + self.d(2, 90)
        self.ev(t, "Run deleted", [old.tgt], old.user)
        old.deleted = True
        story = self.rng.choice(
            ("steady", "rolling-ok", "seed", "multi-replica-crash", "user-stop")
        )
        t_new = t + self.d(0.01, 0.08)
        self.next_run_identity = (old.project, old.name, old.user, old.fleet)
        new = getattr(self, "sc_" + story.replace("-", "_"))(t_new)
        for run in new:
            run.scenario = f"resubmit-new ({story})"
            run.notes = "Re-submitted under the name of a deleted run. " + run.notes
        return [old, *new]

    def sc_same_name_elsewhere(self, t0: int) -> list[_Run]:
        """A run named like a finished run of ANOTHER project (same name, other project)."""
        candidates = [e for e in self.finished_names if e[0] < t0 - 60 * US]
        self.rng.shuffle(candidates)
        for entry in candidates:
            _, name, origin = entry
            others = [p for p in self.projects[1:] if p is not origin and name not in p.names_used]
            if others:
                break
        else:
            return self.sc_steady(t0)
        self.finished_names.remove(entry)
        project = self.rng.choice(others)
        project.names_used.add(name)
        self.next_run_identity = (project, name, None, None)
        story = self.rng.choice(
            ("steady", "rolling-ok", "seed", "multi-replica-crash", "old-replica-fails")
        )
        made = getattr(self, "sc_" + story.replace("-", "_"))(t0)
        for run in made:
            run.scenario = f"same-name-elsewhere ({story})"
            run.notes = (
                f"Same name as an earlier, finished run of project {origin.name}. " + run.notes
            )
        return made

    def sc_same_name_concurrent(self, t0: int) -> list[_Run]:
        """Two ACTIVE runs with the same name in two projects: the second is submitted while
        the first still runs, then the first has an incident (log lines name jobs only by
        <run name>-<job num>-<replica num> and a 6-hex id prefix)."""
        first, ready = self.start_service(t0, "same-name-concurrent")
        others = [
            p
            for p in self.projects[1:]
            if p is not first.project and first.name not in p.names_used
        ]
        if not others:  # every project has a run of that name: two unrelated runs then
            self.incident(first, ready)
            return [first, *self.sc_steady(ready + self.d(30, 600))]
        project = self.rng.choice(others)
        project.names_used.add(first.name)
        self.next_run_identity = (project, first.name, None, None)
        t_second = ready + self.d(30, 600)
        second = self.sc_steady(t_second)[0]
        second.scenario = "same-name-concurrent"
        second.notes = f"Same name as an active run of project {first.project.name}. " + (
            second.notes
        )
        if self.rng.random() < 0.5:
            tu = t_second + self.d(-20, 90)  # while the second run starts up
        else:
            tu = t_second + self.log_delay(200, self.mid)
        self.incident(first, ready, kind=self.rng.choice(("no-capacity", "crash")), tu=tu)
        first.notes += (
            f" A run with the same name is active in project {project.name} at the same time."
        )
        return [first, second]

    def start_task(self, t0: int, scenario: str) -> tuple[_Run, int]:
        run = self.new_run("task", t0, scenario=scenario)
        jobs = self.submit(run, t0)
        return run, self.bring_up(run, jobs, t0)

    def sc_task_fails(self, t0: int) -> list[_Run]:
        run, running = self.start_task(t0, "task-fails")
        t_crash = running + self.log_delay(20, self.mid)
        self.take_snapshot(run, t_crash)
        culprit = run.jobs[0]
        run.culprits.append(culprit)
        self.crash(culprit, t_crash)
        self.fail_run(run, t_crash, quick=True)
        run.notes = "A task (not a service) whose only job exits with an error: JOB_FAILED."
        return [run]

    def sc_task_done(self, t0: int) -> list[_Run]:
        run, running = self.start_task(t0, "task-done")
        t_done = running + self.log_delay(20, self.mid)
        job = run.jobs[0]
        self.terminating(job, t_done, "DONE_BY_RUNNER", "")
        job.exit_status = 0
        self.finish(job, t_done + self.d(7, 9), "DONE")
        t3 = t_done + self.d(1, 2.5)
        self.run_status(run, t3, "TERMINATING", "ALL_JOBS_DONE")
        final = max(job.t_last, t3 + self.d(6, 9)) + self.d(3.9, 6)
        self.run_status(run, final, "DONE")
        run.notes = "A task that exits with code 0: ALL_JOBS_DONE."
        return [run]

    def sc_task_running(self, t0: int) -> list[_Run]:
        run, _ = self.start_task(t0, "task-running")
        run.notes = "A task still running at the end of the capture."
        return [run]

    # -- end of a run: final rows and truth ---------------------------------------------------

    def finalize(self, run: _Run) -> dict:
        end = self.end
        tpl = self.tpl
        if run.status not in ("TERMINATED", "FAILED", "DONE"):
            self.take_snapshot(run, end)
            run.t_last = end - self.d(0, 10)
        elif run.kind == "service" and not run.deleted:
            self.finished_names.append((run.t_last, run.name, run.project))
        project = run.project
        service = run.kind == "service"
        row = dict(tpl.run_service if service else tpl.run_task)
        spec = None
        if service:
            spec = _dumps(dict(tpl.service_spec, url=f"/proxy/services/{project.name}/{run.name}/"))
        row.update(
            id=run.id,
            project_id=project.id,
            repo_id=project.repo_id,
            user_id=run.user.id,
            submitted_at=run.t_sub,
            run_name=run.name,
            status=run.status,
            run_spec=run.spec_text,
            deleted=int(run.deleted),
            last_processed_at=run.t_last,
            termination_reason=run.reason,
            service_spec=spec,
            fleet_id=run.fleet.id,
            priority=run.priority,
            deployment_num=run.dep,
            desired_replica_count=run.desired,
            desired_replica_counts=json.dumps({"0": run.desired}) if service else None,
        )
        self.row("runs", row)
        job_tpl = tpl.job_service if service else tpl.job_task
        instances: dict[str, _Instance] = {}
        for job in run.jobs:
            if job.status not in FINISHED:
                job.t_last = end - self.d(0, 10)
            inst = job.used_inst
            if inst is not None:
                instances[inst.id] = inst
            if job.deleted_row:
                continue
            row = dict(job_tpl)
            row.update(
                id=job.id,
                project_id=project.id,
                run_id=run.id,
                run_name=run.name,
                job_num=0,
                job_name=job.name,
                submission_num=job.submission_num,
                submitted_at=job.t_sub,
                last_processed_at=job.t_last,
                status=job.status,
                termination_reason=job.reason,
                job_spec_data=job.spec_text,
                job_provisioning_data=job.jpd,
                runner_timestamp=job.runner_ts,
                remove_at=job.remove_at,
                used_instance_id=inst.id if inst else None,
                replica_num=job.replica_num,
                termination_reason_message=job.msg,
                instance_assigned=job.assigned,
                job_runtime_data=tpl.jrd_text if job.jpd else None,
                instance_id=job.inst.id if job.inst else None,
                exit_status=job.exit_status,
                deployment_num=job.dep,
                registered=job.registered,
                fleet_id=run.fleet.id if job.assigned else None,
                graceful_termination_attempts=job.gta,
                ready=job.ready,
                running_at=job.running_at,
            )
            self.row("jobs", row)
            if run.probes and job.running_at:
                self.probe_rows(job)
        for inst in instances.values():
            if inst.last_processed is None:
                inst.last_processed = end - self.d(0, 10)
            row = dict(tpl.instance)
            row.update(
                id=inst.id,
                name=inst.name,
                created_at=inst.created,
                deleted=inst.deleted,
                deleted_at=inst.finished if inst.deleted else None,
                project_id=project.id,
                status=inst.status,
                started_at=inst.started,
                finished_at=inst.finished,
                job_provisioning_data=inst.jpd,
                offer=tpl.offer_text,
                last_job_processed_at=inst.last_job,
                termination_deadline=inst.deadline,
                termination_reason=inst.term_reason,
                termination_reason_message=inst.term_msg,
                instance_num=inst.num,
                fleet_id=inst.fleet.id,
                last_processed_at=inst.last_processed,
                busy_blocks=inst.busy,
                provisioning_job_id=inst.prov_job,
            )
            self.row("instances", row)
        return self.truth(run)

    def probe_rows(self, job: _Job) -> None:
        ready_after, interval = job.run.probes
        stop = job.t_term if job.t_term is not None else self.end
        streak = ready_after + max(0, (stop - job.ready_at) // (interval * US)) if job.ready else 0
        running = job.status == "RUNNING"
        due = stop + (self.d(0, interval) if running else self.d(-interval / 2, interval / 2))
        row = dict(self.tpl.probe)
        row.update(
            id=self.new_id(),
            name=f"{job.name}-0",
            job_id=job.id,
            probe_num=0,
            due=due,
            success_streak=streak,
            active=int(running),
        )
        self.row("probes", row)

    def truth(self, run: _Run) -> dict:
        def ref(job: _Job) -> dict:
            return {
                "job_id": dashed(job.id),
                "job_name": job.name,
                "replica_num": job.replica_num,
                "submission_num": job.submission_num,
                "deployment_num": job.dep,
                "status": job.status.lower(),
                "termination_reason": job.reason.lower() if job.reason else None,
                "termination_reason_message": job.msg,
            }

        culprit_dep = max((c.dep for c in run.culprits), default=None)
        healthy_killed = [(j, dep) for j, healthy, dep in run.killed if healthy]
        strict, broad = [], []
        if (
            culprit_dep is not None
            and run.status in ("FAILED", "TERMINATING")
            and run.reason
            in (
                "JOB_FAILED",
                "RETRY_LIMIT_EXCEEDED",
            )
        ):
            strict = [j for j, dep in healthy_killed if dep < culprit_dep]
            broad = [j for j, dep in healthy_killed if dep <= culprit_dep]
        if strict:
            category = "rolling_victim"
        elif broad:
            category = run.category if run.category == "scale_up_victim" else "sibling_victim"
        elif run.category == "unhealthy_victim":
            category = "unhealthy_victim"
        else:
            category = "negative"
        snap_t, snap_jobs, snap_dep = run.snapshot or (run.t_sub, [], 0)
        snapshot_at = (EPOCH + timedelta(microseconds=snap_t)).isoformat()
        alive = [j for j in run.jobs if not j.deleted_row]
        entry = {
            "project": run.project.name,
            "run_name": run.name,
            "run_id": dashed(run.id),
            "expected_flag": bool(strict),
            "category": category,
            "expected_flag_broad": bool(broad),
            "broad_victims": [ref(j) for j in sorted(broad, key=_job_order)],
            "run_status": run.status.lower(),
            "run_termination_reason": run.reason.lower() if run.reason else None,
            "run_deployment_num": run.dep,
            "victims": [
                {
                    "job_id": dashed(j.id),
                    "job_name": j.name,
                    "replica_num": j.replica_num,
                    "deployment_num": j.dep,
                    "submission_num": j.submission_num,
                    "termination_reason": j.reason.lower() if j.reason else None,
                }
                for j in sorted(strict, key=_job_order)
            ],
            "culprit": [
                {
                    "job_id": dashed(c.id),
                    "job_name": c.name,
                    "replica_num": c.replica_num,
                    "deployment_num": c.dep,
                    "submission_num": c.submission_num,
                    "termination_reason": c.reason.lower() if c.reason else None,
                    "termination_reason_message": c.msg,
                }
                for c in run.culprits
            ],
            "healthy_replicas_before_failure": [
                {
                    "job_id": dashed(j.id),
                    "job_name": j.name,
                    "replica_num": j.replica_num,
                    "deployment_num_at_snapshot": dep,
                    "run_deployment_num_at_snapshot": snap_dep,
                    "snapshot_at": snapshot_at,
                }
                for j, dep in snap_jobs
            ],
            "healthy_replicas_killed_by_run_termination": [
                ref(j) for j, _ in sorted(healthy_killed, key=lambda x: _job_order(x[0]))
            ],
            "all_jobs_final": [ref(j) for j in alive],
            "notes": run.notes,
            "extra": {"scenario": run.scenario, "deleted": run.deleted},
        }
        return entry


def _job_order(job: _Job) -> tuple:
    return (job.replica_num, job.submission_num)


_DAY_CACHE: dict[int, str] = {}


def _fmt_db(us: int) -> str:
    """dstack's SQLite time text: naive UTC, microseconds always written."""
    seconds, micro = divmod(us, US)
    day, rest = divmod(seconds, 86400)
    date = _DAY_CACHE.get(day)
    if date is None:
        date = (EPOCH + timedelta(days=day)).strftime("%Y-%m-%d")
        _DAY_CACHE[day] = date
    hour, rest = divmod(rest, 3600)
    minute, second = divmod(rest, 60)
    return f"{date} {hour:02d}:{minute:02d}:{second:02d}.{micro:06d}"


# ---------------------------------------------------------------------------------------------
# writers


def _bulk_ids(gen: np.random.Generator, n: int) -> list[str]:
    """n random uuid4 ids as 32 lowercase hex characters (vectorised)."""
    if n == 0:
        return []
    raw = gen.integers(0, 256, size=(n, 16), dtype=np.uint8)
    raw[:, 6] = (raw[:, 6] & 0x0F) | 0x40
    raw[:, 8] = (raw[:, 8] & 0x3F) | 0x80
    text = raw.tobytes().hex()
    return [text[i : i + 32] for i in range(0, 32 * n, 32)]


def _times(values: Sequence[int], fmt: str, zone: str | None = None) -> list[str]:
    series = pl.Series(values=values, dtype=pl.Int64).cast(pl.Datetime("us"))
    if zone is not None and zone != "UTC":
        series = series.dt.replace_time_zone("UTC").dt.convert_time_zone(zone)
    return series.dt.strftime(fmt).to_list()


class _Database:
    """server.db: the capture's DDL, statement by statement; indexes after the bulk load.

    Rows are written by one background thread (sqlite3 releases the GIL while SQLite works),
    in the order they are handed over, so the file is the same for the same seed."""

    def __init__(self, path: Path, tpl: Templates, seed: int):
        self.tpl = tpl
        self.path = path
        self.counts: Counter[str] = Counter()
        self.gen = np.random.Generator(np.random.PCG64(seed + 0x5EED))
        self.queue: queue.Queue = queue.Queue(maxsize=3)
        self.error: BaseException | None = None
        self.cpu = 0.0
        self.thread = threading.Thread(target=self._work, name="synth-db", daemon=True)
        self.thread.start()

    # -- the writer thread --------------------------------------------------------------------

    def _work(self) -> None:
        con = None
        began = time.thread_time()
        try:
            con = sqlite3.connect(self.path, isolation_level=None)
            con.execute("PRAGMA journal_mode=OFF")
            con.execute("PRAGMA synchronous=OFF")
            con.execute("PRAGMA cache_size=-262144")
            con.execute("PRAGMA threads=4")
            con.execute("BEGIN")
            for kind, _, sql in self.tpl.schema:
                if kind == "table":
                    con.execute(sql)
            while True:
                job = self.queue.get()
                if job is None:
                    break
                job(con)
            con.execute(
                "INSERT INTO alembic_version (version_num) VALUES (?)", (self.tpl.alembic_version,)
            )
            self.counts["alembic_version"] += 1
            for kind, _, sql in self.tpl.schema:
                if kind != "table":
                    con.execute(sql)
            con.execute("COMMIT")
            con.execute("PRAGMA journal_mode=DELETE")
        except BaseException as exc:  # handed to the caller at the next call
            self.error = exc
            while self.queue.get() is not None:
                pass
        finally:
            if con is not None:
                con.close()
            self.cpu = time.thread_time() - began

    def _put(self, job) -> None:
        if self.error is not None:
            raise self.error
        self.queue.put(job)

    # -- what the simulation hands over ------------------------------------------------------

    def insert(self, table: str, rows: list[dict], times: Sequence[str] = ()) -> None:
        """Rows as dicts; the columns named in `times` hold microseconds, written as text."""
        if not rows:
            return
        columns = self.tpl.columns[table]
        sql = (
            f'INSERT INTO "{table}" ({", ".join(columns)}) VALUES ({", ".join("?" * len(columns))})'
        )

        def job(con: sqlite3.Connection) -> None:
            values = [[r[c] for r in rows] for c in columns]
            for column in times:
                index = columns.index(column)
                values[index] = _times(values[index], DB_TIME)
            con.executemany(sql, sorted(zip(*values, strict=True)))
            self.counts[table] += len(rows)

        self._put(job)

    def events(
        self,
        ev_t: list[int],
        ev_msg: list[str],
        ev_actor: list[str | None],
        tg_ev: list[int],
        tg: list[tuple],
        keep_after: int | None,
    ) -> None:
        n, m = len(ev_t), len(tg)
        if n == 0:
            return
        ids = _bulk_ids(self.gen, n + m)

        def job(con: sqlite3.Connection) -> None:
            events = pl.DataFrame(
                {
                    "id": ids[:n],
                    "message": ev_msg,
                    "recorded_at": pl.Series(ev_t, dtype=pl.Int64),
                    "actor_user_id": pl.Series(ev_actor, dtype=pl.String),
                }
            ).with_row_index("e")
            kind, entity, name, project, run, fleet, _ = zip(*tg, strict=True)
            targets = pl.DataFrame(
                {
                    "id": ids[n:],
                    "e": pl.Series(tg_ev, dtype=pl.UInt32),
                    "entity_project_id": pl.Series(project, dtype=pl.String),
                    "entity_type": pl.Series(kind, dtype=pl.String),
                    "entity_id": pl.Series(entity, dtype=pl.String),
                    "entity_name": pl.Series(name, dtype=pl.String),
                    "entity_run_id": pl.Series(run, dtype=pl.String),
                    "entity_fleet_id": pl.Series(fleet, dtype=pl.String),
                }
            )
            if keep_after is not None:
                events = events.filter(pl.col("recorded_at") >= keep_after)
                targets = targets.join(events.select("e"), on="e", how="semi")
            targets = targets.with_columns(
                pl.col("e").replace_strict(events["e"], events["id"]).alias("event_id")
            )
            events = events.with_columns(
                pl.col("recorded_at").cast(pl.Datetime("us")).dt.strftime(DB_TIME)
            ).sort("id")
            targets = targets.sort("id")
            con.executemany(
                "INSERT INTO events (id, message, recorded_at, actor_user_id) VALUES (?, ?, ?, ?)",
                events.select("id", "message", "recorded_at", "actor_user_id").iter_rows(),
            )
            con.executemany(
                "INSERT INTO event_targets (id, event_id, entity_project_id, entity_type, "
                "entity_id, entity_name, entity_run_id, entity_fleet_id, entity_gateway_id) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL)",
                targets.select(
                    "id",
                    "event_id",
                    "entity_project_id",
                    "entity_type",
                    "entity_id",
                    "entity_name",
                    "entity_run_id",
                    "entity_fleet_id",
                ).iter_rows(),
            )
            self.counts["events"] += events.height
            self.counts["event_targets"] += targets.height

        self._put(job)

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error


_WORD = re.compile(r"\s*\S+\s*")


def _divide_line(text: str, width: int) -> list[int]:
    """rich/_wrap.py divide_line for single-cell text: where rich breaks a line."""
    breaks: list[int] = []
    offset = 0
    for match in _WORD.finditer(text):
        start, word = match.start(), match.group()
        length = len(word.rstrip())
        if width - offset >= length:
            offset += len(word)
        elif length > width:
            chunks = [word[i : i + width] for i in range(0, len(word), width)]
            for i, chunk in enumerate(chunks):
                if start:
                    breaks.append(start)
                if i == len(chunks) - 1:
                    offset = len(chunk)
                else:
                    start += len(chunk)
        elif offset and start:
            breaks.append(start)
            offset = len(word)
    return breaks


def _fold_exact(text: str, width: int) -> list[str]:
    out = []
    for hard in text.split("\n"):
        hard = hard.expandtabs(8)
        cuts = [0, *_divide_line(hard, width), len(hard)]
        for a, b in pairwise(cuts):
            piece = hard[a:b]
            if len(piece) > width:
                trailing = len(piece) - len(piece.rstrip())
                piece = piece[: len(piece) - min(trailing, len(piece) - width)]
            out.append(piece[:width])
    return out


def rich_fold(text: str, width: int) -> list[str]:
    """The message column as rich folds it at `width` cells (words wrap at spaces, the space
    at a wrap is dropped, a token longer than the column is cut). Fast path for single-spaced
    text; anything else goes through the port of rich's divide_line."""
    if "  " in text or "\n" in text or "\t" in text or text.startswith(" "):
        return _fold_exact(text, width)
    out = []
    start = 0
    n = len(text)
    while n - start > width:
        cut = text.rfind(" ", start, start + width + 1)
        if cut <= start:
            return _fold_exact(text, width)
        out.append(text[start:cut])
        start = cut + 1
    out.append(text[start:])
    return out


class _Logs:
    """The server's stdout in each layout of reference 9.2, written as records arrive."""

    def __init__(self, folder: Path, formats: Iterable[str], width: int, zone: str):
        folder.mkdir(parents=True, exist_ok=True)
        self.formats = tuple(formats)
        unknown = set(self.formats) - set(LOG_FORMATS)
        if unknown:
            raise ValueError(f"unknown log formats: {sorted(unknown)}")
        if width < 40:
            raise ValueError("rich_width below 40 columns is not supported")
        self.width = width
        self.zone = zone
        self.paths = {f: folder / f"server.{f}.log" for f in self.formats}
        self.files = {
            f: open(p, "w", encoding="utf-8", newline="\n")  # noqa: SIM115
            for f, p in self.paths.items()
        }
        self.lines: Counter[str] = Counter()
        self.records = 0
        self.last_stamp = None
        self.rich_path = [f"{name}:{line} " for name, line in _LOGGERS]

    def write(self, records: list[tuple[int, int, int, str]]) -> None:
        if not records:
            return
        self.records += len(records)
        times = [r[0] for r in records]
        if "standard" in self.files or "json" in self.files:
            frame = pl.DataFrame(
                {
                    "t": pl.Series(times, dtype=pl.Int64).cast(pl.Datetime("us")),
                    "kind": pl.Series([r[2] for r in records], dtype=pl.Int64),
                    "message": pl.Series([r[3] for r in records], dtype=pl.String),
                }
            )
            local = pl.col("t")
            if self.zone != "UTC":
                local = local.dt.replace_time_zone("UTC").dt.convert_time_zone(self.zone)
            level = pl.col("kind").replace_strict(_LEVEL_OF, return_dtype=pl.String)
            logger = pl.col("kind").replace_strict(_LOGGER_OF, return_dtype=pl.String)
            for fmt in ("standard", "json"):
                if fmt not in self.files:
                    continue
                if fmt == "standard":
                    line = pl.concat_str(
                        level,
                        pl.lit(" "),
                        local.dt.strftime("%Y-%m-%dT%H:%M:%S%.3f"),
                        pl.lit(" "),
                        logger,
                        pl.lit(" "),
                        pl.col("message"),
                    )
                else:
                    message = (
                        pl.col("message")
                        .str.replace_all("\\", "\\\\", literal=True)
                        .str.replace_all('"', '\\"', literal=True)
                    )
                    line = pl.concat_str(
                        pl.lit('{"timestamp": "'),
                        local.dt.strftime("%Y-%m-%d %H:%M:%S,%3f"),
                        pl.lit('", "logger": "'),
                        logger,
                        pl.lit('", "level": "'),
                        level,
                        pl.lit('", "message": "'),
                        message,
                        pl.lit('"}'),
                    )
                text = frame.select(line.str.join("\n")).item()
                if fmt == "json" and not text.isascii():
                    text = "\n".join(
                        json.dumps({"timestamp": ts, "logger": lg, "level": lv, "message": m})
                        for ts, lg, lv, m in frame.select(
                            local.dt.strftime("%Y-%m-%d %H:%M:%S,%3f"), logger, level, "message"
                        ).iter_rows()
                    )
                self.files[fmt].write(text + "\n")
                self.lines[fmt] += len(records)
        if "rich" in self.files:
            stamps = _times(times, "[%H:%M:%S]", self.zone)
            width = self.width
            column = width - 20
            blank = " " * 10
            indent = " " * 20
            last = self.last_stamp
            out = []
            for stamp, (_, _, k, m) in zip(stamps, records, strict=True):
                shown = blank if stamp == last else stamp
                last = stamp
                pieces = rich_fold(self.rich_path[k] + m, column)
                level = "WARNING " if k == 3 else "INFO    "
                out.append(f"{shown} {level} {pieces[0]}".ljust(width))
                for piece in pieces[1:]:
                    out.append((indent + piece).ljust(width))
            self.last_stamp = last
            self.files["rich"].write("\n".join(out) + "\n")
            self.lines["rich"] += len(out)

    def close(self) -> None:
        for handle in self.files.values():
            handle.close()


# ---------------------------------------------------------------------------------------------
# entry point

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
    sim = _Sim(tpl, rng.getrandbits(64), start_us, end_us)
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


def _static_rows(sim: _Sim, db: _Database) -> None:
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


def main(argv: Sequence[str] | None = None) -> None:
    """python -m analyzer.synth OUT --runs N [--seed S] [--days D] [--tz ZONE] ..."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m analyzer.synth", description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--days", type=float, default=None)
    parser.add_argument("--projects", type=int, default=None)
    parser.add_argument("--tz", default="UTC", help="zone of the log times (IANA name)")
    parser.add_argument("--rich-width", type=int, default=80)
    parser.add_argument("--formats", default=",".join(LOG_FORMATS))
    parser.add_argument("--events-ttl-days", type=float, default=None)
    parser.add_argument("--unique-names", action="store_true")
    args = parser.parse_args(argv)
    summary = synthesize(
        args.out,
        args.runs,
        args.seed,
        log_formats=[f for f in args.formats.split(",") if f],
        rich_width=args.rich_width,
        log_tz=args.tz,
        days=args.days,
        projects=args.projects,
        events_ttl_days=args.events_ttl_days,
        unique_names=args.unique_names,
    )
    print(
        f"{summary.runs} runs in {summary.seconds:.1f}s ({summary.runs / summary.seconds:.0f} "
        f"runs/s, {summary.log_records / summary.seconds:.0f} log records/s) -> {summary.out}"
    )
    print("scenarios:", json.dumps(summary.scenarios))
    print("categories:", json.dumps(summary.categories))
    print("rows:", json.dumps(summary.rows))
    print("log lines:", json.dumps(summary.log_lines))


if __name__ == "__main__":
    main()
