"""Lease delivery (docs/protocol.md "Lease delivery"): the workload a renter
attaches to a bid or a lease, its secret part sealed to the leased host, and
the delivery statuses the host reports.

Secrets are sealed with libsodium's `crypto_box_seal` (PyNaCl's SealedBox):
the same format the Rust agent opens, so only the host that runs the
workload can read the command, environment and SSH keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from nacl.public import PrivateKey, PublicKey, SealedBox

ENCRYPTION_KEY_DOMAIN = b"gpux-encryption-key-v1:"

# Delivery state names, in the order a healthy delivery goes through them.
STATES = ("awaiting_secrets", "pulling", "starting", "running", "exited", "failed", "stopped")


@dataclass
class Secrets:
    """The secret part of a workload: never sent in clear."""

    command: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    ssh_keys: list[str] = field(default_factory=list)
    # {"port": 8080, "http_path": "/health"}: `running` once it answers there.
    readiness: Optional[dict] = None
    # {"username": ..., "password": ..., "server": ...}: a private registry's credentials.
    registry_auth: Optional[dict] = None

    def to_json(self) -> bytes:
        body = {"command": self.command, "args": self.args, "env": [[k, v] for k, v in self.env.items()], "ssh_keys": self.ssh_keys}
        if self.readiness is not None:
            body["readiness"] = self.readiness
        if self.registry_auth is not None:
            body["registry_auth"] = self.registry_auth
        return json.dumps(body, separators=(",", ":")).encode()

    def seal(self, host_encryption_key: bytes) -> dict:
        """Seals to a host's X25519 key; returns the wire's `sealed` object."""
        ciphertext = SealedBox(PublicKey(host_encryption_key)).encrypt(self.to_json())
        return {"recipient": host_encryption_key.hex(), "ciphertext": ciphertext.hex()}

    @classmethod
    def unseal(cls, sealed: dict, host_key: PrivateKey) -> "Secrets":
        """Opens sealed secrets with a host's key (what an agent does)."""
        if sealed["recipient"] != bytes(host_key.public_key).hex():
            raise ValueError("sealed to another key")
        body = json.loads(SealedBox(host_key).decrypt(bytes.fromhex(sealed["ciphertext"])))
        return cls(
            command=body["command"],
            args=body["args"],
            env=dict(body["env"]),
            ssh_keys=body["ssh_keys"],
            readiness=body.get("readiness"),
            registry_auth=body.get("registry_auth"),
        )


@dataclass
class Workload:
    """A workload: an image and its public options (docs/protocol.md).

    `restart` is "never", "always" or {"on_failure": {"max_restarts": N}}.
    A bid cannot know its hosts, so a bid's workload with secrets says
    `secrets_follow`; the client seals the secrets for each lease it fills.
    """

    image: str
    ports: list[int] = field(default_factory=list)
    shm_mib: int = 0
    restart: Any = "never"
    sealed: Optional[dict] = None
    secrets_follow: bool = False

    def to_wire(self) -> dict:
        return {
            "image": self.image,
            "ports": self.ports,
            "shm_mib": self.shm_mib,
            "restart": self.restart,
            "sealed": self.sealed,
            "secrets_follow": self.secrets_follow,
        }


def verified_host_key(answer: dict) -> bytes:
    """The X25519 key of a `host_key` answer, after checking that the host's
    identity key signed it; raises ValueError if it did not."""
    encryption_key = bytes.fromhex(answer["encryption_key"])
    identity = Ed25519PublicKey.from_public_bytes(bytes.fromhex(answer["identity_key"]))
    try:
        identity.verify(bytes.fromhex(answer["signature"]), ENCRYPTION_KEY_DOMAIN + encryption_key)
    except InvalidSignature as error:
        raise ValueError("the host's encryption key is not signed by its identity key") from error
    return encryption_key


def certify(encryption_key: PrivateKey, identity_sign) -> dict:
    """The `set_encryption_key` fields a host publishes: its X25519 key and
    the identity key's signature over it (`identity_sign` is `Key.sign`)."""
    public = bytes(encryption_key.public_key)
    return {"encryption_key": public.hex(), "signature": identity_sign(ENCRYPTION_KEY_DOMAIN + public).hex()}


def state_name(state: Any) -> Optional[str]:
    """`running`, `failed`, ... for a wire STATE (a string or a one-key object)."""
    if state is None:
        return None
    if isinstance(state, str):
        return state
    (name,) = state.keys()
    return name


def state_fields(state: Any) -> dict:
    if isinstance(state, dict):
        (fields,) = state.values()
        return fields
    return {}


def describe(state: Any) -> str:
    """One line for people: `running 203.0.113.7:40123->8888`, `failed pull_failed (renter): ...`."""
    name, fields = state_name(state), state_fields(state)
    if name is None:
        return "no status yet"
    if name == "pulling":
        return f"pulling {fields['bytes_done'] >> 20}/{fields['bytes_total'] >> 20} MiB"
    if name == "running":
        ports = " ".join(f"{e['host']}:{e['port']}->{e['container_port']}" for e in fields["endpoints"])
        return " ".join(part for part in ("running", ports, fields.get("ssh") or "") if part)
    if name == "exited":
        return f"exited with code {fields['code']}"
    if name == "failed":
        return f"failed {fields['code']} ({fields['fault']}): {fields['reason']}"
    return name
