"""A minimal Kubernetes API client for the test harness (the node agent and the fixtures):
JSON requests and watch streams over HTTPS with a client certificate. The product talks to the
apiserver through its own client; this one only plays the kubelet and sets up tests."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]


class ApiError(Exception):
    def __init__(self, status: int, body: str, method: str, path: str) -> None:
        self.status = status
        self.body = body
        try:
            self.message = json.loads(body).get("message", body)
        except ValueError:
            self.message = body
        super().__init__(f"{method} {path}: {status} {self.message}")


class KubeApi:
    """Requests as the user of ``kubeconfig`` (client certificate or bearer token)."""

    def __init__(self, kubeconfig: Path, retry_for: float = 0) -> None:
        """``retry_for``: seconds a request is tried again while the apiserver cannot be reached
        or answers 429/5xx (restarting), as a kubelet's loops retry; 0: never."""
        self.retry_for = retry_for
        config = yaml.safe_load(kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        self.server = cluster["server"].rstrip("/")
        self.context = ssl.create_default_context(cafile=cluster["certificate-authority"])
        if user.get("client-certificate"):
            self.context.load_cert_chain(user["client-certificate"], user["client-key"])
        self.token = user.get("token", "")

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: dict[str, Any] | None = None,
        timeout: float = 30,
    ) -> Any:
        url = self.server + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", content_type)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        give_up = time.monotonic() + self.retry_for
        while True:
            try:
                with urllib.request.urlopen(request, context=self.context, timeout=timeout) as response:
                    text = response.read().decode()
                break
            except urllib.error.HTTPError as error:
                if (error.code == 429 or error.code >= 500) and time.monotonic() < give_up:
                    time.sleep(0.5)
                    continue
                raise ApiError(error.code, error.read().decode(errors="replace"), method, path) from None
            except OSError:  # refused, reset, timed out: the apiserver is restarting
                if time.monotonic() >= give_up:
                    raise
                time.sleep(0.5)
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError:
            return text

    def get(self, path: str, **query: Any) -> Any:
        return self.request("GET", path, query=query or None)

    def get_or_none(self, path: str) -> Obj | None:
        try:
            return self.get(path)
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    def create(self, path: str, body: Obj) -> Obj:
        return self.request("POST", path, body)

    def apply_object(self, path: str, body: Obj) -> Obj:
        """Create, or replace what is there (keeping its resourceVersion)."""
        try:
            return self.create(path, body)
        except ApiError as error:
            if error.status != 409:
                raise
        name = body["metadata"]["name"]
        current = self.get(f"{path}/{name}")
        body = dict(body, metadata=dict(body["metadata"], resourceVersion=current["metadata"]["resourceVersion"]))
        return self.request("PUT", f"{path}/{name}", body)

    def patch(self, path: str, body: Obj, kind: str = "strategic-merge-patch") -> Obj:
        return self.request("PATCH", path, body, content_type=f"application/{kind}+json")

    def delete(self, path: str, body: Obj | None = None) -> Any:
        try:
            return self.request("DELETE", path, body)
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    def stream(self, path: str, query: dict[str, Any], timeout: float) -> Any:
        """An open streaming response (a watch or a followed log)."""
        url = self.server + path + "?" + urllib.parse.urlencode(query)
        request = urllib.request.Request(url)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            return urllib.request.urlopen(request, context=self.context, timeout=timeout)
        except urllib.error.HTTPError as error:
            raise ApiError(error.code, error.read().decode(errors="replace"), "GET", path) from None

    def watch(self, path: str, resource_version: str, timeout_seconds: int = 60, **query: Any) -> Iterator[Obj]:
        """The events of one watch request (ends when the server closes it). A 410 Gone event
        raises ApiError(410): the caller lists again."""
        params = {
            "watch": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": timeout_seconds,
            "allowWatchBookmarks": "true",
            **query,
        }
        with self.stream(path, params, timeout=timeout_seconds + 30) as response:
            for line in response:
                if not line.strip():
                    continue
                event = json.loads(line)
                if event["type"] == "ERROR":
                    status = event["object"]
                    raise ApiError(int(status.get("code", 500)), json.dumps(status), "WATCH", path)
                yield event

    def wait(self, what: str, check: Any, timeout: float, interval: float = 0.25) -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = check()
            if last:
                return last
            time.sleep(interval)
        raise TimeoutError(f"{what}: not after {timeout:.0f} s (last: {last!r})")
