#!/bin/bash
# User data of a bench GPU instance (a template: infra/user_data.py fills in its fields).
#
# Fetches the agent asset from S3, installs it into a virtual environment and starts the agent
# as a systemd unit. Everything campaign-specific comes later, from the instance's own tags and
# the campaign spec in S3; nothing secret is here (the HF token is read by the agent from
# Secrets Manager at run time). cloud-init runs this once, as root, at first boot; its output
# is in /var/log/cloud-init-output.log.
#
# Instances must not outlive their work, so every path ends in a power-off, which the launch
# template turns into termination:
#   - a backstop at boot: power off after MAX_HOURS, whatever happens;
#   - this script failing: power off after FAILURE_GRACE_MIN (time to look in over SSM);
#   - the agent deciding: at once when its shard is done, after the grace when it failed,
#     never with the campaign's end_action "stay" (the agent owns that decision);
#   - the agent crashing (a non-zero exit): power off after the grace.
# A later `shutdown` replaces a pending one, so the agent may schedule its own.
set -euo pipefail

readonly ASSET_URI='@@ASSET_URI@@'
readonly REGION='@@REGION@@'
readonly MAX_HOURS='@@MAX_HOURS@@'
readonly FAILURE_GRACE_MIN='@@FAILURE_GRACE_MIN@@'
readonly BENCH_HOME=/opt/bench
readonly APP_DIR="${BENCH_HOME}/app"
readonly VENV_DIR="${BENCH_HOME}/venv"
readonly ENV_FILE=/etc/bench/agent.env
readonly UNIT=bench-agent.service
# The instance store, where the instance type has one (the DLAMI mounts it here): fast local
# NVMe for the engines' environments, builds, pip and model caches; the root volume else.
readonly NVME=/opt/dlami/nvme
# The default CUDA toolkit of the DLAMI (a link to /usr/local/cuda-<major>.<minor>).
readonly CUDA_LINK=/usr/local/cuda

log() {
  printf '%s bench-bootstrap: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*"
}

on_error() {
  log "FAILED at line $1; powering off in ${FAILURE_GRACE_MIN} min"
  shutdown -h "+${FAILURE_GRACE_MIN}" "bench bootstrap failed" || true
}
trap 'on_error "${LINENO}"' ERR

log "START"
shutdown -h "+$((MAX_HOURS * 60))" "bench max lifetime (${MAX_HOURS} h) reached"

install -d -m 0755 "${BENCH_HOME}" /etc/bench
# The AMI's system Python has boto3; no reliance on the AWS CLI being installed.
if ! python3 -c 'import boto3' 2>/dev/null; then
  log "boto3 missing from the system Python; installing python3-boto3"
  apt-get -o DPkg::Lock::Timeout=600 update -q
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q python3-boto3
fi
python3 - "${ASSET_URI}" "${BENCH_HOME}/agent.zip" "${REGION}" <<'PY'
import sys

import boto3

uri, dest, region = sys.argv[1:]
bucket, key = uri.removeprefix("s3://").split("/", 1)
boto3.client("s3", region_name=region).download_file(bucket, key, dest)
PY
# Toolchains the engines' recipes build with: CMake for llama.cpp's CUDA build (not
# guaranteed on the Base DLAMI); compilers and headers for source builds.
if ! command -v cmake >/dev/null; then
  log "installing build tools (cmake)"
  apt-get -o DPkg::Lock::Timeout=600 update -q
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q \
    cmake build-essential pkg-config libssl-dev
fi
# Rust for mistral.rs's `cargo install` (the Base DLAMI has none; Ubuntu's rustc is too old
# for its lock file): rustup's minimal profile, root's toolchain, on the unit's PATH below.
if ! command -v cargo >/dev/null && [[ ! -x /root/.cargo/bin/cargo ]]; then
  log "installing the Rust toolchain (rustup, minimal profile)"
  curl --proto '=https' --tlsv1.2 -sSf --retry 3 https://sh.rustup.rs |
    HOME=/root sh -s -- -y --profile minimal --no-modify-path
