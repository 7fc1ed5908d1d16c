#!/usr/bin/env python3
"""Runs every container command line of rendered Kubernetes manifests
against the real programs of a build, so that a flag the programs do not
have cannot hide in deploy/k8s.

    check_commands.py RENDERED.yaml

The programs come from the environment: FERRY_DISPATCHER_BIN,
FERRY_WORKER_BIN, FERRYCTL_BIN, FERRY_TRAINER_BIN (ferry-example-trainer).

For each container and init container of every workload, and each
lifecycle exec hook:
  - the command (command + args; it must name the program: the image's
    entrypoint is not assumed) gets the container's environment, with
    downward-API fields given sample values, and Kubernetes' $(VAR)
    expansion; a /bin/sh -c script is run by a real shell;
  - the programs are shims on PATH that record their argv and run the real
    program with it plus --version (the daemons: it parses every flag and
    exits 0, printing 'NAME VERSION'; an unknown flag or a bad value is
    exit 2) or --help (ferryctl and the trainer, the same for them);
  - a --config file must be a key of a ConfigMap mounted there; its
    'name = value' lines are run as flags the same way;
  - a flag naming a file or directory must lie under one of the
    container's volume mounts;
  - a daemon's gRPC probes must use its --port, HTTP probes and the
    prometheus.io/port annotation its --metrics-port.
Prints one line per command; exits 1 on any failure.
"""
import os
import re
import shlex
import stat
import subprocess
import sys
import tempfile

import yaml

PROGRAMS = {
    "ferry-dispatcher": ("FERRY_DISPATCHER_BIN", "--version"),
    "ferry-worker": ("FERRY_WORKER_BIN", "--version"),
    "ferryctl": ("FERRYCTL_BIN", "--help"),
    "ferry-example-trainer": ("FERRY_TRAINER_BIN", "--help"),
}
# Downward API sample values.
FIELDS = {
    "status.podIP": "10.1.2.3",
    "status.hostIP": "10.0.0.1",
    "spec.nodeName": "node-1",
    "spec.serviceAccountName": "default",
    "metadata.name": "pod-0",
    "metadata.uid": "00000000-0000-0000-0000-000000000000",
}
PATH_FLAGS = {"config", "work-dir", "data-root", "spill-dir", "tls-cert",
              "tls-key", "tls-ca", "token-file", "worker-token-file",
              "client-token-file", "status-token-file", "admin-token-file",
              "out"}

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def pod_spec(obj):
    kind = obj.get("kind")
    spec = obj.get("spec", {})
    if kind == "Pod":
        return spec, obj.get("metadata", {})
    if kind == "CronJob":
        tpl = spec["jobTemplate"]["spec"]["template"]
        return tpl.get("spec", {}), tpl.get("metadata", {})
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job",
                "ReplicaSet"):
        tpl = spec["template"]
        return tpl.get("spec", {}), tpl.get("metadata", {})
    return None, None


def container_env(c, namespace):
    env = {}
    for e in c.get("env", []):
        if "value" in e:
            # $(VAR) in values refers to earlier variables.
            env[e["name"]] = expand(e["value"], env)
        elif "valueFrom" in e:
            vf = e["valueFrom"]
            if "fieldRef" in vf:
                path = vf["fieldRef"]["fieldPath"]
                env[e["name"]] = (namespace if path == "metadata.namespace"
                                  else FIELDS.get(path, "x"))
            else:
                env[e["name"]] = "1"
    return env


