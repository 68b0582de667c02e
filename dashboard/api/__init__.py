"""REST API routers (mounted under ``/api`` by :func:`dashboard.app.create_app`)."""
