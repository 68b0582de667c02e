"""The batch service's shared secret: every request to a ``BatchServer`` carries its run's
batch token, and a request without the right one is refused unread.

The process that starts a batch server makes the token (:func:`new_token`) and hands it to the
server and to its clients out of band: constructor arguments, Ray actor arguments (a shard's
server), or the learner process's environment (:data:`TOKEN_ENV`, read by
:func:`token_from_env`); never over the batch socket, and never on a command line (other users
read those). The token is compared in constant time (``hmac.compare_digest``). It proves the
caller, it does not hide the batches: replies cross the network in the clear, as Ray's object
transfers do (docs/buffer.md, "The batch service").
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Mapping
from typing import Any

TOKEN_ENV = "ROBOFLEET_BATCH_TOKEN"
TOKEN_FIELD = "token"
TOKEN_BYTES = 32
REFUSED = "refused: the request's batch token is wrong or missing"


class BatchRefused(RuntimeError):
    """The batch server refused the request: its batch token was wrong or missing."""


def new_token() -> str:
    """A fresh random batch token (``TOKEN_BYTES`` bytes, hex)."""
    return secrets.token_hex(TOKEN_BYTES)


def checked_token(token: str) -> str:
    """``token``, checked to be usable.

    Raises:
        ValueError: it is empty or not ASCII (``hmac.compare_digest`` compares ASCII).
    """
    if not token or not token.isascii():
        raise ValueError("a batch token must be a non-empty ASCII string (new_token())")
    return token


def token_matches(request: Any, token: str) -> bool:
    """Whether ``request`` (a decoded JSON request) carries ``token`` in its token field."""
    if not isinstance(request, Mapping):
        return False
    got = request.get(TOKEN_FIELD)
    if not isinstance(got, str):
        return False
    # Bytes on both sides: a str with non-ASCII characters would make compare_digest raise.
    return hmac.compare_digest(got.encode(), token.encode())


def token_from_env(environ: Mapping[str, str] | None = None) -> str:
    """The batch token the starting process put in :data:`TOKEN_ENV`.

    Raises:
        ValueError: the variable is unset or empty.
    """
    token = (os.environ if environ is None else environ).get(TOKEN_ENV, "")
    if not token:
        raise ValueError(f"{TOKEN_ENV} is not set: the batch service's token comes from the cloud")
    return checked_token(token)
