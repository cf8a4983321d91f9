"""The real Helm engine (helm-python-sdk, Helm v4's Go library) for kedge's chart tests.

Run with the interpreter `scripts/helm-env.sh` prints. Reads the values as JSON on stdin and
prints one JSON object on stdout:

  render CHART NAMESPACE   {"objects": [...], "crds": [...], "invalid": [...],
                            "unvalidated": [...]} or {"error": "<Helm's message>"}
  lint CHART               Helm's lint report (messages with severity 0-3)
  install|upgrade CHART RELEASE NAMESPACE KUBECONFIG [--reuse-values]
                           {"manifest": [...objects], "revision": N, "status": ...}
                           or {"error": ...}
                           (CHART: a chart directory or a packaged .tgz; --reuse-values:
                           upgrade keeps the release's values and merges these over them)
  uninstall RELEASE NAMESPACE KUBECONFIG
                           {"info": ...} or {"error": ...}
  package CHART DESTINATION
                           {"archive": "DESTINATION/NAME-VERSION.tgz"} (helm package)

Every rendered object (and CRD) is validated against the Kubernetes schemas of
KUBE_VERSION with kubernetes-validate in strict mode (unknown fields are errors); a kind it
has no schema for is listed under "unvalidated".
"""

import json
import sys

import kubernetes_validate
import yaml
from helm_python import errors
from helm_python.chart import Chart, lint, package
from helm_python.config import Config

KUBE_VERSION = "1.33"


def documents(text):
    return [d for d in yaml.safe_load_all(text) if d]


def structural_problems(schema, path):
    """Where a CRD schema is not structural: a node without a type (unless it is
    int-or-string or preserves unknown fields)."""
    out = []
    if not isinstance(schema, dict):
        return out
    if (
        "type" not in schema
        and not schema.get("x-kubernetes-int-or-string")
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out.append(f"{path}: no type")
    for name, sub in (schema.get("properties") or {}).items():
        out.extend(structural_problems(sub, f"{path}.{name}"))
    if isinstance(schema.get("items"), dict):
        out.extend(structural_problems(schema["items"], f"{path}[]"))
    if isinstance(schema.get("additionalProperties"), dict):
        out.extend(structural_problems(schema["additionalProperties"], f"{path}{{}}"))
    return out


def check(objects, invalid, unvalidated):
    for obj in objects:
        name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        try:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            unvalidated.append(obj.get("kind"))
        except kubernetes_validate.ValidationError as e:
            invalid.append(f"{name}: {'.'.join(str(p) for p in e.path)}: {e.message}")
        if obj.get("kind") == "CustomResourceDefinition":
            for v in obj["spec"]["versions"]:
                schema = v.get("schema", {}).get("openAPIV3Schema")
                if schema is None:
                    invalid.append(f"{name} {v['name']}: no schema")
                else:
                    for p in structural_problems(schema, v["name"]):
                        invalid.append(f"{name}: not structural at {p}")


def render(chart_path, namespace, values):
    with Chart.load(chart_path) as chart:
        try:
            out = chart.render(values, name=chart.name, namespace=namespace, is_install=True)
        except errors.HelmError as e:
            return {"error": str(e)}
        objects = []
        for path in sorted(out):
            if path.endswith(".yaml"):
                objects.extend(documents(out[path]))
        crds = [o for c in chart.crds for o in documents(c["data"])]
    invalid, unvalidated = [], []
    check(objects + crds, invalid, unvalidated)
    return {"objects": objects, "crds": crds, "invalid": invalid, "unvalidated": unvalidated}


def release(verb, chart_path, name, namespace, kubeconfig, values, reuse_values=False):
    with Config(kubeconfig_path=kubeconfig, namespace=namespace) as config:
        try:
            if verb == "install":
                rel = config.install(
                    chart_path, name, values, namespace=namespace, create_namespace=True, timeout=60
                )
            else:
                rel = config.upgrade(
                    chart_path,
                    name,
                    values,
                    namespace=namespace,
                    timeout=60,
                    reuse_values=reuse_values,
                )
        except errors.HelmError as e:
            return {"error": str(e)}
    return {
        "manifest": documents(rel.get("manifest", "")),
        "revision": rel.get("revision"),
        "status": rel.get("status"),
    }


def uninstall(name, namespace, kubeconfig):
    with Config(kubeconfig_path=kubeconfig, namespace=namespace) as config:
        try:
            out = config.uninstall(name, timeout=60)
        except errors.HelmError as e:
            return {"error": str(e)}
    return {"info": out.get("info", "")}


def main(argv):
    values = json.loads(sys.stdin.read() or "null")
    verb = argv[1]
    if verb == "render":
        result = render(argv[2], argv[3], values)
    elif verb == "lint":
        result = lint(argv[2], values, strict=True, kube_version=f"v{KUBE_VERSION}.0")
    elif verb in ("install", "upgrade"):
        reuse = "--reuse-values" in argv[6:]
        result = release(verb, argv[2], argv[3], argv[4], argv[5], values, reuse)
    elif verb == "uninstall":
        result = uninstall(argv[2], argv[3], argv[4])
    elif verb == "package":
        result = {"archive": package(argv[2], destination=argv[3])}
    else:
        sys.exit(
            f"unknown command {verb!r}: render, lint, install, upgrade, uninstall or package"
        )
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main(sys.argv)