def expand(s, env):
    """Kubernetes' $(VAR) expansion: $$ escapes, unknown names stay."""
    def repl(m):
        if m.group(0).startswith("$$"):
            return m.group(0)[1:]
        name = m.group(1)
        return env.get(name, m.group(0))
    return re.sub(r"\$\$\([A-Za-z_][A-Za-z0-9_]*\)|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  repl, s)


def make_shims(d, log_dir):
    for name, (var, _) in PROGRAMS.items():
        real = os.environ.get(var)
        if not real or not os.access(real, os.X_OK):
            print(f"FAIL: {var} does not name a program ({real!r})")
            sys.exit(1)
        p = os.path.join(d, name)
        with open(p, "w") as f:
            # The shim records its argv (NUL-separated) and runs nothing:
            # the checker runs the real program itself.
            f.write("#!/bin/sh\n"
                    f"n=$(ls {shlex.quote(log_dir)} | wc -l)\n"
                    f"{{ printf '%s\\0' {name} \"$@\"; }} > "
                    f"{shlex.quote(log_dir)}/$n\n")
        os.chmod(p, stat.S_IRWXU)


def flag_values(argv):
    """(name, value) of every --name=value or --name value."""
    out = []
    i = 1
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            if "=" in a:
                k, v = a[2:].split("=", 1)
                out.append((k, v))
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out.append((a[2:], argv[i + 1]))
                i += 1
            else:
                out.append((a[2:], None))
        i += 1
    return out


def run_real(argv, what):
    name = argv[0]
    var, extra = PROGRAMS[name]
    # --config is checked on its own (check_config): the file is in a
    # ConfigMap, not here.
    args = [a for a in argv[1:] if not a.startswith("--config=")]
    if "--config" in args:
        i = args.index("--config")
        del args[i:i + 2]
    cmd = [os.environ[var]] + args + [extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    out = r.stdout + r.stderr
    ok = r.returncode == 0
    if ok and extra == "--version":
        ok = re.match(rf"^{re.escape(name)} \d+\.\d+\.\d+$", r.stdout.strip()) is not None
    if ok and extra == "--help":
        ok = "--help" in r.stdout
    if ok:
        print(f"ok: {what}: {name} " + " ".join(shlex.quote(a) for a in argv[1:]))
    else:
        fail(f"{what}: {name} {' '.join(shlex.quote(a) for a in argv[1:])} "
             f"{extra}: exit {r.returncode}: {out.strip()[:400]}")


def under_mount(path, mounts):
    return any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounts)


def check(rendered):
    docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
    configmaps = {d["metadata"]["name"]: d.get("data", {})
                  for d in docs if d.get("kind") == "ConfigMap"}
    seen = 0
    for obj in docs:
        spec, meta = pod_spec(obj)
        if spec is None:
            continue
        ns = obj.get("metadata", {}).get("namespace", "default")
        oname = f'{obj["kind"]}/{obj["metadata"]["name"]}'
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        annotations = (meta or {}).get("annotations", {})
        for c in spec.get("initContainers", []) + spec.get("containers", []):
            where = f"{oname} container {c['name']}"
            env = container_env(c, ns)
            mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
            commands = []
            if "command" not in c:
                fail(f"{where}: no command (name the program; the image's "
                     "entrypoint is not assumed)")
            else:
                commands.append(("command", [expand(a, env) for a in
                                             c["command"] + c.get("args", [])]))
            for hook in ("preStop", "postStart"):
                h = c.get("lifecycle", {}).get(hook, {}).get("exec")
                if h:
                    # exec hooks get no $(VAR) expansion.
                    commands.append((hook, list(h["command"])))
            ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
            for kind, argv in commands:
                seen += 1
                label = f"{where} {kind}"
                for prog_argv in invoke(argv, env, label):
                    run_real(prog_argv, label)
                    check_paths(prog_argv, mounts, label)
                    check_config(prog_argv, mounts, volumes, configmaps, label)
                    if kind == "command":
                        check_ports(prog_argv, c, ports, annotations, label,
                                    mounts, volumes, configmaps)
    if seen == 0:
        fail(f"{rendered}: no container found")


def invoke(argv, env, label):
    """Runs argv with the shims first on PATH; returns the argv of every
    Ferry program it started."""
    with tempfile.TemporaryDirectory() as d:
        shims, logs = os.path.join(d, "bin"), os.path.join(d, "log")
        os.mkdir(shims)
        os.mkdir(logs)
        make_shims(shims, logs)
        prog = argv[0]
        if os.path.basename(prog) in PROGRAMS:
            argv = [os.path.basename(prog)] + argv[1:]
        elif os.path.basename(prog) not in ("sh", "bash"):
            fail(f"{label}: {prog} is neither a Ferry program nor a shell")
            return []
        run_env = {"PATH": shims + ":/usr/bin:/bin", "HOME": d}
        run_env.update(env)
        r = subprocess.run(argv, env=run_env, capture_output=True, text=True,
                           timeout=30)
        if r.returncode != 0:
            fail(f"{label}: {' '.join(argv)}: exit {r.returncode}: "
                 f"{(r.stdout + r.stderr).strip()[:300]}")
        got = []
        for n in sorted(os.listdir(logs), key=int):
            with open(os.path.join(logs, n), "rb") as f:
                got.append([a.decode() for a in f.read().split(b"\0")[:-1]])
        if not got:
            fail(f"{label}: starts no Ferry program: {argv}")
        return got


def check_paths(argv, mounts, label):
    for k, v in flag_values(argv):
        if k in PATH_FLAGS and v and v.startswith("/") and not under_mount(v, mounts):
            fail(f"{label}: --{k} {v} is on no volume mount of the container "
                 f"({', '.join(sorted(mounts)) or 'none'})")


def config_lines(argv, mounts, volumes, configmaps, label):
    """The 'name = value' lines of the --config file, from its ConfigMap."""
    for k, v in flag_values(argv):
        if k != "config":
            continue
        d, key = os.path.split(v)
        m = mounts.get(d)
        vol = volumes.get(m["name"]) if m else None
        if not vol or "configMap" not in vol:
            fail(f"{label}: --config {v}: no ConfigMap volume is mounted at {d}")
            return None
        data = configmaps.get(vol["configMap"]["name"])
        if data is None or key not in data:
            fail(f"{label}: --config {v}: ConfigMap {vol['configMap']['name']} "
                 f"has no key {key}")
            return None
        lines = []
        for line in data[key].splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                name, _, value = line.partition("=")
                lines.append((name.strip(), value.strip()))
        return lines
    return []


def check_config(argv, mounts, volumes, configmaps, label):
    lines = config_lines(argv, mounts, volumes, configmaps, label)
    if lines:
        run_real([argv[0]] + [f"--{n}={v}" for n, v in lines],
                 f"{label} --config lines")


def check_ports(argv, c, ports, annotations, label, mounts, volumes, configmaps):
    if argv[0] not in ("ferry-dispatcher", "ferry-worker"):
        return
    opts = dict(config_lines(argv, mounts, volumes, configmaps, label) or [])
    opts.update({k: v for k, v in flag_values(argv)})
    grpc_port = opts.get("port", "5050" if argv[0] == "ferry-dispatcher" else "0")
    metrics_port = opts.get("metrics-port")

    def resolve(p):
        return str(ports.get(p, p))
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        p = c.get(probe)
        if not p:
            continue
        if "grpc" in p and str(p["grpc"]["port"]) != grpc_port:
            fail(f"{label}: {probe} gRPC port {p['grpc']['port']} is not --port {grpc_port}")
        if "httpGet" in p and resolve(p["httpGet"]["port"]) != str(metrics_port):
            fail(f"{label}: {probe} HTTP port {p['httpGet']['port']} is not "
                 f"--metrics-port {metrics_port}")
    if annotations.get("prometheus.io/scrape") == "true":
        if annotations.get("prometheus.io/port") != str(metrics_port):
            fail(f"{label}: prometheus.io/port {annotations.get('prometheus.io/port')} "
                 f"is not --metrics-port {metrics_port}")
    if "grpc" in ports and str(ports["grpc"]) != grpc_port:
        fail(f"{label}: containerPort grpc {ports['grpc']} is not --port {grpc_port}")
    if "metrics" in ports and str(ports["metrics"]) != str(metrics_port):
        fail(f"{label}: containerPort metrics {ports['metrics']} is not "
             f"--metrics-port {metrics_port}")


if __name__ == "__main__":
    for path in sys.argv[1:]:
        check(path)
    sys.exit(1 if failures else 0)
