#!/bin/sh
# Install the robofleet edge agent on a robot computer (Debian/Ubuntu, Python 3.12, systemd).
#
#   sudo sh deploy/edge/install.sh --server cloud.example.org:50051 --robot arm-7 \
#        [--token-file token.txt] [--run RUN] [--source DIR] [--torch-backend cpu]
#
# Installs robofleet[edge,sim] (no Ray, no learner) into /opt/robofleet/venv with the versions of
# requirements.lock, writes /etc/robofleet/{edge.env,edge.yaml,enroll_token}, creates the
# robofleet user and enables robofleet-edge.service. Re-running it upgrades in place and keeps
# the spool (/var/lib/robofleet/spool) and the stored credential.
set -eu

SERVER="" ROBOT="" RUN="default" TOKEN_FILE="" TORCH_BACKEND="cpu"
SOURCE="$(cd "$(dirname "$0")/../.." && pwd)"
PREFIX=/opt/robofleet ETC=/etc/robofleet
UNIT_DIR=/etc/systemd/system
while [ $# -gt 0 ]; do
    case "$1" in
        --server) SERVER="$2"; shift 2 ;;
        --robot) ROBOT="$2"; shift 2 ;;
        --run) RUN="$2"; shift 2 ;;
        --token-file) TOKEN_FILE="$2"; shift 2 ;;
        --source) SOURCE="$2"; shift 2 ;;
        --torch-backend) TORCH_BACKEND="$2"; shift 2 ;;
        *) echo "install.sh: unknown option $1" >&2; exit 2 ;;
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
"$UV" pip install --python "$PREFIX/venv/bin/python" --torch-backend "$TORCH_BACKEND" \
    -r "$PREFIX/edge.lock"
"$UV" pip install --python "$PREFIX/venv/bin/python" --no-deps --reinstall-package robofleet "$SOURCE"
install -d -m 0755 "$PREFIX/docs"
[ -f "$SOURCE/docs/deploy.md" ] && install -m 0644 "$SOURCE/docs/deploy.md" "$PREFIX/docs/deploy.md"

umask 077
cat > "$ETC/edge.env" <<ENV
ROBOFLEET_SERVER=$SERVER
ROBOFLEET_ROBOT=$ROBOT
ROBOFLEET_RUN=$RUN
ROBOFLEET_EDGE_ARGS=
ENV
[ -f "$ETC/edge.yaml" ] || printf '# robofleet settings of this robot computer (see docs/deploy.md)\nedge: {}\ncomms: {}\nhal: {}\n' > "$ETC/edge.yaml"
if [ -n "$TOKEN_FILE" ]; then
    install -m 0600 -o robofleet -g robofleet "$TOKEN_FILE" "$ETC/enroll_token"
fi
chmod 0644 "$ETC/edge.yaml"
chown root:robofleet "$ETC/edge.env" && chmod 0640 "$ETC/edge.env"

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
