"""The simulation's core: randomness, ids, events, log records, projects, runs and jobs."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from json.encoder import encode_basestring_ascii as _encode_string  # type: ignore[attr-defined]

from analyzer.synth.constants import (
    FLEET_NAMES,
    IMAGES,
    NAME_SUFFIXES,
    PROJECT_NAMES,
    RUN_NAMES,
    SERVICE_COMMANDS,
    TASK_COMMANDS,
    TASK_NAMES,
    US,
    USER_NAMES,
)
from analyzer.synth.entities import _Fleet, _Job, _Project, _Run, _target, _User, _uuid4, dashed
from analyzer.synth.templates import Templates, _dumps


class World:
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
