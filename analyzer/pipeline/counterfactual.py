"""What a well-behaved rollout would have done with the same timeline: two named models, each
told from the run's own sequence (was there an update, was it a new version or applied in place,
which deployment's replica failed and how, did a new replica become available first).

Both keep the old replicas serving while the new deployment has not proven itself, which is
exactly what dstack did not do: `process_terminating_run` (server/background/pipeline_tasks/
runs/terminating.py) stops every job of a run that failed (JOB_FAILED), whatever deployment it
belongs to. They differ in when they give up on the new deployment. A model that has no rollout
to act on (no update, or one applied in place) says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property

from analyzer.contract import Counterfactual, ModelDescription


@dataclass(frozen=True)
class FailedReplica:
    """A culprit as the models read it."""

    deployment_num: int | None
    failed_at: datetime | None
    termination_reason: str | None
    exit_status: int | None = None


@dataclass(frozen=True)
class RolloutFacts:
    """The run's sequence, measured by the detector and impact stages."""

    # The deployment the last update started (None, or 0: the run's first submission, no update).
    update_deployment: int | None
    update_at: datetime | None  # when the update was applied (None: not recorded)
    # Replicas of an older deployment were still running when the first culprit failed: the
    # update's rollout was in progress (else it had completed before the failure).
    older_running: bool = False
    # The update reached the running replicas in place (dstack bumped their deployment_num:
    # the same job spec), so there is no new version to roll out, only replicas to add.
    in_place: bool = False
    culprits: list[FailedReplica] = field(default_factory=list)
    # When replicas of the update's deployment became available, before the first failure.
    new_available: list[datetime] = field(default_factory=list)
    victims: int = 0
    lost_replica_seconds: float | None = None
    lost_is_lower_bound: bool = False

    @property
    def updated(self) -> bool:
        return bool(self.update_deployment)

    @property
    def rollout(self) -> bool:
        """A new version was being rolled out when the failure came."""
        return self.updated and not self.in_place and self.older_running

    @cached_property
    def failed_deployments(self) -> str:
        """The deployments of the failed replicas, in words (the culprits and their slots'
        earlier failures: a long retry loop lists many)."""
        numbers = sorted({c.deployment_num for c in self.culprits if c.deployment_num is not None})
        return ", ".join(str(n) for n in numbers) or "unknown"

    @property
    def new_failed(self) -> bool:
        """A replica of the update's deployment failed (not only older ones)."""
        return self.rollout and any(
            c.deployment_num == self.update_deployment for c in self.culprits
        )


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value else "a time the evidence does not date"


def _pod_state(culprit: FailedReplica) -> str:
    """What Kubernetes would show for the failing replica."""
    reason = culprit.termination_reason or ""
    if "no_capacity" in reason:
        return "stays Pending (unschedulable: no node has room for it)"
    if reason == "container_exited_with_error":
        code = f" with code {culprit.exit_status}" if culprit.exit_status is not None else ""
        return f"crash-loops (its container exits{code}; the kubelet restarts it, CrashLoopBackOff)"
    if reason == "waiting_runner_limit_exceeded":
        return "never becomes Ready"
    return f"never becomes available ({reason or 'reason not recorded'})"


def _completed(facts: RolloutFacts) -> str:
    return (
        f"the update to deployment {facts.update_deployment} had completed before the failure "
        "(no replica of an older deployment was still running)"
    )


def _kept(facts: RolloutFacts) -> str:
    return f"the {facts.victims} replica(s) dstack stopped keep serving"


@dataclass(frozen=True)
class KubernetesRollingUpdate:
    """Deployment strategy RollingUpdate: the old ReplicaSet is never scaled below what the new
    one has made available (maxUnavailable 0), so a new pod that never becomes available stops
    nothing; the rollout is marked failed (ProgressDeadlineExceeded) once it has made no
    progress for progressDeadlineSeconds, the rollout stalls and the old pods keep serving
    (Kubernetes does not roll back by itself). A pod that fails outside a rollout is restarted
    by its kubelet; its siblings are never stopped for it."""

    max_surge: int = 1
    max_unavailable: int = 0
    progress_deadline_seconds: int = 600
    name: str = "kubernetes-rolling-update"

    def parameters(self) -> dict[str, float | int | str]:
        return {
            "maxSurge": self.max_surge,
            "maxUnavailable": self.max_unavailable,
            "progressDeadlineSeconds": self.progress_deadline_seconds,
        }

    def evaluate(self, facts: RolloutFacts) -> Counterfactual:
        applies, declared = True, None
        culprit = facts.culprits[0] if facts.culprits else FailedReplica(None, None, None)
        if not facts.updated:
            applies = False
            story = (
                f"no update: there is no rollout, so maxSurge, maxUnavailable and "
                f"progressDeadlineSeconds play no part; the failed replica of deployment "
                f"{facts.failed_deployments} {_pod_state(culprit)}, and a Deployment never "
                f"stops healthy pods because another failed: {_kept(facts)}"
            )
        elif facts.in_place:
            applies = False
            story = (
                f"the update to deployment {facts.update_deployment} reached the running "
                "replicas in place (same job spec): for a Deployment that is a scale of the same "
                "ReplicaSet, not a rollout; the added replica "
                f"{_pod_state(culprit)} and {_kept(facts)}"
            )
        elif not facts.rollout:
            applies = False
            story = (
                f"{_completed(facts)}: no rollout is in progress; the failed replica "
                f"{_pod_state(culprit)}, and a Deployment never stops healthy pods because "
                f"another failed: {_kept(facts)}"
            )
        elif not facts.new_failed:
            story = (
                f"the replica that failed belongs to the old deployment "
                f"{facts.failed_deployments}, not to the rollout of deployment "
                f"{facts.update_deployment}: the kubelet restarts it (or the old ReplicaSet, "
                "being scaled down, simply loses it) and the rollout goes on; nothing is "
                f"declared failed and {_kept(facts)}"
            )
        else:
            progress = max([facts.update_at, *facts.new_available], key=_sort_key)
            declared = (
                progress + timedelta(seconds=self.progress_deadline_seconds) if progress else None
            )
            made = (
                f"{len(facts.new_available)} new pod(s) became available (the last at "
                f"{_when(max(facts.new_available))}) and as many old pods were scaled down; then "
                if facts.new_available
                else ""
            )
            story = (
                f"the update at {_when(facts.update_at)} surges {self.max_surge} new pod of "
                f"deployment {facts.update_deployment} and scales the old ReplicaSet down only "
                f"as new pods become available (maxUnavailable {self.max_unavailable}); {made}"
                f"the new pod {_pod_state(culprit)}, so no further old pod is stopped; "
                f"{self.progress_deadline_seconds} s after the last progress "
                f"({_when(declared)}) the rollout is marked ProgressDeadlineExceeded and stalls, "
                f"with no rollback unless someone runs `kubectl rollout undo`; {_kept(facts)}"
            )
        return Counterfactual(
            model=self.name,
            parameters=self.parameters(),
            applies=applies,
            declared_failed_at=declared,
            rolled_back=False,
            old_replicas_kept=facts.victims,
            serving_seconds_kept=facts.lost_replica_seconds,
            serving_seconds_kept_is_lower_bound=facts.lost_is_lower_bound,
            explanation=story,
        )


