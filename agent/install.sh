#!/bin/bash
# Installs the agent from its unzipped asset into a fresh virtual environment: the commands
# the instance's user data runs (infra/user_data.sh calls this file), and what the rehearsal
# (tests/test_rehearsal.py) and tests/infra/test_agent_install.py run, so what is tested is
# what an instance does.
#
#   install.sh APP_DIR VENV_DIR
#
# PYTHON names the interpreter the environment is made from (default python3: the AMI's
# system Python, 3.12 on the Ubuntu 24.04 DLAMI). Only the project and its dependencies go
# in, plus the packages pinned in agent/requirements-nodeps.txt without theirs; the engines
# get their own environments later, from their recipes.
set -euo pipefail

readonly APP_DIR="$1"
readonly VENV_DIR="$2"
readonly PYTHON="${PYTHON:-python3}"

log() {
  printf '%s bench-install: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*"
}

# pyproject.toml names README.md as its readme; the build needs the file, not its text.
[[ -e "${APP_DIR}/README.md" ]] || : >"${APP_DIR}/README.md"

rm -rf "${VENV_DIR}"
if ! "${PYTHON}" -m venv "${VENV_DIR}"; then
  # Ubuntu ships venv's ensurepip in a separate package.
  log "python3-venv missing; installing it"
  rm -rf "${VENV_DIR}"
  apt-get -o DPkg::Lock::Timeout=600 update -q
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q python3-venv
  "${PYTHON}" -m venv "${VENV_DIR}"
fi
readonly PIP=("${VENV_DIR}/bin/python3" -m pip --disable-pip-version-check)
"${PIP[@]}" install --quiet "${APP_DIR}"
"${PIP[@]}" install --quiet --no-deps -r "${APP_DIR}/agent/requirements-nodeps.txt"
# Fail here, in the user data's log, rather than in the first job that needs one of them.
"${VENV_DIR}/bin/python3" -m agent.preflight
log "agent installed into ${VENV_DIR}"
