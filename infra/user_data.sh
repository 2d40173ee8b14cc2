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
aws s3 cp --only-show-errors --region "${REGION}" "${ASSET_URI}" "${BENCH_HOME}/agent.zip"
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
StateDirectory=bench
WorkingDirectory=/var/lib/bench
ExecStart=${VENV_DIR}/bin/python3 -m agent
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
