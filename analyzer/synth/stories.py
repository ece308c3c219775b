"""The captured stories (reference 7, 11.4), one `sc_*` method each."""

from __future__ import annotations

from analyzer.synth.constants import US
from analyzer.synth.entities import _Job, _Run
from analyzer.synth.records import Records


class Simulation(Records):
    """Every story the generator can tell, on top of the simulator."""

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
