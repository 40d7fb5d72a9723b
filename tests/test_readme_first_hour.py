"""The README's publishing commands and device snippet, run as a new user runs them (issue 14).

The ``bash`` block of "Publishing models and updating devices" runs line by
line in a fresh folder holding what ``make demo`` leaves in ``demo-output/``
(keys, publish, list, pull, ``cdn serve`` in the background, assign), against
a Mosquitto of the test's own. Then the ``python`` block under "On the
device:" runs in a fresh process, in a device folder where nothing was ever
installed but the pinned ``publisher.pub``: the device must start, install
its first model from the CDN, and answer with it. Only the addresses are
changed (the broker's and the CDN's, which are the README's placeholders).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from model_cdn import open_registry
from tandem.demo import write_publish_inputs
from tandem.demo.data import load_digit_splits
from tandem.demo.models import build_demo_models

from ._brokers import MosquittoProcess, free_port, wait_for_port
from ._cli import ROOT, tandem, tandem_env

README = ROOT / "README.md"
SECTION = "## Publishing models and updating devices"
README_BROKERS = ("mqtt://127.0.0.1:1883", "mqtt://broker:1883")
README_CDN = "http://cdn.example:8700"


def _section() -> str:
    text = README.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start : end if end > 0 else None]


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", _section(), flags=re.S)


def _command_lines(block: str) -> list[str]:
    """Logical lines (continuations joined), comments and blank lines left out."""
    joined = re.sub(r"\\\n\s*", " ", block)
    lines = [line.split("  #")[0].strip() for line in joined.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with what ``make demo`` leaves in ``demo-output/`` for the README."""
    root = tmp_path_factory.mktemp("readme")
    models = build_demo_models()
    (root / "demo-output").mkdir()
    write_publish_inputs(root / "demo-output", models.edge_float_onnx, models.cloud_onnx)
    return root


