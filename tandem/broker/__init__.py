"""The MQTT broker's side of a fleet: Mosquitto's files and the embedded broker.

- ``provision_users`` / ``provisioning_acl`` (``_acl``): a password file and topic
  ACLs, the plain-file fallback where the dynamic-security plugin is missing;
- ``provision_dynsec`` (``_dynsec``): the dynamic-security plugin's state, which
  binds each client id to its user and role;
- ``provision_gateway`` (``_bridge``): a site gateway's broker, bridged to the cloud;
- ``render_broker_limits`` / ``write_broker_limits`` (``_conf``): the broker's size
  limit (Mosquitto's ``max_packet_size`` for ``shared.Limits.max_frame_bytes``);
- ``EmbeddedBroker`` (``_embedded``): an in-process broker (amqtt) for the
  zero-setup demo and for tests.

``tandem fleet provision`` and ``tandem fleet gateway`` are the commands over it.
"""

from ._acl import (
    Provisioning,
    mosquitto_password_hash,
    provision_users,
    provisioning_acl,
    write_private_file,
)
from ._bridge import BridgeOptions, BrokerFiles, GatewayProvisioning, provision_gateway
from ._conf import render_broker_limits, write_broker_limits
from ._dynsec import provision_dynsec, render_dynsec_config
from ._embedded import BrokerStartError, EmbeddedBroker

__all__ = [
    "BridgeOptions",
    "BrokerFiles",
    "BrokerStartError",
    "EmbeddedBroker",
    "GatewayProvisioning",
    "Provisioning",
    "mosquitto_password_hash",
    "provision_dynsec",
    "provision_gateway",
    "provision_users",
    "provisioning_acl",
    "render_broker_limits",
    "render_dynsec_config",
    "write_broker_limits",
    "write_private_file",
]
