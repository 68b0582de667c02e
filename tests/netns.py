"""Two test hosts in network namespaces joined by a veth pair (traffic never leaves them):
``robofleet.bench.netns``, shared by the robot-computer-on-its-own-network, multi-host deploy
and WAN tests and by ``robofleet bench fleet --hosts``."""

from robofleet.bench.netns import TwoHosts, netns_available, sh, two_hosts

__all__ = ["TwoHosts", "netns_available", "sh", "two_hosts"]
