"""A finished run's rows (runs, jobs, probes) and its truth.json entry."""

from __future__ import annotations

import json
from datetime import timedelta

from analyzer.synth.constants import EPOCH, FINISHED, US
from analyzer.synth.database import _job_order
from analyzer.synth.entities import _Instance, _Job, _Run, dashed
from analyzer.synth.lifecycle import Lifecycle
from analyzer.synth.templates import _dumps


class Records(Lifecycle):
    """Turns a finished run into its final rows and its ground truth."""

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
