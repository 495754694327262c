"""A Kubernetes API double for tests and benchmarks: real HTTP on 127.0.0.1, real API paths and JSON.

No kube-apiserver can be installed on the machines this project is built on, so the Kubernetes
backend is tested against this: the ``kubernetes`` client talks to it exactly as to a cluster.

What it speaks (core/v1, namespaced): create, replace (PUT), get, list, watch (chunked,
resourceVersion, bookmarks, 410 Gone past its history), delete (Background/Foreground/Orphan with
ownerReference garbage collection), label and field selectors, 400/404/409/422 errors, pod status
transitions (Pending -> Running -> Ready -> Succeeded/Failed with exit codes and reasons), events,
and ``pods/{name}/log`` with ``follow``, ``timestamps``, ``sinceTime``, ``sinceSeconds`` (chunked).

It is as strict as kube-apiserver: every create and replace goes through ``apivalidation`` (the
apiserver's own rules for names, labels, annotations, owner references, pods, services, secrets,
configmaps, and the immutability of a pod's spec) and is refused with the same 422 ``Invalid``
Status and causes; a body the apiserver cannot decode (a bad quantity, data that is not base64)
gets its 400 ``BadRequest``.

``coordination.k8s.io/v1`` Leases are served as on every API server (a deferred job's log mark):
create (409 for a name taken), replace conditional on resourceVersion (409 Conflict), the
MicroTime, duration and transition checks. RBAC (``deny``, ``grant``) knows API groups.

Custom resources are served under ``/apis/<group>/<version>/namespaces/<ns>/<plural>`` once
registered (``register_custom``), checked by ``custom_validator`` (a CRD's schema); controllers
(``gang_controllers``; ``mpijob_controller`` with ``batch_jobs`` and ``kueue_mpijobs``) hear every
change, may hold a pod back from the kubelet until its group is admitted (``pod_gates``), mutate
pods on create (``pod_webhooks``), default custom objects (``custom_defaulters``), and finalizers
keep a deleted object until they are removed.

Its kubelet side is pluggable: ``ScriptedKubelet`` plays scripted pods (fault tests, benchmarks);
``tests.doubles.real_kubelet.RealKubelet`` runs each pod's command for real in a sandbox.

Admission: a namespace labelled ``pod-security.kubernetes.io/enforce`` (``label_namespace``)
refuses pods its Pod Security Standards level forbids, with the real 403 and message
(``tests.doubles.podsecurity``).

Fault knobs: ``fail_requests`` (e.g. 500 on the N-th create), ``drop_log_streams`` (cut a log
stream after K lines), ``expire_watches`` (410), ``clock_offset`` (the node's clock against
this machine's), and the scripted kubelet's per-pod faults (image pull error, unschedulable,
evicted, OOMKilled, exit codes). The API server's own refusals and outages, with the bodies a
real one sends: ``deny`` (RBAC: 403 for a verb on a resource), ``expire_credentials`` (401),
namespaces (``delete_namespace``: creating in a namespace that does not exist is 404, listing
there lists nothing, reading it is 404), ``hang`` (accept requests, never answer, streams go silent) and
``refuse_connections`` (nothing listens on the port: connection refused).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import queue
import re
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, urlparse

from airflow_mpi.contract import ENV_ROLE, ENV_STARTUP_TIMEOUT, ENV_WORKER_REPLICAS
from airflow_mpi.job.naming import LABEL_JOB, LABEL_ROLE
from tests.doubles import podsecurity
from tests.doubles.apivalidation import (
    KINDS,
    decode_error,
    decode_failure_message,
    invalid_details,
    invalid_message,
    validate_object,
)

LEASE_RESOURCE = ("coordination.k8s.io", "v1", "leases", "Lease")
LEASES = "leases.coordination.k8s.io"  # the store's key
HISTORY = 20_000  # watch events kept; older resourceVersions get 410 Gone
NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")  # what a new cluster has
MICRO_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})")  # RFC 3339
USER = "system:serviceaccount:airflow:airflow-worker"  # who asks, in the double's 403 messages
# The API groups besides the core one that the product's Roles name (the rules review, with only
# ``deny`` in force, grants them whole).
OTHER_GROUPS = (
    "coordination.k8s.io",
    "batch.volcano.sh",
    "scheduling.volcano.sh",
    "scheduling.x-k8s.io",
    "kueue.x-k8s.io",
    "kubeflow.org",
    "trainer.kubeflow.org",
)

Obj = dict[str, Any]


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_nano(ns: int) -> str:
    """The kubelet's log timestamp: Go's RFC3339Nano, trailing zeros trimmed."""
    seconds, nanos = divmod(ns, 1_000_000_000)
    base = _second(seconds)
    fraction = f"{nanos:09d}".rstrip("0")
    return f"{base}.{fraction}Z" if fraction else f"{base}Z"


@lru_cache(maxsize=16)
def _second(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def parse_time_seconds(text: str) -> int:
    """A ``sinceTime`` as the API server reads it: RFC3339, kept to whole seconds."""
    clean = re.sub(r"\.\d+", "", text).replace("Z", "+00:00")
    return int(datetime.fromisoformat(clean).timestamp())


def status_body(code: int, reason: str, message: str, details: Obj | None = None) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": details or {},
        "code": code,
    }


def match_labels(selector: str, labels: dict[str, str]) -> bool:
    """Equality- and existence-based label selectors (``a=b,c!=d,e,!f``)."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "==" in term or "=" in term:
            key, value = re.split("==?", term, maxsplit=1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def match_fields(selector: str, obj: Obj) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        key, value = re.split("==?", term, maxsplit=1)
        current: Any = obj
        for part in key.split("."):
            current = current.get(part) if isinstance(current, dict) else None
        if str(current) != value:
            return False
    return True


@dataclass
class LogBuffer:
    """One container's log: (node timestamp ns, line); readers wait on the condition.

    Like the kubelet's CRI log, an entry may be part of a line (the container wrote no newline
    yet): ``ends[i]`` is False for such an entry. A line in parts keeps the stamp of its first
    part, the only one a ``timestamps=true`` reader sees."""

    lines: list[tuple[int, str]] = field(default_factory=list)
    done: bool = False
    cond: threading.Condition = field(default_factory=threading.Condition)
    ends: list[bool] = field(default_factory=list)  # per entry: it ends its line

    def append(self, ns: int, line: str) -> None:
        self.extend([(ns, line)])

    def extend(self, lines: list[tuple[int, str]]) -> None:
        with self.cond:
            if self.ends and not self.ends[-1]:
                self.ends[-1] = True  # whole lines after a part: the part's line ends first
            self.lines.extend(lines)
            self.ends.extend([True] * len(lines))
            self.cond.notify_all()

    def write(self, ns: int, text: str) -> None:
        """Output as the container wrote it: whole lines, and a last part with no newline yet."""
        with self.cond:
            *whole, rest = text.split("\n")
            for line in whole:
                self.lines.append((self._line_start(ns), line))
                self.ends.append(True)
            if rest:
                self.lines.append((self._line_start(ns), rest))
                self.ends.append(False)
            self.cond.notify_all()

    def _line_start(self, ns: int) -> int:
        return self.lines[-1][0] if self.ends and not self.ends[-1] else ns

    def close(self) -> None:
        with self.cond:
            self.done = True
            self.cond.notify_all()


class Kubelet(Protocol):
    def start(self, double: KubeDouble, pod: Obj) -> None:
        """A pod was created: schedule and run it (in the background)."""

    def stop(self, double: KubeDouble, pod: Obj) -> None:
        """A pod is being deleted: end its processes (returns when they are gone)."""

    def shutdown(self) -> None:
        """The double stops: end everything."""


@dataclass
class _Fault:
    method: str | None
    path: re.Pattern[str] | None
    status: int
    remaining: int
    skip: int
    retry_after: int | None


class KubeDouble:
    def __init__(self, kubelet: Kubelet | None = None, *, clock_offset: float = 0.0) -> None:
        self.kubelet: Kubelet = kubelet or ScriptedKubelet()
        self.clock_offset = clock_offset  # the node's clock minus this machine's, in seconds
        self.namespaces: set[str] = set(NAMESPACES)
        self.user = USER
        self.credentials_expired = False
        self._denied: set[tuple[str, str]] = set()  # (verb, resource) the Role lacks
        self._granted: set[tuple[str, str]] | None = None  # with a Role: only what it grants
        self.metadata_lists: list[str] = []  # plurals listed with metadata only, in order
        self._answering = threading.Event()  # cleared: requests are held, streams go silent
        self._answering.set()
        self._connections: set[socket.socket] = set()
        self._port = 0
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.logs: dict[tuple[str, str], LogBuffer] = {}
        self.history: deque[tuple[int, str, str, Obj]] = deque(maxlen=HISTORY)
        self.requests: list[tuple[str, str]] = []
        self.created: list[Obj] = []  # every body POSTed, for schema checks
        self.namespace_labels: dict[str, dict[str, str]] = {}  # e.g. the PodSecurity enforce level
        self._rv = 1000
        self._min_rv = 0  # watches from below this get 410 Gone
        self._lock = threading.RLock()
        self._watchers: list[tuple[str, str, queue.Queue[Any]]] = []
        self._faults: list[_Fault] = []
        self._log_drops: list[list[int]] = []  # [after_lines, times left]
        self._server: ThreadingHTTPServer | None = None
        self._gc_stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # Custom resources ("<plural>.<group>" -> (apiVersion, kind)) and the controllers that
        # act on them (``gang_controllers``): they hear every change, may hold a pod back from
        # the kubelet until its group is admitted, and may mutate a pod on create (a webhook).
        self.custom_kinds: dict[str, tuple[str, str]] = {}
        self.custom_validator: Callable[[Obj], list[str]] | None = None
        self.listeners: list[Callable[[str, str, Obj], None]] = []
        self.pod_gates: list[Callable[[Obj], bool]] = []
        self.pod_webhooks: list[Callable[[Obj], None]] = []
        # The apiserver's defaulting of a custom kind (a CRD's defaults, a batch/v1 Job's
        # selector), run on create once the uid is set; and the kinds with a status subresource,
        # whose PUT keeps the stored status (``mpijob_controller``, ``batch_jobs``).
        self.custom_defaulters: dict[str, Callable[[Obj], None]] = {}
        self.status_subresources: set[str] = set()
        # Built in, as on every API server: coordination.k8s.io/v1 Leases (a job's live-log mark).
        self.register_custom(*LEASE_RESOURCE)

    # --- server ---------------------------------------------------------------------------

    def start(self) -> str:
        self._listen()
        gc = threading.Thread(target=self._collect_garbage, name="kube-double-gc", daemon=True)
        gc.start()
        self._threads.append(gc)
        return self.url

    def _listen(self) -> None:
        handler = type("Handler", (_Handler,), {"double": self})
        self._server = _Server(("127.0.0.1", self._port), handler)
        self._server.daemon_threads = True
        self._server.request_queue_size = 1024
        self._port = self._server.server_address[1]
        thread = threading.Thread(target=self._server.serve_forever, name="kube-double", daemon=True)
        thread.start()
        self._threads.append(thread)

    @property
    def url(self) -> str:
        assert self._port, "the double was never started"
        return f"http://127.0.0.1:{self._port}"

    def stop(self) -> None:
        self._gc_stop.set()
        self.kubelet.shutdown()
        self._answering.set()
        self._close_server()
        for buffer in list(self.logs.values()):
            buffer.close()

    def _close_server(self) -> None:
        """Stop listening and cut every open connection (watches, log streams, held requests)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        with self._lock:
            for _, _, q in self._watchers:
                q.put(None)
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def kubeconfig(self, namespace: str = "default") -> Obj:
        """A kubeconfig for this double (e.g. the ``kube_config`` extra of an Airflow connection)."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "double", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": "double-token"}}],
            "contexts": [
                {"name": "double", "context": {"cluster": "double", "user": "tester", "namespace": namespace}}
            ],
            "current-context": "double",
        }

    # --- knobs ----------------------------------------------------------------------------

    def fail_requests(
        self,
        *,
        method: str | None = None,
        path: str | None = None,
        status: int = 500,
        count: int = 1,
        skip: int = 0,
        retry_after: int | None = None,
    ) -> None:
        """The next ``count`` requests matching ``method``/``path`` (regex), after ``skip`` of them, fail."""
        with self._lock:
            self._faults.append(_Fault(method, re.compile(path) if path else None, status, count, skip, retry_after))

    def stop_failing(self) -> None:
        """Drop every fault ``fail_requests`` still holds: requests are answered as usual again."""
        with self._lock:
            self._faults.clear()

    def deny(self, verb: str, resource: str) -> None:
        """RBAC without ``verb`` on ``resource`` (``pods``, ``pods/log``, ``services`` ...; of
        another API group ``<plural>.<group>``: ``leases.coordination.k8s.io``): 403, with the
        message and details a real API server sends."""
        with self._lock:
            self._denied.add((verb, resource))

    def grant(self, rules: list[Obj]) -> None:
        """RBAC by a Role's ``rules``: any other verb or resource of the core API group is 403;
        the rules of other groups are only reported by the rules review."""
        granted = {
            (verb, _resource_key(group, resource))
            for rule in rules
            for group in rule.get("apiGroups", [""])
            for verb in rule.get("verbs", [])
            for resource in rule.get("resources", [])
        }
        with self._lock:
            self._granted = granted

    # As an API server with a webhook authorizer answers: its rules review is incomplete, so a
    # client cannot tell what it may do before it asks (each request's 403 says).
    rules_review_incomplete = False

    def resource_rules(self) -> list[Obj]:
        """What a SelfSubjectRulesReview answers: the granted rules less the denied verbs."""
        with self._lock:
            granted, denied = self._granted, set(self._denied)
        if granted is None and not denied:
            return [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]
        others: list[Obj] = []  # a Role's rules of every group are in ``granted``
        if granted is None:
            resources = [*KINDS, "pods/log", *self.custom_kinds]
            verbs = ("create", "get", "list", "watch", "delete", "deletecollection", "update", "patch")
            granted = {(verb, resource) for verb in verbs for resource in resources}
            # Only ``deny`` in force: the other groups the Roles name are granted whole, but for a
            # group with a denied verb, whose resources' remaining verbs are listed one by one.
            denied_groups = {key.partition(".")[2] for _, key in denied}
            groups = [group for group in OTHER_GROUPS if group not in denied_groups]
            others = [{"apiGroups": groups, "resources": ["*"], "verbs": ["*"]}] if groups else []
        rules = []
        for verb, key in sorted(granted - denied):
            resource, _, group = key.partition(".")
            rules.append({"apiGroups": [group], "resources": [resource], "verbs": [verb]})
        return [*rules, *others]

    def expire_credentials(self, expired: bool = True) -> None:
        """Every request is 401 Unauthorized (a revoked or expired token), until called with False."""
        self.credentials_expired = expired

    def create_namespace(self, name: str) -> None:
        with self._lock:
            self.namespaces.add(name)

    def delete_namespace(self, name: str) -> None:
        """Delete a namespace and everything in it (its pods are stopped first, as a real one)."""
        with self._lock:
            self.namespaces.discard(name)
            inside = [(p, n) for (p, ns, n) in self.objects if ns == name and p != "events"]
        for plural, obj_name in inside:
            with contextlib.suppress(ApiError):
                self.delete(plural, name, obj_name)

    def hang(self) -> None:
        """Accept connections and requests, answer none (until ``answer``); open watches and log
        streams go silent: a server that is overloaded or cut off behind its load balancer."""
        self._answering.clear()

    def answer(self) -> None:
        """Answer again: the held requests get their answers, late."""
        self._answering.set()

    def refuse_connections(self) -> None:
        """Stop listening (connection refused) and cut every open connection, as a stopped API
        server; ``accept_connections`` starts it again on the same port with the same state."""
        self._close_server()

    def accept_connections(self) -> None:
        if self._server is None:
            self._listen()

    def wait_answering(self) -> None:
        """Hold the caller while the double hangs (it returns at once otherwise)."""
        while not self._answering.wait(0.2):
            pass

    def refusal(self, method: str, path: str, query: dict[str, str]) -> ApiError | None:
        """401 or 403 for this request, as authentication and RBAC would answer it; None: allowed."""
        if self.credentials_expired:
            return ApiError(401, "Unauthorized", "Unauthorized")
        match = _Handler.ROUTE.match(path)
        custom = _Handler.CUSTOM_ROUTE.match(path)
        if not (match or custom) or (not self._denied and self._granted is None):
            return None
        group = ""
        if match:
            namespace, plural, name = match["ns"], match["plural"], match["name"] or ""
            resource = f"{plural}/log" if match["log"] else plural
        else:
            assert custom is not None
            namespace, plural, name, group = custom["ns"], custom["plural"], custom["name"] or "", custom["group"]
            resource = plural
        if method == "GET":
            verb = "get" if name else ("watch" if _flag(query, "watch") else "list")
        else:
            verb = {"POST": "create", "PUT": "update", "DELETE": "delete" if name else "deletecollection"}.get(
                method, method.lower()
            )
        key = _resource_key(group, resource)
        allowed = self._granted is None or (verb, key) in self._granted
        if allowed and (verb, key) not in self._denied:
            return None
        qualified = _resource_key(group, plural)
        what = f'{qualified} "{name}"' if name else qualified
        details = {"name": name, "kind": plural} if name else {"kind": plural}
        if group:  # omitted for the core group, as the API server's Status does
            details["group"] = group
        return ApiError(
            403,
            "Forbidden",
            f'{what} is forbidden: User "{self.user}" cannot {verb} resource "{resource}" in API group "{group}" '
            f'in the namespace "{namespace}"',
            details,
        )

    def drop_log_streams(self, after_lines: int, times: int = 1) -> None:
        """Cut the next ``times`` log streams abruptly after ``after_lines`` lines each."""
        with self._lock:
            self._log_drops.append([after_lines, times])

    def expire_watches(self) -> None:
        """Compact history: open watches get a 410 ERROR event, old resourceVersions get 410."""
        with self._lock:
            self._min_rv = self._rv + 1
            for _, _, q in self._watchers:
                q.put("expired")

    def label_namespace(self, namespace: str, labels: dict[str, str]) -> None:
        """Set a namespace's labels, e.g. ``{"pod-security.kubernetes.io/enforce": "restricted"}``;
        creates the namespace first if the double does not have it."""
        with self._lock:
            self.namespaces.add(namespace)
            self.namespace_labels[namespace] = dict(labels)

    def request_count(self, method: str | None = None, path: str = "") -> int:
        return sum(1 for m, p in self.requests if (method is None or m == method) and path in p)

    def node_time_ns(self) -> int:
        return time.time_ns() + int(self.clock_offset * 1e9)

    # --- custom resources and controllers ------------------------------------------------

    def register_custom(self, group: str, version: str, plural: str, kind: str) -> str:
        """Serve ``/apis/<group>/<version>/namespaces/<ns>/<plural>``; returns the store's key."""
        key = f"{plural}.{group}"
        self.custom_kinds[key] = (f"{group}/{version}", kind)
        return key

    def plural_of(self, obj: Obj) -> str:
        """The store key of an object by its apiVersion and kind (core or custom)."""
        api_version, kind = obj.get("apiVersion", "v1"), obj.get("kind", "")
        if api_version == "v1":
            return _plural(kind)
        for key, (custom_version, custom_kind) in self.custom_kinds.items():
            if (custom_version, custom_kind) == (api_version, kind):
                return key
        raise KeyError(f"{api_version} {kind}")

    def kind_of(self, plural: str) -> str:
        return self.custom_kinds[plural][1] if plural in self.custom_kinds else KINDS[plural]

    def update_object(self, plural: str, namespace: str, name: str, change: Callable[[Obj], None]) -> Obj | None:
        """Controller side: change any object in place (status, finalizers) and tell the watches."""
        with self._lock:
            obj = self.objects.get((plural, namespace, name))
            if obj is None:
                return None
            change(obj)
            obj["metadata"]["resourceVersion"] = self._next_rv()
            self._emit("MODIFIED", plural, obj)
            return copy.deepcopy(obj)

    def start_pod(self, namespace: str, name: str) -> None:
        """Hand a held pod to the kubelet (its group was admitted)."""
        pod = self.get("pods", namespace, name)
        if pod is not None and not pod["metadata"].get("deletionTimestamp"):
            self._spawn(self.kubelet.start, self, pod)

    # --- store ----------------------------------------------------------------------------

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _emit(self, event: str, plural: str, obj: Obj) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        snapshot = copy.deepcopy(obj)
        self.history.append((rv, event, plural, snapshot))
        for watch_plural, namespace, q in self._watchers:
            if watch_plural == plural and namespace in ("", obj["metadata"].get("namespace")):
                q.put((rv, event, snapshot))
        for listener in self.listeners:
            listener(event, plural, snapshot)

    def get(self, plural: str, namespace: str, name: str) -> Obj | None:
        with self._lock:
            obj = self.objects.get((plural, namespace, name))
            return copy.deepcopy(obj) if obj else None

    def list_objects(self, plural: str, namespace: str = "", label_selector: str = "") -> list[Obj]:
        with self._lock:
            return [
                copy.deepcopy(o)
                for (p, ns, _), o in self.objects.items()
                if p == plural
                and namespace in ("", ns)
                and match_labels(label_selector, o["metadata"].get("labels", {}))
            ]

    def create(self, plural: str, namespace: str, body: Obj) -> Obj:
        """Store a new object (what POST does); raises ``ApiError`` for 400/409/422."""
        if namespace not in self.namespaces:
            raise ApiError(
                404, "NotFound", f'namespaces "{namespace}" not found', {"name": namespace, "kind": "namespaces"}
            )
        meta = self._admit(plural, namespace, body)
        if plural == "pods":
            for webhook in self.pod_webhooks:
                webhook(body)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = generate_name(str(meta["generateName"]))
        name = str(meta.get("name") or "")
        self._validate_any(plural, name, body)
        if plural == "pods":  # admission runs after validation, as in the API server
            denial = podsecurity.admission_denial(name, body, self.namespace_labels.get(namespace, {}))
            if denial:
                raise ApiError(403, "Forbidden", denial)
        with self._lock:
            key = (plural, namespace, name)
            if key in self.objects:
                raise ApiError(409, "AlreadyExists", f'{plural} "{name}" already exists')
            meta.update(
                uid=str(uuid.uuid4()),
                resourceVersion=self._next_rv(),
                creationTimestamp=rfc3339(time.time()),
            )
            body.setdefault("apiVersion", "v1")
            body.setdefault("kind", self.kind_of(plural))
            if plural in self.custom_defaulters:
                self.custom_defaulters[plural](body)
            if plural == "pods":
                body["status"] = {"phase": "Pending", "qosClass": "Guaranteed"}
                self.logs[(namespace, name)] = LogBuffer()
            self._merge_string_data(plural, body)
            self.objects[key] = body
            self._emit("ADDED", plural, body)
            stored = copy.deepcopy(body)
        if plural == "pods" and not any(held(stored) for held in self.pod_gates):
            self._spawn(self.kubelet.start, self, copy.deepcopy(stored))
        return stored

    def replace(self, plural: str, namespace: str, name: str, body: Obj) -> Obj:
        """Replace an object (what PUT does): the apiserver's update rules, e.g. a pod's spec is
        immutable but for images, a shorter deadline and added tolerations. A pod keeps its status."""
        meta = self._admit(plural, namespace, body)
        if meta.get("name") != name:
            sent = meta.get("name", "")
            raise ApiError(
                400, "BadRequest", f"the name of the object ({sent}) does not match the name on the URL ({name})"
            )
        with self._lock:
            old = self.objects.get((plural, namespace, name))
            if old is None:
                raise ApiError(404, "NotFound", f'{plural} "{name}" not found')
            current = old["metadata"]["resourceVersion"]
            if meta.get("resourceVersion") not in (None, "", current):
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {plural} "{name}": the object has been modified; '
                    "please apply your changes to the latest version and try again",
                )
            for key in ("uid", "creationTimestamp", "deletionTimestamp"):  # system fields, kept if not sent
                if key in old["metadata"] and not meta.get(key):
                    meta[key] = old["metadata"][key]
            meta["resourceVersion"] = current
            self._validate_any(plural, name, body, old=old)
            body.setdefault("apiVersion", "v1")
            body.setdefault("kind", self.kind_of(plural))
            if plural == "pods":
                body["status"] = copy.deepcopy(old.get("status", {}))
            elif plural in self.status_subresources:  # status is written through /status only
                body.pop("status", None)
                if "status" in old:
                    body["status"] = copy.deepcopy(old["status"])
            self._merge_string_data(plural, body)
            meta["resourceVersion"] = self._next_rv()
            self.objects[(plural, namespace, name)] = body
            self._emit("MODIFIED", plural, body)
            return copy.deepcopy(body)

    def _admit(self, plural: str, namespace: str, body: Obj) -> Obj:
        """What the apiserver does before validating: decode, and fill the namespace from the URL."""
        meta: Obj = body.setdefault("metadata", {})
        if meta.get("namespace") and meta["namespace"] != namespace:
            raise ApiError(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            )
        meta["namespace"] = namespace
        if plural in self.custom_kinds:
            return meta
        problem = decode_error(plural, body)
        if problem:
            raise ApiError(400, "BadRequest", decode_failure_message(plural, body, problem))
        return meta

    def _validate_any(self, plural: str, name: str, body: Obj, old: Obj | None = None) -> None:
        """Core objects by the apiserver's rules; custom ones by their CRD's schema when known."""
        if plural not in self.custom_kinds:
            self._validate(plural, name, body, old=old)
            return
        api_version, kind = self.custom_kinds[plural]
        if (body.get("apiVersion"), body.get("kind")) != (api_version, kind):
            raise ApiError(400, "BadRequest", f"the object is not a {api_version} {kind}")
        if plural == LEASES:
            self._validate_lease(name, body)
            return
        errors = self.custom_validator(body) if self.custom_validator is not None else []
        if errors:
            raise ApiError(
                422, "Invalid", f'{kind}.{api_version.split("/")[0]} "{name}" is invalid: ' + "; ".join(errors)
            )

    @staticmethod
    def _validate_lease(name: str, body: Obj) -> None:
        """A Lease as the apiserver checks it: its times decode as MicroTime (else 400), its
        duration is positive and its transitions not negative (else 422); annotations as on any
        object."""
        spec = body.get("spec") or {}
        for field_name in ("acquireTime", "renewTime"):
            value = spec.get(field_name)
            if value is not None and not (isinstance(value, str) and MICRO_TIME.fullmatch(value)):
                raise ApiError(400, "BadRequest", f'Lease in version "v1" cannot be handled as a Lease: {field_name}')
        causes = []
        holder = spec.get("holderIdentity")
        if holder is not None and not isinstance(holder, str):
            raise ApiError(400, "BadRequest", 'Lease in version "v1" cannot be handled as a Lease: holderIdentity')
        duration = spec.get("leaseDurationSeconds")
        if duration is not None and (not isinstance(duration, int) or duration <= 0):
            causes.append(f"spec.leaseDurationSeconds: Invalid value: {duration}: must be greater than 0")
        transitions = spec.get("leaseTransitions")
        if transitions is not None and (not isinstance(transitions, int) or transitions < 0):
            causes.append(f"spec.leaseTransitions: Invalid value: {transitions}: must be greater than or equal to 0")
        for key, value in (body.get("metadata", {}).get("annotations") or {}).items():
            if not isinstance(value, str):
                raise ApiError(400, "BadRequest", f'Lease in version "v1" cannot be handled as a Lease: {key}')
        if causes:
            raise ApiError(422, "Invalid", f'Lease.coordination.k8s.io "{name}" is invalid: ' + ", ".join(causes))

    @staticmethod
    def _validate(plural: str, name: str, body: Obj, old: Obj | None = None) -> None:
        causes = validate_object(plural, body, old=old)
        if causes:
            kind = KINDS[plural]
            raise ApiError(
                422, "Invalid", invalid_message(kind, name, causes), details=invalid_details(kind, name, causes)
            )

    @staticmethod
    def _merge_string_data(plural: str, body: Obj) -> None:
        """A Secret's stringData is write-only: stored base64-encoded in data, as the apiserver does."""
        if plural == "secrets" and "stringData" in body:
            data = body.setdefault("data", {})
            for key, value in body.pop("stringData").items():
                data[key] = base64.b64encode(value.encode()).decode()

    def update_pod_status(self, namespace: str, name: str, change: Callable[[Obj], None]) -> Obj | None:
        """Kubelet side: change a pod's status in place and tell the watches."""
        with self._lock:
            pod = self.objects.get(("pods", namespace, name))
            if pod is None:
                return None
            change(pod)
            pod["metadata"]["resourceVersion"] = self._next_rv()
            self._emit("MODIFIED", "pods", pod)
            return copy.deepcopy(pod)

    def record_event(self, namespace: str, pod: Obj, reason: str, message: str, kind: str = "Normal") -> None:
        name = f"{pod['metadata']['name']}.{uuid.uuid4().hex[:12]}"
        body = {
            "metadata": {"name": name},
            "involvedObject": {
                "kind": "Pod",
                "namespace": namespace,
                "name": pod["metadata"]["name"],
                "uid": pod["metadata"].get("uid"),
            },
            "reason": reason,
            "message": message,
            "type": kind,
            "count": 1,
            "firstTimestamp": rfc3339(time.time()),
            "lastTimestamp": rfc3339(time.time()),
            "source": {"component": "kubelet" if reason != "FailedScheduling" else "default-scheduler"},
        }
        with contextlib.suppress(ApiError):  # its namespace is being deleted
            self.create("events", namespace, body)

    def delete(self, plural: str, namespace: str, name: str, propagation: str = "Background") -> Obj:
        with self._lock:
            obj = self.objects.get((plural, namespace, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{plural} "{name}" not found')
            if obj["metadata"].get("deletionTimestamp"):
                return copy.deepcopy(obj)
            obj["metadata"]["deletionTimestamp"] = rfc3339(time.time())
            if propagation == "Foreground":
                obj["metadata"]["finalizers"] = ["foregroundDeletion"]
            obj["metadata"]["resourceVersion"] = self._next_rv()
            self._emit("MODIFIED", plural, obj)
            snapshot = copy.deepcopy(obj)
        if plural != "pods" and propagation != "Foreground":
            # No finalizer and no graceful shutdown: gone when DELETE answers, as in the API server.
            self._finish_delete(plural, namespace, name, propagation)
        else:
            self._spawn(self._finish_delete, plural, namespace, name, propagation)
        return snapshot

    def _finish_delete(self, plural: str, namespace: str, name: str, propagation: str) -> None:
        with self._lock:
            obj = self.objects.get((plural, namespace, name))
        if obj is None:
            return
        uid = obj["metadata"]["uid"]
        if propagation == "Foreground":
            for dependent in self._dependents(uid):
                kind_plural = self.plural_of(dependent)
                try:
                    self.delete(
                        kind_plural, dependent["metadata"]["namespace"], dependent["metadata"]["name"], "Foreground"
                    )
                except ApiError:
                    pass
            deadline = time.monotonic() + 30
            while self._dependents(uid) and time.monotonic() < deadline:
                time.sleep(0.01)
        while self._held_by_finalizers(plural, namespace, name) and not self._gc_stop.is_set():
            time.sleep(0.01)  # as the apiserver: gone only once its controllers let go
        if plural == "pods":
            self.kubelet.stop(self, copy.deepcopy(obj))
            buffer = self.logs.get((namespace, name))
            if buffer is not None:
                buffer.close()
        with self._lock:
            obj = self.objects.pop((plural, namespace, name), None)
            if obj is None:
                return
            obj["metadata"]["resourceVersion"] = self._next_rv()
            self._emit("DELETED", plural, obj)
            if plural == "pods":
                self.logs.pop((namespace, name), None)
        if propagation == "Orphan":
            with self._lock:
                for dependent in self._dependents(uid):
                    dependent["metadata"]["ownerReferences"] = [
                        r for r in dependent["metadata"]["ownerReferences"] if r.get("uid") != uid
                    ]

    def _held_by_finalizers(self, plural: str, namespace: str, name: str) -> bool:
        with self._lock:
            obj = self.objects.get((plural, namespace, name))
            finalizers = (obj or {}).get("metadata", {}).get("finalizers") or []
            return any(f != "foregroundDeletion" for f in finalizers)

    def _dependents(self, uid: str) -> list[Obj]:
        with self._lock:
            return [
                o
                for o in self.objects.values()
                if any(ref.get("uid") == uid for ref in o["metadata"].get("ownerReferences", []))
            ]

    def _collect_garbage(self) -> None:
        """Background GC: delete objects all of whose owners are gone (as kube-controller-manager)."""
        while not self._gc_stop.wait(0.05):
            with self._lock:
                uids = {o["metadata"]["uid"] for o in self.objects.values()}
                orphans = [
                    (self.plural_of(o), o["metadata"]["namespace"], o["metadata"]["name"])
                    for o in self.objects.values()
                    if o["metadata"].get("ownerReferences")
                    and not o["metadata"].get("deletionTimestamp")
                    and all(ref.get("uid") not in uids for ref in o["metadata"]["ownerReferences"])
                ]
            for plural, namespace, name in orphans:
                try:
                    self.delete(plural, namespace, name)
                except ApiError:
                    pass

    def _spawn(self, target: Callable[..., Any], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()

    # --- watches and logs (generators the handler streams) ------------------------------

    def watch(
        self, plural: str, namespace: str, selector: str, fields: str, resource_version: str, timeout: float
    ) -> Iterator[Obj]:
        q: queue.Queue[Any] = queue.Queue()
        with self._lock:
            start_rv = int(resource_version or 0)
            if resource_version and start_rv < self._min_rv:
                yield {"type": "ERROR", "object": status_body(410, "Expired", f"too old resource version: {start_rv}")}
                return
            if not resource_version or start_rv == 0:
                backlog = [
                    (int(o["metadata"]["resourceVersion"]), "ADDED", copy.deepcopy(o))
                    for (p, ns, _), o in self.objects.items()
                    if p == plural and namespace in ("", ns)
                ]
            else:
                backlog = [
                    (rv, event, obj)
                    for rv, event, p, obj in self.history
                    if p == plural and rv > start_rv and namespace in ("", obj["metadata"].get("namespace"))
                ]
            entry = (plural, namespace, q)
            self._watchers.append(entry)
        try:
            for _rv, event, obj in sorted(backlog, key=lambda e: e[0]):
                if self._selected(obj, selector, fields):
                    yield {"type": event, "object": obj}
            deadline = time.monotonic() + timeout
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                try:
                    item = q.get(timeout=min(remaining, 1.0))
                except queue.Empty:
                    continue
                if item is None:
                    return
                if item == "expired":
                    yield {"type": "ERROR", "object": status_body(410, "Expired", "too old resource version")}
                    return
                _rv, event, obj = item
                if self._selected(obj, selector, fields):
                    yield {"type": event, "object": obj}
        finally:
            with self._lock:
                self._watchers.remove(entry)

    @staticmethod
    def _selected(obj: Obj, selector: str, fields: str) -> bool:
        return match_labels(selector, obj["metadata"].get("labels", {})) and (not fields or match_fields(fields, obj))

    def take_log_drop(self) -> int | None:
        with self._lock:
            for drop in self._log_drops:
                if drop[1] > 0:
                    drop[1] -= 1
                    return drop[0]
        return None

    def check_fault(self, method: str, path: str) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.remaining <= 0:
                    continue
                if (fault.method is None or fault.method == method) and (fault.path is None or fault.path.search(path)):
                    if fault.skip > 0:
                        fault.skip -= 1
                        continue
                    fault.remaining -= 1
                    return fault
        return None


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that hang up (a stopped watch, a dropped log) are normal here."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError | OSError):
            super().handle_error(request, client_address)


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


GENERATED_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # the apiserver's: no vowels, no look-alikes


def generate_name(prefix: str) -> str:
    """``generateName`` as the apiserver expands it: the prefix cut to 58, five random characters."""
    suffix = "".join(GENERATED_NAME_CHARS[b % len(GENERATED_NAME_CHARS)] for b in uuid.uuid4().bytes[:5])
    return prefix[:58] + suffix


def _resource_key(group: str, resource: str) -> str:
    """A resource as the double's RBAC and store name it: ``pods``; ``leases.coordination.k8s.io``."""
    return f"{resource}.{group}" if group else resource


def _flag(query: dict[str, str], name: str) -> bool:
    """Booleans as Go's strconv.ParseBool reads them (the Python client sends "True")."""
    return query.get(name, "").lower() in ("1", "t", "true")


def _plural(kind: str) -> str:
    return {v: k for k, v in KINDS.items()}[kind]


class _Handler(BaseHTTPRequestHandler):
    double: KubeDouble
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # as Go's net/http: no 40 ms Nagle/delayed-ACK stalls on streams
    ROUTE = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<plural>[a-z]+)(?:/(?P<name>[^/]+))?(?P<log>/log)?$")
    NAMESPACE_ROUTE = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)$")
    CUSTOM_ROUTE = re.compile(
        r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)/namespaces/(?P<ns>[^/]+)/(?P<plural>[a-z]+)(?:/(?P<name>[^/]+))?$"
    )

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        with self.double._lock:
            self.double._connections.add(self.connection)

    def finish(self) -> None:
        with self.double._lock:
            self.double._connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def _send_json(self, code: int, body: Obj, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _start_chunked(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.double.wait_answering()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _body(self) -> Obj:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}") if length else {}

    def _route(self, method: str) -> None:
        double = self.double
        url = urlparse(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        control = url.path.startswith("/_double/")
        if not control:
            double.wait_answering()
        double.requests.append((method, self.path))
        refusal = None if control else double.refusal(method, url.path, query)
        if refusal is not None:
            if method in ("POST", "PUT", "PATCH"):
                self._body()
            self._send_json(refusal.code, status_body(refusal.code, refusal.reason, refusal.message, refusal.details))
            return
        fault = double.check_fault(method, self.path)
        if fault is not None:
            if method in ("POST", "PUT", "PATCH"):
                self._body()
            headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else None
            self._send_json(fault.status, status_body(fault.status, "InternalError", "injected fault"), headers)
            return
        if url.path.startswith("/_double/"):
            self._control(method, url.path)
            return
        if url.path == "/apis/authentication.k8s.io/v1/selfsubjectreviews" and method == "POST":
            review = self._body()
            review["status"] = {"userInfo": {"username": double.user, "groups": ["system:authenticated"]}}
            self._send_json(201, review)
            return
        if url.path == "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews" and method == "POST":
            review = self._body()
            review["status"] = {
                "resourceRules": double.resource_rules(),
                "nonResourceRules": [],
                "incomplete": double.rules_review_incomplete,
            }
            self._send_json(201, review)
            return
        namespace_path = self.NAMESPACE_ROUTE.match(url.path)
        if namespace_path is not None and method == "GET":
            self._namespace(namespace_path["ns"])
            return
        match = self.ROUTE.match(url.path)
        custom = self.CUSTOM_ROUTE.match(url.path)
        if custom and f"{custom['plural']}.{custom['group']}" in double.custom_kinds:
            key = f"{custom['plural']}.{custom['group']}"
            if double.custom_kinds[key][0] != f"{custom['group']}/{custom['version']}":
                custom = None
        elif match is None or match["plural"] not in KINDS:
            self._send_json(404, status_body(404, "NotFound", f"the server could not find {url.path}"))
            return
        if custom is not None:
            namespace, plural, name = custom["ns"], f"{custom['plural']}.{custom['group']}", custom["name"]
        elif match is not None:
            namespace, plural, name = match["ns"], match["plural"], match["name"]
        else:
            self._send_json(404, status_body(404, "NotFound", f"the server could not find {url.path}"))
            return
        try:
            if custom is None and match is not None and match["log"]:
                if plural != "pods" or method != "GET":
                    raise ApiError(405, "MethodNotAllowed", "only GET pods/log")
                self._logs(namespace, name, query)
            elif method == "POST" and not name:
                body = self._body()
                self.double.created.append(copy.deepcopy(body))
                self._send_json(201, double.create(plural, namespace, body))
            elif method == "GET" and name:
                obj = double.get(plural, namespace, name)
                if obj is None:
                    raise ApiError(404, "NotFound", f'{plural} "{name}" not found')
                self._send_json(200, obj)
            elif method == "GET":
                if _flag(query, "watch"):
                    self._watch(plural, namespace, query)
                else:
                    self._list(plural, namespace, query)
            elif method == "PUT" and name:
                body = self._body()
                self._send_json(200, double.replace(plural, namespace, name, body))
            elif method == "DELETE" and name:
                body = self._body()
                propagation = body.get("propagationPolicy") or query.get("propagationPolicy") or "Background"
                self._send_json(200, double.delete(plural, namespace, name, propagation))
            else:
                raise ApiError(405, "MethodNotAllowed", f"{method} {url.path}")
        except ApiError as error:
            self._send_json(error.code, status_body(error.code, error.reason, error.message, error.details))
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _namespace(self, name: str) -> None:
        """GET one namespace: the object, or the 404 a real API server sends for a missing one."""
        with self.double._lock:
            exists = name in self.double.namespaces
        if not exists:
            details = {"name": name, "kind": "namespaces"}
            self._send_json(404, status_body(404, "NotFound", f'namespaces "{name}" not found', details))
            return
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}, "status": {"phase": "Active"}}
        self._send_json(200, body)

    def _control(self, method: str, path: str) -> None:
        """Knobs and counters for a double running in another process (benchmarks)."""
        double = self.double
        if path == "/_double/requests":
            self._send_json(200, {"requests": [r for r in double.requests if not r[1].startswith("/_double/")]})
        elif path == "/_double/reset" and method == "POST":
            double.requests.clear()
            double.created.clear()
            self._send_json(200, {})
        elif path == "/_double/knobs" and method == "POST":
            knobs = self._body()
            if "clock_offset" in knobs:
                double.clock_offset = float(knobs.pop("clock_offset"))
            if "drop_log_streams" in knobs:
                after, times = knobs.pop("drop_log_streams")
                double.drop_log_streams(int(after), int(times))
            if isinstance(double.kubelet, ScriptedKubelet) and isinstance(double.kubelet.script, KnobScript):
                double.kubelet.script.knobs.update(knobs)
            self._send_json(200, {})
        else:
            self._send_json(404, status_body(404, "NotFound", path))

    def _list(self, plural: str, namespace: str, query: dict[str, str]) -> None:
        items = [
            o
            for o in self.double.list_objects(plural, namespace, query.get("labelSelector", ""))
            if not query.get("fieldSelector") or match_fields(query["fieldSelector"], o)
        ]
        with self.double._lock:
            rv = str(self.double._rv)
        if "as=PartialObjectMetadataList" in (self.headers.get("Accept") or ""):  # metadata only
            items = [
                {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}
                for o in items
            ]
            self.double.metadata_lists.append(plural)
            kind, api_version = "PartialObjectMetadataList", "meta.k8s.io/v1"
        else:
            kind, api_version = (
                f"{self.double.kind_of(plural)}List",
                self.double.custom_kinds.get(plural, ("v1", ""))[0],
            )
        self._send_json(
            200,
            {"kind": kind, "apiVersion": api_version, "metadata": {"resourceVersion": rv}, "items": items},
        )

    def _watch(self, plural: str, namespace: str, query: dict[str, str]) -> None:
        self._start_chunked("application/json")
        events = self.double.watch(
            plural,
            namespace,
            query.get("labelSelector", ""),
            query.get("fieldSelector", ""),
            query.get("resourceVersion", ""),
            float(query.get("timeoutSeconds") or 300),
        )
        for event in events:
            self._chunk(json.dumps(event).encode() + b"\n")
        self._end_chunks()

    def _logs(self, namespace: str, name: str, query: dict[str, str]) -> None:
        double = self.double
        pod = double.get("pods", namespace, name)
        if pod is None:
            raise ApiError(404, "NotFound", f'pods "{name}" not found')
        container = (pod["spec"].get("containers") or [{}])[0].get("name", "")
        statuses = pod.get("status", {}).get("containerStatuses") or []
        state = statuses[0].get("state", {}) if statuses else {}
        if "running" not in state and "terminated" not in state:
            reason = state.get("waiting", {}).get("reason", "ContainerCreating")
            raise ApiError(400, "BadRequest", f'container "{container}" in pod "{name}" is waiting to start: {reason}')
        buffer = double.logs.get((namespace, name))
        if buffer is None:
            raise ApiError(404, "NotFound", f'pods "{name}" not found')
        follow = _flag(query, "follow")
        timestamps = _flag(query, "timestamps")
        since_ns = parse_time_seconds(query["sinceTime"]) * 1_000_000_000 if query.get("sinceTime") else 0
        if query.get("sinceSeconds"):  # the kubelet counts back from its own (the node's) clock
            since_ns = double.node_time_ns() - int(query["sinceSeconds"]) * 1_000_000_000
        drop_after = double.take_log_drop() if follow else None
        self._start_chunked("text/plain")
        index, sent = 0, 0
        line_start = True  # the next entry starts a line (the last one sent ended its line)
        while True:
            with buffer.cond:
                while index >= len(buffer.lines) and not buffer.done and follow:
                    buffer.cond.wait(1.0)
                batch = buffer.lines[index:]
                ends = buffer.ends[index:]
                index = len(buffer.lines)
                finished = buffer.done or not follow
            out = []
            for (ns, line), ends_line in zip(batch, ends, strict=True):
                if ns < since_ns:
                    continue
                stamp = f"{rfc3339_nano(ns)} " if timestamps and line_start else ""
                line_start = ends_line
                out.append(f"{stamp}{line}\n" if ends_line else f"{stamp}{line}")
                sent += 1
                if drop_after is not None and sent >= drop_after:
                    if out:
                        self._chunk("".join(out).encode())
                    self.close_connection = True
                    self.wfile.flush()
                    self.connection.shutdown(2)  # an abrupt cut: no terminating chunk
                    return
            if out:
                self._chunk("".join(out).encode())
            if finished and index >= len(buffer.lines):
                break
        self._end_chunks()

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PUT(self) -> None:
        self._route("PUT")

    def do_DELETE(self) -> None:
        self._route("DELETE")


