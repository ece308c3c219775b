"""A job's stages, a run's deployments, rollouts and failures (reference 7)."""

from __future__ import annotations

import math
from typing import Any

from analyzer.synth.constants import (
    COULD_NOT_STOP,
    FINISHED,
    IMAGES,
    NO_CAPACITY_MESSAGE,
    SERVICE_COMMANDS,
    US,
)
from analyzer.synth.entities import _Instance, _Job, _Run, _target, _User
from analyzer.synth.simulator import World


class Lifecycle(World):
    """Moves jobs through dstack's stages and runs through deployments."""

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
