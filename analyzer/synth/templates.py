"""The captures' schema, rows and JSON documents the synthetic server copies."""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _ro(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def _rows(con: sqlite3.Connection, sql: str, params: Sequence = ()) -> list[dict[str, Any]]:
    cur = con.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _dumps(value: Any) -> str:
    """JSON as pydantic's model_dump_json writes it (compact, UTF-8)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


SHIPPED = Path(__file__).with_name("data") / "templates.json"
# the capture rows a synthetic server copies: (attribute, capture, query)
ROWS = {
    "user_admin": ("seed", "SELECT * FROM users WHERE global_role = 'ADMIN'"),
    "user": ("seed", "SELECT * FROM users WHERE global_role = 'USER'"),
    "project": ("seed", "SELECT * FROM projects WHERE name != 'main'"),
    "member_admin": ("seed", "SELECT * FROM members WHERE project_role = 'ADMIN'"),
    "member_user": ("seed", "SELECT * FROM members WHERE project_role = 'USER'"),
    "backend": ("seed", "SELECT * FROM backends"),
    "repo": ("seed", "SELECT * FROM repos"),
    "fleet": ("seed", "SELECT * FROM fleets"),
    "instance": ("seed", "SELECT * FROM instances"),
    "run_service": ("seed", "SELECT * FROM runs"),
    "job_service": ("seed", "SELECT * FROM jobs WHERE job_provisioning_data IS NOT NULL"),
    "run_task": ("task-fails", "SELECT * FROM runs"),
    "job_task": ("task-fails", "SELECT * FROM jobs"),
    "probe": ("multi-replica-crash", "SELECT * FROM probes"),
}


def read_captures(root: Path) -> dict[str, Any]:
    """What the generator takes from a folder of dstack 0.22.5 captures (each scenario with its
    server.db), as JSON-ready values: the schema, one row per kind, the probe documents and
    the key pairs of every user and project. `SHIPPED` holds this for tests/data's captures,
    so an installed package needs no checkout."""
    if not (root / "seed" / "server.db").is_file():
        raise FileNotFoundError(f"{root} holds no dstack 0.22.5 capture set (no seed/server.db)")
    facts: dict[str, Any] = {}
    seed = _ro(root / "seed" / "server.db")
    facts["schema"] = [
        [kind, name, sql]
        for kind, name, sql in seed.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid"
        )
    ]
    facts["alembic_version"] = seed.execute("SELECT version_num FROM alembic_version").fetchone()[0]
    tables = [name for kind, name, _ in facts["schema"] if kind == "table"]
    facts["columns"] = {
        t: [c[1] for c in seed.execute(f'PRAGMA table_info("{t}")').fetchall()] for t in tables
    }
    seed.close()
    for name, (capture, query) in ROWS.items():
        con = _ro(root / capture / "server.db")
        facts[name] = _rows(con, query)[0]
        con.close()
    crash = _ro(root / "multi-replica-crash" / "server.db")
    crash_spec = json.loads(crash.execute("SELECT run_spec FROM runs").fetchone()[0])
    facts["run_probe"] = crash_spec["configuration"]["probes"][0]
    crash_job = json.loads(crash.execute("SELECT job_spec_data FROM jobs").fetchone()[0])
    facts["job_probe"] = crash_job["probes"][0]
    crash.close()
    users: list[list[str]] = []
    projects: list[list[str]] = []
    for db in sorted(root.glob("*/server.db")):
        con = _ro(db)
        for priv, pub in con.execute(
            "SELECT ssh_private_key, ssh_public_key FROM users ORDER BY name"
        ):
            if priv and [priv, pub] not in users:
                users.append([priv, pub])
        for priv, pub in con.execute(
            "SELECT ssh_private_key, ssh_public_key FROM projects ORDER BY name"
        ):
            if [priv, pub] not in projects:
                projects.append([priv, pub])
        con.close()
    facts["user_keys"], facts["project_keys"] = users, projects
    return facts


def write_shipped(root: Path) -> None:
    """Refresh the shipped `SHIPPED` from the captures in `root` (tests/data/captures/v0.22.5)."""
    SHIPPED.parent.mkdir(exist_ok=True)
    text = json.dumps(read_captures(root), indent=1, ensure_ascii=False)
    SHIPPED.write_text(text + "\n", encoding="utf-8")


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
        given = root or os.environ.get("DSTACK_AUDIT_CAPTURES")
        if given:
            self.root = Path(given)
            facts = read_captures(self.root)
        else:
            self.root = SHIPPED
            facts = json.loads(SHIPPED.read_text(encoding="utf-8"))
        self.schema = [tuple(entry) for entry in facts["schema"]]
        self.alembic_version = facts["alembic_version"]
        self.columns = facts["columns"]
        for name in ROWS:
            setattr(self, name, facts[name])
        self.run_probe = facts["run_probe"]
        self.job_probe = facts["job_probe"]
        # key pairs of every user and project of every capture (no key generation here)
        self.user_keys: list[tuple[str, str]] = [tuple(pair) for pair in facts["user_keys"]]
        self.project_keys: list[tuple[str, str]] = [tuple(pair) for pair in facts["project_keys"]]

        run_spec = json.loads(self.run_service["run_spec"])
        task_spec = json.loads(self.run_task["run_spec"])
        conf = ("configuration",)
        head = [("run_name",), (*conf, "name"), (*conf, "commands"), (*conf, "image")]
        scaling = [(*conf, "replicas"), (*conf, "probes")]
        tail = [(*conf, "priority"), (*conf, "retry"), (*conf, "env"), ("ssh_key_pub",)]
        self.run_spec_service = _Doc(run_spec, [*head, *scaling, *tail])
        self.task_spec_has_replicas = "replicas" in task_spec["configuration"]
        self.run_spec_task = _Doc(
            task_spec, [*head, *scaling, *tail] if self.task_spec_has_replicas else [*head, *tail]
        )
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