# --- the scripted kubelet ---------------------------------------------------------------------


@dataclass
class PodScript:
    """What a scripted pod does. Workers by default: Running and Ready until deleted."""

    schedule_delay: float = 0.0
    unschedulable: str | None = None  # scheduler message, e.g. "0/3 nodes are available: ..."
    image_error: str | None = None  # waiting reason, e.g. "ErrImagePull" or "ImagePullBackOff"
    crash_loop: bool = False
    start_delay: float = 0.0
    ready_delay: float = 0.0
    lines: Callable[[], Iterator[str]] | None = None  # output; None: nothing
    # Or output as written: parts of lines ("\r" kept, a newline only where written).
    writes: Callable[[], Iterator[str]] | None = None
    exit_code: int | None = None  # None: run until deleted
    fail_after: float | None = None  # then terminate with fail_reason/fail_exit_code
    fail_reason: str = "Error"
    fail_exit_code: int = 1
    evicted_after: float | None = None


class ScriptedKubelet:
    """Plays pods by script: ``script(pod) -> PodScript`` (default: run and be Ready)."""

    def __init__(self, script: Callable[[Obj], PodScript] | None = None) -> None:
        self.script = script or (lambda pod: PodScript())
        self._stopped: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def _alive(self, namespace: str, name: str) -> bool:
        with self._lock:
            return (namespace, name) not in self._stopped

    def start(self, double: KubeDouble, pod: Obj) -> None:
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        script = self.script(pod)
        container = pod["spec"]["containers"][0]
        image = container.get("image", "")
        if script.schedule_delay:
            time.sleep(script.schedule_delay)
        if script.unschedulable:
            double.update_pod_status(namespace, name, lambda p: _set_unschedulable(p, script.unschedulable or ""))
            double.record_event(namespace, pod, "FailedScheduling", script.unschedulable, "Warning")
            return
        double.update_pod_status(namespace, name, lambda p: _set_scheduled(p, container["name"], image))
        if script.image_error:
            message = (
                f'Back-off pulling image "{image}"'
                if "BackOff" in script.image_error
                else (f'Failed to pull image "{image}": not found')
            )
            double.update_pod_status(namespace, name, lambda p: _set_waiting(p, script.image_error or "", message))
            double.record_event(namespace, pod, "Failed", message, "Warning")
            return
        if script.crash_loop:
            double.update_pod_status(
                namespace,
                name,
                lambda p: _set_waiting(p, "CrashLoopBackOff", "back-off 10s restarting failed container"),
            )
            return
        if script.start_delay:
            time.sleep(script.start_delay)
        if not self._alive(namespace, name):
            return
        double.update_pod_status(namespace, name, lambda p: _set_running(p, ready=False))
        # A container that exits non-zero right after its output (a worker whose sshd fails) never
        # passes its probe: a real sshd that did not start does not answer. Ready comes first only
        # for pods that keep running or end well.
        has_probe = bool(container.get("readinessProbe")) and not script.exit_code
        if has_probe:
            if script.ready_delay:
                time.sleep(script.ready_delay)
            double.update_pod_status(namespace, name, lambda p: _set_running(p, ready=True))
        if not self._workers_answer(double, pod):
            return
        buffer = double.logs.get((namespace, name))
        started = time.monotonic()
        if script.lines is not None and buffer is not None:
            pending: list[tuple[int, str]] = []
            flushed = time.monotonic()
            for line in script.lines():
                pending.append((double.node_time_ns(), line))
                if len(pending) >= 1000 or time.monotonic() - flushed > 0.001:  # like a pipe: batches
                    if not self._alive(namespace, name):
                        return
                    buffer.extend(pending)
                    pending, flushed = [], time.monotonic()
            buffer.extend(pending)
        if script.writes is not None and buffer is not None:
            for text in script.writes():
                if not self._alive(namespace, name):
                    return
                buffer.write(double.node_time_ns(), text)
        timed = [t for t in (script.fail_after, script.evicted_after) if t is not None]
        if script.exit_code is not None or timed:
            wait = min(timed) - (time.monotonic() - started) if timed else 0.0
            end = time.monotonic() + max(wait, 0.0)
            while time.monotonic() < end:
                if not self._alive(namespace, name):
                    return
                time.sleep(0.01)
            if not self._alive(namespace, name):
                return
            if script.evicted_after is not None and (
                script.fail_after is None or script.evicted_after <= script.fail_after
            ):
                double.update_pod_status(namespace, name, _set_evicted)
                double.record_event(namespace, pod, "Evicted", "The node was low on resource: memory.", "Warning")
            elif timed:
                code, reason = script.fail_exit_code, script.fail_reason
                double.update_pod_status(namespace, name, lambda p: _set_terminated(p, code, reason))
            else:
                code = script.exit_code or 0
                double.update_pod_status(
                    namespace, name, lambda p: _set_terminated(p, code, "Completed" if code == 0 else "Error")
                )
            if buffer is not None:
                buffer.close()

    def _workers_answer(self, double: KubeDouble, pod: Obj) -> bool:
        """A master waits, as the launch script's ``wait_for_hosts`` does, until every worker of its
        job is Ready (its sshd answers), for at most ``AIRFLOW_MPI_STARTUP_TIMEOUT``; past that it
        prints the script's error and exits 1. False: it ended so, or was stopped."""
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        env = {item["name"]: item.get("value") for item in pod["spec"]["containers"][0].get("env") or []}
        job = (pod["metadata"].get("labels") or {}).get(LABEL_JOB)
        expected = int(env.get(ENV_WORKER_REPLICAS) or 0)
        if env.get(ENV_ROLE) != "master" or not job or not expected:
            return True
        timeout = float(env.get(ENV_STARTUP_TIMEOUT) or 300)
        deadline = time.monotonic() + timeout
        selector = f"{LABEL_JOB}={job},{LABEL_ROLE}=worker"
        while True:
            ready = [w for w in double.list_objects("pods", namespace, selector) if _is_ready(w)]
            if len(ready) >= expected:
                return True
            if not self._alive(namespace, name):
                return False
            if time.monotonic() >= deadline:
                buffer = double.logs.get((namespace, name))
                if buffer is not None:
                    line = f"[airflow-mpi] ERROR: {expected - len(ready)} host(s) did not accept ssh within {timeout:.0f}s:"
                    buffer.extend([(double.node_time_ns(), line)])
                    buffer.close()
                double.update_pod_status(namespace, name, lambda p: _set_terminated(p, 1, "Error"))
                return False
            time.sleep(0.02)

    def stop(self, double: KubeDouble, pod: Obj) -> None:
        with self._lock:
            self._stopped.add((pod["metadata"]["namespace"], pod["metadata"]["name"]))

    def shutdown(self) -> None:
        pass


