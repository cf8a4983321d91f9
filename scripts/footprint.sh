#!/usr/bin/env bash
# Measures the agent's footprint: the shipped binary's size (the `agent` profile, what the
# image builds) and the resident memory of an idle agent connected to a hub on loopback and
# to a simulated member cluster (after a settle time), split into anonymous and file-backed
# pages. Fails unless the agent's session with the hub was established.
# Prints a Markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p kedge-hub -p kedge-sim --bins >/dev/null
cargo build --profile agent -p kedge-agent --bin kedge-agent >/dev/null
B=target/release
AGENT=${KEDGE_AGENT_BIN:-target/agent/kedge-agent}
dir=$(mktemp -d)
trap 'kill $hub $agent $sim 2>/dev/null || true; rm -rf "$dir"' EXIT
"$B/kubectl-kedge" dev-certs --dir "$dir" --members footprint >/dev/null
"$B/kedge-sim" serve --clusters footprint --dir "$dir" >"$dir/sim.out" 2>/dev/null & sim=$!
for _ in $(seq 1 100); do grep -q "kedge-sim ready" "$dir/sim.out" && break; sleep 0.1; done
port=$(python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# A hub of its own, without a hub cluster (`--controllers false`): it admits any member
# with a certificate from the CA and is active alone.
"$B/kedge-hub" --controllers false --listen "127.0.0.1:$port" --ops-listen 127.0.0.1:0 \
  --tls-cert "$dir/hub.pem" --tls-key "$dir/hub-key.pem" --tls-ca "$dir/ca.pem" 2>/dev/null & hub=$!
sleep 0.5
"$AGENT" --hub "127.0.0.1:$port" --hub-server-name localhost --ops-listen 127.0.0.1:0 --kubeconfig "$dir/footprint.kubeconfig" --namespaces default \
  --tls-cert "$dir/member-footprint.pem" --tls-key "$dir/member-footprint-key.pem" --tls-ca "$dir/ca.pem" 2>"$dir/agent.log" & agent=$!
settle=${SETTLE_SECONDS:-20}
sleep "$settle"
if ! grep -q "session established" "$dir/agent.log"; then
  echo "footprint: the agent has no session with the hub; its log:" >&2
  cat "$dir/agent.log" >&2
  exit 1
fi
rss_kib=$(awk '/VmRSS/ {print $2}' "/proc/$agent/status")
hwm_kib=$(awk '/VmHWM/ {print $2}' "/proc/$agent/status")
# Anonymous (heap, stacks, relocated data) and file-backed (the binary's and libraries' pages).
anon_kib=$(awk '/RssAnon/ {print $2}' "/proc/$agent/status")
file_kib=$(awk '/RssFile/ {print $2}' "/proc/$agent/status")
echo "| what | value |"
echo "|---|---|"
echo "| kedge-agent binary (\`agent\` profile, stripped) | $(( $(stat -c %s "$AGENT") / 1024 )) KiB |"
echo "| kedge-agent idle RSS after ${settle}s connected | ${rss_kib} KiB (peak ${hwm_kib} KiB) |"
echo "| of which anonymous / file-backed | ${anon_kib} KiB / ${file_kib} KiB |"
echo "| machine | $(nproc) cores, $(uname -m), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(rustc --version) |"
