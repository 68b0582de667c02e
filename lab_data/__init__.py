"""A lab's data in and out of robofleet buffers: importers registered by format (LeRobotDataset
v3, ROS 2 bags, robofleet buffers), the dataset catalog and LeRobotDataset export.

Sits above ``buffer`` and ``hal``; the CLI (``robofleet data``), a run's offline mounts
(``runs.offline``) and the benches call it.
"""

from lab_data.catalog import DatasetCatalog, DatasetExists, UnknownDataset
from lab_data.lerobot_io import export_lerobot, import_lerobot

__all__ = ["DatasetCatalog", "DatasetExists", "UnknownDataset", "export_lerobot", "import_lerobot"]
