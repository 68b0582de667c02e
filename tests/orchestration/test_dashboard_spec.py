"""The dashboard's launch form becomes a run spec the run manager can execute."""

from __future__ import annotations

from dashboard.run_spec import RunSpec as FormSpec
from robofleet.orchestration.manager import as_run_spec
from robofleet.orchestration.params import RunParams


def test_dashboard_form_spec_maps_onto_the_run_spec() -> None:
    form = FormSpec.model_validate(
        {
            "name": "from-the-form",
            "algorithm": "hg-dagger",
            "tasks": ["reach-v3", "push-v3"],
            "robots": {"robot_type": "metaworld-sawyer", "count": 2},
            "policy": {"hidden": 128, "depth": 2},
            "hyperparameters": {"learning_rate": 0.002, "publish_every": 25},
        }
    )
    spec = as_run_spec(form)
    assert spec.name == "from-the-form"
    assert spec.tasks == ["reach-v3", "push-v3"]
    assert spec.robots.count == 2 and spec.robots.robot_type == "metaworld-sawyer"
    assert spec.policy.hidden_sizes == [128, 128]
    assert spec.publish.every_updates == 25
    assert RunParams.from_spec(spec).lr == 0.002