fi
# cuRAND's headers and library for mistral.rs's CUDA build (its kernels include
# curand_kernel.h; seed 000 had to install libcurand-dev-13-1): the package of the toolkit
# /usr/local/cuda points to, only where that toolkit lacks it. Not fatal: only mistral.rs
# needs it, and its install step then fails with the compiler's message.
ensure_curand_dev() {
  local toolkit version package
  toolkit=$(readlink -f "${CUDA_LINK}") || return 0
  [[ -d "${toolkit}" ]] || { log "no CUDA toolkit at ${CUDA_LINK}; cuRAND not checked"; return 0; }
  if [[ -f "${toolkit}/include/curand.h" ]] && compgen -G "${toolkit}/lib*/libcurand.so" >/dev/null; then
    return 0
  fi
  version=${toolkit##*/cuda-}
  if [[ ! "${version}" =~ ^[0-9]+\.[0-9]+$ ]]; then
    log "CUDA toolkit ${toolkit} has no cuRAND and no version in its name; not installed"
    return 0
  fi
  package="libcurand-dev-${version//./-}"
  log "installing ${package} (cuRAND for ${toolkit})"
  if ! { apt-get -o DPkg::Lock::Timeout=600 update -q &&
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q "${package}"; }; then
    log "WARNING: ${package} did not install; mistral.rs's CUDA build will fail"
  fi
}
ensure_curand_dev
if mountpoint -q "${NVME}"; then
  CACHE_ROOT="${NVME}/bench"
else
  CACHE_ROOT=/var/lib/bench-cache
fi
readonly CACHE_ROOT
install -d -m 0755 "${CACHE_ROOT}/work" "${CACHE_ROOT}/pip"
rm -rf "${APP_DIR}"
python3 -m zipfile -e "${BENCH_HOME}/agent.zip" "${APP_DIR}"
# The agent's environment: the project, its dependencies and the no-deps pins, then a check
# that every package the agent imports lazily is there (agent/install.sh).
PYTHON=python3 bash "${APP_DIR}/agent/install.sh" "${APP_DIR}" "${VENV_DIR}"

# Names, not secrets: the agent reads the token itself, with the instance role.
install -m 0600 /dev/null "${ENV_FILE}"
cat >"${ENV_FILE}" <<'EOF'
@@AGENT_ENV@@
EOF
{
  printf 'BENCH_CACHE_DIR=%s\n' "${CACHE_ROOT}"
  printf 'PIP_CACHE_DIR=%s\n' "${CACHE_ROOT}/pip"
  printf 'HF_HOME=%s\n' "${CACHE_ROOT}/hf"
} >>"${ENV_FILE}"

cat >/etc/systemd/system/bench-poweroff@.service <<'EOF'
[Unit]
Description=Power off this bench instance in %i minutes (the launch template terminates it)

[Service]
Type=oneshot
ExecStart=/usr/sbin/shutdown -h +%i "bench agent exited"
EOF

cat >"/etc/systemd/system/${UNIT}" <<EOF
[Unit]
Description=LLM serving benchmark agent (python3 -m agent)
Wants=network-online.target
After=network-online.target
OnFailure=bench-poweroff@${FAILURE_GRACE_MIN}.service

[Service]
Type=exec
EnvironmentFile=${ENV_FILE}
Environment=PATH=/root/.cargo/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
StateDirectory=bench
WorkingDirectory=/var/lib/bench
ExecStart=${VENV_DIR}/bin/python3 -m agent --work-dir ${CACHE_ROOT}/work
Restart=no
# A spot interruption notice gives two minutes; leave the agent most of it to flush.
TimeoutStopSec=100
KillMode=mixed

[Install]
WantedBy=multi-user.target
EOF

systemctl daemon-reload
systemctl enable --now "${UNIT}"
log "END agent started as ${UNIT}"
