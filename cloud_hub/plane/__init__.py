"""The process plane ``tandem hub`` runs in production.

A supervisor (``_supervisor``) starts one executor process per model instance
(``_executor_loop``) and ingress processes for MQTT and HTTP (``_roles``, each
started by ``_child``); tensors cross between them through shared-memory rings
(``_ring``, ``_records``), announced over Unix-socket IPC (``_ipc``), and
``_served_versions`` tells every ingress which version of each model is where.
Language models get a language executor each (``_llm_executor``: the model's
engine), which ingress processes reach through ``_llm_client`` over framed
records (``_llm_wire``).
``serve(HubServeSettings(...))`` is what ``tandem hub`` and ``python -m
cloud_hub`` call; the in-process ``cloud_hub.Hub`` is the embedded plane.
"""

from ._launch import (
    LOG_FORMATS,
    LOG_LEVELS,
    MQTT_CLIENTS,
    HubServeSettings,
    check_options,
    default_workers,
    ensure_repo,
    https_settings,
    serve,
)

__all__ = [
    "LOG_FORMATS",
    "LOG_LEVELS",
    "MQTT_CLIENTS",
    "HubServeSettings",
    "check_options",
    "default_workers",
    "ensure_repo",
    "https_settings",
    "serve",
]
