#!/bin/sh
# ExecStart of robofleet-edge.service: the robot's settings come from /etc/robofleet/edge.env
# (loaded by systemd); the one-time enrollment token is passed only while no credential has been
# stored in the spool yet, and is never placed in the unit or the environment file.
set -eu
: "${ROBOFLEET_SERVER:?set ROBOFLEET_SERVER in /etc/robofleet/edge.env}"
: "${ROBOFLEET_ROBOT:?set ROBOFLEET_ROBOT in /etc/robofleet/edge.env}"
token_file="${ROBOFLEET_ENROLL_TOKEN_FILE:-/etc/robofleet/enroll_token}"
set -- --server "$ROBOFLEET_SERVER" --robot "$ROBOFLEET_ROBOT" --run "${ROBOFLEET_RUN:-default}"
if [ -s "$token_file" ]; then
    set -- "$@" --token "$(cat "$token_file")"
fi
# ROBOFLEET_EDGE_ARGS: extra options such as "--task reach-v3 --operator keyboard".
# shellcheck disable=SC2086
exec /opt/robofleet/venv/bin/robofleet edge "$@" ${ROBOFLEET_EDGE_ARGS:-}
