"""What the LLM package tests share: a real CDN (the model_cdn app on loopback, a SQLite
registry, a blob store) that publishes the tiny language models as packages, signed
assignments stored where devices fetch them, crafted packages signed by the real key
(a compromised or buggy publisher, which the device must still refuse), and greedy text.
"""

from __future__ import annotations

import contextlib
import copy
import io
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_agent import EdgeAgent, ModelUpdater
from model_cdn import add_version, assign_version, create_app, make_assignment, open_registry
from model_cdn.publish import PublishResult, publish_package
from model_cdn.registry import Registry
from shared import SigningKey, compress_blob, digest, sign_document
from shared.server.store import LocalBlobStore

from ._cdn import serve_in_thread

__all__ = ["MODEL", "PROMPT", "PackageCdn", "greedy_text", "package_cdn", "tar_of"]

MODEL = "tiny-llm"
PROMPT = "The "


def greedy_text(agent: EdgeAgent, prompt: str = PROMPT, tokens: int = 12) -> str:
    return "".join(chunk.text for chunk in agent.generate(prompt, max_tokens=tokens))


def tar_of(members: list[tarfile.TarInfo], data: dict[str, bytes]) -> bytes:
    """A tar built member by member, as an attacker may: links, paths, sizes of their own."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for info in members:
            body = data.get(info.name)
            tar.addfile(info, io.BytesIO(body) if body is not None else None)
    return out.getvalue()


@dataclass
class PackageCdn:
    key: SigningKey
    registry: Registry
    store: LocalBlobStore
    url: str
    tmp: Path

    def publish(self, folder: Path, **options: Any) -> PublishResult:
        return publish_package(
            folder,
            name=MODEL,
            signing_key=self.key,
            registry=self.registry,
            store=self.store,
            **options,
        )

    def assign(self, device: str, version: int, *, rollback: bool = False) -> None:
        doc = make_assignment(
            self.key, device=device, model=MODEL, version=version, rollback=rollback
        )
        assign_version(self.registry, None, device, MODEL, doc, trusted_keys=[self.key.public_key])

    def craft(
        self,
        version: int,
        raw: bytes,
        *,
        based_on: PublishResult,
        files: list[dict[str, Any]] | None = None,
        blob: bytes | None = None,
        raw_size: int | None = None,
        key: SigningKey | None = None,
        **fields: Any,
    ) -> None:
        """A package of the archive ``raw`` (listing ``files``, else ``based_on``'s), signed
        by ``key`` (the publisher's by default) and stored as ``version``; ``fields``
        replace the manifest's own."""
        signed = copy.deepcopy(based_on.signed["signed"])
        signed.update(fields)
        blob = compress_blob(raw) if blob is None else blob
        signed["version"] = version
        signed["deltas"] = []
        signed["blob"] = {
            "digest": digest(blob),
            "size": len(blob),
            "raw_size": raw_size or len(raw),
            "compression": "zstd",
            "raw_digest": digest(raw),
        }
        if files is not None:
            signed["package"] = {"archive": "tar", "files": files}
        document = sign_document(signed, key or self.key)
        add_version(
            self.registry, self.store, document, trusted_keys=None, blobs={digest(blob): blob}
        )

    def updater(self, agent: EdgeAgent, device: str, store_dir: Path, **kw: Any) -> ModelUpdater:
        return ModelUpdater(
            agent,
            model=MODEL,
            device_id=device,
            cdn_url=self.url,
            trusted_keys=[self.key.public_key],
            store_dir=store_dir,
            **kw,
        )


@contextlib.contextmanager
def package_cdn(tmp: Path) -> Iterator[PackageCdn]:
    key = SigningKey.generate()
    registry = open_registry(f"sqlite:///{tmp / 'registry.db'}")
    store = LocalBlobStore(tmp / "blobs")
    app = create_app(registry=registry, store=store, admin_token=None)
    try:
        with serve_in_thread(app) as url:
            yield PackageCdn(key, registry, store, url, tmp)
    finally:
        registry.close()
