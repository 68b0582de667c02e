"""Edge-to-cloud transport: protobuf schemas, gRPC services, auth, chunked weight distribution,
site relay.

Every seam in one place (wire schema: ``comms/proto/robofleet.proto``)::

    # cloud (robofleet cloud / learner process)
    from comms.cloud.server import CloudServer          # Enrollment, Experience, Episodes, Weights,
    from comms.cloud.replay_buffer_sink import ReplayBufferSink      # Heartbeat, Control, Act on one port
    server = CloudServer(settings.comms, store, ReplayBufferSink(replay_buffer), act_handler=None)
    server.start()
    dist = server.distributor(run_id)             # comms.cloud.distributor.WeightDistributor
    dist.publish(policy.state_dict(), learner_step=step)  # one copy on the caller, returns;
                                                  # digests/deltas on the encoder thread,
                                                  # latest-only, bandwidth capped by
                                                  # comms.weight_max_bytes_per_s
    server.push_control(robot_id, "estop" | "pause" | "resume" | "lease_changed", run_id)
    # ("rerecord" | "discard": the robot ends its episode and marks it never trained on)
    # learner in its own process (keeps publishing off the learner's CPU and GIL), the
    # learner -> cloud handoff is a directory of versions (the run's weights/):
    from comms.cloud.weight_file import WeightDirectory, WeightFileFeed
    WeightDirectory(run_dir / "weights").publish(v, policy.state_dict())  # learner: durable
    feed = WeightFileFeed(server.distributor(run_id), run_dir / "weights")  # cloud side
    feed.poll()                                   # a newer version published as is: returns
                                                  # (version, safetensors bytes) or None
    dist.publish_safetensors(blob, version=v)     # any safetensors blob as is (no copy)

    # robot (edge agent)
    from comms.robot.client import make_channel, enroll, EdgeClient, ControlListener
    from comms.robot.uploader import MemorySpool, Uploader      # or the edge agent's disk Spool
    from comms.robot.receiver import WeightReceiver
    from comms.robot.grpc_subscription import GrpcWeightSubscription  # from the cloud or a relay
    from comms.robot.zmq_subscription import ZmqWeightSubscription    # from a site relay's fan-out
    robot_id, credential = enroll(make_channel(addr, s), token, name, robot_type, spec)
    client = EdgeClient(make_channel(addr, s), credential, s)
    spool = MemorySpool(); Uploader(client, run_id, spool); spool.put(step_batch)  # Arrow
    rx = WeightReceiver(as_torch=True, on_applied=report)
    GrpcWeightSubscription(client, run_id, rx)
    version, state = rx.current()                 # whole versions only, (-1, {}) before any
    client.heartbeat("running", rx.version, {"loop_hz": 10.0})
    from comms.robot.mark_sender import EpisodeMarkSender  # discard / rerecord verdicts
    from comms.wire.marks import EpisodeMark
    client.mark_episode(EpisodeMark(run_id, episode_index, "discard"))  # stored in the sink
    EpisodeMarkSender(client, outbox)             # sends a durable outbox's marks until stored
    action_chunk, policy_version = client.act(run_id, observation, task)   # remote inference

    # site
    from comms.relay.site_relay import SiteRelay             # ``robofleet relay`` (robofleet.commands.relay)

Step batches need ``robot_id`` (the robot's id, int or its decimal string) and ``seq``
columns; the sink (``comms.cloud.step_sink.StepSink``) acknowledges the highest durable ``seq``.
Weights travel as safetensors-layout bytes with a manifest (names, shapes, dtypes, BLAKE3 per
chunk of <= 1 MiB, base version of a delta); nothing from the network is ever unpickled.
Large payload messages are assembled around their bytes with one copy (``comms.wire.payload_messages``).
A site relay signs each manifest it fans out over ZeroMQ with an HMAC-SHA256 whose key robots
get only over the relay's authenticated gRPC; robots drop unsigned manifests.
The cloud drops rows already durable against the sink itself (per robot, under a lock), so a
robot's old and new upload streams overlapping after a reconnect never store a row twice.

Bulk bytes can leave Python gRPC: with ``comms.data_plane`` (default on) the cloud server also
runs a ZeroMQ data plane (``comms.cloud.dataplane.DataPlaneServer``, client side
``comms.robot.dataplane_client``). gRPC streams hand out a single-use token; weight chunks (zero-copy
from the shared payload) and step batches then travel as ZeroMQ frames, while manifests, acks
and every check stay on gRPC. CURVE-encrypted under TLS; an unreachable or failing data plane
falls back to gRPC bytes. See docs/comms-data-plane.md.
"""
