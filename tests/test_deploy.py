"""deploy/: every Kustomize overlay renders to valid Kubernetes objects, and the container
images start the same ``tandem`` commands the tests run.

Rendering is ``tests/_kustomize.py`` (no kubectl needed); where ``kubectl`` is
installed its own ``kubectl kustomize`` must print the same objects. Every
object is validated offline against the Kubernetes OpenAPI schemas that the
``kubernetes-validate`` package ships (strict: unknown fields fail); KEDA's
ScaledObject, a CRD that package does not know, against the subset of its
schema vendored in deploy/k8s/schemas/.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import tomllib
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from ._cli import ROOT, tandem
from ._kustomize import render

DEPLOY = ROOT / "deploy"
OVERLAYS = sorted(p.name for p in (DEPLOY / "k8s" / "overlays").iterdir() if p.is_dir())
# the oldest and the newest Kubernetes minor the manifests are checked against
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
KEDA_SCHEMA = json.loads((DEPLOY / "k8s/schemas/keda-scaledobject-v1alpha1.json").read_text())
# what the operator makes out of band (docs/deployment.md): secrets never live in git
MADE_BY_OPERATOR = {"tandem-cdn-secrets", "tandem-publisher-key", "tandem-s3", "emqx-dashboard"}
ROLES = ("hub", "cdn", "edge")


def validate(obj: dict[str, Any]) -> None:
    if obj["apiVersion"] == "keda.sh/v1alpha1":
        jsonschema.validate(obj, KEDA_SCHEMA)
        return
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


def by_name(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [found] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def pod_specs(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (o["metadata"]["name"], o["spec"]["template"]["spec"])
        for o in objects
        if o["kind"] in ("Deployment", "StatefulSet")
    ]


# -- the manifests --------------------------------------------------------------------------


def test_there_is_a_dev_and_a_prod_overlay() -> None:
    assert {"dev", "prod"} <= set(OVERLAYS)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_of_every_overlay_is_valid_against_the_schemas(overlay: str) -> None:
    objects = render(DEPLOY / "k8s/overlays" / overlay)
    assert len(objects) >= 8
    keys = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert len(keys) == len(set(keys)), "an object appears twice"
    for obj in objects:
        validate(obj)
        assert obj["metadata"].get("namespace"), f"{obj['kind']} without a namespace"


def test_the_validation_catches_a_broken_object() -> None:
    """The checks above would fail on a mistake: a typo'd field, a wrong type, no trigger."""
    objects = render(DEPLOY / "k8s/overlays/prod")
    hub = copy.deepcopy(by_name(objects, "Deployment", "tandem-hub"))
    hub["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(hub)
    hub = copy.deepcopy(by_name(objects, "Deployment", "tandem-hub"))
    hub["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(hub)
    scaled = copy.deepcopy(by_name(objects, "ScaledObject", "tandem-hub"))
    scaled["spec"]["triggers"] = []
    with pytest.raises(jsonschema.ValidationError):
        validate(scaled)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_renderer_prints_what_kubectl_kustomize_prints(overlay: str) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the renderer's output is checked alone")
    out = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / "k8s/overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode != 0 and "unknown command" in out.stderr:
        pytest.skip("this kubectl has no kustomize")
    assert out.returncode == 0, out.stderr
    theirs = [d for d in yaml.safe_load_all(out.stdout) if d]
    ours = render(DEPLOY / "k8s/overlays" / overlay)

    def key(o: dict[str, Any]) -> tuple[str, str]:
        return o["kind"], o["metadata"]["name"]

    assert sorted(map(key, ours)) == sorted(map(key, theirs))
    for obj in theirs:
        assert by_name(ours, *key(obj)) == obj, key(obj)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_hubs_probe_the_hub_health_routes_and_outlast_its_drain(overlay: str) -> None:
    from cloud_hub._plane_roles import DRAIN_S

    hub = by_name(render(DEPLOY / "k8s/overlays" / overlay), "Deployment", "tandem-hub")
    pod = hub["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    pre_stop = float(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    # preStop, then ingress processes (DRAIN_S, SIGKILL 5 s later), then executors as long
    assert pod["terminationGracePeriodSeconds"] > pre_stop + 2 * (DRAIN_S + 5)
    annotations = hub["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    ports = {p["containerPort"] for p in container["ports"]}
    assert int(annotations["prometheus.io/port"]) in ports


def test_prod_runs_hubs_on_gpus_scaled_on_queue_depth_and_cdns_on_postgres_and_s3() -> None:
    objects = render(DEPLOY / "k8s/overlays/prod")
    hub = by_name(objects, "Deployment", "tandem-hub")
    [container] = hub["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "--device=cuda" in container["args"]
    assert container["image"].endswith("-cuda")
    # autoscaled on the hub's queue-depth gauge, a metric the hub exports; never on CPU
    scaled = by_name(objects, "ScaledObject", "tandem-hub")
    assert scaled["spec"]["scaleTargetRef"]["name"] == "tandem-hub"
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert "tandem_queue_depth" in trigger["metadata"]["query"]
    assert '"tandem_queue_depth"' in (ROOT / "cloud_hub/_prometheus.py").read_text()
    assert not [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]
    # the broker is an EMQX cluster behind Service "mqtt", blobs go through nginx
    emqx = by_name(objects, "StatefulSet", "emqx")
    assert emqx["spec"]["replicas"] >= 3
    assert by_name(objects, "Service", "mqtt")["spec"]["selector"] == {
        "app.kubernetes.io/name": "emqx"
    }
    nginx = by_name(objects, "ConfigMap", "tandem-blobs")["data"]["default.conf"]
    assert "location /v1/blobs/" in nginx and "proxy_cache blobs" in nginx
    assert "server tandem-cdn:8700" in nginx
    cdn = by_name(objects, "Deployment", "tandem-cdn")
    assert cdn["spec"]["replicas"] >= 2  # one leads rollouts, the others serve
    store = by_name(objects, "ConfigMap", "tandem-cdn-config")["data"]["store-url"]
    assert store.startswith("s3://")
    env = {e["name"] for e in cdn["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert {"TANDEM_REGISTRY", "TANDEM_REDIS_URL", "AWS_ACCESS_KEY_ID"} <= env


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_run_as_non_root_and_reference_only_what_exists_or_the_operator_makes(
    overlay: str,
) -> None:
    objects = render(DEPLOY / "k8s/overlays" / overlay)
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for name, pod in pod_specs(objects):
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        for container in pod["containers"]:
            assert re.search(r":[\w.-]+$", container["image"]), f"{name}: untagged image"
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
        text = json.dumps(pod)
        for kind, ref in re.findall(
            r'"(configMapKeyRef|secretKeyRef)": \{"name": "([^"]+)"', text
        ) + [("configMap", n) for n in re.findall(r'"configMap": \{"name": "([^"]+)"', text)]:
            wanted = "Secret" if kind.startswith("secret") else "ConfigMap"
            assert (wanted, ref) in names or ref in MADE_BY_OPERATOR, f"{name}: {ref}"
        for ref in re.findall(r'"secretName": "([^"]+)"', text):
            assert ("Secret", ref) in names or ref in MADE_BY_OPERATOR, f"{name}: {ref}"


# -- the images -------------------------------------------------------------------------------


def dockerfile(role: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/docker/<role>.Dockerfile, continuations joined."""
    text = (DEPLOY / "docker" / f"{role}.Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, rest = line.partition(" ")
            out.append((instruction.upper(), rest.strip()))
    return out


def final_stage(role: str) -> list[tuple[str, str]]:
    steps = dockerfile(role)
    starts = [i for i, (ins, _) in enumerate(steps) if ins == "FROM"]
    assert len(starts) >= 2, f"{role}: not a multi-stage build"
    return steps[starts[-1] :]


def exec_form(role: str, instruction: str) -> list[str]:
    [args] = [rest for ins, rest in final_stage(role) if ins == instruction]
    value = json.loads(args)  # exec form: a JSON array, so signals reach the process
    assert isinstance(value, list) and all(isinstance(v, str) for v in value)
    return value


def options(args: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in args if a.startswith("--")]


@pytest.mark.parametrize("role", ROLES)
def test_each_image_is_multi_stage_and_runs_as_a_non_root_user(role: str) -> None:
    [user] = [rest for ins, rest in final_stage(role) if ins == "USER"]
    assert user.isdigit() and int(user) != 0  # numeric: runAsNonRoot can check it


@pytest.mark.parametrize("role", ["hub", "cdn"])
def test_the_server_images_start_a_tandem_command_that_exists_with_options_it_knows(
    role: str,
) -> None:
    entrypoint, cmd = exec_form(role, "ENTRYPOINT"), exec_form(role, "CMD")
    assert entrypoint[0] == "tandem"
    shown = tandem(*entrypoint[1:], "--help")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    for option in options(cmd):
        assert option in shown.stdout, f"{role}: CMD uses {option}, unknown to {entrypoint}"
    # and the Deployments pass it only options it knows
    for overlay in OVERLAYS:
        objects = render(DEPLOY / "k8s/overlays" / overlay)
        deployment = by_name(objects, "Deployment", f"tandem-{role}")
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        assert "command" not in container  # the image's entrypoint, as tested here
        for option in options(container["args"]):
            assert option in shown.stdout, f"{overlay}: {role} args use unknown {option}"


def _extra(extras: dict[str, list[str]], name: str) -> set[str]:
    """Every requirement of ``tandem[name]``, following tandem[...] inside it."""
    out: set[str] = set()
    for requirement in extras[name]:
        inner = re.fullmatch(r"tandem\[([\w,]+)\]", requirement)
        if inner:
            for sub in inner.group(1).split(","):
                out |= _extra(extras, sub)
        else:
            out.add(re.split(r"[<>=\[;]", requirement, maxsplit=1)[0].strip().lower())
    return out


def test_the_edge_image_installs_the_edge_extra_only_and_that_has_no_torch() -> None:
    installs = [rest for ins, rest in dockerfile("edge") if ins == "RUN" and "pip install" in rest]
    assert installs and all('"/src[edge]"' in line for line in installs), installs
    assert not [r for r in installs if "torch" in r or "[hub" in r or "[cdn" in r]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    edge = _extra(extras, "edge")
    assert not edge & {"torch", "fastapi", "uvicorn", "boto3", "psycopg"}, edge
    assert exec_form("edge", "ENTRYPOINT") == ["python"]


def test_the_hub_image_takes_the_torch_the_project_pins_from_the_cpu_index_by_default() -> None:
    steps = dockerfile("hub")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    [pin] = [r for r in extras["hub"] if r.startswith("torch")]
    assert any(ins == "RUN" and pin in rest for ins, rest in steps), pin
    [index] = [rest for ins, rest in steps if ins == "ARG" and rest.startswith("TORCH_INDEX=")]
    assert index.endswith("/whl/cpu")
    assert [rest for ins, rest in steps if ins == "ARG" and rest.startswith("ONNXRUNTIME=")]
