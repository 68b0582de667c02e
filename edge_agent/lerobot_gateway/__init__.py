"""``robofleet lerobot-gateway``: LeRobot's HIL-SERL actor, unmodified, as a robofleet robot.

One gateway runs beside one LeRobot actor (``python -m lerobot.rl.actor``) on the robot
computer. Toward the actor it serves LeRobot's own gRPC ``transport.LearnerService`` (the
installed package's generated modules, LeRobot's ``TransferState`` chunking); toward the cloud
it is an enrolled robot like any other (credential, assignment, durable spool with acks,
weight subscription). Modules, one job each:

* :mod:`~edge_agent.lerobot_gateway.chunks` - reassembles LeRobot's chunked messages.
* :mod:`~edge_agent.lerobot_gateway.transitions` - ``torch.load(weights_only=True)``, checks
  against the run's step schema, LeRobot transitions -> robofleet step rows.
* :mod:`~edge_agent.lerobot_gateway.replay` - messages a retried transitions call sends again,
  recognised and not stored twice.
* :mod:`~edge_agent.lerobot_gateway.interactions` - the restricted reader of LeRobot's pickled
  per-episode statistics (no class is ever resolved).
* :mod:`~edge_agent.lerobot_gateway.parameters` - a run version -> the bytes LeRobot's actor
  loads (the seam the cloud's ``lerobot-sac`` converter plugs into).
* :mod:`~edge_agent.lerobot_gateway.features` - the robot's spec and step schema from a
  LeRobot training config's features.
* :mod:`~edge_agent.lerobot_gateway.state` - what the actor sees: assignment, latest
  parameters, counters.
* :mod:`~edge_agent.lerobot_gateway.service` - the ``LearnerService`` servicer.
* :mod:`~edge_agent.lerobot_gateway.run` - one run's cloud links (spool, uplink, uploader,
  weight subscription).
* :mod:`~edge_agent.lerobot_gateway.gateway` - enrollment, assignments, heartbeats, the server.
"""