def _sort_key(value: datetime | None) -> float:
    return value.timestamp() if value else float("-inf")


@dataclass(frozen=True)
class CircuitBreakerRollback:
    """ECS-style deployment circuit breaker with rollback: the deployment is declared failed
    when its failed launches reach the threshold, then rolled back to the last completed
    deployment, whose tasks were never stopped (minimumHealthyPercent 100). A failure dstack
    will not retry is final, so by default the first one trips the breaker. The breaker watches
    a deployment's new tasks only: a task that fails outside a deployment is replaced by the
    service scheduler."""

    failure_threshold: int = 1
    minimum_healthy_percent: int = 100
    name: str = "ecs-circuit-breaker-rollback"

    def parameters(self) -> dict[str, float | int | str]:
        return {
            "failure_threshold": self.failure_threshold,
            "minimumHealthyPercent": self.minimum_healthy_percent,
            "rollback": "enabled",
        }

    def evaluate(self, facts: RolloutFacts) -> Counterfactual:
        applies, declared, rolled_back = True, None, False
        if not facts.updated:
            applies = False
            story = (
                "no update: no deployment is in progress, so the breaker has nothing to watch "
                "and there is nothing to roll back to; the service scheduler replaces the "
                f"failed task of deployment {facts.failed_deployments} and {_kept(facts)}"
            )
        elif facts.in_place:
            applies = False
            story = (
                f"the update to deployment {facts.update_deployment} reached the running "
                "replicas in place (same job spec): a desired-count change, no new task "
                "definition, so no deployment for the breaker to watch; the scheduler keeps "
                f"trying to place the added task and {_kept(facts)}"
            )
        elif not facts.rollout:
            applies = False
            story = (
                f"{_completed(facts)}: no deployment is in progress for the breaker to watch; "
                f"the service scheduler replaces the failed task and {_kept(facts)}"
            )
        elif not facts.new_failed:
            story = (
                f"the task that failed belongs to the old deployment "
                f"{facts.failed_deployments}: the breaker counts failures of the new "
                f"deployment {facts.update_deployment}'s tasks only, so it does not trip; "
                f"nothing is rolled back and {_kept(facts)}"
            )
        else:
            new_culprits = [
                c for c in facts.culprits if c.deployment_num == facts.update_deployment
            ]
            dated = sorted(c.failed_at for c in new_culprits if c.failed_at)
            tripped = len(new_culprits) >= self.failure_threshold
            declared = (
                dated[self.failure_threshold - 1]
                if tripped and len(dated) == len(new_culprits)
                else None
            )
            rolled_back = tripped
            replaced = (
                f"; the {len(facts.new_available)} new task(s) that had become healthy are "
                "drained in the rollback and replaced by tasks of the old deployment"
                if facts.new_available
                else ""
            )
            story = (
                (
                    f"the breaker trips at the failure of deployment {facts.update_deployment}'s "
                    f"task at {_when(declared)} (threshold {self.failure_threshold}) and rolls "
                    "back to the last completed deployment, whose tasks were never stopped "
                    f"(minimumHealthyPercent {self.minimum_healthy_percent}){replaced}"
                )
                if tripped
                else (
                    f"only {len(new_culprits)} failure(s) of the new deployment observed, fewer "
                    f"than the threshold {self.failure_threshold}: the deployment stays in "
                    "progress and its old tasks keep serving"
                )
            ) + f"; {_kept(facts)}"
        return Counterfactual(
            model=self.name,
            parameters=self.parameters(),
            applies=applies,
            declared_failed_at=declared,
            rolled_back=rolled_back,
            old_replicas_kept=facts.victims,
            serving_seconds_kept=facts.lost_replica_seconds,
            serving_seconds_kept_is_lower_bound=facts.lost_is_lower_bound,
            explanation=story,
        )


MODELS = (KubernetesRollingUpdate(), CircuitBreakerRollback())


def describe_models() -> list[ModelDescription]:
    return [
        ModelDescription(
            name=model.name,
            parameters=model.parameters(),
            description=" ".join((model.__doc__ or "").split()),
        )
        for model in MODELS
    ]


def evaluate_all(facts: RolloutFacts) -> list[Counterfactual]:
    return [model.evaluate(facts) for model in MODELS]