@pytest.fixture(scope="module")
def operator(work: Path, mosquitto: MosquittoProcess) -> Iterator[str]:
    """Runs the README's publishing block; yields the URL of the CDN it started."""
    (block,) = _blocks("bash")[:1]
    lines = _command_lines(block)
    assert lines[0].startswith("T="), lines[0]  # the README's shorthand for the CLI
    port = free_port()
    server: subprocess.Popen[str] | None = None
    try:
        for line in lines[1:]:
            for placeholder in README_BROKERS:
                line = line.replace(placeholder, mosquitto.url)
            words = shlex.split(line.removesuffix("&"))
            env = dict(w.split("=", 1) for w in words[: words.index("$T")])
            args = words[words.index("$T") + 1 :]
            if line.endswith("&"):  # the CDN, as a process of its own
                assert server is None and args[:2] == ["cdn", "serve"], line
                server = subprocess.Popen(
                    [sys.executable, "-m", "tandem.cli", *args, "--port", str(port)],
                    cwd=work,
                    env=tandem_env(**env),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                wait_for_port(port, timeout_s=60)
                continue
            assert not env, line
            result = tandem(*args, cwd=work, timeout=300)
            assert result.returncode == 0, f"{line}\n{result.stdout}{result.stderr}"
        assert server is not None, "the README's block starts no CDN"
        yield f"http://127.0.0.1:{port}"
    finally:
        if server is not None:
            server.terminate()
            _, stderr = server.communicate(timeout=30)
            assert "Traceback" not in stderr, stderr


def test_the_publishing_commands_publish_pull_and_assign(operator: str, work: Path) -> None:
    import onnxruntime as ort

    registry = open_registry(f"sqlite:///{work / 'tandem-cdn' / 'registry.db'}", create=False)
    try:
        record = registry.get_version("mnist-edge")
        assignment = registry.get_assignment("cam-7", "mnist-edge")
    finally:
        registry.close()
    assert record.version == 1 and assignment is not None
    assert assignment["signed"]["version"] == 1
    pulled = work / "mnist-edge.onnx"  # what the README's pull line wrote
    session = ort.InferenceSession(str(pulled), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].name == "image"
    assert record.manifest["signed"]["blob"]["raw_size"] == pulled.stat().st_size


def test_the_device_snippet_installs_its_first_model_on_a_fresh_device(
    operator: str, work: Path, mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    (snippet,) = [b for b in _blocks("python") if "ModelUpdater.bootstrap" in b][:1]
    for placeholder in README_BROKERS:
        snippet = snippet.replace(placeholder, mosquitto.url)
    snippet = snippet.replace(README_CDN, operator)
    device = tmp_path / "device"
    device.mkdir()
    shutil.copyfile(work / "keys" / "publisher.pub", device / "publisher.pub")  # provisioning
    digit = load_digit_splits().test_images[:1]
    np.save(device / "digit.npy", digit)
    check = textwrap.dedent(
        """
        import json, time
        import numpy as np
        assert runtime is None, "the device was not fresh"
        deadline = time.monotonic() + 120
        while updater.running_version is None and time.monotonic() < deadline:
            time.sleep(0.05)  # waiting on the updater's condition, polled
        result = agent.infer(np.load("digit.npy"), deadline_ms=2000)
        print(json.dumps({"version": updater.running_version, "source": result.source.name,
                          "output": np.asarray(result.output).tolist()}))
        updater.stop()
        agent.close()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", snippet + check],
        cwd=device,
        env=tandem_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["version"] == 1
    assert answer["source"] in ("EDGE", "EDGE_FALLBACK")  # the answer is the local model's
    import onnxruntime as ort

    pulled = ort.InferenceSession(str(work / "mnist-edge.onnx"), providers=["CPUExecutionProvider"])
    want = pulled.run(None, {"image": digit})[0]
    np.testing.assert_allclose(np.asarray(answer["output"]), want, rtol=1e-5, atol=1e-5)


def _refine_line() -> str:
    text = README.read_text()
    start = text.index("## The learning loop")
    section = text[start : text.index("\n## ", start + 1)]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    (line,) = [c for b in blocks for c in _command_lines(b) if "models refine" in c]
    return line


# What the README's refine line does through a CDN; here it publishes into the registry and
# store the publishing block wrote (its `--cdn` placeholder serves nothing, and a rollout
# needs the rollout service).
_THROUGH_A_CDN = {"--cdn", "--token", "--rollout", "--soak", "--max-agreement-drop"}


@pytest.mark.slow
@pytest.mark.timeout(600)  # the publishing block, then training on two shared cores
def test_the_refine_command_runs_on_what_the_demo_leaves(operator: str, work: Path) -> None:
    """Issue 21: the README's refine example named a ``train.npz`` the demo did not write.
    Each file it names must be in ``demo-output/``, and the line must run there (on examples
    a hub would have kept from drifted digits), judged against the published mnist-edge@1."""
    from shared.server.store import LocalBlobStore
    from tandem.demo.drift import Drift

    from ._lessons import collect_offline

    words = shlex.split(_refine_line())
    assert words[:3] == ["$T", "models", "refine"], words
    args, i = [], 3
    while i < len(words):
        option = words[i]
        value = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else None
        i += 2 if value is not None else 1
        if option in _THROUGH_A_CDN:
            continue
        if value is not None and value.startswith("demo-output/"):
            assert (work / value).is_file(), f"the README's refine names {value}: not written"
        args += [option] if value is None else [option, value]
    named = [a for a in args if a.startswith("demo-output/")]
    assert "demo-output/train.npz" in named and len(named) == 4, named
    models = build_demo_models()
    splits = load_digit_splits()
    lessons = LocalBlobStore(work / "lessons")
    drifted = Drift().apply(splits.train_images[:1500], seed=1)
    assert collect_offline(lessons, models.edge_int8_onnx, models.cloud_onnx, drifted) > 50
    at = args.index("--examples")
    args[at + 1] = str(lessons.root)
    done = tandem("models", "refine", *args, "--trainer-option", "epochs=1", cwd=work)
    # Published (0) or refused after judging both models (1): either way it ran on the files.
    assert done.returncode in (0, 1), done.stdout + done.stderr
    assert "mnist-edge@1" in done.stdout and "validation accuracy" in done.stdout, done.stdout
