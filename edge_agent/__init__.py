"""Edge agent: control loop, intervention sources, episode recording, uplink spool, weight apply.

Start with :mod:`edge_agent.core` (every seam and the step, in one file). Then:

* :mod:`edge_agent.agent` - :class:`~edge_agent.agent.EdgeAgent`, the control loop, built of
  :mod:`~edge_agent.recording` (rows, one step late), :mod:`~edge_agent.weights` (apply at safe
  boundaries, staleness), :mod:`~edge_agent.pacing` (ticks, latency, overruns),
  :mod:`~edge_agent.holds` (cloud pause / e-stop, first weights), :mod:`~edge_agent.episodes`
  (episode index across restarts, the outbox of discard / rerecord marks),
  :mod:`~edge_agent.heartbeat` and :mod:`~edge_agent.stats`.
* :mod:`edge_agent.control` - cloud commands (e-stop, pause, resume, rerecord, discard).
* :mod:`edge_agent.gating` - HG-DAgger takeover / handback rule.
* :mod:`edge_agent.operators` - scripted expert, keyboard (pynput), gamepad (pygame).
* :mod:`edge_agent.inference` - local and remote (deadline + safe hold) policy runners.
* :mod:`edge_agent.policy_build` - the robot's policy, built from each version's policy card.
* :mod:`edge_agent.spool` / :mod:`edge_agent.uplink` - durable bounded spool owning ``seq``;
  comms' ``Uploader`` streams it; :mod:`edge_agent.journal` keeps each step durable before
  its batch is cut.
* :mod:`edge_agent.credential` - the robot's enrolled credential file (mode 0600).
* :mod:`edge_agent.build` - one builder for ``robofleet edge`` (:mod:`robofleet.commands.edge`) and the
  Ray actor (:mod:`edge_agent.ray_actor`).
* :mod:`edge_agent.latency_report` - control-loop p50/p99 of N agents on one machine.
"""
