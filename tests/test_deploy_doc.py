"""docs/deployment.md's walk from an empty cluster to a device: every command is run or
rendered here.

- The blocks marked ``<!-- test: run OVERLAY... -->`` (keys, passwords, certificates,
  Secrets, a device's provisioning) run in bash, in a temporary directory, with the real
  ``tandem`` CLI and openssl, and ``kubectl`` replaced by a recorder: the Secrets it
  would have created are read from its arguments as ``kubectl create secret`` reads them
  (``--from-file``, ``--from-literal``, ``tls --cert/--key``), then checked against what
  the overlay's pods reference, name and key, both ways.
- The dev overlay's Mosquitto is started from its rendered ConfigMap with the files
  those Secrets hold, mounted where its pod mounts them: anonymous clients are refused,
  the hub, the CDN and the provisioned device log in over TLS.
- Every other ``tandem`` command's options are checked against that command's ``--help``
  (in process), every ``kubectl`` command names an overlay the tests render or an object
  it renders, and the device's Python program calls the SDK with parameters it has.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from ._brokers import MosquittoProcess, dynsec_plugin, free_port
from ._cli import ROOT, tandem, tandem_env
from ._kustomize import render
from ._needs import need
from .test_deploy import DEPLOY, by_name, pod_specs

DOC = ROOT / "docs" / "deployment.md"
WAIT_S = 15.0
# what the doc may run: ours, kubectl, and the shell tools that make files for the Secrets
PROGRAMS = {"tandem", "kubectl", "openssl", "mkdir", "printf", "export", "docker"}
_FENCE = re.compile(r"(?:<!-- test: ([\w ]+) -->\n)?```(\w+)\n(.*?)```", re.S)


@dataclass(frozen=True)
class Block:
    marks: tuple[str, ...]  # e.g. ("run", "dev", "prod"), or () when unmarked
    language: str
    text: str


def blocks(doc: str | None = None) -> list[Block]:
    text = DOC.read_text() if doc is None else doc
    return [Block(tuple((m or "").split()), lang, body) for m, lang, body in _FENCE.findall(text)]


def commands(block: str) -> list[list[str]]:
    """The shell commands of a block: continuations joined, comments dropped, pipelines
    and ``&&`` split, ``$(...)`` substitutions as commands of their own."""
    joined = re.sub(r"\\\n\s*", " ", block)
    out: list[list[str]] = []
    for line in joined.splitlines():
        for inner in re.findall(r"\$\(([^()]*)\)", line):
            out += [shlex.split(part) for part in re.split(r"\||&&", inner) if part.strip()]
        line = re.sub(r"\$\([^()]*\)", "SUBST", line)
        words = shlex.split(line, comments=True)
        current: list[str] = []
        for word in [*words, "|"]:
            if word in ("|", "&&", ";", "&"):
                if current:
                    out.append(current)
                current = []
            elif not (current == [] and word == "SUBST"):
                current.append(word)
    return [c for c in out if c]


# -- running the doc's blocks -------------------------------------------------------------


@dataclass(frozen=True)
class Walk:
    """What running an overlay's blocks made: the directory and kubectl's calls."""

    workdir: Path
    namespace: str
    kubectl: list[list[str]]

    def secrets(self) -> dict[str, dict[str, bytes]]:
        """Secret name -> data, as the recorded ``kubectl create secret`` calls make them
        (a later call of the same name replaces the Secret, as apply does)."""
        made: dict[str, dict[str, bytes]] = {}
        for args in self.kubectl:
            if args[:3] == ["-n", self.namespace, "create"] and args[3] == "secret":
                kind, name, *options = args[4:]
                made[name] = _secret_data(self.workdir, kind, options)
            elif "secret" in args:
                assert args[:2] == ["-n", self.namespace], f"not in the namespace: {args}"
        return made


def _secret_data(workdir: Path, kind: str, options: list[str]) -> dict[str, bytes]:
    data: dict[str, bytes] = {}
    options = [o for i, o in enumerate(options) if not (i and options[i - 1] == "-o")]
    for option in options:
        name, _, value = option.partition("=")
        if name == "--from-literal":
            key, _, literal = value.partition("=")
            data[key] = literal.encode()
        elif name == "--from-file":
            key, _, path = value.rpartition("=")
            data[key or Path(path).name] = (workdir / path).read_bytes()
        elif kind == "tls" and name in ("--cert", "--key"):
            data["tls.crt" if name == "--cert" else "tls.key"] = (workdir / value).read_bytes()
        else:
            assert name in ("--dry-run", "-o"), f"kubectl create secret: {option}?"
    assert all(data.values()), f"an empty value: {sorted(k for k, v in data.items() if not v)}"
    return data


def run_walk(overlay: str, workdir: Path) -> Walk:
    for program in ("bash", "openssl"):
        if shutil.which(program) is None:
            need(f"{program} is not installed: the doc's blocks cannot run")
    namespace = yaml.safe_load(
        (DEPLOY / "k8s/overlays" / overlay / "kustomization.yaml").read_text()
    )["namespace"]
    script = "\n".join(b.text for b in blocks() if b.marks[:1] == ("run",) and overlay in b.marks)
    calls = workdir / "kubectl-calls"
    prelude = (
        "set -euo pipefail\n"
        f'tandem() {{ {shlex.quote(sys.executable)} -m tandem.cli "$@"; }}\n'
        # kubectl records its arguments (NUL-separated, one call a line) and does nothing;
        # the two kubectls of a pipeline run at once, so each record is written under a lock
        f"kubectl() {{ ( flock 9; printf '%s\\0' \"$@\" >> {shlex.quote(str(calls))}; "
        f"printf '\\n' >> {shlex.quote(str(calls))} ) 9>> {shlex.quote(str(calls))}.lock; }}\n"
    )
    out = subprocess.run(
        ["bash", "-c", prelude + script],
        cwd=workdir,
        env=tandem_env(NS=namespace),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    recorded = [
        [a for a in line.split("\0") if a] for line in calls.read_text().split("\0\n") if line
    ]
    return Walk(workdir, namespace, recorded)


_WALKS: dict[str, Walk] = {}  # one run per overlay per session: each spawns ~6 processes


def walk_for(overlay: str, factory: pytest.TempPathFactory) -> Walk:
    if overlay not in _WALKS:
        _WALKS[overlay] = run_walk(overlay, factory.mktemp(f"walk-{overlay}"))
    return _WALKS[overlay]


@pytest.fixture(scope="module", params=["dev", "prod"])
def walk(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Walk:
    return walk_for(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def dev_walk(tmp_path_factory: pytest.TempPathFactory) -> Walk:
    return walk_for("dev", tmp_path_factory)


def overlay_of(walk: Walk) -> str:
    return "dev" if walk.namespace == "tandem-dev" else "prod"


# -- Secrets: made by the doc, referenced by the pods ----------------------------------------


def secret_references(objects: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Secret name -> the keys the overlay's objects read from it ("*": all of them)."""
    wanted: dict[str, set[str]] = {}
    for _, pod in pod_specs(objects):
        for container in pod.get("initContainers", []) + pod["containers"]:
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    wanted.setdefault(ref["name"], set()).add(ref["key"])
            for source in container.get("envFrom", []):
                if "secretRef" in source:
                    wanted.setdefault(source["secretRef"]["name"], set()).add("*")
        for volume in pod.get("volumes", []):
            secret = volume.get("secret")
            if secret:
                keys = {item["key"] for item in secret.get("items", [])} or {"*"}
                wanted.setdefault(secret["secretName"], set()).update(keys)
    for obj in objects:
        if obj["kind"] == "Ingress":
            by_cert_manager = any(
                a.startswith("cert-manager.io/") for a in obj["metadata"].get("annotations", {})
            )
            for tls in obj["spec"].get("tls", []):
                if not by_cert_manager:  # else cert-manager makes it
                    wanted.setdefault(tls["secretName"], set()).update({"tls.crt", "tls.key"})
    return wanted


