"""Learning rules: HG-DAgger, RECAP, SAC/RLPD, LeRobot's SAC; one file each, readable top to bottom, each
ending with its builder (what a run needs of it: :mod:`cloud_learner.algorithms.builder`)."""

from cloud_learner.algorithms.builder import AlgorithmBuilder
from cloud_learner.algorithms.hg_dagger import HGDAgger, HGDAggerBuilder, HGDAggerConfig
from cloud_learner.algorithms.lerobot_sac import LeRobotSAC, LeRobotSACBuilder, LeRobotSACConfig
from cloud_learner.algorithms.recap import RECAP, RECAPBuilder, RECAPConfig, RECAPOptions
from cloud_learner.algorithms.sac_rlpd import SACRLPD, SACBuilder, SACConfig, SACOptions

# The run spec's algorithm name -> its builder; and by the learner's name for it.
BUILDERS: dict[str, AlgorithmBuilder] = {
    b.name: b for b in (HGDAggerBuilder(), RECAPBuilder(), SACBuilder(), LeRobotSACBuilder())
}
BY_LEARNER_NAME: dict[str, AlgorithmBuilder] = {b.learner_name: b for b in BUILDERS.values()}

__all__ = [
    "BUILDERS",
    "BY_LEARNER_NAME",
    "RECAP",
    "SACRLPD",
    "AlgorithmBuilder",
    "HGDAgger",
    "HGDAggerConfig",
    "LeRobotSAC",
    "LeRobotSACConfig",
    "RECAPConfig",
    "RECAPOptions",
    "SACConfig",
    "SACOptions",
]
