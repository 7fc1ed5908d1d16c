#!/usr/bin/env python3
"""Every image a rendered kustomization names is the project's.

    check_images.py RENDERED.yaml VERSION [--base | KUSTOMIZATION.yaml]

Each container and init container of every pod template (Deployment,
StatefulSet, DaemonSet, Job, CronJob, Pod) must name REGISTRY/ferry:VERSION,
or REGISTRY/ferry-trainer:VERSION for the trainer Job's containers, where
REGISTRY is `localhost` or a host name with a dot or a port: a bare `ferry`
or `ferry-trainer` is pulled from docker.io/library, which is not Ferry.
With --base (the base rendered alone, before an overlay names the
registry): exactly `ferry` / `ferry-trainer`, the names the overlays'
`images:` entries match. With an overlay's KUSTOMIZATION.yaml: each image
is also one its `images:` entries names (newName:newTag), so an overlay's
registry reaches every container (a rewrite in the base would rename them
first, and the overlay's entry for `ferry` would match nothing).
"""
import re
import sys

import yaml


def pod_templates(obj):
    spec = obj.get("spec") or {}
    kind = obj.get("kind")
    if kind == "Pod":
        return [spec]
    if kind == "CronJob":
        spec = spec.get("jobTemplate", {}).get("spec", {})
    t = spec.get("template", {}).get("spec")
    return [t] if t else []


def main():
    rendered, version = sys.argv[1], sys.argv[2]
    base = "--base" in sys.argv[3:]
    declared = None
    kust = [a for a in sys.argv[3:] if a != "--base"]
    if kust:
        entries = (yaml.safe_load(open(kust[0])) or {}).get("images") or []
        declared = {f'{e.get("newName", e["name"])}:{e.get("newTag", "latest")}'
                    for e in entries}
    fail = 0
    seen = 0
    for obj in yaml.safe_load_all(open(rendered)):
        if not obj:
            continue
        for spec in pod_templates(obj):
            for c in spec.get("initContainers", []) + spec.get("containers", []):
                seen += 1
                where = f'{obj["kind"]}/{obj["metadata"]["name"]} container {c["name"]}'
                image = c.get("image", "")
                repo = "ferry-trainer" if obj["kind"] in ("Job", "CronJob") else "ferry"
                if base:
                    ok = image == repo
                    want = repo
                else:
                    m = re.fullmatch(r"(localhost(:\d+)?|[^/]*[.:][^/]*)(/[^:@]+)*/"
                                     r"([^/:@]+):([^/:@]+)", image)
                    ok = bool(m) and m.group(4) == repo and m.group(5) == version
                    want = f"REGISTRY/{repo}:{version}"
                    if declared is not None:
                        ok = ok and image in declared
                        want += f" and one of the overlay's images: {sorted(declared)}"
                if ok:
                    print(f"ok: image of {where}: {image}")
                else:
                    why = " (a bare name is pulled from docker.io)" if "/" not in image else ""
                    print(f"FAIL: image of {where}: '{image}', want {want}{why}")
                    fail = 1
    if seen == 0:
        print(f"FAIL: {rendered}: no containers")
        fail = 1
    return fail


if __name__ == "__main__":
    sys.exit(main())