def test_every_secret_the_pods_read_is_made_by_the_doc_and_every_one_it_makes_is_read(
    walk: Walk,
) -> None:
    objects = render(DEPLOY / "k8s/overlays" / overlay_of(walk))
    assert not [o for o in objects if o["kind"] == "Secret"], "a Secret kept in git"
    wanted = secret_references(objects)
    made = walk.secrets()
    assert sorted(wanted) == sorted(made)
    for name, keys in wanted.items():
        assert keys - {"*"} <= set(made[name]), f"{name}: the doc makes {sorted(made[name])}"


def test_the_doc_makes_the_namespace_it_puts_the_secrets_in(walk: Walk) -> None:
    assert ["create", "namespace", walk.namespace] in walk.kubectl


def test_the_broker_certificate_names_every_host_it_is_reached_by(walk: Walk) -> None:
    objects = render(DEPLOY / "k8s/overlays" / overlay_of(walk))
    config = by_name(objects, "ConfigMap", "tandem-config")["data"]
    cert = x509.load_pem_x509_certificate(walk.secrets()["tandem-mqtt-tls"]["tls.crt"])
    names = set(
        cert.extensions.get_extension_for_class(
            x509.SubjectAlternativeName
        ).value.get_values_for_type(x509.DNSName)
    )
    inside = config["broker-address"].rsplit(":", 1)[0]
    outside = re.fullmatch(r"mqtts://([^:/]+):8883", config["device-broker-url"])
    assert outside is not None, config["device-broker-url"]
    assert {inside, f"{inside}.{walk.namespace}.svc", outside.group(1)} <= names, names
    ca = x509.load_pem_x509_certificate(walk.secrets()["tandem-mqtt-ca"]["ca.crt"])
    assert cert.issuer == ca.subject


