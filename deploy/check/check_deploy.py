"""Check Switchboard's deploy files offline: the Kubernetes manifests against Kubernetes' schemas
(kubernetes-validate, strict) and the ScaledObjects against scaledobject.schema.json, Compose
against the Compose specification's schema, the Dockerfile with hadolint, the alert rules with
promtool, the dashboard's JSON, and each of them against the product: a Deployment, a budget and
a ScaledObject per worker, scaled on the consumers that worker reads; compose's services; the
pinned versions; the metrics the dashboard and alerts name.

    python3 check_deploy.py --tools DIR --deploy DIR --repo DIR --expect expect.json

DIR of --tools: what tools.sh prints. expect.json (written by tests/tests/deploy_files.rs from
the product's own lists): {"workers": {worker: [[stream, consumer], ...]}, "drain_s": n,
"pins": {name: value}, "nats_reference": the stack's own nats.conf users, rendered for "sb"}.
Prints "ok <check>" or "FAIL <check>: <why>" per check; exits 1 when any failed.
"""
import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tomllib

FAILED = []


def report(check, problems):
    if problems:
        FAILED.append(check)
        for p in problems:
            print(f"FAIL {check}: {p}")
    else:
        print(f"ok {check}")


def run(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return p.returncode, p.stdout + p.stderr


def yaml_docs(yaml, path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def check_kubernetes(args, yaml, jsonschema, expect, env):
    kdir = args.deploy / "kubernetes"
    problems = []
    code, out = run([sys.executable, str(kdir / "generate.py"), "--check"])
    report("kubernetes: the manifests are what generate.py writes", [out.strip()] if code else [])

    kust = yaml.safe_load((kdir / "kustomization.yaml").read_text())
    resources = kust.get("resources", [])
    listed = set(resources)
    manifests = sorted(
        p.name for p in kdir.glob("*.yaml")
        if p.name not in {"kustomization.yaml", "secret.example.yaml", "nats-values.yaml"}
    )
    problems += [f"{r} is listed but does not exist" for r in resources if not (kdir / r).is_file()]
    problems += [f"{m} is not listed in kustomization.yaml" for m in manifests if m not in listed]
    for gen in kust.get("configMapGenerator", []):
        for f in gen.get("files", []):
            if not (kdir / f).is_file():
                problems.append(f"configMapGenerator file {f} does not exist")
    report("kubernetes: kustomization.yaml lists every manifest", problems)

    files = [str(kdir / r) for r in resources if (kdir / r).is_file()]
    files.append(str(kdir / "secret.example.yaml"))
    code, out = run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "--no-warn", "-k",
         args.kubernetes_version, *files],
        env,
    )
    errors = [line for line in out.splitlines() if line.startswith("ERROR")]
    if code and not errors:
        errors = [out.strip() or f"kubernetes-validate exited with {code}"]
    report(f"kubernetes: strict schemas of Kubernetes {args.kubernetes_version}", errors)

    docs = []
    for f in files:
        for d in yaml_docs(yaml, f):
            docs.append((pathlib.Path(f).name, d))
    schema = json.loads((pathlib.Path(__file__).parent / "scaledobject.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    problems = []
    deployments = {d["metadata"]["name"]: d for _, d in docs if d.get("kind") == "Deployment"}
    scaled = {}
    for name, d in docs:
        if d.get("kind") != "ScaledObject":
            continue
        for e in validator.iter_errors(d):
            where = "/".join(str(x) for x in e.absolute_path)
            problems.append(f"{name}: {where}: {e.message}")
        target = d.get("spec", {}).get("scaleTargetRef", {}).get("name")
        if target not in deployments:
            problems.append(f"{name}: scaleTargetRef {target!r} is no Deployment here")
        scaled[target] = d
    report("kubernetes: ScaledObjects (scaledobject.schema.json, targets)", problems)

    problems = []
    budgets = {
        json.dumps(d["spec"]["selector"]["matchLabels"], sort_keys=True)
        for _, d in docs if d.get("kind") == "PodDisruptionBudget"
    }
    for worker, stages in sorted(expect["workers"].items()):
        name = f"switchboard-{worker}"
        dep = deployments.get(name)
        if dep is None:
            problems.append(f"worker {worker}: no Deployment {name}")
            continue
        pod = dep["spec"]["template"]["spec"]
        c = pod["containers"][0]
        if c.get("args") != ["worker", worker]:
            problems.append(f"{name}: args {c.get('args')}, expected ['worker', '{worker}']")
        problems += pod_problems(name, pod, c, expect["drain_s"])
        labels = json.dumps(dep["spec"]["selector"]["matchLabels"], sort_keys=True)
        if labels not in budgets:
            problems.append(f"{name}: no PodDisruptionBudget selects its pods")
        so = scaled.get(name)
        if so is None:
            problems.append(f"{name}: no ScaledObject")
            continue
        got = sorted(
            [t["metadata"]["stream"], t["metadata"]["consumer"]]
            for t in so["spec"]["triggers"] if t["type"] == "nats-jetstream"
        )
        if got != sorted(stages):
            problems.append(f"{name}: scaled on consumers {got}, the worker reads {sorted(stages)}")
    gateway = deployments.get("switchboard-gateway")
    if gateway is None:
        problems.append("no Deployment switchboard-gateway")
    else:
        pod = gateway["spec"]["template"]["spec"]
        problems += pod_problems("switchboard-gateway", pod, pod["containers"][0], expect["drain_s"])
    extra = set(deployments) - {f"switchboard-{w}" for w in expect["workers"]} - {"switchboard-gateway"}
    problems += [f"{d}: a Deployment of no worker" for d in sorted(extra)]
    report("kubernetes: a Deployment, budget and ScaledObject per worker", problems)


def pod_problems(name, pod, container, drain_s):
    problems = []
    grace = pod.get("terminationGracePeriodSeconds", 30)
    if grace <= drain_s:
        problems.append(f"{name}: terminationGracePeriodSeconds {grace} is not longer than the drain ({drain_s} s)")
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    for probe, path in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")]:
        http = container.get(probe, {}).get("httpGet", {})
        if http.get("path") != path or ports.get(http.get("port")) != 8081:
            problems.append(f"{name}: {probe} is not {path} on the admin port 8081")
    if "resources" not in container or "requests" not in container["resources"]:
        problems.append(f"{name}: no resource requests")
    return problems


def check_compose(args, yaml, expect, env):
    path = args.deploy / "compose.yaml"
    code, out = run(
        [str(args.tools / "py/bin/check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path)],
        env,
    )
    report("compose: the Compose specification's schema", [out.strip()] if code else [])
    doc = yaml.safe_load(path.read_text())
    services = doc.get("services", {})
    problems = []
    for worker in sorted(expect["workers"]):
        command = services.get(worker, {}).get("command")
        if command != ["worker", worker]:
            problems.append(f"service {worker}: command {command}, expected ['worker', '{worker}']")
    nats = [s for n, s in services.items() if n.startswith("nats-")]
    if len(nats) != 3:
        problems.append(f"{len(nats)} NATS services, expected a cluster of 3")
    want = f"nats:{expect['pins']['nats']}-alpine"
    for s in nats:
        if not s.get("image", "").endswith(want):
            problems.append(f"NATS image {s.get('image')}, the stack runs {want}")
    for mount in ["compose/nats.conf", "compose/switchboard.toml", "compose/runner.toml"]:
        if not (args.deploy / mount).is_file():
            problems.append(f"{mount} does not exist")
    report("compose: a service per worker, a 3-node NATS cluster at the stack's version", problems)

    problems = []
    for name, service in sorted(services.items()):
        for port in service.get("ports", []):
            host = published_host(port)
            if host in ("", "0.0.0.0", "::", "[::]"):
                problems.append(
                    f"service {name}: port {port!r} is published on every interface; bind it to "
                    "127.0.0.1 (the gateway's through ${SB_GATEWAY_ADDR:-127.0.0.1})"
                )
    report("compose: published ports are bound to loopback", problems)

    conf = (args.deploy / "compose/nats.conf").read_text()
    reference = pathlib.Path(expect["nats_reference"]).read_text()
    problems = []
    for user in ["switchboard", "analytics"]:
        got, want = nats_permissions(conf, user), nats_permissions(reference, user)
        if want is None or None in want.values():
            problems.append(f"user {user}: not found in the stack's own configuration")
        elif got != want:
            problems.append(f"user {user}: {got}, the stack gives {want}")
    report("compose: NATS users' rights are the stack's", problems)
    # Each user in an account of its own, importing what the stack's config imports: a
    # read-only user in the product's account could have JetStream answer into the work
    # subjects (a request's reply subject is the client's choice).
    got, want = nats_sharing(conf), nats_sharing(reference)
    problems = [] if want and got == want else [f"exports and imports {sorted(got)}, the stack has {sorted(want)}"]
    report("compose: NATS accounts' exports and imports are the stack's", problems)


def nats_sharing(conf):
    """The export and import entries of a nats.conf's accounts, comments left out."""
    lines = (line.split("#")[0].strip() for line in conf.splitlines())
    return {line for line in lines if line.startswith(("{ service:", "{ stream:"))}


def published_host(port):
    """The host address a Compose port is published on ("" for every interface), with a
    ${VAR:-default} read as its default: what a fresh deploy/.env gets."""
    if isinstance(port, dict):
        return str(port.get("host_ip", ""))
    text = re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:?-([^}]*)\}", r"\1", str(port))
    text = text.split("/")[0]
    if text.startswith("["):  # [::1]:8080:8080
        return text[: text.index("]") + 1]
    parts = text.split(":")
    return parts[0] if len(parts) == 3 else ""


def nats_permissions(conf, user):
    """The publish and subscribe allow lists of `user` in a nats.conf."""
    m = re.search(r'user:\s*"' + re.escape(user) + r'"(.*?)\n\s*\}\n\s*\}', conf, re.S)
    if not m:
        return None
    block = m.group(1)
    out = {}
    for kind in ["publish", "subscribe"]:
        k = re.search(kind + r":\s*\{\s*allow:\s*\[(.*?)\]", block, re.S)
        out[kind] = re.findall(r'"([^"]*)"', k.group(1)) if k else None
    return out


def check_dockerfile(args, expect):
    path = args.deploy / "image/Dockerfile"
    code, out = run([str(args.tools / "py/bin/hadolint"), "--no-color", str(path)])
    report("image: hadolint", [out.strip()] if code else [])
    text = path.read_text()
    problems = []
    for arg, pin in expect["pins"].items():
        if arg == "nats":
            continue
        m = re.search(r"^ARG " + re.escape(arg) + r"=(.+)$", text, re.M)
        got = m.group(1).strip().strip('"') if m else "missing"
        if got != pin:
            problems.append(f"ARG {arg} is {got}, the stack pins {pin}")
    report("image: the embedder's versions are the stack's pins", problems)


def check_monitoring(args):
    rules = args.deploy / "grafana/alerts.yaml"
    code, out = run([str(args.tools / "prometheus/usr/bin/promtool"), "check", "rules", str(rules)])
    report("grafana: promtool check rules", [out.strip()] if code else [])
    known = set()
    for rs in (args.repo / "services").rglob("*.rs"):
        known |= set(re.findall(r'"(sb_[a-z0-9_]+)"', rs.read_text()))
    problems = []
    exprs = re.findall(r"expr:\s*(.*)", rules.read_text())
    for dash in sorted((args.deploy / "grafana").glob("*.json")):
        try:
            doc = json.loads(dash.read_text())
        except json.JSONDecodeError as e:
            problems.append(f"{dash.name}: {e}")
            continue
        for panel in doc.get("panels", []):
            if not panel.get("targets"):
                problems.append(f"{dash.name}: panel {panel.get('title')!r} has no query")
            exprs += [t.get("expr", "") for t in panel.get("targets", [])]
    for expr in exprs:
        for name in re.findall(r"\b(sb_[a-z0-9_]+)", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if base not in known:
                problems.append(f"{name} is no metric the product serves ({expr})")
    report("grafana: every metric named exists", problems)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tools", type=pathlib.Path, required=True)
    ap.add_argument("--deploy", type=pathlib.Path, required=True)
    ap.add_argument("--repo", type=pathlib.Path, required=True)
    ap.add_argument("--expect", type=pathlib.Path, required=True)
    ap.add_argument("--kubernetes-version", default="1.33.0")
    args = ap.parse_args()
    sys.path.insert(0, str(args.tools / "py"))
    env = dict(os.environ, PYTHONPATH=str(args.tools / "py"))
    import jsonschema
    import yaml

    expect = json.loads(args.expect.read_text())
    for path in [args.deploy / "kubernetes/switchboard.toml", args.deploy / "compose/switchboard.toml",
                 args.deploy / "compose/runner.toml"]:
        try:
            tomllib.loads(path.read_text())
            report(f"toml: {path.name} ({path.parent.name})", [])
        except (OSError, tomllib.TOMLDecodeError) as e:
            report(f"toml: {path.name} ({path.parent.name})", [str(e)])
    check_kubernetes(args, yaml, jsonschema, expect, env)
    check_compose(args, yaml, expect, env)
    check_dockerfile(args, expect)
    check_monitoring(args)
    if FAILED:
        print(f"{len(FAILED)} deploy checks failed", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
