"""The simulated fleet's Meta-World constants.

The simulated robots themselves are robot computers like a lab's (:mod:`robofleet.sim.
computers`): their demonstrations are driven by their scripted operator on the robot, as a
person's would be (``demonstrations`` of a run spec, ``edge_agent.agent``).
"""

from __future__ import annotations

# Meta-World's goal-observable state and the Sawyer's action (hal.drivers.metaworld).
STATE_DIM = 39
ACTION_DIM = 4