# -- the dev broker, started from what the doc made ---------------------------------------


def materialize(
    pod: dict[str, Any],
    container: dict[str, Any],
    made: dict[str, Any],
    configmaps: dict[str, dict[str, str]],
    root: Path,
) -> dict[str, Path]:
    """Write the container's Secret and ConfigMap mounts under ``root``; mountPath -> dir."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts: dict[str, Path] = {}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "secret" in volume:
            data = made[volume["secret"]["secretName"]]
            items = volume["secret"].get("items") or [{"key": k, "path": k} for k in data]
            files = {item["path"]: data[item["key"]] for item in items}
        elif "configMap" in volume:
            files = {k: v.encode() for k, v in configmaps[volume["configMap"]["name"]].items()}
        else:
            continue
        where = root / mount["mountPath"].strip("/").replace("/", "_")
        where.mkdir(parents=True)
        for path, content in files.items():
            (where / path).write_bytes(content)
        mounts[mount["mountPath"]] = where
    return mounts


@pytest.fixture(scope="module")
def dev_broker(dev_walk: Walk) -> Iterator[tuple[MosquittoProcess, dict[str, dict[str, bytes]]]]:
    plugin = dynsec_plugin()
    if plugin is None:
        need("Mosquitto's dynamic-security plugin is not installed")
    objects = render(DEPLOY / "k8s/overlays/dev")
    deployment = by_name(objects, "Deployment", "mosquitto")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    configmaps = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}
    made = dev_walk.secrets()
    mounts = materialize(pod, container, made, configmaps, dev_walk.workdir / "pod")
    conf_path = Path(container["args"][container["args"].index("-c") + 1])
    conf = (mounts[str(conf_path.parent)] / conf_path.name).read_text()
    port = free_port()
    listener = re.compile(r"^listener 8883 0\.0\.0\.0$", re.M)
    assert listener.search(conf), conf  # the container port, on every interface
    conf = listener.sub(f"listener {port} 127.0.0.1", conf)
    conf = re.sub(r"^plugin .*$", f"plugin {plugin}", conf, flags=re.M)  # the image's path
    for mount_path, where in sorted(mounts.items(), key=lambda m: -len(m[0])):
        conf = conf.replace(mount_path + "/", f"{where}/").replace(
            f" {mount_path}\n", f" {where}\n"
        )
    assert "/mosquitto/" not in conf, conf  # every file it reads is one the pod mounts
    broker = MosquittoProcess(dev_walk.workdir, port=port, size_limit=False)
    # Our own configuration, the overlay's, in place of the one the helper wrote; as root,
    # Mosquitto would drop to its own user, which cannot read pytest's 0700 directories.
    broker.config.write_text(conf + ("user root\n" if _is_root() else ""))
    broker.start()
    try:
        yield broker, made
    finally:
        broker.stop()


def _is_root() -> bool:
    return os.geteuid() == 0


def connack(port: int, ca: Path, user: str | None, password: str | None, client_id: str) -> Any:
    """The broker's CONNACK reason to a TLS client (the CA checked, not the host name)."""
    import paho.mqtt.client as mqtt

    from shared import MqttSettings, TlsSettings, create_client

    settings = MqttSettings(
        host="127.0.0.1",
        port=port,
        username=user,
        password=password,
        tls=TlsSettings(ca_certs=str(ca), insecure=True),
    )
    client = create_client(settings, client_id, protocol="5")
    got: list[Any] = []
    done = threading.Event()

    def on_connect(c: Any, u: Any, flags: Any, reason: Any, props: Any) -> None:
        got.append(reason)
        done.set()

    client.on_connect = on_connect
    client.connect(settings.host, settings.port, keepalive=30)
    client.loop_start()
    try:
        assert done.wait(WAIT_S), "no CONNACK"
    finally:
        client.disconnect()
        client.loop_stop()
    assert isinstance(got[0], mqtt.ReasonCode)
    return got[0]


