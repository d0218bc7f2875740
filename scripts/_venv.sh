# Sourced by scripts/demo and scripts/test: makes .venv with gpu-cockpit installed in it.
# On a fresh Debian machine python3 may lack venv; as root we install python3-venv.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
apt_install() {
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@") >/dev/null
  else
    sudo sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $*" >/dev/null
  fi
}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv 2>/dev/null || { rm -rf .venv; apt_install python3-venv; "$PY" -m venv .venv; }
fi
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
install_extras=${1:-}
.venv/bin/python -m pip install -q -e ".${install_extras}" 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -c 'import cockpit, textual, asyncssh, psutil, yaml, setproctitle' \
  || { echo "gpu-cockpit: installing into .venv failed (see pip's messages above)" >&2; exit 1; }
