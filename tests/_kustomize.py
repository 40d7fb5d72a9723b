"""A small Kustomize renderer for the subset deploy/k8s uses, so tests need no kubectl.

Supported: ``resources`` (YAML files and directories with a kustomization),
``namespace``, ``images`` (``newName``/``newTag``, matched on the image name
without its tag) and ``patches`` given by ``path`` (strategic-merge patches;
the target is the patch's own kind and name). Anything else in a
kustomization is refused with ``ValueError``, so the manifests cannot drift
into features this renderer would silently ignore; tests compare its output
with ``kubectl kustomize`` where that is installed.

Strategic merge, as the API server's schema says for the fields used here:
maps merge, a ``null`` deletes the key; lists of containers, env, volumes,
ports and volume mounts merge by their merge key (new items first, as
kustomize orders them); other lists are replaced.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

__all__ = ["render"]

_KNOWN = {"apiVersion", "kind", "resources", "namespace", "images", "patches"}
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
}


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize directory`` would print."""
    path = directory / "kustomization.yaml"
    spec = yaml.safe_load(path.read_text())
    unknown = set(spec) - _KNOWN
    if unknown:
        raise ValueError(f"{path}: this renderer does not support {sorted(unknown)}")
    objects: list[dict[str, Any]] = []
    for entry in spec.get("resources", []):
        target = directory / entry
        if target.is_dir():
            objects += render(target)
        else:
            objects += [d for d in yaml.safe_load_all(target.read_text()) if d]
    for patch in spec.get("patches", []):
        if set(patch) != {"path"}:
            raise ValueError(f"{path}: only patches with a path are supported: {patch}")
        for doc in yaml.safe_load_all((directory / patch["path"]).read_text()):
            _apply_patch(objects, doc, directory / patch["path"])
    for image in spec.get("images", []):
        for obj in objects:
            _set_image(obj, image)
    if "namespace" in spec:
        for obj in objects:
            obj.setdefault("metadata", {})["namespace"] = spec["namespace"]
    return objects


def _apply_patch(objects: list[dict[str, Any]], patch: dict[str, Any], where: Path) -> None:
    name = patch.get("metadata", {}).get("name")
    matches = [o for o in objects if o["kind"] == patch["kind"] and o["metadata"]["name"] == name]
    if len(matches) != 1:
        raise ValueError(f"{where}: patch for {patch['kind']}/{name} matches {len(matches)}")
    merged = _merge(matches[0], patch)
    matches[0].clear()
    matches[0].update(merged)


def _merge(base: Any, patch: Any, key: str | None = None) -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            elif k in out:
                out[k] = _merge(out[k], v, k)
            else:
                out[k] = copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(patch, list) and key in _MERGE_KEYS:
        merge_key = _MERGE_KEYS[key]
        out_list, added = copy.deepcopy(base), []
        for item in patch:
            same = [i for i, b in enumerate(out_list) if b.get(merge_key) == item.get(merge_key)]
            if same:
                out_list[same[0]] = _merge(out_list[same[0]], item)
            else:
                added.append(copy.deepcopy(item))
        return added + out_list  # kustomize puts the patch's new items first
    return copy.deepcopy(patch)


def _set_image(obj: dict[str, Any], image: dict[str, str]) -> None:
    pod = obj.get("spec", {}).get("template", {}).get("spec")
    if pod is None:
        return
    for container in [*pod.get("containers", []), *pod.get("initContainers", [])]:
        current = container["image"]
        name, _, tag = (
            current.rpartition(":") if ":" in current.split("/")[-1] else (current, "", "")
        )
        if name != image["name"]:
            continue
        new = image.get("newName", name)
        tag = image.get("newTag", tag)
        container["image"] = f"{new}:{tag}" if tag else new