def test_the_dev_broker_refuses_anonymous_clients_and_lets_the_doc_users_in_over_tls(
    dev_broker: tuple[MosquittoProcess, dict[str, dict[str, bytes]]], dev_walk: Walk
) -> None:
    broker, made = dev_broker
    ca = dev_walk.workdir / "ca-for-clients.crt"
    ca.write_bytes(made["tandem-mqtt-ca"]["ca.crt"])
    assert connack(broker.port, ca, None, None, "anonymous-1").is_failure
    assert connack(broker.port, ca, "hub", "not-its-password", "tandem-hub-x").is_failure
    passwords = made["tandem-mqtt-clients"]
    hub = connack(broker.port, ca, "hub", passwords["hub-password"].decode(), "tandem-hub-0")
    cdn = connack(broker.port, ca, "cdn", passwords["cdn-password"].decode(), "tandem-cdn-0")
    assert not hub.is_failure and not cdn.is_failure, (hub, cdn)
    # the device provisioned in step 5, with the password file it is given
    user, password = (dev_walk.workdir / "broker/cam-01.txt").read_text().split()
    assert user == "cam-01"
    assert not connack(broker.port, ca, user, password, "cam-01").is_failure


# -- the doc's other commands --------------------------------------------------------------


def doc_commands() -> list[list[str]]:
    return [c for b in blocks() if b.language == "bash" for c in commands(b.text)]


def test_the_doc_runs_only_programs_the_tests_know() -> None:
    assert {c[0] for c in doc_commands()} <= PROGRAMS | {"awk", "cat"}


_SUBCOMMANDS: dict[str, list[str]] = {}


def _tandem_command(words: list[str]) -> tuple[str, ...]:
    """The longest ``tandem`` subcommand path at the start of ``words``."""
    positional = [w for w in words if not w.startswith("-")]
    for size in (2, 1):
        candidate = tuple(positional[:size])
        shown = tandem(*candidate, "--help")
        usage = re.search(r"Usage: \S+ ([\w -]+?) \[OPTIONS\]", shown.stdout)
        if shown.returncode == 0 and usage and usage.group(1) == " ".join(candidate):
            if size == 1 and "Commands" in shown.stdout:
                continue  # a group: the subcommand is missing
            _SUBCOMMANDS[" ".join(candidate)] = [shown.stdout]
            return candidate
    raise AssertionError(f"tandem {' '.join(words)}: no such command")


def test_every_tandem_command_in_the_doc_is_a_command_with_the_options_it_names() -> None:
    doc = DOC.read_text()
    named = [c[1:] for c in doc_commands() if c[0] == "tandem"]
    # and the one-line mentions in the prose: `tandem hub --cdn …`
    named += [
        shlex.split(m)
        for m in re.findall(r"`tandem ([a-z][^`]*)`", doc)
        if not re.search(r"[…<>\[]", m)
    ]
    assert len(named) >= 8
    for words in named:
        command = _tandem_command(words)
        shown = _SUBCOMMANDS[" ".join(command)][0]
        for word in words:
            if word.startswith("--"):
                option = word.split("=", 1)[0]
                assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", shown), (
                    f"tandem {' '.join(command)} has no {option}"
                )


def test_the_hub_options_the_doc_explains_are_the_hubs() -> None:
    """Issue 21: the doc said options were "being added" that existed; every ``--option``
    of a hub or CDN server named in the prose is one of theirs."""
    doc = DOC.read_text()
    hub, cdn = tandem("hub", "--help").stdout, tandem("cdn", "serve", "--help").stdout
    for option in ("--cdn", "--model", "--trusted-key", "--cdn-token", "--cdn-ca", "--cdn-poll-s"):
        assert f"`{option}" in doc or f"{option}=" in doc, option
        assert option in hub, option
    for option in ("--redis", "--leader-lease-s"):
        assert option in doc and option in cdn, option
    assert "being added" not in doc


def test_every_kubectl_command_in_the_doc_names_what_the_overlays_render() -> None:
    overlays = {p.name: render(p) for p in (DEPLOY / "k8s/overlays").iterdir() if p.is_dir()}
    kinds = {"deployment": "Deployment", "service": "Service", "ingress": "Ingress"}
    seen = 0
    for command in doc_commands():
        if command[0] != "kubectl":
            continue
        args = command[3:] if command[1] == "-n" else command[1:]
        if args[0] == "kustomize":
            assert (ROOT / args[1]).resolve().parent == (DEPLOY / "k8s/overlays").resolve()
            assert Path(args[1]).name in overlays
        elif args[0] == "rollout" or args[0] == "get":
            kind, _, name = (args[2] if args[0] == "rollout" else "/".join(args[1:3])).partition(
                "/"
            )
            assert any(
                (kinds[kind], name) in {(o["kind"], o["metadata"]["name"]) for o in objects}
                for objects in overlays.values()
            ), command
        else:
            assert args[0] in ("create", "apply"), command
        seen += 1
    assert seen >= 10


