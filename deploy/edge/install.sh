#!/bin/sh
# Install the robofleet edge agent on a robot computer (Debian/Ubuntu, Python 3.12, systemd).
#
#   sudo sh deploy/edge/install.sh --server cloud.example.org:50051 --robot arm-7 \
#        [--token-file token.txt] [--source DIR] [--torch-backend cpu] \
#        [-- --driver lerobot --driver-option type=so101_follower --operator gamepad ...]
#
# Installs robofleet[edge,sim] (no Ray, no learner) into /opt/robofleet/venv with the versions of
# requirements.lock, writes /etc/robofleet/{edge.env,edge.yaml,enroll_token}, creates the
# robofleet user and enables robofleet-edge.service. The options after "--" (those that
# `robofleet robots enroll` printed after --robot) go to /etc/robofleet/edge.args, one per
# line. There is no run id: the service enrolls, goes idle and the cloud assigns it to runs.
# Re-running it upgrades in place and keeps the spool (/var/lib/robofleet/spool), the stored
# credential and, unless "--" is given again, edge.args.
set -eu

SERVER="" ROBOT="" TOKEN_FILE="" TORCH_BACKEND="cpu" EDGE_ARGS_GIVEN=""
SOURCE="$(cd "$(dirname "$0")/../.." && pwd)"
PREFIX=/opt/robofleet ETC=/etc/robofleet
UNIT_DIR=/etc/systemd/system
while [ $# -gt 0 ]; do
    case "$1" in
        --server) SERVER="$2"; shift 2 ;;
        --robot) ROBOT="$2"; shift 2 ;;
        --run) echo "install.sh: --run is gone: a robot computer takes no run id, runs are assigned to it by the cloud (docs/deploy.md)" >&2; exit 2 ;;
        --token-file) TOKEN_FILE="$2"; shift 2 ;;
        --source) SOURCE="$2"; shift 2 ;;
        --torch-backend) TORCH_BACKEND="$2"; shift 2 ;;
        --) shift; EDGE_ARGS_GIVEN=1; break ;;
        *) echo "install.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
# What remains ("$@") are the `robofleet edge` options of this robot; the wrapper adds
# --server, --robot and the token itself.
for arg in "$@"; do
    case "$arg" in
        --server|--server=*|--robot|--robot=*|--token|--token=*)
            echo "install.sh: give ${arg%%=*} as install.sh's own option, not after --" >&2; exit 2 ;;
        --run|--run=*)
            echo "install.sh: no --run: runs are assigned to the robot computer by the cloud" >&2; exit 2 ;;
    esac
    case "$arg" in
        *"
"*) echo "install.sh: an edge option holds a newline" >&2; exit 2 ;;
    esac
done
[ -n "$SERVER" ] || { echo "install.sh: --server HOST:PORT is required" >&2; exit 2; }
[ -n "$ROBOT" ] || { echo "install.sh: --robot NAME is required" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "install.sh: run as root (sudo)" >&2; exit 2; }
[ -f "$SOURCE/pyproject.toml" ] || { echo "install.sh: no robofleet source at $SOURCE" >&2; exit 2; }
command -v python3.12 >/dev/null || { echo "install.sh: needs python3.12" >&2; exit 2; }

id robofleet >/dev/null 2>&1 || useradd --system --home-dir /var/lib/robofleet --shell /usr/sbin/nologin robofleet
install -d -m 0755 "$PREFIX" "$ETC"
install -d -m 0700 -o robofleet -g robofleet /var/lib/robofleet

[ -x "$PREFIX/venv/bin/python" ] || python3.12 -m venv "$PREFIX/venv"
"$PREFIX/venv/bin/python" -m pip install --quiet --disable-pip-version-check "uv==0.13.9"
UV="$PREFIX/venv/bin/uv"
# Only the edge and sim extras, at the lock's versions.
"$UV" pip compile "$SOURCE/pyproject.toml" --extra edge --extra sim -c "$SOURCE/requirements.lock" \
    --torch-backend "$TORCH_BACKEND" --quiet -o "$PREFIX/edge.lock"
# Bytecode compiled at install: uv writes no .pyc by default, so the service would compile torch and
# lerobot from source at every start and every run assignment.
"$UV" pip install --python "$PREFIX/venv/bin/python" --torch-backend "$TORCH_BACKEND" \
    --compile-bytecode -r "$PREFIX/edge.lock"
"$UV" pip install --python "$PREFIX/venv/bin/python" --no-deps --reinstall-package robofleet \
    --compile-bytecode "$SOURCE"
install -d -m 0755 "$PREFIX/docs"
[ -f "$SOURCE/docs/deploy.md" ] && install -m 0644 "$SOURCE/docs/deploy.md" "$PREFIX/docs/deploy.md"

umask 077
cat > "$ETC/edge.env" <<ENV
ROBOFLEET_SERVER=$SERVER
ROBOFLEET_ROBOT=$ROBOT
ROBOFLEET_EDGE_ARGS=
ENV
if [ -n "$EDGE_ARGS_GIVEN" ]; then
    printf '%s\n' "# robofleet edge options of this robot, one per line (written by install.sh)" > "$ETC/edge.args.new"
    for arg in "$@"; do printf '%s\n' "$arg" >> "$ETC/edge.args.new"; done
    mv "$ETC/edge.args.new" "$ETC/edge.args"
fi
[ -f "$ETC/edge.args" ] || printf '%s\n' "# robofleet edge options of this robot, one per line (written by install.sh)" > "$ETC/edge.args"
[ -f "$ETC/edge.yaml" ] || printf '# robofleet settings of this robot computer (see docs/deploy.md)\nedge: {}\ncomms: {}\nhal: {}\n' > "$ETC/edge.yaml"
if [ -n "$TOKEN_FILE" ]; then
    install -m 0600 -o robofleet -g robofleet "$TOKEN_FILE" "$ETC/enroll_token"
fi
chmod 0644 "$ETC/edge.yaml"
chown root:robofleet "$ETC/edge.env" "$ETC/edge.args" && chmod 0640 "$ETC/edge.env" "$ETC/edge.args"

install -d -m 0755 "$PREFIX/bin"
install -m 0755 "$SOURCE/deploy/edge/robofleet-edge-run.sh" "$PREFIX/bin/robofleet-edge-run"
install -m 0644 "$SOURCE/deploy/systemd/robofleet-edge.service" "$UNIT_DIR/robofleet-edge.service"
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    systemctl enable --now robofleet-edge.service
    systemctl restart robofleet-edge.service
    echo "robofleet-edge.service running; logs: journalctl -u robofleet-edge -f"
else
    echo "installed; systemd is not running here, start with: systemctl enable --now robofleet-edge"
fi
