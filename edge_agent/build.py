"""Assemble an edge agent from settings: driver, policy runner, operator, spool, comms links.

Used by the CLI (``robofleet edge``) and the Ray actor alike, so both run the same agent.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_agent.agent import EdgeAgent
from edge_agent.config import EdgeSettings
from edge_agent.credential import (
    RobotCredential,
    credential_path,
    read_credential,
    write_credential,
)
from edge_agent.gating import HGDaggerGate
from edge_agent.help import HelpDesk, HelpSettings
from edge_agent.help_risk import make_risk
from edge_agent.inference import LocalPolicyRunner, RemotePolicyRunner
from edge_agent.operators import Expert, make_operator
from edge_agent.rewards import make_reward_source
from edge_agent.spool import Spool
from edge_agent.uplink import UplinkWorker

if TYPE_CHECKING:
    from comms.robot.client import EdgeClient
    from comms.robot.receiver import WeightReceiver
    from comms.robot.shard_route import ShardRouter
    from edge_agent.site_relay import RelayLink

log = logging.getLogger(__name__)


@dataclass
class AgentOptions:
    """What differs between robots of one fleet (the rest is settings).

    Attributes:
        robot_name: the robot's name (hal's ``validate_name`` rules).
        tasks: tasks this robot runs, in turn (empty: the driver's own).
        driver: the robot's ``hal`` driver kind (``hal.drivers.driver_class``: a built-in
            kind or a lab's plugin, ``module.path:ClassName`` or an entry point); the run-wide
            episode options below (``tasks``, ``seed``, ``max_episode_steps``,
            ``terminate_on_success``) reach it where its kind takes them
            (``hal.driver.RobotDriver.episode_options``).
        run_id: the run the steps belong to.
        server: cloud gRPC ``host:port``; None runs offline (spool only).
        token: one-time enrollment token (only needed before the first credential exists).
        operator: ``none``, ``scripted``, ``keyboard``, ``gamepad``, ``remote`` (the dashboard's
            operator station), ``lerobot`` or ``spacemouse``.
        operator_options: the lerobot operator's options (``type`` and the LeRobot
            teleoperator config's fields, ``edge_agent.teleop``) or the spacemouse's
            (``edge_agent.spacemouse``).
        max_episode_steps: episode length: a driver that takes it ends episodes there; for
            other drivers the agent truncates them there unless ``edge.max_episode_steps`` is
            set.
        spool_dir: overrides ``edge.spool_dir`` (one directory per robot).
        hidden: hidden width of the local fallback MLP (weights without a policy card; a
            version's card, see ``edge_agent.policy_build``, decides the policy otherwise).
        seed: episode seed of the driver's first episode; each further episode takes the
            next integer (for a driver that takes it; Meta-World's picks goal variation
            ``seed % 50`` and seeds the simulator with it, so robots of one fleet given
            different seeds, e.g. 1000 apart, replay different goals). Default 0.
        terminate_on_success: end an episode (``terminated``) when the task succeeds
            (sparse-return learners such as RECAP need success as the terminal signal).
        driver_options: keyword options of that driver (e.g. ``env_id`` for gymnasium,
            ``type`` and ``config`` for lerobot, ``joints`` for ros2).
        credential_dir: where the robot's credential is kept (default ``spool_dir``; a robot
            computer keeps one credential and one spool per run, ``edge_agent.host``).
        demonstrations: task -> demonstration episodes the operator drives first (the
            run's demonstration phase; ``edge_agent.agent``).
        reward_source: the run's ``reward.source`` (``edge_agent.rewards``): ``robot``,
            ``labels`` or ``classifier``.
        help: the run's ``help:`` (``edge_agent.help.HelpSettings`` fields; empty: never ask).
        ingest: the assignment's ingest route (a sharded run: the robot's shard endpoint and
            ticket, ``comms.robot.shard_route.Route``); empty: uploads go to ``server``.
    """

    robot_name: str
    tasks: list[str]
    driver: str
    run_id: str = "default"
    server: str | None = None
    token: str | None = None
    operator: str = "scripted"
    max_episode_steps: int = 500
    spool_dir: Path | None = None
    hidden: int = 64
    seed: int = 0
    terminate_on_success: bool = False
    driver_options: dict[str, Any] = field(default_factory=dict)
    operator_options: dict[str, Any] = field(default_factory=dict)
    demonstrations: dict[str, int] = field(default_factory=dict)
    reward_source: str = "robot"
    help: dict[str, Any] = field(default_factory=dict)
    ingest: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    credential_dir: Path | None = None


@dataclass
class BuiltAgent:
    """An agent and the background services it needs; ``close`` stops them all."""

    agent: EdgeAgent
    closers: list[Any]

    def close(self) -> None:
        for c in reversed(self.closers):
            try:
                c()
            except Exception as exc:  # closing must not hide the first error
                log.warning("closing %s failed: %s", c, exc)


def credential(
    spool_dir: Path,
    opts: AgentOptions,
    comms: Any,
    spec: dict[str, Any],
    stop: threading.Event | None = None,
) -> tuple[int, str]:
    """The robot's (id, credential): the one stored in ``spool_dir``, or enroll with
    ``opts.token`` once (waiting for an unreachable cloud, ``edge_agent.enrollment``) and
    store it (mode 0600).

    Raises:
        ValueError: no credential stored and no token.
        edge_agent.enrollment.EnrollmentRefused: the cloud refused the token or the name.
        edge_agent.enrollment.EnrollmentStopped: ``stop`` was set while waiting.
    """
    from edge_agent.enrollment import enroll_when_reachable

    stored = read_credential(spool_dir)
    if stored is not None:
        return stored.robot_id, stored.credential
    if not opts.token:
        raise ValueError(
            f"no credential in {credential_path(spool_dir)} and no --token to enroll with"
        )
    assert opts.server is not None
    robot_id, secret = enroll_when_reachable(
        opts.server, comms, opts.token, opts.robot_name, spec["robot_type"], spec, stop
    )
    write_credential(spool_dir, RobotCredential(robot_id, secret))
    return robot_id, secret


def probe_driver(opts: AgentOptions) -> Any:
    """The robot's driver, not connected: what a robot computer describes itself with."""
    driver, _tasks = _driver(opts)
    return driver


def _driver(opts: AgentOptions) -> tuple[Any, list[str]]:
    """The robot's driver (not connected) and its task names."""
    from hal.drivers import make_driver

    episode = {
        "tasks": opts.tasks,
        "max_episode_steps": opts.max_episode_steps,
        "seed": opts.seed,
        "terminate_on_success": opts.terminate_on_success,
    }
    driver = make_driver(opts.driver, opts.robot_name, episode, **opts.driver_options)
    tasks = list(opts.tasks) or list(driver.spec.tasks) or [driver.spec.robot_type]
    if "observation.state" not in driver.observation_features:
        raise ValueError(
            f"robot {opts.robot_name}: the {opts.driver} driver has no observation.state "
            f"(features {sorted(driver.observation_features)}); the edge policy acts on state"
        )
    return driver, tasks


def build_agent(edge: EdgeSettings, comms: Any, opts: AgentOptions) -> BuiltAgent:
    """Build a robot's agent from settings and options, for any ``hal`` driver
    (``opts.driver``).

    Raises:
        ValueError: unknown task/operator/driver kind, bad driver options, a scripted
            operator for a driver without an expert, or no credential and no token.
        edge_agent.enrollment.EnrollmentRefused: the cloud refused the token or the name.
    """
    from buffer.table.schema import StepSchema
    from hal.driver import ScriptedExpertDriver

    closers: list[Any] = []
    driver, tasks = _driver(opts)
    experts: dict[str, Expert] | None = None
    if opts.operator == "scripted":
        if not isinstance(driver, ScriptedExpertDriver):
            raise ValueError(
                "the scripted operator needs a driver that offers a scripted expert; a "
                f"{opts.driver} robot takes --operator keyboard, gamepad, lerobot, spacemouse or none"
            )
        experts = {t: driver.expert(t) for t in tasks}
    if "max_episode_steps" not in driver.episode_options and edge.max_episode_steps is None:
        # A driver that takes the limit ends its own episodes; the agent truncates others'.
        edge = edge.model_copy(update={"max_episode_steps": opts.max_episode_steps})
    spool_dir = opts.spool_dir or edge.spool_dir / opts.robot_name
    spool = Spool(spool_dir, edge.spool_max_bytes, edge.spool_full_policy)
    schema = StepSchema.from_features(driver.observation_features, driver.action_features)

    robot_id, client = _connect(spool_dir, opts, comms, driver.spec)
    if client is not None:
        closers.append(client.close)
    relay = None
    if client is not None and edge.relay:
        from edge_agent.site_relay import RelayLink

        relay = RelayLink(edge, comms, client)
        closers.append(relay.close)
    uplink = UplinkWorker(
        spool,
        schema,
        batch_max_steps=edge.batch_max_steps,
        batch_max_delay_s=edge.batch_max_delay_s,
        robot_id_on_wire="int64" if client is not None else "schema",
    ).start()
    closers.append(uplink.close)
    runner, weights = _policy_runner(edge, opts, driver, tasks, client, closers, relay)
    operator = _operator(edge, opts, driver, tasks, experts)
    closers.append(operator.close)

    help_kw = _help(opts, runner, str(robot_id))
    desk = help_kw.get("helpdesk")
    if desk is not None and desk.settings.on_call:
        operator = _on_call(operator, desk)
    heartbeat: Callable[..., Any] | None = None
    # Through the site relay unless the run is sharded (its shard takes the uploads).
    upload = relay.client if relay is not None and not opts.ingest else client
    if client is not None:
        from comms.robot.uploader import Uploader

        assert upload is not None
        closers.append(
            Uploader(
                upload, opts.run_id, spool, shard_router(client, opts.run_id, robot_id, opts.ingest)
            ).close
        )
        heartbeat = functools.partial(client.heartbeat, run_id=opts.run_id)
        if relay is not None:
            from edge_agent.site_relay import with_counters

            heartbeat = with_counters(heartbeat, relay.counters)
    agent = EdgeAgent(
        driver,
        runner,
        uplink,
        edge,
        robot_id=str(robot_id),
        run_id=opts.run_id,
        tasks=tasks,
        operator=operator,
        weights=weights,
        heartbeat=heartbeat,
        demonstrations=opts.demonstrations,
        rewards=make_reward_source(opts.reward_source),
        **help_kw,
    )
    if client is not None:
        from comms.robot.mark_sender import EpisodeMarkSender

        assert upload is not None
        closers.append(EpisodeMarkSender(upload, agent.marks).close)
    if client is not None and edge.cloud_control:
        from edge_agent.control import listen

        closers.append(listen(client, agent.control).close)  # closed before the client
    _attach_remote(operator, agent, client)
    closers.insert(0, driver.disconnect)
    return BuiltAgent(agent, closers)


def _on_call(operator: Any, desk: HelpDesk) -> Any:
    """The run has fewer people than robots: a simulated person goes on call
    (``edge_agent.on_call``); a real person's device stays as it is (the cloud's assignment
    tells them which robot to take)."""
    from edge_agent.on_call import OnCallPerson
    from edge_agent.simulated_person import SimulatedPerson

    if isinstance(operator, SimulatedPerson):
        return OnCallPerson(operator, desk, desk.settings.on_call_steps)
    return operator


def _help(opts: AgentOptions, runner: Any, robot_id: str) -> dict[str, Any]:
    """The agent's ``helpdesk`` and ``risk`` keywords for the run's ``help:`` (none when it
    asks for no help).

    Raises:
        ValueError: a risk this robot cannot compute (e.g. remote inference), named.
    """
    if not opts.help or opts.help.get("risk", "none") == "none":
        return {}
    known = {f.name for f in fields(HelpSettings)}  # a newer cloud's keys are ignored
    settings = HelpSettings(**{k: v for k, v in opts.help.items() if k in known})
    risk = make_risk(settings.risk, runner, settings.ensemble_members, settings.random_rate)
    return {"helpdesk": HelpDesk(settings, robot_id), "risk": risk}


def _attach_remote(operator: Any, agent: EdgeAgent, client: EdgeClient | None) -> None:
    """A remote operator (the dashboard's station) takes its commands from the agent's Control
    stream and reports frames and echoes through ``client`` (none without a cloud)."""
    from edge_agent.remote import RemoteOperator, StationUpdate

    if not isinstance(operator, RemoteOperator):
        return
    send = None
    if client is not None:
        from comms.proto import robofleet_pb2 as pb

        run_id = agent.run_id
        station = client

        def send(u: StationUpdate) -> None:
            station.station_report(
                pb.StationReport(
                    run_id=run_id,
                    frame=u.frame,
                    frame_format="jpeg" if u.frame else "",
                    camera=u.camera,
                    taken_over=u.taken_over,
                    echo_id=u.echo_id,
                    note=u.note,
                )
            )

    operator.attach(agent.control, send)


def _connect(
    spool_dir: Path, opts: AgentOptions, comms: Any, spec: Any
) -> tuple[int | str, EdgeClient | None]:
    """The robot's id on the wire and its cloud client: the enrolled id and a client when
    ``opts.server`` is set (enrolling first if no credential is stored), else the robot's
    name and None (offline)."""
    if opts.server is None:
        return opts.robot_name, None
    from comms.robot.client import EdgeClient, make_channel

    home = opts.credential_dir or spool_dir
    robot_id, secret = credential(home, opts, comms, spec.to_dict())
    return robot_id, EdgeClient(
        make_channel(opts.server, comms), secret, comms, address=opts.server
    )


def shard_router(
    client: EdgeClient, run_id: str, robot_id: int | str, ingest: Mapping[str, Any]
) -> ShardRouter | None:
    """Where the uploads of a sharded run's robot go (its shard, from the assignment's
    ``ingest``); None (``ingest`` empty): to the client's server, as for every other run.

    Raises:
        ValueError: ``ingest`` lacks a field or has one of the wrong type.
    """
    if not ingest:
        return None
    from comms.robot.shard_route import Route, ShardRouter

    try:
        first = Route.from_dict(ingest)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"assignment ingest: {exc!r} in {sorted(ingest)}") from None
    return ShardRouter(client, run_id, int(robot_id), first)


