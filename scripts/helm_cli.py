"""`helm install` and `helm uninstall` on the real Helm engine, for machines without a helm binary.

Run with the interpreter `scripts/helm-env.sh` prints (it has helm-python-sdk, Helm v4's Go
library). The part of helm's command line the README's walkthrough uses, with helm's
meaning, so that tests/tests/readme_walkthrough.rs can run the walkthrough's Helm branch as
written:

  helm install RELEASE CHART [-n|--namespace NS] [--create-namespace]
                             [--kube-context CONTEXT] [-f|--values FILE]... [--set K=V]...
  helm uninstall RELEASE [-n NS] [--kube-context CONTEXT]

`--set` takes helm's syntax for what the walkthrough needs: dotted keys, `{a,b}` lists,
`true`/`false`, integers, everything else a string; values files are merged in order, then
each `--set`. The cluster is `$KUBECONFIG`'s current context, or `--kube-context`. Any other
flag is refused with a message naming it, never ignored.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import helm_chart  # noqa: E402


def strval(text):
    if text.startswith("{") and text.endswith("}"):
        inner = text[1:-1]
        return [strval(v) for v in inner.split(",")] if inner else []
    if text in ("true", "false"):
        return text == "true"
    try:
        return int(text)
    except ValueError:
        return text


def set_value(values, assignment):
    key, sep, text = assignment.partition("=")
    if not sep or not key:
        raise SystemExit(f"Error: --set {assignment!r}: expected KEY=VALUE")
    node = values
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise SystemExit(f"Error: --set {assignment!r}: {part} is not a map")
    node[parts[-1]] = strval(text)


def merge(base, over):
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            merge(base[k], v)
        else:
            base[k] = v
    return base


def parse(args):
    opts = {"namespace": "default", "create": False, "context": None, "files": [], "sets": []}
    positional = []
    it = iter(args)
    for a in it:
        if a in ("-n", "--namespace"):
            opts["namespace"] = next(it)
        elif a == "--create-namespace":
            opts["create"] = True
        elif a == "--kube-context":
            opts["context"] = next(it)
        elif a in ("-f", "--values"):
            opts["files"].append(next(it))
        elif a == "--set":
            opts["sets"].append(next(it))
        elif a.startswith("-"):
            raise SystemExit(f"Error: unknown flag {a} (this helm runs the real engine for the flags the README uses)")
        else:
            positional.append(a)
    return positional, opts


def kubeconfig(context):
    """The cluster as one kubeconfig file (kubectl's own view of it)."""
    args = ["kubectl", "config", "view", "--minify", "--flatten", "--raw"]
    if context:
        args += ["--context", context]
    out = subprocess.run(args, stdout=subprocess.PIPE, check=True, text=True).stdout
    f = tempfile.NamedTemporaryFile("w", suffix=".kubeconfig", delete=False)
    f.write(out)
    f.close()
    return f.name


def main(argv):
    if len(argv) < 2 or argv[1] not in ("install", "uninstall"):
        raise SystemExit("Error: this helm knows `install` and `uninstall`")
    verb = argv[1]
    positional, opts = parse(argv[2:])
    config = kubeconfig(opts["context"])
    try:
        if verb == "uninstall":
            if len(positional) != 1:
                raise SystemExit("Error: uninstall needs RELEASE")
            result = helm_chart.uninstall(positional[0], opts["namespace"], config)
        else:
            if len(positional) != 2:
                raise SystemExit("Error: install needs RELEASE and CHART")
            release, chart = positional
            values = {}
            for f in opts["files"]:
                merge(values, yaml.safe_load(Path(f).read_text()) or {})
            for s in opts["sets"]:
                set_value(values, s)
            # Helm creates the namespace itself only when asked to.
            if not opts["create"]:
                probe = ["kubectl", "--kubeconfig", config, "get", "namespace", opts["namespace"]]
                if subprocess.run(probe, capture_output=True).returncode != 0:
                    raise SystemExit(f'Error: create: namespaces "{opts["namespace"]}" not found')
            result = helm_chart.release("install", chart, release, opts["namespace"], config, values)
    finally:
        os.unlink(config)
    if "error" in result:
        raise SystemExit(f"Error: {result['error']}")
    if verb == "install":
        print(f"NAME: {positional[0]}\nNAMESPACE: {opts['namespace']}\nSTATUS: {result['status']}\nREVISION: {result['revision']}")
    else:
        print(f'release "{positional[0]}" uninstalled')


if __name__ == "__main__":
    main(sys.argv)
