"""The README's ``curl`` commands to the hub, run as written against a real ``tandem hub``.

Issue 21 (item 10): the README's plain ``curl -d`` got 415, because curl
labels such a body a form. The README now sends the JSON media type; a form
stays refused (a web page may post one cross-site without a preflight), with
a hint that says what to add, and a body with no Content-Type is taken.
Only the README's address (``localhost:8000``) is changed, to the test hub's.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ._brokers import MosquittoProcess, free_port
from ._cli import ROOT
from ._hub_process import tandem_hub
from ._needs import need


@pytest.fixture(autouse=True)
def _curl() -> None:
    need(None if shutil.which("curl") else "curl is not installed (the README's commands use it)")


README_ADDRESS = "localhost:8000"


def _readme_block() -> str:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    [block] = [b for b in blocks if "/v2/models/mnist/infer" in b]
    return block


def _mnist_repo(root: Path) -> Path:
    """``mnist``: image FP32[n, 1, 28, 28] -> logits FP32[n, 10] (a linear layer)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["image"], ["flat"], axis=1),
            helper.make_node("MatMul", ["flat", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["logits"]),
        ],
        "mnist",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 1, 28, 28])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        initializer=[
            numpy_helper.from_array(rng.normal(size=(784, 10)).astype(np.float32), "W"),
            numpy_helper.from_array(np.arange(10, dtype=np.float32), "b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (root / "mnist" / "1").mkdir(parents=True)
    onnx.save(model, str(root / "mnist" / "1" / "model.onnx"))
    (root / "mnist" / "config.json").write_text('{"max_batch_size": 8, "max_queue_delay_ms": 1}')
    return root


def _documents(text: str) -> list[Any]:
    """The JSON documents curl printed one after another (no newline between them)."""
    decoder, found, position = json.JSONDecoder(), [], 0
    while position < len(text):
        document, position = decoder.raw_decode(text, position)
        found.append(document)
        while position < len(text) and text[position].isspace():
            position += 1
    return found


def test_the_readme_curl_commands_get_metadata_and_an_answer(
    tmp_path: Path, mosquitto: MosquittoProcess
) -> None:
    block = _readme_block()
    assert README_ADDRESS in block
    port = free_port()
    work = tmp_path / "work"
    work.mkdir()
    repo = _mnist_repo(tmp_path / "repo")
    with tandem_hub(repo, mosquitto.url, port, tmp_path / "hub.log"):
        script = "set -eu\n" + block.replace(README_ADDRESS, f"127.0.0.1:{port}")
        run = subprocess.run(
            ["bash", "-c", script], cwd=work, capture_output=True, text=True, timeout=60
        )
        assert run.returncode == 0, run.stderr
        metadata, answer = _documents(run.stdout)
        assert metadata["name"] == "mnist" and metadata["inputs"][0]["name"] == "image"
        [logits] = answer["outputs"]
        assert logits["name"] == "logits" and logits["shape"] == [1, 10], answer
        assert logits["data"] == pytest.approx(list(range(10)))  # zeros in: the bias out

        url = f"http://127.0.0.1:{port}/v2/models/mnist/infer"

        def curl(*args: str) -> tuple[int, str]:
            out = subprocess.run(
                ["curl", "-s", "-w", "\n%{http_code}", *args, url],
                cwd=work, capture_output=True, text=True, timeout=60, check=True,
            ).stdout  # fmt: skip
            body, _, status = out.rpartition("\n")
            return int(status), body

        # curl -d alone labels the body a form: refused, saying what to add.
        status, body = curl("-d", "@image.json")
        assert status == 415, body
        assert "-H 'Content-Type: application/json'" in json.loads(body)["error"]
        # No Content-Type at all (as Triton's client sends): taken as JSON.
        status, body = curl("-H", "Content-Type:", "-d", "@image.json")
        assert status == 200, body
