"""Run orchestration: the run manager and one run's driver with its parts.

* :mod:`~runs.manager` - :class:`RunManager` (launch/stop/pause/resume,
  requests from other processes through the metadata store, resume after a restart) and
  :class:`QueuedRunManager` (requests recorded for a cloud in another process).
* :mod:`~runs.run` - :class:`RunDriver`, one run from lease to report,
  driving: ``learning`` (buffer, batch server, learner process, weight feed), ``agents``
  (the robots' edge agents), ``evaluations`` (over ``evaluator`` and ``evalqueue``),
  ``progress`` (live figures and curves), ``clock`` (run time, robot-hours), ``hold``
  (pause/resume until the robots' heartbeats agree), ``leasing`` (robots and learner
  placement), ``cadence`` (the loop's periodic jobs), ``disk_notice`` (files waiting for
  space), ``stop_conditions`` (the spec's ``stop``); its steps: ``run_assignment`` (what
  each robot is told), ``run_evals`` (which evaluations), ``pausing`` (the loop following a
  pause), ``live_state`` (running/degraded from the leases), ``run_end`` (teardown and the
  final report); ``cloud_context`` (what every run of one cloud shares).
* :mod:`~runs.supervisor` - restart with backoff, crash-loop detection
  and the hung-process watchdog.
* :mod:`~runs.estop` - e-stops in the store pushed to the robots.
* :mod:`~runs.accounting` - acknowledged steps missing from the buffer.
* :mod:`~runs.report` - report.json and plots.
* :mod:`~runs.pidfile` - which process is the cloud of a data directory.
* :mod:`~runs.config` - the ``orchestration:`` settings section.
"""
