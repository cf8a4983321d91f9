#!/usr/bin/env bash
# The chart tests' Python environment: the real Helm engine (helm-python-sdk, Helm v4's Go
# library; there is no helm binary on these machines) and kubernetes-validate, pinned, in a
# virtualenv under target/. Idempotent: a stamp naming the pins marks a finished install,
# so a second run costs nothing and a change of pins reinstalls. Prints the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
PINS="helm-python-sdk==0.2.2 kubernetes-validate==1.37.0 PyYAML==6.0.2"
venv=${KEDGE_PYENV:-target/pyenv}
stamp="$venv/.kedge-stamp"
# One installer at a time (test binaries or shells started together on a fresh tree).
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$PINS" ] && [ -x "$venv/bin/python" ]; then
  echo "$venv/bin/python"
  exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv" >&2
# shellcheck disable=SC2086
"$venv/bin/python" -m pip install --disable-pip-version-check --quiet $PINS >&2
"$venv/bin/python" -c 'import helm_python.chart, kubernetes_validate, yaml' >&2
echo "$PINS" >"$stamp"
echo "$venv/bin/python"