def test_the_device_program_in_the_doc_calls_the_sdk_with_parameters_it_has() -> None:
    [program] = [b.text for b in blocks() if b.marks == ("device",)]
    tree = ast.parse(program)
    names: dict[str, Any] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("edge_agent", "shared"):
            module = __import__(node.module)
            for alias in node.names:
                names[alias.name] = getattr(module, alias.name)  # exported, or AttributeError
    import shared

    methods = {"from_url": shared.MqttSettings.from_url, "with_tls": shared.MqttSettings.with_tls}
    import edge_agent

    methods["infer"] = edge_agent.EdgeAgent.infer
    checked = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        target = (
            names.get(func.id)
            if isinstance(func, ast.Name)
            else methods.get(getattr(func, "attr", ""))
        )
        if target is None:
            continue
        signature = inspect.signature(target)
        placeholders = [None] * len(node.args)
        if isinstance(func, ast.Attribute) and func.attr in ("with_tls", "infer"):
            placeholders = [None, *placeholders]  # self
        signature.bind(*placeholders, **{k.arg: None for k in node.keywords if k.arg})
        checked += 1
    assert checked >= 4, checked


def test_every_option_the_doc_names_is_one_of_the_commands_it_uses() -> None:
    """Also the prose's (`--workers`, `--leader-lease-s`): an option of a ``tandem``
    command the doc uses, or of the other program whose command names it."""
    doc = DOC.read_text()
    others = {
        w.split("=", 1)[0] for c in doc_commands() if c[0] != "tandem" for w in c if w[:2] == "--"
    }
    used = {" ".join(_tandem_command(c[1:])) for c in doc_commands() if c[0] == "tandem"}
    helps = [tandem(*command.split(), "--help").stdout for command in used | {"hub", "cdn serve"}]
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", doc)) - others
    assert len(named) >= 20
    for option in sorted(named):
        pattern = rf"(?<![\w-]){re.escape(option)}(?![\w-])"
        assert any(re.search(pattern, shown) for shown in helps), f"{option} is no option"


def test_the_doc_site_overlay_replaces_every_placeholder_name(tmp_path: Path) -> None:
    """The operator's own overlay, as the doc writes it, renders with the placeholder
    hosts gone and the devices' CDN URL, the Ingress host and its TLS host the same."""
    files = [b.text for b in blocks() if b.marks == ("site",)]
    assert len(files) == 2
    (tmp_path / "deploy").symlink_to(DEPLOY)  # site/ sits next to deploy/, as in the doc
    for text in files:
        first = text.splitlines()[0]
        assert first.startswith("# site/"), first
        target = tmp_path / first[2:]
        target.parent.mkdir(exist_ok=True)
        target.write_text(text)
    objects = render(tmp_path / "site")
    assert "tandem.example" not in json.dumps(objects)
    kubectl = shutil.which("kubectl")
    if kubectl is not None:  # and the operator's own tool renders the same
        out = subprocess.run(
            [kubectl, "kustomize", str(tmp_path / "site")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if "unknown command" not in out.stderr:
            assert out.returncode == 0, out.stderr
            theirs = [d for d in yaml.safe_load_all(out.stdout) if d]
            key = lambda o: (o["kind"], o["metadata"]["name"])  # noqa: E731
            assert sorted(theirs, key=key) == sorted(objects, key=key)
    base = render(DEPLOY / "k8s/overlays/dev")
    assert sorted((o["kind"], o["metadata"]["name"]) for o in objects) == sorted(
        (o["kind"], o["metadata"]["name"]) for o in base
    )
    config = by_name(objects, "ConfigMap", "tandem-config")["data"]
    host = config["cdn-url"].removeprefix("https://")
    ingress = by_name(objects, "Ingress", "tandem-cdn")["spec"]
    assert [r["host"] for r in ingress["rules"]] == [host]
    assert [t["hosts"] for t in ingress["tls"]] == [[host]]
    # the rest of the ConfigMap is the overlay's: a patch merges, it does not replace
    assert (
        config["broker-address"]
        == by_name(base, "ConfigMap", "tandem-config")["data"]["broker-address"]
    )
