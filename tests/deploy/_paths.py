"""Paths shared by the deploy tests."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE = DEPLOY / "compose" / "compose.yaml"
K8S = DEPLOY / "k8s"
GUIDE = REPO / "docs" / "deploy.md"
