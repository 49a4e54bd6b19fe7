#!/usr/bin/env python3
"""Validates every manifest under deploy/kubernetes/ offline, against the Kubernetes object
schemas that the kubernetes-validate package bundles, and the ServiceMonitor (a custom
resource) against the schema vendored in deploy/kubernetes/schemas/. No cluster, no network.

Then checks that it can fail: a copy of the manifests with deliberate faults, made in a
temporary directory, must be refused, each fault by name.

Exit 0 when all is well, 1 on a failure (each says what was expected), 77 (ctest's skip)
when kubernetes-validate or PyYAML is not installed: scripts/install-deps.sh installs both
into build/venv.
"""
import argparse
import copy
import json
import os
import sys
import tempfile

try:
    import jsonschema
    import kubernetes_validate
    import yaml
except ImportError as e:
    print(f"SKIP: {e.name} is not installed in {sys.executable}; scripts/install-deps.sh installs kubernetes-validate "
          "(with PyYAML and jsonschema) into build/venv; the manifests were not validated")
    sys.exit(77)

CUSTOM_SCHEMAS = {("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-monitoring.coreos.com-v1.json"}
NOT_OBJECTS = {"kustomization.yaml"}


def manifests(root):
    found = []
    for d, _, files in os.walk(root):
        if os.path.basename(d) == "schemas":
            continue
        found += [os.path.join(d, f) for f in files if f.endswith((".yaml", ".yml")) and f not in NOT_OBJECTS]
    return sorted(found)


def validate_object(obj, where, root, k8s_version):
    """The error text, or None when the object is valid."""
    if not isinstance(obj, dict) or "apiVersion" not in obj or "kind" not in obj:
        return f"{where}: not a Kubernetes object (expected a mapping with apiVersion and kind)"
    key = (obj["apiVersion"], obj["kind"])
    if key in CUSTOM_SCHEMAS:
        with open(os.path.join(root, "schemas", CUSTOM_SCHEMAS[key])) as f:
            schema = json.load(f)
        errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(obj), key=lambda e: list(e.path))
        if errors:
            return "; ".join(f"{where}: {'.'.join(map(str, e.path)) or '(top)'}: {e.message}" for e in errors)
        return None
    try:
        kubernetes_validate.validate(obj, k8s_version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return f"{where}: {'.'.join(map(str, e.path)) or '(top)'}: {e.message}"
    except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as e:
        return f"{where}: no schema for {obj['apiVersion']} {obj['kind']} in Kubernetes {k8s_version}: {e}"
    return None


def validate_tree(root, k8s_version, quiet=False):
    """(objects validated, errors)."""
    errors, count = [], 0
    files = manifests(root)
    if not files:
        return 0, [f"{root}: no manifests found (expected *.yaml files)"]
    for path in files:
        rel = os.path.relpath(path, root)
        try:
            with open(path) as f:
                docs = [d for d in yaml.safe_load_all(f) if d is not None]
        except yaml.YAMLError as e:
            errors.append(f"{rel}: not valid YAML: {e}")
            continue
        for i, obj in enumerate(docs):
            where = f"{rel}[{i}] {obj.get('kind', '?') if isinstance(obj, dict) else '?'}"
            err = validate_object(obj, where, root, k8s_version)
            count += 1
            if err:
                errors.append(err)
            elif not quiet:
                print(f"valid: {where} {obj['apiVersion']} {obj.get('metadata', {}).get('name', '')}")
    # kustomization.yaml: every file it lists exists, and every top-level manifest is listed.
    kpath = os.path.join(root, "kustomization.yaml")
    if os.path.exists(kpath):
        with open(kpath) as f:
            listed = yaml.safe_load(f).get("resources", [])
        for r in listed:
            if not os.path.exists(os.path.join(root, r)):
                errors.append(f"kustomization.yaml: lists {r}, which does not exist")
        top = {os.path.basename(p) for p in files if os.path.dirname(p) == os.path.abspath(root) or os.path.dirname(p) == root}
        for name in sorted(top - set(listed)):
            errors.append(f"kustomization.yaml: {name} is not listed in resources (expected every top-level manifest)")
        if not quiet:
            print(f"checked: kustomization.yaml lists {len(listed)} manifests, all present")
    return count, errors


def broken_copy(root, tmp):
    """A copy of the manifests with one fault per file kind; the faults' names."""
    import shutil
    dst = os.path.join(tmp, "kubernetes")
    shutil.copytree(root, dst)

    def rewrite(name, change):
        path = os.path.join(dst, name)
        with open(path) as f:
            obj = yaml.safe_load(f)
        change(obj)
        with open(path, "w") as f:
            yaml.safe_dump(obj, f)

    # kubernetes-validate reports an object's first error only: one fault per object.
    def ds(o):  # a string where the schema wants an integer
        o["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "sixty"

    def job(o):  # a misspelt field (strict mode refuses fields the schema lacks)
        o["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []

    def sm(o):  # the required selector gone, a bad interval
        del o["spec"]["selector"]
        o["spec"]["endpoints"][0]["interval"] = "30 seconds"

    rewrite("daemonset.yaml", ds)
    rewrite(os.path.join("examples", "job-unmodified.yaml"), job)
    rewrite("servicemonitor.yaml", sm)
    with open(os.path.join(dst, "service.yaml"), "a") as f:
        f.write("  ports: [unclosed\n")
    return dst, ["terminationGracePeriodSeconds", "volumeMount", "selector", "interval", "service.yaml: not valid YAML"]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--manifests", default=os.path.join(here, "..", "..", "deploy", "kubernetes"))
    ap.add_argument("--kubernetes-version", default="1.30.0")
    args = ap.parse_args()
    root = os.path.abspath(args.manifests)
    print(f"validating {root} against Kubernetes {args.kubernetes_version} "
          f"(kubernetes-validate {kubernetes_validate.version.__version__ if hasattr(kubernetes_validate.version, '__version__') else ''}) "
          f"and {', '.join(CUSTOM_SCHEMAS.values())}")
    count, errors = validate_tree(root, args.kubernetes_version)
    for e in errors:
        print(f"FAIL: {e} (expected a valid manifest)")
    print(f"{count} objects validated, {len(errors)} invalid")

    # The check must be able to fail: a broken copy must be refused, every fault by name.
    with tempfile.TemporaryDirectory() as tmp:
        dst, faults = broken_copy(root, tmp)
        _, broken_errors = validate_tree(dst, args.kubernetes_version, quiet=True)
        said = "\n".join(broken_errors)
        missed = [f for f in faults if f not in said]
        if missed:
            errors.append("x")
            print(f"FAIL: a deliberately broken copy ({dst}) should be refused for {', '.join(missed)}; it reported: {said or 'nothing'}")
        else:
            print(f"checked: a deliberately broken copy is refused for each of its {len(faults)} faults:")
            for e in broken_errors:
                print(f"  refused as expected: {e}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
