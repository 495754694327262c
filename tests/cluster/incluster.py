"""A process on this machine as a pod sees the cluster: its ServiceAccount's files at
/var/run/secrets/kubernetes.io/serviceaccount (token, ca.crt, namespace) and
KUBERNETES_SERVICE_HOST/PORT naming the real apiserver. The process runs in a private mount
namespace (``unshare -m``) where /run is an overlay of the real one and a directory of this test
is bind-mounted at that path; nothing of it is seen outside, and nothing is left when it ends.

Tokens come from the TokenRequest API bound to a Secret of their own (``boundObjectRef``):
deleting the Secret invalidates the token at once, so a test revokes the token a process holds
without waiting out its life, and ``issue`` swaps the file as the kubelet does (a new file
renamed over the old one).
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from tests.cluster.cluster import Cluster

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# argv[1]: the test's directory (sa/, run-upper/, run-work/ in it); the rest: the command.
IN_POD = (
    'set -e; mount -t overlay overlay -o "lowerdir=/run,upperdir=$1/run-upper,workdir=$1/run-work" /run; '
    f'mkdir -p {SERVICE_ACCOUNT_DIR}; mount --bind "$1/sa" {SERVICE_ACCOUNT_DIR}; shift; exec "$@"'
)


class PodIdentity:
    """ServiceAccount ``account`` of ``namespace`` as a pod of it holds it, under ``root``."""

    def __init__(self, cluster: Cluster, namespace: str, account: str, root: Path) -> None:
        self.cluster, self.namespace, self.account, self.root = cluster, namespace, account, root
        self.api = cluster.api()
        self.dir = root / "sa"
        for folder in (self.dir, root / "run-upper", root / "run-work"):
            folder.mkdir(parents=True, exist_ok=True)
        assert cluster.plane.pki is not None
        shutil.copy(cluster.plane.pki_dir / "ca.crt", self.dir / "ca.crt")
        (self.dir / "namespace").write_text(namespace)
        self.secrets: list[str] = []

    def issue(self, seconds: int = 600) -> str:
        """A new token of the account, bound to a new Secret, written over the token file (a new
        file renamed into place, as the kubelet's atomic writer does); the Secret's name."""
        name = f"token-{uuid.uuid4().hex[:8]}"
        secrets = f"/api/v1/namespaces/{self.namespace}/secrets"
        secret = self.api.create(secrets, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}})
        self.secrets.append(name)
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": seconds,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "name": name,
                    "uid": secret["metadata"]["uid"],
                },
            },
        }
        path = f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{self.account}/token"
        token = self.api.create(path, request)["status"]["token"]
        fresh = self.dir / f".token-{name}"
        fresh.write_text(token)
        os.replace(fresh, self.dir / "token")
        return name

    def revoke(self, secret: str) -> None:
        """Delete the Secret token ``secret`` was bound to: the API server refuses that token from now on."""
        self.api.delete(f"/api/v1/namespaces/{self.namespace}/secrets/{secret}")
        self.secrets.remove(secret)

    def token_claims(self) -> dict[str, Any]:
        """The claims of the token in the file now (a JWT's payload, not verified: the API server did)."""
        import base64
        import json

        payload = (self.dir / "token").read_text().split(".")[1]
        return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run as in a pod of the account (the caller adds ``env()`` to its environment)."""
        return ["unshare", "-m", "--propagation", "private", "sh", "-c", IN_POD, "in-pod", str(self.root), *argv]

    def env(self) -> dict[str, str]:
        """What the kubelet sets in every container: the apiserver's address (its serving
        certificate names 127.0.0.1)."""
        return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(self.cluster.plane.port)}

    def close(self) -> None:
        """Delete the Secrets of the tokens issued and not revoked."""
        for secret in list(self.secrets):
            self.revoke(secret)
