"""deploy/: every Kustomize overlay renders to valid Kubernetes objects, and the container
images start the same ``tandem`` commands the tests run.

Rendering is ``tests/_kustomize.py`` (no kubectl needed); where ``kubectl`` is
installed its own ``kubectl kustomize`` must print the same objects. Every
object is validated offline against the Kubernetes OpenAPI schemas that the
``kubernetes-validate`` package ships (strict: unknown fields fail); KEDA's
ScaledObject and the Prometheus Operator's PodMonitor, CRDs that package does not
know, against the subsets of their schemas in deploy/k8s/schemas/.

What a real cluster needs of them: hubs pull signed models from the CDN (no shared
volume), every MQTT client logs in over TLS, prod hubs require API keys, devices reach
the broker through a LoadBalancer on 8883 and the CDN through an Ingress with TLS, and
the autoscaler's query names a metric a real hub exports on a port a PodMonitor
scrapes. The Secrets are the operator's: tests/test_deploy_doc.py runs the doc's
commands that make them and checks them against what the pods read.
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
from ._needs import need

DEPLOY = ROOT / "deploy"
OVERLAYS = sorted(p.name for p in (DEPLOY / "k8s" / "overlays").iterdir() if p.is_dir())
# the oldest and the newest Kubernetes minor the manifests are checked against
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
CRD_SCHEMAS = {  # apiVersion -> the JSON schema its objects are checked against
    "keda.sh/v1alpha1": "keda-scaledobject-v1alpha1.json",
    "monitoring.coreos.com/v1": "monitoring-podmonitor-v1.json",
}
ROLES = ("hub", "cdn", "edge")


def validate(obj: dict[str, Any]) -> None:
    if obj["apiVersion"] in CRD_SCHEMAS:
        schema = DEPLOY / "k8s/schemas" / CRD_SCHEMAS[obj["apiVersion"]]
        jsonschema.validate(obj, json.loads(schema.read_text()))
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
    monitor = copy.deepcopy(by_name(objects, "PodMonitor", "tandem-hub"))
    monitor["spec"]["podMetricsEndpoint"] = monitor["spec"].pop("podMetricsEndpoints")
    with pytest.raises(jsonschema.ValidationError):
        validate(monitor)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_renderer_prints_what_kubectl_kustomize_prints(overlay: str) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        need("kubectl is not installed: the renderer's output is checked alone")
    out = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / "k8s/overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode != 0 and "unknown command" in out.stderr:
        need("this kubectl has no kustomize")
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
    from cloud_hub.plane._roles import DRAIN_S

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


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_hub_service_reaches_the_http_and_grpc_ports_the_hub_serves(overlay: str) -> None:
    objects = render(DEPLOY / "k8s/overlays" / overlay)
    [container] = by_name(objects, "Deployment", "tandem-hub")["spec"]["template"]["spec"][
        "containers"
    ]
    opened = {
        arg.split("=", 1)[0]: int(arg.split("=", 1)[1])
        for arg in container["args"]
        if arg.startswith(("--http-port=", "--grpc-port="))
    }
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    service = by_name(objects, "Service", "tandem-hub")
    reached = {p["name"]: named[p["targetPort"]] for p in service["spec"]["ports"]}
    assert reached == {"http": opened["--http-port"], "grpc": opened["--grpc-port"]}


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
def test_pods_run_as_non_root_and_reference_only_config_maps_that_exist(overlay: str) -> None:
    """Secrets are the operator's (never in git): tests/test_deploy_doc.py checks them."""
    objects = render(DEPLOY / "k8s/overlays" / overlay)
    configmaps = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}
    for name, pod in pod_specs(objects):
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        for container in pod["containers"]:
            assert re.search(r":[\w.-]+$", container["image"]), f"{name}: untagged image"
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("configMapKeyRef")
                if ref:
                    assert ref["key"] in configmaps[ref["name"]], f"{name}: {ref}"
        for volume in pod.get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in configmaps, f"{name}: {volume}"


