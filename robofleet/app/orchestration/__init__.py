"""Run orchestration: the run manager, supervision and resume, the simulated fleet, reports.

* :mod:`robofleet.app.cloud` - :class:`CloudService`, the cloud process tree
  (``robofleet cloud``, ``robofleet demo``).
* :mod:`robofleet.app.orchestration.manager` - :class:`RunManager` (launch/stop/pause/resume,
  requests from other processes through the metadata store, resume after a restart).
* :mod:`robofleet.app.orchestration.run` - :class:`RunDriver`, one run from lease to report.
* :mod:`robofleet.app.orchestration.supervisor` - restart with backoff, crash-loop detection and
  the hung-process watchdog.
* :mod:`robofleet.app.orchestration.hold` - pause/resume pushed to robots until their heartbeats agree.
* :mod:`robofleet.app.orchestration.config` - the ``orchestration:`` settings section.
* :mod:`robofleet.app.sim.fleet` - enrollment, heartbeats and edge agents of
  simulated robots; expert demonstrations.
* :mod:`robofleet.app.orchestration.evaluator` - evaluation episodes, the operator never acting.
* :mod:`robofleet.app.orchestration.accounting` - acknowledged steps missing from the buffer.
* :mod:`robofleet.app.orchestration.report` - report.json and plots.
"""