# --- pod status builders (shared with the real kubelet) ---------------------------------------


def _conditions(scheduled: bool, ready: bool, reason: str = "", message: str = "") -> list[Obj]:
    now = rfc3339(time.time())
    scheduled_condition: Obj = {
        "type": "PodScheduled",
        "status": "True" if scheduled else "False",
        "lastTransitionTime": now,
    }
    if reason:
        scheduled_condition.update(reason=reason, message=message)
    return [
        scheduled_condition,
        {"type": "Initialized", "status": "True" if scheduled else "False", "lastTransitionTime": now},
        {"type": "ContainersReady", "status": "True" if ready else "False", "lastTransitionTime": now},
        {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": now},
    ]


def _container_status(pod: Obj, state: Obj, ready: bool = False) -> list[Obj]:
    container = pod["spec"]["containers"][0]
    return [
        {
            "name": container["name"],
            "image": container.get("image", ""),
            "imageID": "",
            "ready": ready,
            "started": "running" in state,
            "restartCount": 0,
            "state": state,
        }
    ]


def _set_unschedulable(pod: Obj, message: str) -> None:
    pod["status"] = {"phase": "Pending", "conditions": _conditions(False, False, "Unschedulable", message)}


def _set_scheduled(pod: Obj, container: str, image: str) -> None:
    pod["status"] = {
        "phase": "Pending",
        "conditions": _conditions(True, False),
        "containerStatuses": _container_status(pod, {"waiting": {"reason": "ContainerCreating"}}),
        "hostIP": "192.0.2.10",
        "startTime": rfc3339(time.time()),
    }


def _set_waiting(pod: Obj, reason: str, message: str) -> None:
    pod["status"]["containerStatuses"] = _container_status(pod, {"waiting": {"reason": reason, "message": message}})


def _is_ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _set_running(pod: Obj, ready: bool, ip: str | None = None) -> None:
    status = pod["status"]
    status["phase"] = "Running"
    status["conditions"] = _conditions(True, ready)
    status["containerStatuses"] = _container_status(pod, {"running": {"startedAt": rfc3339(time.time())}}, ready)
    status["podIP"] = ip or status.get("podIP") or "10.96.0.1"


def _set_terminated(pod: Obj, exit_code: int, reason: str) -> None:
    status = pod["status"]
    status["phase"] = "Succeeded" if exit_code == 0 else "Failed"
    status["conditions"] = _conditions(True, False)
    status["containerStatuses"] = _container_status(
        pod,
        {"terminated": {"exitCode": exit_code, "reason": reason, "finishedAt": rfc3339(time.time())}},
    )


def _set_evicted(pod: Obj) -> None:
    status = pod["status"]
    status.update(phase="Failed", reason="Evicted", message="The node was low on resource: memory.")
    status["conditions"] = _conditions(True, False)
    status["containerStatuses"] = _container_status(
        pod, {"terminated": {"exitCode": 137, "reason": "Error", "finishedAt": rfc3339(time.time())}}
    )


class KnobScript:
    """Scripted pods steered by knobs (``POST /_double/knobs``): workers run and are Ready; the
    master prints ``master_lines`` lines (at ``master_rate`` per second, 0: as fast as it can),
    each ending with the real clock in ns, then exits with ``master_exit``. While ``hold_masters``
    is true, masters run without printing (deferred jobs wait on them; clearing it ends them all).
    A master whose name contains ``flood_job`` prints ``flood_lines`` lines as fast as it can."""

    def __init__(self) -> None:
        self.knobs: dict[str, Any] = {"master_lines": 10, "master_rate": 0.0, "master_exit": 0, "hold_masters": False}
        self.knobs.update(flood_job=None, flood_lines=0)

    def _lines(self, flood: bool = False) -> Iterator[str]:
        while self.knobs["hold_masters"]:
            time.sleep(0.05)
        count, rate = int(self.knobs["master_lines"]), float(self.knobs["master_rate"])
        if flood:
            count, rate = int(self.knobs["flood_lines"]), 0.0
        start = time.monotonic()
        for i in range(count):
            if rate:
                delay = start + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            yield f"[1,{i % 4}]<stdout>:line {i:08d} {time.time_ns()}"

    def __call__(self, pod: Obj) -> PodScript:
        name = pod["metadata"]["name"]
        if "-master-" in name or "-launcher-" in name:  # an MPIJob's launcher plays the master
            flood = bool(self.knobs["flood_job"]) and str(self.knobs["flood_job"]) in name
            return PodScript(lines=lambda: self._lines(flood), exit_code=int(self.knobs["master_exit"]))
        return PodScript()


def main() -> None:
    """``python -m tests.doubles.kube_double``: serve a knob-driven double, print its URL."""
    double = KubeDouble(ScriptedKubelet(KnobScript()))
    print(double.start(), flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        double.stop()


if __name__ == "__main__":
    main()
