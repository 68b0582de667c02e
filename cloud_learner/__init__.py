"""Asynchronous cloud learner: algorithms, policies, training loop, checkpoints, evaluation.

Start with :mod:`cloud_learner.core` (the learner's seams and its loop in one file). Then:

* ``algorithms/``: :class:`HGDAgger`, :class:`RECAP`, :class:`SACRLPD`, one file each, each
  ending with its builder (its own hyper-parameters, learner config, replay wiring, episode rule).
* ``run_plan.py``: a run spec resolved through its algorithm's builder into learner settings.
* ``process.py``: the learner process of a run (``python -m cloud_learner.process``).
* ``policies/``: :class:`MLPPolicy` (state MLP; CNN + MLP with cameras),
  :class:`FlowMatchingPolicy` (action chunks), ``GaussianPolicy`` (SAC), LeRobot adapters.
* :class:`Learner` (``loop.py``), :class:`CheckpointManager` (``checkpoint.py``), batch sources
  (``sources.py``: the run's buffer service behind ``TransitionBatchSource``, an in-process
  buffer, memory), the tests' in-memory weight publisher (``publisher.py``).
* ``policy_card.py``: the JSON card inside every weight version that says which policy the
  weights are for (kind, shapes, algorithm); ``warm_start.py``: the state normalisation of the
  weak start; ``evaluation.py``: policy-only evaluation episodes on any hal driver.
"""

# No imports here: every CLI call would otherwise pay for importing torch.
