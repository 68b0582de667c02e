"""The end of one run: its robots released, its learner stopped, and for a run that ends (not
one the cloud detaches from) the last version's evaluation, the promotion of the best version
and ``report.json``. The driver's loop and setup read apart from this last step, which works
over the driver's parts.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from foundation.store.models import RunState
from foundation.store.runs import set_state
from runs.promotion import promote_best

if TYPE_CHECKING:
    from runs.assignments import RobotAssignments
    from runs.run import RunDriver

log = logging.getLogger(__name__)


def teardown(run: RunDriver, final: bool) -> None:
    """Stop everything; with ``final`` also the final evaluation, report and accounting."""
    run.progress["state"] = "stopping"
    if final:
        set_state(run.ctx.store, run.run_id, RunState.STOPPING, run.stop_reason or "")
    try:
        # A run that ends releases its robots; one the cloud detaches from (shutting down,
        # to be resumed) leaves them acting and spooling, as a crash of the cloud would.
        if run.agents is not None and final:
            run.agents.release(run.orchestration.release_timeout_s)
    except Exception:
        log.exception("releasing the robots")
    if run.learning is not None:
        run.learning.learner.stop()
        if final:
            final_report(run)
        run.learning.close()
    if run.evaluations is not None:
        run.evaluations.close()
        run.evaluations = None
    if run.allocation is not None:
        if run.paused and run.detach and not final:
            run.allocation.suspend()  # the cloud goes away: a paused run keeps its robots
        else:
            run.allocation.release()
    run.ctx.server.invalidate_auth()


def quiet_teardown(run: RunDriver) -> None:
    """Teardown on the way to ``crashed``: a second failure must not hide the first."""
    try:
        teardown(run, final=False)
    except Exception:
        log.exception("run %s: teardown after a failure failed too", run.run_id)


def final_report(run: RunDriver) -> None:
    """The last version out, the last figures, the final evaluation, then the report with
    the acknowledged steps the buffer lost (``accounting``)."""
    from runs.accounting import reported_accounts
    from runs.report import write_report

    assert run.learning is not None and run.evaluations is not None
    run.learning.publish_new_weights()
    run.record_progress()
    if run.learning.version:
        run.snapshot_for_eval(final=True)
    for got in run.evaluations.drain():
        run.progress.update(got)
    promotion = promote_best(run.ctx.store, run.run_id, run.run_dir, run.spec)
    reports = run.agents.reports if run.agents is not None else {}
    if reports:  # the robots' final counts (their heartbeats stop with their release)
        run.effort.write(
            run.clock.elapsed(), len(reports), int(run.progress.get("env_steps", 0)), reports
        )
    run.result = write_report(
        run.run_dir,
        run.run_id,
        run.spec,
        learner_restarts=run.learner_restarts(),
        accounts=reported_accounts(run.learning.buffer, final_reports(run.agents)),
        elapsed_s=run.clock.elapsed(),
        setup_s=run.progress.get("setup_s"),
        robot_reports=run.agents.reports if run.agents is not None else {},
        promotion=promotion,
    )


def final_reports(agents: RobotAssignments | None) -> dict[str, dict[str, float]]:
    """Robot id (the buffer's ``robot_id``) -> the final report its computer sent when
    released."""
    if agents is None:
        return {}
    ids = {name: rid for name, (rid, _a) in agents.robots.items()}
    return {str(ids[name]): r for name, r in agents.reports.items() if name in ids}
