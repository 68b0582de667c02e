"""Password hashing and token helpers (standard library only).

Passwords: scrypt (RFC 7914) with a random 16-byte salt, stored as
``scrypt$<n>$<r>$<p>$<salt hex>$<hash hex>``; parameters n=2**14, r=8, p=1 follow the
OWASP password storage cheat sheet. Tokens are 32 random bytes (URL-safe base64); only their
sha256 is stored (``foundation.store.metadata_store.hash_secret``). The CSRF token of a session is
HMAC-SHA256(secret key, session token): a double-submit token the server can check without
storing it, and that an attacker who cannot read the session cookie cannot forge.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

SCRYPT_N = 2**14
SCRYPT_R = 8
SCRYPT_P = 1
_DKLEN = 32


def hash_password(password: str) -> str:
    """Salted scrypt hash of ``password`` in the self-describing format above."""
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(
        password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=_DKLEN
    )
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${salt.hex()}${digest.hex()}"


def verify_password(password: str, stored: str) -> bool:
    """True when ``password`` matches ``stored``; False for any malformed hash."""
    try:
        algo, n, r, p, salt_hex, digest_hex = stored.split("$")
        if algo != "scrypt":
            return False
        digest = hashlib.scrypt(
            password.encode(),
            salt=bytes.fromhex(salt_hex),
            n=int(n),
            r=int(r),
            p=int(p),
            dklen=len(digest_hex) // 2,
        )
    except ValueError:
        return False
    return hmac.compare_digest(digest.hex(), digest_hex)


# Verifying against this when the user does not exist keeps the response time the same.
DUMMY_HASH = hash_password(secrets.token_urlsafe(16))


def new_token() -> str:
    return secrets.token_urlsafe(32)


def csrf_token(secret: str, session_token: str) -> str:
    """The CSRF token bound to one session."""
    return hmac.new(secret.encode(), f"csrf:{session_token}".encode(), hashlib.sha256).hexdigest()


def same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())