def _policy_runner(
    edge: EdgeSettings,
    opts: AgentOptions,
    driver: Any,
    tasks: list[str],
    client: EdgeClient | None,
    closers: list[Any],
    relay: RelayLink | None = None,
) -> tuple[Any, WeightReceiver | None]:
    """The policy runner ``edge.inference`` names and the receiver of the weights the local
    runner applies (None for remote inference or offline; through ``relay`` when the robot
    has one); appends what must be closed to ``closers``.

    Raises:
        ValueError: remote inference without a client (no ``--server``).
    """
    action_dim = driver.spec.action_dim
    if edge.inference == "remote":
        if client is None:
            raise ValueError("remote inference needs --server")
        from edge_agent.grpc_client import EdgeActClient

        act = EdgeActClient(client, opts.run_id)
        closers.append(act.close)
        remote = RemotePolicyRunner(
            act, action_dim, tasks, edge.remote_deadline_s, edge.hold_keep_dims
        )
        return remote, None
    import torch

    from edge_agent.policy_build import CardPolicy

    torch.set_num_threads(1)
    features = driver.observation_features
    state_dim = int(features["observation.state"]["shape"][0])
    cameras = {
        k: (int(f["shape"][0]), int(f["shape"][1]))
        for k, f in features.items()
        if k.startswith("observation.images.")
    }
    # The network is whatever each weight version's policy card says (MLP, CNN, RECAP's
    # indicator-conditioned MLP, SAC's Gaussian sampling while training, flow-matching or
    # LeRobot chunks).
    policy = CardPolicy(
        state_dim,
        action_dim,
        len(tasks),
        opts.hidden,
        stochastic=True,
        seed=opts.seed,
        cameras=cameras,
    )
    local = LocalPolicyRunner(policy, action_dim)
    if client is None:
        return local, None
    from comms.robot.grpc_subscription import GrpcWeightSubscription
    from comms.robot.receiver import WeightReceiver

    receiver = WeightReceiver(as_torch=True)
    if relay is not None:
        closers.append(relay.subscribe(opts.run_id, receiver))
    else:
        closers.append(GrpcWeightSubscription(client, opts.run_id, receiver).close)
    return local, receiver


