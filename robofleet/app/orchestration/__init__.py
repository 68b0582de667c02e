"""Run orchestration: the run manager and one run's driver with its parts.

* :mod:`~robofleet.app.orchestration.manager` - :class:`RunManager` (launch/stop/pause/resume,
  requests from other processes through the metadata store, resume after a restart) and
  :class:`QueuedRunManager` (requests recorded for a cloud in another process).
* :mod:`~robofleet.app.orchestration.run` - :class:`RunDriver`, one run from lease to report,
  driving: ``learning`` (buffer, batch server, learner process, weight feed), ``agents``
  (the robots' edge agents), ``evaluations`` (over ``evaluator`` and ``evalqueue``),
  ``progress`` (live figures and curves), ``clock`` (run time, robot-hours), ``hold``
  (pause/resume until the robots' heartbeats agree).
* :mod:`~robofleet.app.orchestration.supervisor` - restart with backoff, crash-loop detection
  and the hung-process watchdog.
* :mod:`~robofleet.app.orchestration.estop` - e-stops in the store pushed to the robots.
* :mod:`~robofleet.app.orchestration.accounting` - acknowledged steps missing from the buffer.
* :mod:`~robofleet.app.orchestration.report` - report.json and plots.
* :mod:`~robofleet.app.orchestration.pidfile` - which process is the cloud of a data directory.
* :mod:`~robofleet.app.orchestration.config` - the ``orchestration:`` settings section.
"""
