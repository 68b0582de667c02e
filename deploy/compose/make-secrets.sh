#!/bin/sh
# Create the secret files compose.yaml mounts (random, never committed).
# The directory is 0700 so no other host user can reach them; the files are 0644 because
# compose bind-mounts each file as is and the services run as non-root users (robofleet
# uid 10001, postgres uid 999). Existing files are kept: running it again rotates nothing.
set -eu
dir="$(cd "$(dirname "$0")" && pwd)/secrets"
mkdir -p "$dir"
chmod 0700 "$dir"
umask 022
rand() { python3 -c 'import secrets; print(secrets.token_urlsafe(32))'; }
[ -s "$dir/postgres_password" ] || rand > "$dir/postgres_password"
[ -s "$dir/secret_key" ] || rand > "$dir/secret_key"
if [ ! -s "$dir/database_url" ]; then
    printf 'postgresql+psycopg://robofleet:%s@postgres:5432/robofleet\n' \
        "$(cat "$dir/postgres_password")" > "$dir/database_url"
fi
# Placeholders until real one-time tokens are created in the dashboard.
for robot in 1 2; do
    [ -e "$dir/enroll_token_sim_$robot" ] || : > "$dir/enroll_token_sim_$robot"
done
echo "secrets in $dir"
