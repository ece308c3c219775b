"""The words and numbers of the synthetic world: units, dstack's loggers, names, commands."""

from __future__ import annotations

from datetime import UTC, datetime

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
