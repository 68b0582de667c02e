"""Asynchronous cloud learner: algorithms, policies, training loop, checkpoints, evaluation.

Start with :mod:`cloud_learner.core` (every seam and the loop in one file). Then:

* ``algorithms/``: :class:`HGDAgger`, :class:`RECAP`, :class:`SACRLPD` (one file each).
* ``policies/``: :class:`MLPPolicy` (state MLP; CNN + MLP with cameras),
  :class:`FlowMatchingPolicy` (action chunks), ``GaussianPolicy`` (SAC), LeRobot adapters.
* :class:`Learner` (``loop.py``), :class:`CheckpointManager` (``checkpoint.py``),
  :class:`BufferSource` / :class:`InMemorySource` (``sources.py``), the tests' in-memory
  weight publisher (``publisher.py``), ``learner_main`` (the process), ``evaluation`` and ``hgdagger_sim``.
* ``policy_card.py``: the JSON card inside every weight version that says which policy the
  weights are for (kind, shapes, algorithm); ``warm_start.py``: each algorithm's weak start from
  demonstrations.
"""

# No imports here: robofleet.app.settings imports cloud_learner.config, and every CLI call would
# otherwise pay for importing torch.
