#!/bin/sh
# ExecStart of robofleet-edge.service: the robot's settings come from /etc/robofleet/edge.env
# (loaded by systemd) and its `robofleet edge` options (driver, driver options, operator) from
# /etc/robofleet/edge.args, one per line; the one-time enrollment token is passed only while
# no credential has been stored in the spool yet, and is never placed in the unit or the
# environment file. No run id: the robot computer enrolls, goes idle and the cloud assigns it
# to runs over its Control stream.
set -eu
: "${ROBOFLEET_SERVER:?set ROBOFLEET_SERVER in /etc/robofleet/edge.env}"
: "${ROBOFLEET_ROBOT:?set ROBOFLEET_ROBOT in /etc/robofleet/edge.env}"
token_file="${ROBOFLEET_ENROLL_TOKEN_FILE:-/etc/robofleet/enroll_token}"
args_file="${ROBOFLEET_EDGE_ARGS_FILE:-/etc/robofleet/edge.args}"
if [ -n "${ROBOFLEET_RUN:-}" ]; then
    echo "robofleet-edge-run: ROBOFLEET_RUN is ignored: the cloud assigns this robot to runs" \
        "(re-run install.sh to drop it from edge.env)" >&2
fi
set -- --server "$ROBOFLEET_SERVER" --robot "$ROBOFLEET_ROBOT"
if [ -s "$token_file" ]; then
    set -- "$@" --token "$(cat "$token_file")"
fi
if [ -f "$args_file" ]; then
    # One argument per line, taken whole (a JSON value may hold spaces); '#' lines are comments.
    while IFS= read -r arg || [ -n "$arg" ]; do
        case "$arg" in
            ''|'#'*) ;;
            *) set -- "$@" "$arg" ;;
        esac
    done < "$args_file"
fi
# ROBOFLEET_EDGE_ARGS: further options split at spaces, such as "--max-steps 200".
# shellcheck disable=SC2086
exec /opt/robofleet/venv/bin/robofleet edge "$@" ${ROBOFLEET_EDGE_ARGS:-}
