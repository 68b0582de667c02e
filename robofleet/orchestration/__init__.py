"""Run orchestration: the run manager, supervision and resume, the simulated fleet, reports.

* :mod:`robofleet.orchestration.service` - :class:`CloudService`, the cloud process tree
  (``robofleet cloud``, ``robofleet demo``).
* :mod:`robofleet.orchestration.manager` - :class:`RunManager` (launch/stop/pause/resume,
  requests from other processes through the metadata store, resume after a restart).
* :mod:`robofleet.orchestration.run` - :class:`RunDriver`, one run from lease to report.
* :mod:`robofleet.orchestration.supervisor` - restart with backoff, crash-loop detection and
  the hung-process watchdog.
* :mod:`robofleet.orchestration.hold` - pause/resume pushed to robots until their heartbeats agree.
* :mod:`robofleet.orchestration.config` - the ``orchestration:`` settings section.
* :mod:`robofleet.orchestration.params` - a run spec's algorithm, hyper-parameters and rewards
  as the learner, batch server and robots need them.
* :mod:`robofleet.orchestration.learner_proc` - the learner process of a run.
* :mod:`robofleet.orchestration.batches` - batches from the cloud's buffer to the learner.
* :mod:`robofleet.orchestration.simfleet` - enrollment, heartbeats and edge agents of
  simulated robots; expert demonstrations.
* :mod:`robofleet.orchestration.evaluator` - evaluation episodes, the operator never acting.
* :mod:`robofleet.orchestration.accounting` - acknowledged steps missing from the buffer.
* :mod:`robofleet.orchestration.report` - report.json and plots.
"""
