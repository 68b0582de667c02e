#!/bin/sh
# Container entrypoint: turn mounted secret files into robofleet settings, then exec the command.
#
# For every variable NAME_FROM_FILE=/path (e.g.
# ROBOFLEET_SECRET_KEY_FROM_FILE=/run/secrets/secret_key) NAME is exported with the file's
# content (not the usual *_FILE suffix: settings such as comms.tls_cert_file already end in
# it), so secrets live in Docker/Kubernetes secrets and never in an image layer, a compose file or `docker inspect` output of the variable itself.
# A *_FROM_FILE that names a missing or unreadable file is an error (the service must not start
# with a silently empty secret).
set -eu

for pair in $(env | sed -n 's/^\(ROBOFLEET_[A-Z0-9_]*\)_FROM_FILE=.*/\1/p'); do
    eval "path=\${${pair}_FROM_FILE}"
    if [ ! -r "$path" ]; then
        echo "robofleet-entrypoint: ${pair}_FROM_FILE names an unreadable file: $path" >&2
        exit 2
    fi
    value=$(cat "$path")
    export "$pair=$value"
    unset "${pair}_FROM_FILE"
done

exec "$@"
