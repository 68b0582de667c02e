#!/bin/sh
# Create the files kustomization.yaml turns into Secrets (random, never committed).
# PG_URL=postgresql+psycopg://user:pass@host:5432/db sh make-secrets.sh uses an external database.
set -eu
dir="$(cd "$(dirname "$0")" && pwd)/secrets"
mkdir -p "$dir"
chmod 0700 "$dir"
umask 077
rand() { python3 -c 'import secrets; print(secrets.token_urlsafe(32), end="")'; }
[ -s "$dir/postgres_password" ] || rand > "$dir/postgres_password"
[ -s "$dir/secret_key" ] || rand > "$dir/secret_key"
[ -s "$dir/ray_auth_token" ] || rand > "$dir/ray_auth_token"
if [ ! -s "$dir/database_url" ]; then
    printf '%s' "${PG_URL:-postgresql+psycopg://robofleet:$(cat "$dir/postgres_password")@robofleet-postgres:5432/robofleet}" \
        > "$dir/database_url"
fi
echo "secrets in $dir"
