"""The simulated users, projects, fleets, instances, runs and jobs."""

from __future__ import annotations

from analyzer.synth.constants import _words


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
