"""Run inside the head's network namespace by test_multinode: join the cluster, lease the robot,
place an edge-agent actor with the scheduler, print where it ran as one JSON line."""

import json
import sys

import ray

from hal.fleet import RobotReport, heartbeat, report_robots
from hal.scheduler import LearnerRequest, RobotAllocation, RobotRequest
from robofleet.store.models import Run
from robofleet.store.store import MetadataStore, upgrade


@ray.remote(num_cpus=0.1)
class EdgeProbe:
    def where(self) -> str:
        return ray.util.get_node_ip_address()


def main() -> None:
    address, db_url, robot, robot_node_ip = sys.argv[1:5]
    ray.init(address=address, log_to_driver=False)
    upgrade(db_url)
    store = MetadataStore(db_url)
    report_robots(
        store,
        [RobotReport(robot, "metaworld", "metaworld-sawyer", {})],
        node="robot-node",
        node_ip=robot_node_ip,
    )
    heartbeat(store, robot)
    with store.session() as s:
        s.add(Run(id="mn-run", algorithm="hg-dagger"))
    alloc = RobotAllocation(
        store, "mn-run", RobotRequest(1, "metaworld-sawyer"), LearnerRequest(0.2), edge_cpus=0.2
    )
    alloc.acquire(timeout_s=60)
    agents = [
        EdgeProbe.options(scheduling_strategy=alloc.edge_strategy(robot)).remote() for _ in range(2)
    ]
    where = ray.get([a.where.remote() for a in agents], timeout=90)
    nodes = sorted({n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]})
    alloc.release()
    print(json.dumps({"edge_agents_on": where, "nodes": nodes}), flush=True)


if __name__ == "__main__":
    main()
