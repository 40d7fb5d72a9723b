"""Over-the-air model updates for the edge agent: signed, verified, resumable, atomic.

Typical use::

    from edge_agent import EdgeAgent
    from edge_agent.updater import ModelUpdater
    from shared import MqttSettings, PublicKey

    keys = [PublicKey.load("/etc/tandem/publisher.pub")]
    runtime = ModelUpdater.bootstrap("/var/lib/tandem/models", keys, "mnist")
    agent = EdgeAgent(runtime, device_id="cam-7", cloud_model="mnist", broker=...)
    updater = ModelUpdater(agent, model="mnist", device_id="cam-7",
                           cdn_url="https://cdn.example/", trusted_keys=keys,
                           store_dir="/var/lib/tandem/models",
                           mqtt=MqttSettings.from_url("mqtts://hub.example"))
    updater.start()

``_trust`` decides (pure), ``_fetcher`` is what the updater asks of a CDN
(``CdnFetcher``: the rules; ``ModelUpdater(fetcher=...)`` takes another
implementation), ``_urllib_fetcher`` its default on urllib (``CdnClient``),
``_sources`` turns a verified manifest into verified model bytes, ``_smoke``
loads and checks them, ``_store`` keeps models on disk, ``_updater`` runs
the steps and reports.
"""

from ._fetcher import CdnFetcher, DownloadResult, DownloadSettings, FetchResponse
from ._stats import UpdaterStats
from ._store import CurrentPointer, DeviceModelStore, InstalledModel, LoadedModel
from ._trust import TrustRecord, UpdateTrust
from ._updater import STEPS, ModelUpdater
from ._urllib_fetcher import CdnClient

__all__ = [
    "STEPS",
    "CdnClient",
    "CdnFetcher",
    "CurrentPointer",
    "DeviceModelStore",
    "DownloadResult",
    "DownloadSettings",
    "FetchResponse",
    "InstalledModel",
    "LoadedModel",
    "ModelUpdater",
    "TrustRecord",
    "UpdateTrust",
    "UpdaterStats",
]
