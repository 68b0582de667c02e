"""One run spec: the launch form and ``POST /api/runs`` speak ``foundation.runspec.RunSpec``, and
the run manager's own refusals come back as 422s naming the form's fields."""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel

from cloud_learner.algorithms import BUILDERS
from cloud_learner.run_plan import RunPlan, parse_spec
from dashboard.app import create_app
from foundation.runspec import RunParams, RunSpec, knob_names
from foundation.store.accounts import Role
from foundation.store.metadata_store import MetadataStore
from foundation.store.models import Event, Run
from robofleet.settings import Settings
from runs.manager import RunManager
from runs.run import CloudContext
from tests.dashboard.conftest import login
from tests.dashboard.helpers import VALID_SPEC, add_robot, count

TEMPLATE = Path(__file__).resolve().parents[2] / "dashboard" / "templates" / "runs.html"


def _form_fields() -> tuple[set[str], set[str]]:
    """(input/select names, error-span fields) of the launch form."""
    html = TEMPLATE.read_text()
    form = html[html.index('<form id="launch-form"') : html.index("</form>")]
    names = set(re.findall(r'<(?:input|select)[^>]*\bname="([^"]+)"', form))
    spans = set(re.findall(r'data-field="([^"]+)"', form))
    return names, spans


def _resolves(path: str) -> bool:
    """Whether a dotted path names a RunSpec field (hyper-parameters: a knob of every run or
    of an algorithm)."""
    model: type[BaseModel] = RunSpec
    parts = path.split(".")
    for i, part in enumerate(parts):
        if model is RunSpec and part == "hyperparameters" and i + 1 < len(parts):
            knobs = knob_names(RunParams).union(*(knob_names(b.options) for b in BUILDERS.values()))
            return parts[i + 1] in knobs and i + 2 == len(parts)
        info = model.model_fields.get(part)
        if info is None:
            return False
        if i + 1 < len(parts):
            sub = info.annotation
            if not (isinstance(sub, type) and issubclass(sub, BaseModel)):
                return False
            model = sub
    return True


def test_every_form_field_is_a_run_spec_path_with_an_error_slot() -> None:
    names, spans = _form_fields()
    assert len(names) >= 15
    unknown = sorted(n for n in names if not _resolves(n))
    assert unknown == []
    assert names <= spans  # each field has its error slot
    assert {"robots", "hyperparameters"} <= spans  # model-level errors have one too


def _orchestrated_app(settings: Settings, store: MetadataStore) -> TestClient:
    """The dashboard with the real run manager; launches refused here never reach Ray."""
    ctx = CloudContext(
        settings=settings,
        store=store,
        server=None,
        server_address="127.0.0.1:0",
        sinks={},
        python=sys.executable,
    )
    manager = RunManager(ctx, settings.data_dir / "runs")
    return login(create_app(settings, store, run_manager=manager), Role.OPERATOR.value)


def test_run_manager_refusals_name_the_form_fields(
    settings: Settings, store: MetadataStore
) -> None:
    add_robot(store, "sim-00")
    op = _orchestrated_app(settings, store)
    before = (count(store, Run), count(store, Event))
    spec: dict[str, Any] = copy.deepcopy(VALID_SPEC)
    spec["tasks"] = ["reach-v3", "no-such-task-v3"]
    spec["hyperparameters"] = {"lr": -1, "warp_factor": 9}
    r = op.post("/api/runs", json=spec)
    assert r.status_code == 422, r.text
    errors = {tuple(e["loc"]): e["msg"] for e in r.json()["detail"]}
    assert "no-such-task-v3" in errors[("body", "tasks")]
    assert "must be positive" in errors[("body", "hyperparameters", "lr")]
    assert "unknown hyper-parameter" in errors[("body", "hyperparameters", "warp_factor")]
    # two robots asked, one in the fleet
    assert "the fleet has 1" in errors[("body", "robots")]
    _, spans = _form_fields()
    for loc in errors:  # the page shows each next to its field or its enclosing fieldset
        assert any(".".join(loc[1:n]) in spans for n in range(len(loc), 1, -1)), loc
    assert (count(store, Run), count(store, Event)) == before


@pytest.mark.parametrize("algorithm", ["hg-dagger", "recap", "sac"])
def test_form_defaults_make_a_spec_the_run_manager_accepts(
    settings: Settings, store: MetadataStore, algorithm: str
) -> None:
    """What the form sends with its defaults, for each algorithm (plus the fields without a
    default); the policy kind left to the algorithm."""
    html = TEMPLATE.read_text()
    form = html[html.index('<form id="launch-form"') : html.index("</form>")]
    body: dict[str, Any] = {"algorithm": algorithm, "name": "defaults", "tasks": ["reach-v3"]}
    for tag in re.findall(r"<input [^>]*>", form):
        attrs = dict(re.findall(r'(\w+)="([^"]*)"', tag))
        if "value" not in attrs:
            continue
        target = body
        *parents, leaf = attrs["name"].split(".")
        for p in parents:
            target = target.setdefault(p, {})
        value: Any = attrs["value"]
        if attrs.get("type") == "number":  # as the page's readForm sends them
            value = float(value) if "." in value else int(value)
        elif leaf == "hidden_sizes":
            value = [int(x) for x in value.split(",")]
        target[leaf] = value
    body["robots"]["robot_type"] = "metaworld-sawyer"
    spec = parse_spec(body)  # what the launch route does with it
    assert spec.policy.hidden_sizes == [256, 256]
    assert spec.policy.kind == ("gaussian" if algorithm == "sac" else "mlp")
    assert RunPlan.from_spec(spec).params.lr == 0.001
    add_robot(store, "sim-00")
    from runs.manager import validate_launch

    validate_launch(store, spec)  # raises on any refusal