# -- what a real cluster needs -------------------------------------------------------------


def configmaps(objects: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}


def expanded_env(container: dict[str, Any], maps: dict[str, dict[str, str]]) -> dict[str, str]:
    """The container's environment as the kubelet makes it: ConfigMap values read,
    ``$(VAR)`` of variables defined above expanded; a Secret's value reads ``<secret>``."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        source = item.get("valueFrom", {})
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            env[item["name"]] = maps[ref["name"]][ref["key"]]
        elif "secretKeyRef" in source:
            env[item["name"]] = "secret"
        elif "value" in item:
            env[item["name"]] = expand(item["value"], env)
    return env


def expand(text: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), text)


def arg_values(container: dict[str, Any], option: str, env: dict[str, str]) -> list[str]:
    return [
        expand(a.split("=", 1)[1], env) for a in container["args"] if a.startswith(option + "=")
    ]


def mounted_volume(pod: dict[str, Any], container: dict[str, Any], path: str) -> dict[str, Any]:
    """The volume whose mount holds ``path`` (a file: its directory must be the mount)."""
    mounts = [
        m
        for m in container["volumeMounts"]
        if path.startswith(m["mountPath"].rstrip("/") + "/") or path == m["mountPath"]
    ]
    assert mounts, f"nothing is mounted at {path}"
    [volume] = [
        v
        for v in pod["volumes"]
        if v["name"] == max(mounts, key=lambda m: len(m["mountPath"]))["name"]
    ]
    return volume


def secret_file(pod: dict[str, Any], container: dict[str, Any], path: str) -> tuple[str, str]:
    """(Secret name, key) of the file at ``path``, which must come from a Secret."""
    volume = mounted_volume(pod, container, path)
    assert "secret" in volume, f"{path} is not from a Secret: {volume}"
    name = path.rsplit("/", 1)[1]
    items = {i["path"]: i["key"] for i in volume["secret"].get("items", [])}
    return volume["secret"]["secretName"], items.get(name, name)


def broker_clients(
    objects: list[dict[str, Any]],
) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(name, pod, container) of every Tandem container that talks MQTT: hubs and the CDN."""
    out = []
    for name, pod in pod_specs(objects):
        for container in pod["containers"]:
            if name in ("tandem-hub", "tandem-cdn"):
                out.append((name, pod, container))
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_hubs_pull_signed_models_from_the_cdn_and_mount_no_shared_models_volume(
    overlay: str,
) -> None:
    objects = render(DEPLOY / "k8s/overlays" / overlay)
    assert not [o for o in objects if o["kind"] == "PersistentVolumeClaim"]
    hub = by_name(objects, "Deployment", "tandem-hub")
    pod = hub["spec"]["template"]["spec"]
    [container] = pod["containers"]
    env = expanded_env(container, configmaps(objects))
    assert "persistentVolumeClaim" not in json.dumps(pod)
    [repo] = arg_values(container, "--repo", env)
    assert "emptyDir" in mounted_volume(pod, container, repo)  # a cache each pod fills
    [cdn] = arg_values(container, "--cdn", env)
    services = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Service"}
    host, port = re.fullmatch(r"http://([\w-]+):(\d+)", cdn).groups()  # type: ignore[union-attr]
    assert int(port) in {p["port"] for p in services[host]["spec"]["ports"]}, cdn
    [model] = arg_values(container, "--model", env)
    assert re.fullmatch(r"[\w.-]+(@\d+)?", model), model
    [key] = arg_values(container, "--trusted-key", env)
    assert secret_file(pod, container, key)[1] == "publisher.pub"


