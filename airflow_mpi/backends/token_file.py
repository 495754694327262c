"""The in-cluster ServiceAccount token, read from its file whenever the kubelet has rewritten it.

A pod's projected token lives ten minutes by default (``expirationSeconds``); the kubelet writes
a new one at 80% of that life and the old one expires soon after, or at once when the object it
was bound to is deleted. The ``kubernetes`` and ``kubernetes_asyncio`` in-cluster loaders re-read
the file at most once a minute, and their clients send the token they read until then: a request
in that minute after a revocation is refused (401), which ends a job's wait. A client whose
configuration's ``refresh_api_key_hook`` is a ``TokenFile`` sends the token the file holds when
the request is made (one ``stat`` a request); and a 401 to a request made before the file
changed is retried with the new token (``renewed_since``) instead of ending the wait.
"""

from __future__ import annotations

import os
import threading
from typing import Any

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_PATH = f"{SERVICE_ACCOUNT_DIR}/token"
API_KEY = "BearerToken"  # where both clients keep the ``Authorization`` header's value


class TokenFile:
    """A client configuration's ``refresh_api_key_hook``: the token the file holds now, read
    again only when the file changed (its inode, size or modification time: the kubelet swaps a
    symlink to a new file). ``generation`` counts the tokens read."""

    def __init__(self, path: str = TOKEN_PATH) -> None:
        self.path = path
        self.generation = 0
        self._seen: tuple[int, int, int, int] | None = None
        self._token = ""
        self._lock = threading.Lock()  # a backend creates pods from several threads

    def current(self) -> str:
        """``Bearer <token>`` as the file holds it now; the last token read when the file cannot
        be read at this moment (the kubelet is swapping it)."""
        try:
            info = os.stat(self.path)
        except OSError:
            return self._token
        seen = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        with self._lock:
            if seen != self._seen:
                try:
                    with open(self.path) as handle:
                        token = handle.read().strip()
                except OSError:
                    return self._token
                if token:
                    self._seen = seen
                    if f"Bearer {token}" != self._token:
                        self._token = f"Bearer {token}"
                        self.generation += 1
            return self._token

    def __deepcopy__(self, memo: dict[int, Any]) -> TokenFile:
        return self  # a copied configuration reads the same file (both clients copy theirs)

    def __call__(self, configuration: Any, *args: Any) -> None:
        token = self.current()
        if token:
            configuration.api_key[API_KEY] = token


def use_token_file(configuration: Any, path: str = TOKEN_PATH) -> Any:
    """``configuration`` (either client's) sending the token of ``path`` as it is at each request."""
    configuration.refresh_api_key_hook = TokenFile(path)
    configuration.refresh_api_key_hook(configuration)
    return configuration


def token_generation(api_client: Any) -> int:
    """Which token of its file the client sends now (0: its token is not read from a file)."""
    hook = getattr(getattr(api_client, "configuration", None), "refresh_api_key_hook", None)
    if not isinstance(hook, TokenFile):
        return 0
    hook.current()
    return hook.generation


def renewed_since(api_client: Any, generation: int) -> bool:
    """Whether the client's token file holds a newer token than ``generation`` (what a refused
    request was sent with): then the request is made again with it rather than failed."""
    return generation > 0 and token_generation(api_client) > generation
