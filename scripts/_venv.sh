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
install_extras=${1:-}
# Installed already, from this pyproject.toml with these extras (the package is editable: the code
# itself needs no install)? Then skip pip: it costs seconds at every start.
stamp=".venv/.gpu-cockpit-installed"
want="$( (cat pyproject.toml; echo "extras=${install_extras}"; .venv/bin/python -V) | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] \
   && .venv/bin/python -c 'import cockpit, textual, asyncssh, psutil, yaml, setproctitle' 2>/dev/null; then
  return 0 2>/dev/null || exit 0
fi
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -m pip install -q -e ".${install_extras}" 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -c 'import cockpit, textual, asyncssh, psutil, yaml, setproctitle' \
  || { echo "gpu-cockpit: installing into .venv failed (see pip's messages above)" >&2; exit 1; }
echo "$want" > "$stamp"