def test_prod_hubs_require_api_keys_from_a_secret() -> None:
    objects = render(DEPLOY / "k8s/overlays/prod")
    hub = by_name(objects, "Deployment", "tandem-hub")
    pod = hub["spec"]["template"]["spec"]
    [container] = pod["containers"]
    env = expanded_env(container, configmaps(objects))
    assert arg_values(container, "--http-host", env) == ["0.0.0.0"]
    [keys] = arg_values(container, "--api-keys", env)
    secret, key = secret_file(pod, container, keys)
    assert secret and key == "api-keys.json"
    # a directory mount: the kubelet swaps a Secret's files in place, the hub re-reads it
    mount = next(m for m in container["volumeMounts"] if keys.startswith(m["mountPath"] + "/"))
    assert "subPath" not in mount


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_broker_url_logs_in_over_tls_with_the_ca_mounted(overlay: str) -> None:
    from shared import MqttSettings

    objects = render(DEPLOY / "k8s/overlays" / overlay)
    maps = configmaps(objects)
    clients = broker_clients(objects)
    assert {name for name, _, _ in clients} == {"tandem-hub", "tandem-cdn"}
    for name, pod, container in clients:
        env = expanded_env(container, maps)
        urls = arg_values(container, "--broker", env) or [env["TANDEM_BROKER"]]
        for url in urls:
            settings = MqttSettings.from_url(url)
            assert settings.tls is not None, f"{name}: {url} is plain TCP"
            assert settings.username and settings.password == "secret", f"{name}: {url}"
        [ca] = arg_values(container, "--mqtt-ca", env)
        assert secret_file(pod, container, ca)[1] == "ca.crt"
    # and the configuration says no plain broker anywhere
    assert "mqtt://" not in json.dumps(maps)


