"""Web dashboard and REST API (FastAPI)."""
