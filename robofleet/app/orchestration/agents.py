"""A run's edge agents on simulated robots: Ray actors placed on the robots' bundles.

Each leased robot of the simulated fleet gets an ``edge_agent`` (``robofleet.app.sim.fleet.
SimRobotWorker``) with the run's options, its own spool under ``<run-dir>/robots/<name>`` and a
seed that keeps robots on different goal variations. An agent that dies is restarted with
backoff (``orchestration`` restart policy); too many deaths in the window are a crash loop
that ends the run. At the end every agent stops at a safe boundary, returns its report and
drains its spool.

This is the Meta-World wiring of today's runs, kept as it was: robot computers that the cloud
assigns to runs over their Control stream will replace it.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from robofleet.app.orchestration.supervisor import CrashLoop, CrashWindow, RestartPolicy
from robofleet.app.sim.fleet import SimRobotWorker, spool_dir

log = logging.getLogger(__name__)


class SimAgents:
    """The edge agents of one run's robots, by robot name.

    Args:
        ctx: the cloud's shared services (``robofleet.app.orchestration.run.CloudContext``).
        run_id / run_dir: the run.
        options: ``edge_agent.build.AgentOptions`` fields every agent of the run shares.
        control_hz: the run's control rate.
        placement: robot name -> its Ray scheduling strategy (the robot's bundle).
        on_event: records an event of the run (``kind, **data``).
    """

    def __init__(
        self,
        ctx: Any,
        run_id: str,
        run_dir: Path,
        options: dict[str, Any],
        control_hz: float,
        placement: Callable[[str], Any],
        on_event: Callable[..., None],
    ) -> None:
        self.ctx, self.run_id, self.run_dir = ctx, run_id, run_dir
        self.options = options
        self.control_hz = control_hz
        self.placement = placement
        self.on_event = on_event
        self.actors: dict[str, tuple[Any, Any, int]] = {}  # name -> (actor, run ref, index)
        self.reports: dict[str, dict[str, float]] = {}  # name -> its final EdgeAgent.report()
        self._policy: RestartPolicy = ctx.agent_restarts
        self._crashes: dict[str, CrashWindow] = {}
        self._backoff = self._policy.backoff()

    def __len__(self) -> int:
        return len(self.actors)

    @property
    def names(self) -> list[str]:
        return list(self.actors)

    def _seed(self, index: int, spool: Path) -> int:
        from edge_agent.episodes import EpisodeLog

        episode = EpisodeLog(spool).next_index
        # Meta-World's goal variation is seed % 50 and 100_000 is a multiple of 50: without the
        # 13 * index offset every robot would replay the same variation at the same time (a
        # quarter of the variety per env step with 4 robots, measured in bench efficiency).
        return 100_000 * (index + 1) + 13 * index + int(episode)

    def start(self, name: str, index: int) -> None:
        """Start the edge agent of robot ``name`` (the ``index``-th of the run)."""
        import ray

        from edge_agent.build import AgentOptions
        from edge_agent.credential import credential_path

        ctx = self.ctx
        spool = self.run_dir / "robots" / name
        spool.mkdir(parents=True, exist_ok=True)
        if not credential_path(spool).exists():
            home = spool_dir(ctx.settings.data_dir, name)  # where the robot enrolled
            shutil.copy2(credential_path(home), credential_path(spool))
        edge = ctx.settings.edge.model_copy(
            update={
                "control_hz": self.control_hz,
                "heartbeat_interval_s": ctx.settings.hal.heartbeat_interval_s,
            }
        ).model_dump(mode="json")
        opts = AgentOptions(
            robot_name=name,
            run_id=self.run_id,
            server=ctx.server_address,
            spool_dir=spool,
            **self.options,
        )
        actor_options: dict[str, Any] = {"max_concurrency": 4, "num_cpus": 0}
        Worker: Any = ray.remote(**actor_options)(SimRobotWorker)
        actor = Worker.options(scheduling_strategy=self.placement(name)).remote(
            edge, ctx.settings.comms.model_dump(mode="json"), opts, self._seed(index, spool)
        )
        self.actors[name] = (actor, actor.run.remote(None), index)
        if ctx.host is not None:
            ctx.host.busy[name] = time.monotonic() + 60.0
        self.on_event("edge_agent.started", robot=name)

    def wait_ready(
        self, timeout_s: float, go_on: Callable[[], bool], meanwhile: Callable[[], None]
    ) -> None:
        """Wait until every started agent runs its loop (robot connected, policy built,
        uplink and weight subscription up, waiting for the first version), while ``go_on()``;
        ``meanwhile()`` between polls. One still starting after ``timeout_s`` is noted (event
        ``edge_agent.slow_start``) and joins late."""
        import ray

        deadline = time.monotonic() + timeout_s
        waiting = set(self.actors)
        while waiting and go_on():
            calls = {name: self.actors[name][0].is_running.remote() for name in waiting}
            try:
                answers = ray.get(list(calls.values()), timeout=5.0)
            except ray.exceptions.GetTimeoutError:
                answers = [False] * len(calls)
            except ray.exceptions.RayError:  # an agent died starting: supervision restarts it
                break
            waiting = {name for name, up in zip(calls, answers, strict=True) if not up}
            if not waiting or time.monotonic() > deadline:
                break
            meanwhile()
            time.sleep(0.25)
        if waiting:
            self.on_event("edge_agent.slow_start", robots=sorted(waiting), waited_s=timeout_s)

    def supervise(self) -> None:
        """Restart every agent whose run ended, with backoff.

        Raises:
            CrashLoop: an agent died too often within the restart policy's window.
        """
        import ray

        for name, (actor, ref, index) in list(self.actors.items()):
            done, _ = ray.wait([ref], timeout=0)
            if not done:
                continue
            try:
                ray.get(ref)
                why = "returned"
            except Exception as exc:
                why = f"{type(exc).__name__}: {str(exc)[:200]}"
            crashes = self._crashes.setdefault(name, CrashWindow(self._policy))
            n = crashes.record(time.monotonic())
            self.on_event("edge_agent.died", robot=name, why=why)
            del self.actors[name]
            try:
                ray.kill(actor)
            except Exception:
                pass
            if crashes.looping:
                raise CrashLoop(f"edge agent of {name} crashed {n} times: {why}")
            # The delay grows with the crashes in the window (n - 1 before this one).
            time.sleep(self._backoff.delay(n - 1))
            self.start(name, index)
            self.on_event("edge_agent.restarted", robot=name)

    def stop(self) -> None:
        """Stop every agent at a safe boundary, keep its report, drain its spool, end it."""
        import ray

        refs = []
        for actor, ref, _i in self.actors.values():
            actor.stop.remote()
            refs.append(ref)
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=30)
        for name, (_actor, ref, _i) in self.actors.items():
            try:
                self.reports[name] = dict(ray.get(ref, timeout=1))
            except Exception as exc:  # an agent that died has no report; its heartbeats stay
                log.info("no final report from the edge agent of %s: %s", name, exc)
        for name, (actor, _ref, _i) in list(self.actors.items()):
            try:
                ray.get(actor.drain.remote(30.0), timeout=40)
                ray.get(actor.close.remote(), timeout=30)
            except Exception as exc:
                log.warning("closing the edge agent of %s: %s", name, exc)
            ray.kill(actor)
            if self.ctx.host is not None:
                self.ctx.host.busy.pop(name, None)
        self.actors.clear()