def _operator(
    edge: EdgeSettings,
    opts: AgentOptions,
    driver: Any,
    tasks: list[str],
    experts: dict[str, Expert] | None,
) -> Any:
    """The intervention source ``opts.operator`` names, gated by HG-DAgger's rule within the
    driver's action bounds; the scripted one follows the expert of the episode's task."""
    expert = None
    if opts.operator == "scripted" and experts is not None:
        scripted = experts

        def expert(obs: Any) -> Any:  # the expert of the episode's task
            return scripted[driver.episode.task or tasks[0]](obs)

    gate = HGDaggerGate(
        edge.gating_threshold, edge.handback_steps, edge.gating_norm, edge.risk_regions
    )
    spec = driver.spec
    bounds = None
    if spec.action_low is not None and spec.action_high is not None:
        bounds = (np.asarray(spec.action_low, np.float32), np.asarray(spec.action_high, np.float32))
    operator = make_operator(
        opts.operator,
        driver.spec.action_dim,
        expert=expert,
        gate=gate,
        bounds=bounds,
        options=opts.operator_options,
        robot=driver,
    )
    truth = hasattr(driver, "ground_truth")
    if opts.operator == "scripted" and truth and not spec.capabilities.detects_success:
        # A simulated robot that hides its verdict: the simulated person gives it, from
        # the scene it sees (the simulator's ground truth kept aside by the driver).
        from edge_agent.simulated_person import SimulatedPerson

        operator = SimulatedPerson.watching(
            driver,
            operator,
            edge.max_episode_steps or opts.max_episode_steps,
            labelled_episodes=edge.scripted_labelled_episodes,
            ready_after_s=edge.scripted_ready_after_s,
        )
    return operator
