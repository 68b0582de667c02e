"""The one uvicorn configuration of the dashboard (``robofleet dashboard``, ``robofleet cloud``).

uvicorn's defaults trust ``X-Forwarded-For`` from 127.0.0.1, so anyone on the dashboard's own
host (or a proxy there that passes the header through) could name any client address and get a
fresh login-throttle key per request. Here the header is honoured only from
``dashboard.trusted_proxies``, and not at all when that list is empty.
"""

from __future__ import annotations

from typing import Any

import uvicorn
from fastapi import FastAPI

from dashboard.config import DashboardSettings


def uvicorn_config(app: FastAPI, settings: DashboardSettings, **options: Any) -> uvicorn.Config:
    """A ``uvicorn.Config`` serving ``app`` with proxy headers trusted only as ``settings`` say.

    Args:
        app: the dashboard (``dashboard.app.create_app``).
        settings: the dashboard section; ``trusted_proxies`` decides ``proxy_headers`` and
            ``forwarded_allow_ips``; ``tls_cert_file`` / ``tls_key_file`` serve HTTPS.
        options: any other ``uvicorn.Config`` keyword (``log_level``,
            ``timeout_graceful_shutdown``); access logging is off unless given.
    """
    proxies = list(settings.trusted_proxies)
    options.setdefault("access_log", False)
    if settings.tls_cert_file is not None:
        options.setdefault("ssl_certfile", str(settings.tls_cert_file))
        options.setdefault("ssl_keyfile", str(settings.tls_key_file or settings.tls_cert_file))
    return uvicorn.Config(app, proxy_headers=bool(proxies), forwarded_allow_ips=proxies, **options)
