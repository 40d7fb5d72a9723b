"""The model CDN's HTTP API: models, signed manifests, immutable blobs, assignments, rollouts.

Routes (the paths are ``shared.CdnPaths.ROUTES``; devices, the updater and
the admin client build the same URLs from ``shared.CdnPaths``)::

    GET    /healthz, /metrics                               open
    GET    /v1/models                                       {"models": [name, …]}
    GET    /v1/models/{name}/versions                       {"versions": [{version,
                                                              blob_digest, published_at}]}
    GET    /v1/models/{name}/manifest                       latest signed manifest
    GET    /v1/models/{name}/versions/{version}/manifest    one signed manifest
    GET    /v1/blobs/{digest}            (and HEAD)         the blob; ranges, ETag, immutable
    GET    /v1/devices/{device}/assignments/{model}         signed assignment
  admin (Authorization: Bearer <admin token>, or an API key with the scope in brackets):
    PUT    /v1/blobs/{digest}                 [models:publish]  body = the bytes; digest checked
    POST   /v1/models/{name}/versions         [models:publish]  body = signed manifest
    DELETE /v1/models/{name}/versions/{version}                  [models:publish]
    PUT    /v1/devices/{device}/assignments/{model}              [rollout:admin]
                                                 body = signed assignment; MQTT retained
    POST, GET /v1/rollouts; GET /v1/rollouts/{rollout_id};
    POST   /v1/rollouts/{rollout_id}/{command}; GET /v1/devices[/{device}]  [rollout:admin]

With ``api_keys`` (a ``shared.ApiKeyGuard``) reads need a key with
``models:read`` (or the read or admin token): see ``_auth`` for the rules.
Every name and digest in a path is checked before it reaches the registry or
the store (no ``..``, ``/``, upper-case hex), and every error is JSON
``{"error": "…"}`` with its status (``_errors``).

One module per group of routes: ``_models`` (models, versions, manifests),
``_blobs`` (blobs, ranges and ETags with ``_ranges``), ``_assignments``,
``_rollouts`` (rollouts and the fleet), ``_health`` (health and metrics);
``_auth`` (who may do what, as route dependencies), ``_bodies`` (bounded
request bodies), ``_app`` (the factory). The writes call the library's
operations (``model_cdn._versions``), the same code the CLI runs.
Importing this package imports FastAPI, which ``import model_cdn`` does not.
"""

from ._app import create_app
from ._blobs import BLOB_FILE_CHUNK_BYTES

__all__ = ["BLOB_FILE_CHUNK_BYTES", "create_app"]