def test_the_dev_broker_refuses_anonymous_clients_and_speaks_only_tls() -> None:
    from shared import mqtt_max_packet_bytes

    objects = render(DEPLOY / "k8s/overlays/dev")
    conf = by_name(objects, "ConfigMap", "mosquitto")["data"]["mosquitto.conf"]
    lines = [line.split() for line in conf.splitlines() if line.strip()]
    assert ["allow_anonymous", "false"] in lines
    assert ["allow_anonymous", "true"] not in lines
    listeners = [line for line in lines if line[0] == "listener"]
    assert [line[1] for line in listeners] == ["8883"]
    assert {"certfile", "keyfile"} <= {line[0] for line in lines}
    assert any(line[0] == "plugin" and "dynamic_security" in line[1] for line in lines)
    mosquitto = by_name(objects, "Deployment", "mosquitto")
    [container] = mosquitto["spec"]["template"]["spec"]["containers"]
    assert [p["containerPort"] for p in container["ports"]] == [8883]
    # the size limit comes from 'tandem fleet provision --broker-conf' in the auth Secret
    assert ["include_dir", "/mosquitto/auth"] in lines
    emqx = by_name(render(DEPLOY / "k8s/overlays/prod"), "StatefulSet", "emqx")
    env = {
        e["name"]: e.get("value") for e in emqx["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["EMQX_LISTENERS__TCP__DEFAULT__ENABLE"] == "false"
    assert env["EMQX_MQTT__MAX_PACKET_SIZE"] == str(mqtt_max_packet_bytes())
    assert "password_based" in env["EMQX_AUTHENTICATION"]
    assert env["EMQX_AUTHORIZATION__NO_MATCH"] == "deny"


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def pod_labels(objects: list[dict[str, Any]]) -> dict[str, tuple[dict[str, str], dict[str, Any]]]:
    return {
        o["metadata"]["name"]: (
            o["spec"]["template"]["metadata"]["labels"],
            o["spec"]["template"]["spec"],
        )
        for o in objects
        if o["kind"] in ("Deployment", "StatefulSet")
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_load_balancer_exposes_the_broker_to_devices_over_tls_on_8883(overlay: str) -> None:
    objects = render(DEPLOY / "k8s/overlays" / overlay)
    balancers = [
        o for o in objects if o["kind"] == "Service" and o["spec"].get("type") == "LoadBalancer"
    ]
    exposed = [(s, p) for s in balancers for p in s["spec"]["ports"] if p["port"] == 8883]
    assert exposed, "no LoadBalancer on 8883"
    for service, port in exposed:
        pods = [
            pod
            for labels, pod in pod_labels(objects).values()
            if selects(service["spec"]["selector"], labels)
        ]
        assert pods, f"{service['metadata']['name']} selects no pod"
        for pod in pods:  # the port it forwards to is the broker's TLS listener
            named = {p["name"]: p["containerPort"] for c in pod["containers"] for p in c["ports"]}
            assert named[port["targetPort"]] == 8883
    assert not [p for s in balancers for p in s["spec"]["ports"] if p["port"] == 1883]
    config = by_name(objects, "ConfigMap", "tandem-config")["data"]
    assert config["device-broker-url"].startswith("mqtts://")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_devices_reach_the_cdn_through_an_ingress_with_tls_at_the_cdn_url(overlay: str) -> None:
    objects = render(DEPLOY / "k8s/overlays" / overlay)
    config = by_name(objects, "ConfigMap", "tandem-config")["data"]
    url = re.fullmatch(r"https://([\w.-]+)", config["cdn-url"])
    assert url is not None, f"cdn-url {config['cdn-url']} is not an external https name"
    host = url.group(1)
    assert "." in host and not host.endswith((".svc", ".local")), host
    ingress = by_name(objects, "Ingress", "tandem-cdn")
    [rule] = ingress["spec"]["rules"]
    assert rule["host"] == host
    assert [t for t in ingress["spec"]["tls"] if host in t["hosts"] and t["secretName"]]
    services = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Service"}
    for path in rule["http"]["paths"]:
        backend = path["backend"]["service"]
        ports = {p["name"] for p in services[backend["name"]]["spec"]["ports"]}
        assert backend["port"]["name"] in ports, backend


def test_the_autoscaler_asks_for_a_metric_a_real_hub_exports_on_a_port_a_pod_monitor_scrapes(
    tmp_path: Any,
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from cloud_hub import Hub

    from ._models import write_linear_classifier

    write_linear_classifier(tmp_path / "linear" / "1" / "model.onnx")
    with Hub(tmp_path) as hub:
        exported = {
            f.name for f in text_string_to_metric_families(hub.prometheus.render().decode())
        }
    objects = render(DEPLOY / "k8s/overlays/prod")
    [trigger] = by_name(objects, "ScaledObject", "tandem-hub")["spec"]["triggers"]
    query = trigger["metadata"]["query"]
    asked = set(re.findall(r"\b(tandem_\w+)\s*\{", query))
    assert asked and asked <= exported, (asked, sorted(exported))
    # the Prometheus it asks is the Prometheus Operator's, which scrapes what PodMonitors say
    assert "prometheus-operated" in trigger["metadata"]["serverAddress"]
    hub = by_name(objects, "Deployment", "tandem-hub")
    labels = hub["spec"]["template"]["metadata"]["labels"]
    [container] = hub["spec"]["template"]["spec"]["containers"]
    monitors = [
        o
        for o in objects
        if o["kind"] == "PodMonitor" and selects(o["spec"]["selector"]["matchLabels"], labels)
    ]
    assert monitors, "no PodMonitor selects the hub pods"
    [endpoint] = [e for m in monitors for e in m["spec"]["podMetricsEndpoints"]]
    assert endpoint["port"] in {p["name"] for p in container["ports"]}
    assert endpoint["path"] == "/metrics"
    # what the query filters on is what the scrape labels: the container's name
    assert f'container="{container["name"]}"' in query
    for monitor in (o for o in objects if o["kind"] == "PodMonitor"):
        matched = [
            pod
            for lab, pod in pod_labels(objects).values()
            if selects(monitor["spec"]["selector"]["matchLabels"], lab)
        ]
        assert matched, monitor["metadata"]["name"]
        for pod in matched:
            ports = {p["name"] for c in pod["containers"] for p in c.get("ports", [])}
            for e in monitor["spec"]["podMetricsEndpoints"]:
                assert e["port"] in ports, monitor["metadata"]["name"]


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
