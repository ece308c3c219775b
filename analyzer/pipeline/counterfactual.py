"""What a well-behaved rollout would have done with the same timeline: two named models.

Both keep the old replicas serving while the new deployment has not proven itself, which is
exactly what dstack did not do. They differ in when they give up on the new deployment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from analyzer.contract import Counterfactual, ModelDescription


@dataclass(frozen=True)
class RolloutFacts:
    """The timeline facts a model needs, measured by the detector and impact stages."""

    update_at: datetime | None  # the update that started the rollout
    culprit_failures: list[datetime] = field(default_factory=list)  # sorted
    victims: int = 0
    lost_replica_seconds: float | None = None


@dataclass(frozen=True)
class KubernetesRollingUpdate:
    """Deployment strategy RollingUpdate: the old ReplicaSet is never scaled below what the new
    one has made available (maxUnavailable 0), so a new pod that never becomes available stops
    nothing; the rollout is marked failed (ProgressDeadlineExceeded) once it has made no
    progress for progressDeadlineSeconds, and the old pods keep serving."""

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
        start = facts.update_at or (facts.culprit_failures[0] if facts.culprit_failures else None)
        declared = start + timedelta(seconds=self.progress_deadline_seconds) if start else None
        return Counterfactual(
            model=self.name,
            parameters=self.parameters(),
            declared_failed_at=declared,
            rolled_back=False,
            old_replicas_kept=facts.victims,
            serving_seconds_kept=facts.lost_replica_seconds,
            explanation=(
                "the new replica never became available, so no old replica would have been "
                f"stopped; the rollout is marked failed {self.progress_deadline_seconds} s after "
                "it started without progress, and the old replicas keep serving"
            ),
        )


@dataclass(frozen=True)
class CircuitBreakerRollback:
    """ECS-style deployment circuit breaker with rollback: the deployment is declared failed
    when its failed launches reach the threshold, then rolled back to the last completed
    deployment, whose tasks were never stopped. A failure dstack will not retry is final, so
    by default the first one trips the breaker."""

    failure_threshold: int = 1
    name: str = "ecs-circuit-breaker-rollback"

    def parameters(self) -> dict[str, float | int | str]:
        return {"failure_threshold": self.failure_threshold, "rollback": "enabled"}

    def evaluate(self, facts: RolloutFacts) -> Counterfactual:
        failures = facts.culprit_failures
        declared = failures[min(self.failure_threshold, len(failures)) - 1] if failures else None
        short = len(failures) < self.failure_threshold
        return Counterfactual(
            model=self.name,
            parameters=self.parameters(),
            declared_failed_at=declared,
            rolled_back=True,
            old_replicas_kept=facts.victims,
            serving_seconds_kept=facts.lost_replica_seconds,
            explanation=(
                "the breaker trips at the culprit's failure"
                if not short
                else f"only {len(failures)} failure(s) observed, fewer than the threshold"
            )
            + "; the deployment is rolled back to the last completed one and its replicas, "
            "never stopped, keep serving",
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
