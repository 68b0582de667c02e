"""Learning rules: HG-DAgger, RECAP, SAC/RLPD; one file each, readable top to bottom."""

from cloud_learner.algorithms.hg_dagger import HGDAgger, HGDAggerConfig
from cloud_learner.algorithms.recap import RECAP, RECAPConfig
from cloud_learner.algorithms.sac_rlpd import SACRLPD, SACConfig

__all__ = ["RECAP", "SACRLPD", "HGDAgger", "HGDAggerConfig", "RECAPConfig", "SACConfig"]
