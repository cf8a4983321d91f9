#!/usr/bin/env bash
# A local fleet on loopback: one kedge-hub and three kedge-agents with development
# certificates, and a live view of their sessions. Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${KEDGE_BIN:-target/release}
dir=${KEDGE_DEMO_DIR:-.kedge-demo}
members=(member-1 member-2 member-3)
quic=127.0.0.1:${KEDGE_DEMO_QUIC_PORT:-17443}
ops=127.0.0.1:${KEDGE_DEMO_OPS_PORT:-18080}

mkdir -p "$dir/logs"
"$bin/kubectl-kedge" dev-certs --dir "$dir/pki" --members "$(IFS=,; echo "${members[*]}")" >/dev/null

pids=()
cleanup() {
  trap - INT TERM EXIT
  echo; echo "stopping the fleet..."
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  echo "stopped; logs are in $dir/logs"
}
trap cleanup INT TERM EXIT

"$bin/kedge-hub" --listen "$quic" --ops-listen "$ops" \
  --tls-cert "$dir/pki/hub.pem" --tls-key "$dir/pki/hub-key.pem" --tls-ca "$dir/pki/ca.pem" \
  --heartbeat-interval 1s 2>"$dir/logs/hub.log" &
pids+=($!)
for m in "${members[@]}"; do
  "$bin/kedge-agent" --hub "$quic" --hub-server-name localhost \
    --tls-cert "$dir/pki/member-$m.pem" --tls-key "$dir/pki/member-$m-key.pem" \
    --tls-ca "$dir/pki/ca.pem" --ops-listen 127.0.0.1:0 --reconnect-max 5s 2>"$dir/logs/$m.log" &
  pids+=($!)
done

echo "hub: QUIC $quic, ops http://$ops (/metrics /healthz /readyz /v1/sessions)"
echo "try: kill -STOP ${pids[1]}  (freeze member-1: Unreachable after 3 missed heartbeats)"
echo "     kill -CONT ${pids[1]}  (it comes back)"
if [[ -n "${KEDGE_DEMO_ONCE:-}" ]]; then
  sleep 3
  "$bin/kubectl-kedge" sessions --hub "http://$ops"
  exit 0
fi
while sleep 1; do
  clear 2>/dev/null || true
  date -u +"%H:%M:%S  kedge fleet (Ctrl-C to stop)"
  "$bin/kubectl-kedge" sessions --hub "http://$ops" || echo "(hub not answering)"
done
