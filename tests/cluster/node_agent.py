"""A kubelet stand-in for the real control plane: registers Nodes and runs the pods the real
scheduler binds to them, for real, with the local backend's namespace runner (real sshd, mpiexec
and Python ranks, each pod in its own network/UTS/PID/mount namespaces).

Per Node: the Node object and its status (capacity and allocatable with cpu, memory, pods and
``nvidia.com/gpu``; Ready and the pressure conditions; InternalIP; the kubelet endpoint), its
Lease renewed every 10 s, a watch of the pods bound to it, and an HTTPS server that answers the
apiserver's ``/containerLogs`` requests (follow, timestamps, sinceTime, sinceSeconds, tailLines,
limitBytes, previous), with a client certificate required.

Per pod: env (values, downward API, secretKeyRef, configMapKeyRef, envFrom, resourceFieldRef),
Secret/ConfigMap/downwardAPI/projected (service-account token by TokenRequest)/emptyDir/hostPath/
a PersistentVolumeClaim bound to a hostPath or local PersistentVolume
volumes with their modes, ``<hostname>.<subdomain>[.<ns>.svc[.cluster.local]]`` names, tcpSocket
and exec readiness probes, restartPolicy, activeDeadlineSeconds, graceful deletion (SIGTERM,
grace, SIGKILL, terminated statuses, then the final DELETE with a uid precondition), node-pressure
eviction on request, and ErrImagePull for images it is told are missing. Each container's command
runs on this machine's files whatever its image. It acts with a node's credentials
(``system:node:<name>``), so the Node authorizer and NodeRestriction judge what it does.

Test code only: a double of the kubelet. What the product talks to is the real apiserver.

    python -m tests.cluster.node_agent CONFIG.json     (ready when it prints "ready")
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from airflow_mpi.backends.sandbox import Sandbox
from airflow_mpi.backends.sandbox_pod import Mount
from tests.cluster.kubeapi import ApiError, KubeApi, Obj
from tests.doubles.real_kubelet import tmpfs_size

LEASE_SECONDS = 40
RENEW_SECONDS = 10
API_RETRY_SECONDS = 60
MAX_LINE = 16 * 1024  # the kubelet's CRI log line limit: longer lines are split


def now_rfc3339(nano: int | None = None) -> str:
    nano = time.time_ns() if nano is None else nano
    seconds, rest = divmod(nano, 1_000_000_000)
    stamp = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{rest:09d}Z"


def now_seconds() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time_ns(text: str) -> int:
    """RFC 3339 (with or without fractional seconds) to ns since the epoch."""
    main, _, frac = text.rstrip("Z").partition(".")
    seconds = datetime.datetime.strptime(main, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc).timestamp()
    return int(seconds) * 1_000_000_000 + int((frac or "0").ljust(9, "0")[:9])


@dataclass(frozen=True)
class NodeConfig:
    name: str
    address: str  # InternalIP, on loopback
    port: int  # the kubelet endpoint
    kubeconfig: str
    serving_cert: str
    serving_key: str
    ca: str
    capacity: dict[str, str]


# --- container logs --------------------------------------------------------------------------


class ContainerLog:
    """One container run's output: records (ns timestamp, line bytes with its newline), kept in
    memory and in a file, with a condition for followers."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[tuple[int, bytes]] = []
        self.closed = False
        self.cond = threading.Condition()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("ab")

    def append(self, line: bytes) -> None:
        stamp = time.time_ns()
        with self.cond:
            self.records.append((stamp, line))
            self._file.write(now_rfc3339(stamp).encode() + b" " + line)
            self._file.flush()
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self._file.close()
            self.cond.notify_all()


def pump(stream: Any, log: ContainerLog) -> None:
    """A container's output into its log, split like the kubelet's (at newlines, and at 16 KiB)."""
    try:
        while True:
            line = stream.readline(MAX_LINE)
            if not line:
                break
            log.append(line if line.endswith(b"\n") else line + b"\n")
    except (ValueError, OSError):
        pass  # the stream was closed under the read: the pod was stopped
    finally:
        log.close()


# --- pods ------------------------------------------------------------------------------------


@dataclass
class ContainerState:
    restarts: int = 0
    state: Obj = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    ready: bool = False
    last_state: Obj = field(default_factory=dict)
    logs: list[ContainerLog] = field(default_factory=list)


class PodRunner:
    """Runs one pod bound to a node, from its first sighting to its final DELETE."""

    def __init__(self, agent: NodeAgent, node: Node, pod: Obj) -> None:
        self.agent, self.node, self.pod = agent, node, pod
        meta = pod["metadata"]
        self.namespace, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.key = f"{self.name}.{self.uid[:6]}"  # the sandbox pod: names repeat across namespaces
        self.container = pod["spec"]["containers"][0]
        self.cstate = ContainerState()
        self.phase = "Pending"
        self.reason = ""
        self.message = ""
        self.pod_ip = ""
        self.started_at = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self.lock = threading.RLock()
        self.deleting = threading.Event()
        self.evicted = False
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, name=f"pod-{self.name}", daemon=True)
        self.disruption: Obj | None = None

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods/{self.name}"

    # --- status -------------------------------------------------------------------------------

    def status(self) -> Obj:
        with self.lock:
            running = "running" in self.cstate.state
            ready = running and self.cstate.ready and self.phase == "Running"
            started = self.phase != "Pending" or running
            conditions = [
                {"type": "PodReadyToStartContainers", "status": "True" if self.pod_ip else "False"},
                {"type": "Initialized", "status": "True"},
                {"type": "ContainersReady", "status": "True" if ready else "False"},
                {"type": "Ready", "status": "True" if ready else "False"},
            ]
            if not ready and started is not None:
                for condition in conditions[2:]:
                    condition["reason"] = (
                        "PodCompleted" if self.phase in ("Succeeded", "Failed") else "ContainersNotReady"
                    )
            if self.disruption:
                conditions.append(self.disruption)
            now = now_seconds()
            for condition in conditions:
                condition["lastTransitionTime"] = now
                condition["lastProbeTime"] = None
            container_status: Obj = {
                "name": self.container["name"],
                "image": self.container.get("image", ""),
                "imageID": "",
                "ready": ready,
                "started": running,
                "restartCount": self.cstate.restarts,
                "state": self.cstate.state,
                "lastState": self.cstate.last_state,
            }
            if "waiting" not in self.cstate.state:
                container_status["containerID"] = f"airflow-mpi://{self.uid}/{self.cstate.restarts}"
            status: Obj = {
                "phase": self.phase,
                "conditions": conditions,
                "hostIP": self.node.config.address,
                "hostIPs": [{"ip": self.node.config.address}],
                "containerStatuses": [container_status],
                "qosClass": _qos(self.container),
            }
            if self.started_at:
                status["startTime"] = self.started_at
            if self.pod_ip:
                status["podIP"] = self.pod_ip
                status["podIPs"] = [{"ip": self.pod_ip}]
            if self.reason:
                status["reason"] = self.reason
            if self.message:
                status["message"] = self.message
            return status

    def report(self) -> None:
        """Send the pod's status (pods/status, as a kubelet does). A pod already gone: nothing."""
        body = {"status": self.status()}
        try:
            self.node.api.patch(f"{self.path}/status", body)
        except ApiError as error:
            if error.status not in (404, 409):
                self.agent.log(f"status of {self.namespace}/{self.name}: {error}")

    def set_state(self, state: Obj, *, ready: bool = False, phase: str | None = None) -> None:
        with self.lock:
            self.cstate.state = state
            self.cstate.ready = ready
            if phase:
                self.phase = phase
        self.report()

    # --- life cycle ---------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._run()
        except Exception as error:  # never leave a pod half-made: report and clean up
            self.agent.log(f"pod {self.namespace}/{self.name}: {type(error).__name__}: {error}")
            with contextlib.suppress(Exception):
                self.set_state({"waiting": {"reason": "RunContainerError", "message": str(error)}})
            # It stays until deleted, then goes like any pod (else its deletion never finishes
            # and whatever waits on it, e.g. a foreground deletion, waits for ever).
            while not self.deleting.wait(0.5) and not self.agent.stopping.is_set():
                pass
            with contextlib.suppress(Exception):
                self.finish_deletion(exit_code=None)
        finally:
            self.done.set()

    def _run(self) -> None:
        spec = self.pod["spec"]
        with self.lock:
            self.started_at = now_seconds()
        image = self.container.get("image", "")
        if image in self.agent.missing_images:
            message = f'Failed to pull image "{image}": not found (the node agent was told it is missing)'
            self.set_state({"waiting": {"reason": "ErrImagePull", "message": message}})
            time.sleep(1)
            back_off = f'Back-off pulling image "{image}": ErrImagePull: {message}'
            while not self.deleting.wait(5):
                self.set_state({"waiting": {"reason": "ImagePullBackOff", "message": back_off}})
            self.set_state({"waiting": {"reason": "ImagePullBackOff", "message": back_off}})
            self.finish_deletion(exit_code=None)
            return
        self.report()
        mounts = self.prepare_volumes(spec)
        if mounts is None:
            self.finish_deletion(exit_code=None)
            return
        entry = self.agent.add_sandbox_pod(self)
        with self.lock:
            self.pod_ip = entry.ip
        env = self.environment()
        if env is None:
            self.finish_deletion(exit_code=None)
            return
        deadline = spec.get("activeDeadlineSeconds")
        started = time.monotonic()
        restart_policy = spec.get("restartPolicy", "Always")
        back_off = 1.0
        while True:
            code = self.run_container(mounts, env, deadline, started)
            if self.deleting.is_set() or self.evicted or code is None:
                break
            if restart_policy == "Never" or (restart_policy == "OnFailure" and code == 0):
                with self.lock:
                    self.phase = "Succeeded" if code == 0 else "Failed"
                self.report()
                break
            with self.lock:
                self.cstate.last_state = self.cstate.state
                self.cstate.restarts += 1
            self.set_state(
                {
                    "waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": f"back-off {back_off:.0f}s restarting failed container",
                    }
                }
            )
            if self.deleting.wait(back_off):
                break
            back_off = min(back_off * 2, 30)
        self.deleting.wait()
        self.finish_deletion(exit_code=None)

    def run_container(self, mounts: list[Mount], env: dict[str, str], deadline: Any, started: float) -> int | None:
        """One run of the container; its exit code, or None when deletion, eviction or the
        deadline ended it (the status is already reported then)."""
        argv = [*(self.container.get("command") or []), *(self.container.get("args") or [])]
        if not argv:
            self.set_state(
                {
                    "waiting": {
                        "reason": "CreateContainerError",
                        "message": "the node agent runs a container's command on this machine: "
                        "the container has no command",
                    }
                }
            )
            return None
        log = ContainerLog(
            self.agent.log_dir / self.namespace / self.name / f"{self.container['name']}-{self.cstate.restarts}.log"
        )
        with self.lock:
            self.cstate.logs.append(log)
        user = _run_as(self.pod["spec"], self.container)
        if user is None and _no_escalation(self.container):
            # What the container runtime gives allowPrivilegeEscalation: false to a root container:
            # no_new_privs on its first process (a non-root user gets it from the sandbox already).
            argv = ["setpriv", "--no-new-privs", "--", *argv]
        proc = self.agent.sandbox.start(
            self.key,
            argv,
            env,
            mounts,
            subprocess.PIPE,
            user=user,
            hostname=self.pod["spec"].get("hostname") or self.name,
        )
        self.proc = proc
        pumping = threading.Thread(target=pump, args=(proc.stdout, log), daemon=True)
        pumping.start()
        with self.lock:
            self.phase = "Running"
        probe = self.container.get("readinessProbe")
        self.set_state({"running": {"startedAt": now_seconds()}}, ready=probe is None)
        if probe:
            threading.Thread(target=self.probe, args=(probe, proc), daemon=True).start()
        while proc.poll() is None:
            if self.deleting.wait(0.2) or self.evicted:
                pumping.join(timeout=5)
                return None
            if deadline is not None and time.monotonic() - started > int(deadline):
                self.kill(grace=0)
                with self.lock:
                    self.phase, self.reason = "Failed", "DeadlineExceeded"
                    self.message = "Pod was active on the node longer than the specified deadline"
                self.set_state(_terminated(137, "Error"))
                return None
        pumping.join(timeout=5)
        code = proc.returncode
        exit_code = code if code >= 0 else 128 - code
        self.set_state(_terminated(exit_code, "Completed" if exit_code == 0 else "Error"))
        return exit_code

    def probe(self, probe: Obj, proc: subprocess.Popen[bytes]) -> None:
        """Readiness: tcpSocket from the node (the bridge), or exec inside the pod's namespaces."""
        period = float(probe.get("periodSeconds", 10))
        timeout = float(probe.get("timeoutSeconds", 1))
        delay = float(probe.get("initialDelaySeconds", 0))
        success_needed = int(probe.get("successThreshold", 1))
        failure_needed = int(probe.get("failureThreshold", 3))
        if self.deleting.wait(delay):
            return
        successes = failures = 0
        ready = False
        while proc.poll() is None and not self.deleting.is_set():
            ok = self.probe_once(probe, proc, timeout)
            successes, failures = (successes + 1, 0) if ok else (0, failures + 1)
            if not ready and successes >= success_needed:
                ready = True
            elif ready and failures >= failure_needed:
                ready = False
            with self.lock:
                changed = self.cstate.ready != ready and "running" in self.cstate.state
                if changed:
                    self.cstate.ready = ready
            if changed:
                self.report()
            self.deleting.wait(min(period, 0.5) if not ready else period)

    def probe_once(self, probe: Obj, proc: subprocess.Popen[bytes], timeout: float) -> bool:
        if "tcpSocket" in probe:
            try:
                with socket.create_connection((self.pod_ip, int(probe["tcpSocket"]["port"])), timeout=timeout):
                    return True
            except OSError:
                return False
        if "exec" in probe:
            inner = children(proc.pid)
            target = children(inner[0])[0] if inner and children(inner[0]) else None
            if target is None:
                return False
            argv = ["nsenter", "-t", str(target), "-n", "-u", "-p", "-m", "--", *probe["exec"]["command"]]
            try:
                return subprocess.run(argv, capture_output=True, timeout=timeout + 1).returncode == 0
            except subprocess.TimeoutExpired:
                return False
        return True

    def kill(self, grace: float) -> None:
        """SIGTERM to the container, SIGKILL (the whole pod) after ``grace`` seconds."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        if grace > 0:
            for pid in _container_pids(proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace)
        self.agent.sandbox.stop(self.key)

    def delete(self) -> None:
        """The pod has a deletionTimestamp: stop it within its grace period."""
        if self.deleting.is_set():
            return
        grace = self.pod["metadata"].get("deletionGracePeriodSeconds", 30) or 0
        self.kill(grace=float(grace))
        self.deleting.set()

    def evict(self, message: str) -> None:
        """Node-pressure eviction, as the kubelet does it: kill, Failed/Evicted, kept."""
        with self.lock:
            self.evicted = True
            self.phase, self.reason, self.message = "Failed", "Evicted", message
            self.disruption = {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "TerminationByKubelet",
                "message": message,
            }
        self.kill(grace=1)
        self.set_state(_terminated(137, "Error"))

    def finish_deletion(self, exit_code: int | None) -> None:
        """After the deletionTimestamp: everything stopped, then the final DELETE."""
        self.kill(grace=0)
        self.agent.remove_sandbox_pod(self)
        if self.agent.stopping.is_set():
            return  # the agent stops, not the pod: a kubelet going away deletes no pod
        with self.lock:
            if "running" in self.cstate.state or "waiting" in self.cstate.state:
                self.cstate.state = _terminated(137 if "running" in self.cstate.state else 0, "Error")
                if self.phase in ("Pending", "Running"):
                    self.phase = "Failed"
        self.report()
        body = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": self.uid},
        }
        try:
            self.node.api.delete(self.path, body)
        except ApiError as error:
            if error.status != 409:  # a new pod of the same name: not ours to delete
                self.agent.log(f"final delete of {self.namespace}/{self.name}: {error}")

    # --- volumes and env ---------------------------------------------------------------------

    def prepare_volumes(self, spec: Obj) -> list[Mount] | None:
        """The container's mounts; retried while a referenced object is missing (as the
        kubelet does: the pod waits in ContainerCreating). None when deleted meanwhile."""
        while True:
            try:
                return self._mounts(spec)
            except _NotFound as error:
                self.set_state({"waiting": {"reason": "ContainerCreating", "message": str(error)}})
                if self.deleting.wait(1):
                    return None

    def _mounts(self, spec: Obj) -> list[Mount]:
        mounts = [Mount("/tmp", tmpfs_size="50%", tmpfs_mode="1777"), Mount("/run/sshd", tmpfs_size="1m")]
        user = _run_as(spec, self.container)
        if user is not None:
            # What an image built for the user has (docker/install-runtime.sh --user): the pod
            # contract's runtime directory owned by it, so sshd's StrictModes accepts the job key.
            mounts.append(Mount("/run/airflow-mpi", tmpfs_size="16m", tmpfs_owner=user))
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        root = self.agent.volume_dir / self.uid
        binds: list[Mount] = []
        for volume_mount in self.container.get("volumeMounts") or []:
            volume = volumes[volume_mount["name"]]
            target = volume_mount["mountPath"]
            self.agent.make_mount_point(Path(target))
            read_only = bool(volume_mount.get("readOnly"))
            path = root / volume["name"]
            if "emptyDir" in volume:
                empty = volume["emptyDir"] or {}
                fs_group = (spec.get("securityContext") or {}).get("fsGroup")
                if empty.get("medium") == "Memory":
                    owner = (0, int(fs_group)) if fs_group is not None else None
                    mode = "2777" if fs_group is not None else "0777"
                    mounts.append(Mount(target, tmpfs_size=tmpfs_size(empty.get("sizeLimit", "64Mi")),
                                        tmpfs_mode=mode, tmpfs_owner=owner))  # fmt: skip
                    continue
                path.mkdir(parents=True, exist_ok=True)
                path.chmod(0o777)  # the kubelet's emptyDir: writable by any user of the pod
                if fs_group is not None:
                    _apply_fs_group(path, int(fs_group), read_only=False)
            elif "hostPath" in volume:
                path = Path(volume["hostPath"]["path"])
            elif "persistentVolumeClaim" in volume:
                path = self._claimed_path(volume["persistentVolumeClaim"]["claimName"])
            else:
                self._materialize(volume, path)
            if volume_mount.get("subPath"):
                path = path / volume_mount["subPath"]
            if "hostPath" in volume and path == Path(target) and not read_only:
                continue
            binds.append(Mount(target, source=str(path), read_only=read_only))
        return mounts + binds

    def _materialize(self, volume: Obj, path: Path) -> None:
        files: list[tuple[str, bytes, int]] = []
        if "secret" in volume or "configMap" in volume:
            files = self._object_files(volume.get("secret") or volume["configMap"], "secret" in volume)
        elif "downwardAPI" in volume:
            files = self._downward_files(volume["downwardAPI"])
        elif "projected" in volume:
            projected = volume["projected"]
            mode = projected.get("defaultMode", 0o644)
            for source in projected.get("sources") or []:
                if "serviceAccountToken" in source:
                    token = self._token(source["serviceAccountToken"])
                    files.append((source["serviceAccountToken"]["path"], token.encode(), mode))
                elif "configMap" in source or "secret" in source:
                    inner = dict(source.get("configMap") or source["secret"], defaultMode=mode)
                    files += self._object_files(inner, "secret" in source)
                elif "downwardAPI" in source:
                    files += self._downward_files(dict(source["downwardAPI"], defaultMode=mode))
        else:
            raise _NotFound(f"volume {volume['name']}: a kind the node agent does not provide")
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True, mode=0o755)
        for name, data, mode in files:
            target = path / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(mode)
        fs_group = (self.pod["spec"].get("securityContext") or {}).get("fsGroup")
        if fs_group is not None:
            _apply_fs_group(path, int(fs_group), read_only=True)

    def _referenced(self, plural: str, name: str) -> Obj | None:
        """A Secret or ConfigMap the pod uses. The Node authorizer learns that this node may read
        it from the pod's binding, asynchronously: until then it answers 403 "no relationship
        found", and the kubelet's volume manager tries again; so does this."""
        give_up = time.monotonic() + 30
        while True:
            try:
                return self.node.api.get_or_none(f"/api/v1/namespaces/{self.namespace}/{plural}/{name}")
            except ApiError as error:
                if error.status != 403 or "no relationship found" not in error.message or time.monotonic() > give_up:
                    raise
                if self.deleting.wait(0.2):
                    raise

    def _claimed_path(self, claim: str) -> Path:
        """The directory of the PersistentVolume bound to ``claim``: the kinds a node holds on its
        own disk (``hostPath``, ``local``), as the kubelet mounts them."""
        pvc = self._referenced("persistentvolumeclaims", claim)
        volume_name = (pvc or {}).get("spec", {}).get("volumeName")
        if not volume_name:
            raise _NotFound(f'persistentvolumeclaim "{claim}" not found or not bound')
        pv = self.node.api.get_or_none(f"/api/v1/persistentvolumes/{volume_name}") or {}
        source = pv.get("spec", {}).get("hostPath") or pv.get("spec", {}).get("local")
        if not source:
            raise _NotFound(f'persistentvolume "{volume_name}" is neither hostPath nor local')
        return Path(source["path"])

    def _object_files(self, source: Obj, secret: bool) -> list[tuple[str, bytes, int]]:
        name = source["secretName"] if secret else source["name"]
        plural = "secrets" if secret else "configmaps"
        obj = self._referenced(plural, name)
        if obj is None:
            if source.get("optional"):
                return []
            raise _NotFound(f'{plural[:-1]} "{name}" not found')
        data = {k: base64.b64decode(v) if secret else v.encode() for k, v in (obj.get("data") or {}).items()}
        data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
        mode = int(source.get("defaultMode", 0o644))
        items = source.get("items") or [{"key": k, "path": k} for k in data]
        return [(item["path"], data[item["key"]], int(item.get("mode", mode))) for item in items if item["key"] in data]

    def _downward_files(self, source: Obj) -> list[tuple[str, bytes, int]]:
        mode = int(source.get("defaultMode", 0o644))
        return [
            (item["path"], self.field_value(item["fieldRef"]["fieldPath"]).encode(), int(item.get("mode", mode)))
            for item in source.get("items") or []
            if "fieldRef" in item
        ]

    def _token(self, source: Obj) -> str:
        account = self.pod["spec"].get("serviceAccountName") or "default"
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [source["audience"]] if source.get("audience") else None,
                "expirationSeconds": int(source.get("expirationSeconds", 3607)),
                "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": self.name, "uid": self.uid},
            },
        }
        answer = self.node.api.create(f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{account}/token", request)
        return str(answer["status"]["token"])

    def field_value(self, path: str) -> str:
        meta = self.pod["metadata"]
        simple = {
            "metadata.name": self.name,
            "metadata.namespace": self.namespace,
            "metadata.uid": self.uid,
            "spec.nodeName": self.node.config.name,
            "spec.serviceAccountName": self.pod["spec"].get("serviceAccountName", ""),
            "status.hostIP": self.node.config.address,
            "status.podIP": self.pod_ip,
        }
        if path in simple:
            return simple[path]
        for kind in ("labels", "annotations"):
            if path == f"metadata.{kind}":
                return "\n".join(f'{k}="{v}"' for k, v in sorted((meta.get(kind) or {}).items()))
            if path.startswith(f"metadata.{kind}["):
                return str((meta.get(kind) or {}).get(path.split("['", 1)[1].rstrip("']"), ""))
        raise _NotFound(f"fieldRef {path}: not supported by the node agent")

    def environment(self) -> dict[str, str] | None:
        while True:
            try:
                return self._environment()
            except _NotFound as error:
                self.set_state({"waiting": {"reason": "CreateContainerConfigError", "message": str(error)}})
                if self.deleting.wait(1):
                    return None

    def _environment(self) -> dict[str, str]:
        env = {
            "PATH": self.agent.path,
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "USER": "root",
            "HOSTNAME": self.pod["spec"].get("hostname") or self.name,
        }
        for source in self.container.get("envFrom") or []:
            prefix = source.get("prefix", "")
            ref = source.get("configMapRef") or source.get("secretRef") or {}
            plural = "secrets" if "secretRef" in source else "configmaps"
            obj = self._referenced(plural, ref["name"])
            if obj is None:
                if ref.get("optional"):
                    continue
                raise _NotFound(f'{plural[:-1]} "{ref["name"]}" not found')
            for key, value in (obj.get("data") or {}).items():
                env[prefix + key] = base64.b64decode(value).decode() if plural == "secrets" else value
        for item in self.container.get("env") or []:
            value = self._env_value(item, env)
            if value is not None:
                env[item["name"]] = value
        return env

    def _env_value(self, item: Obj, defined: dict[str, str]) -> str | None:
        if "valueFrom" not in item:
            return _expand(str(item.get("value", "")), defined)
        source = item["valueFrom"]
        if "fieldRef" in source:
            return self.field_value(source["fieldRef"]["fieldPath"])
        if "resourceFieldRef" in source:
            return _resource_value(self.container, source["resourceFieldRef"])
        ref = source.get("secretKeyRef") or source.get("configMapKeyRef")
        secret = "secretKeyRef" in source
        plural = "secrets" if secret else "configmaps"
        obj = self._referenced(plural, ref["name"])
        data = (obj or {}).get("data") or {}
        if ref["key"] not in data:
            if ref.get("optional"):
                return None
            what = f'{plural[:-1]} "{ref["name"]}"' + (f' has no key "{ref["key"]}"' if obj else " not found")
            raise _NotFound(f"env {item['name']}: {what}")
        return base64.b64decode(data[ref["key"]]).decode() if secret else str(data[ref["key"]])


class _NotFound(Exception):
    """A referenced object or key is not there (yet)."""


# --- nodes -----------------------------------------------------------------------------------


class Node:
    """One registered Node: its object, Lease, pod watch and log server."""

    def __init__(self, agent: NodeAgent, config: NodeConfig) -> None:
        self.agent, self.config = agent, config
        # Its requests outlast an apiserver restart, as the kubelet's status and volume loops do.
        self.api = KubeApi(Path(config.kubeconfig), retry_for=API_RETRY_SECONDS)
        self.pods: dict[str, PodRunner] = {}  # by uid
        self.server: ThreadingHTTPServer | None = None

    def register(self) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.config.name,
                "labels": {
                    "kubernetes.io/hostname": self.config.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "airflow-mpi.io/node-agent": "true",
                },
            },
        }
        try:
            self.api.create("/api/v1/nodes", node)
        except ApiError as error:
            if error.status != 409:
                raise
        self.heartbeat()
        self.renew_lease()

    def node_status(self) -> Obj:
        now = now_seconds()
        conditions = [
            {"type": t, "status": "False", "reason": f"KubeletHas{r}", "message": m}
            for t, r, m in (
                ("MemoryPressure", "SufficientMemory", "kubelet has sufficient memory available"),
                ("DiskPressure", "NoDiskPressure", "kubelet has no disk pressure"),
                ("PIDPressure", "SufficientPID", "kubelet has sufficient PID available"),
            )
        ] + [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "node agent is posting ready status",
            }
        ]
        for condition in conditions:
            condition.update(lastHeartbeatTime=now, lastTransitionTime=now)
        return {
            "capacity": self.config.capacity,
            "allocatable": self.config.capacity,
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": self.config.address},
                {"type": "Hostname", "address": self.config.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.config.port}},
            "nodeInfo": {
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": os.uname().release,
                "osImage": "airflow-mpi node agent",
                "containerRuntimeVersion": "airflow-mpi://1",
                "kubeletVersion": self.agent.kubelet_version,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    def heartbeat(self) -> None:
        self.api.patch(f"/api/v1/nodes/{self.config.name}/status", {"status": self.node_status()})

    def renew_lease(self) -> None:
        path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.config.name},
            "spec": {
                "holderIdentity": self.config.name,
                "leaseDurationSeconds": LEASE_SECONDS,
                "renewTime": now_rfc3339()[:26] + "Z",
            },
        }
        current = self.api.get_or_none(f"{path}/{self.config.name}")
        if current is None:
            self.api.create(path, lease)
        else:
            self.api.patch(f"{path}/{self.config.name}", {"spec": lease["spec"]}, "merge-patch")

    def keep_alive(self) -> None:
        beat = 0
        while not self.agent.stopping.wait(RENEW_SECONDS):
            with contextlib.suppress(Exception):
                self.renew_lease()
            beat += 1
            if beat % 3 == 0:
                with contextlib.suppress(Exception):
                    self.heartbeat()

    def watch_pods(self) -> None:
        """List, then watch, the pods bound to this node; relist on 410 Gone or a broken stream."""
        selector = f"spec.nodeName={self.config.name}"
        while not self.agent.stopping.is_set():
            try:
                listed = self.api.get("/api/v1/pods", fieldSelector=selector)
                for pod in listed["items"]:
                    self.on_pod("ADDED", pod)
                version = listed["metadata"]["resourceVersion"]
                while not self.agent.stopping.is_set():
                    for event in self.api.watch("/api/v1/pods", version, timeout_seconds=30, fieldSelector=selector):
                        version = event["object"]["metadata"]["resourceVersion"]
                        if event["type"] != "BOOKMARK":
                            self.on_pod(event["type"], event["object"])
            except Exception as error:
                if not self.agent.stopping.is_set():
                    self.agent.log(f"{self.config.name}: pod watch: {error}; listing again")
                    time.sleep(0.5)

    def on_pod(self, kind: str, pod: Obj) -> None:
        uid = pod["metadata"]["uid"]
        runner = self.pods.get(uid)
        if kind == "DELETED":
            if runner is not None:
                runner.pod = pod
                runner.delete()
                self.pods.pop(uid, None)
            return
        if runner is None:
            if pod["status"].get("phase") in ("Succeeded", "Failed") and not pod["metadata"].get("deletionTimestamp"):
                return  # finished before this agent started: nothing of it runs here
            runner = self.pods[uid] = PodRunner(self.agent, self, pod)
            if pod["metadata"].get("deletionTimestamp"):
                runner.deleting.set()
            runner.thread.start()
        elif pod["metadata"].get("deletionTimestamp"):
            runner.pod = pod
            threading.Thread(target=runner.delete, daemon=True).start()

    # --- the kubelet's log endpoint ---------------------------------------------------------

    def serve_logs(self) -> None:
        node = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                parts = url.path.strip("/").split("/")
                if len(parts) != 4 or parts[0] != "containerLogs":
                    self.send_error(404)
                    return
                node.answer_logs(self, parts[1], parts[2], parts[3], urllib.parse.parse_qs(url.query))

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.config.serving_cert, self.config.serving_key)
        context.load_verify_locations(self.config.ca)
        context.verify_mode = ssl.CERT_REQUIRED  # the apiserver's kubelet client certificate
        server = ThreadingHTTPServer((self.config.address, self.config.port), Handler)
        server.daemon_threads = True
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self.server = server
        threading.Thread(target=server.serve_forever, daemon=True, name=f"logs-{self.config.name}").start()

    def find(self, namespace: str, name: str) -> PodRunner | None:
        for runner in list(self.pods.values()):
            if runner.namespace == namespace and runner.name == name:
                return runner
        return None

    def answer_logs(
        self, handler: BaseHTTPRequestHandler, namespace: str, name: str, container: str, query: dict[str, list[str]]
    ) -> None:
        def arg(key: str) -> str | None:
            return query[key][0] if key in query else None

        runner = self.find(namespace, name)
        if runner is None or runner.container["name"] != container:
            _plain(handler, 404, f'pod "{name}" or container "{container}" not found on node {self.config.name}')
            return
        previous = arg("previous") == "true"
        with runner.lock:
            logs = list(runner.cstate.logs)
            state = runner.cstate.state
        if previous:
            if len(logs) < 2:
                _plain(handler, 400, f'previous terminated container "{container}" in pod "{name}" not found')
                return
            log = logs[-2]
        elif not logs:
            reason = (state.get("waiting") or {}).get("reason", "ContainerCreating")
            _plain(handler, 400, f'container "{container}" in pod "{name}" is waiting to start: {reason}')
            return
        else:
            log = logs[-1]
        follow = arg("follow") == "true" and not previous
        timestamps = arg("timestamps") == "true"
        since_ns = 0
        if arg("sinceTime"):
            since_ns = parse_time_ns(arg("sinceTime") or "")
        elif arg("sinceSeconds"):
            since_ns = time.time_ns() - int(arg("sinceSeconds") or 0) * 1_000_000_000
        tail = int(arg("tailLines")) if arg("tailLines") is not None else None
        limit = int(arg("limitBytes")) if arg("limitBytes") is not None else None
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        sent = 0
        with log.cond:
            records = [r for r in log.records if r[0] >= since_ns]
            index = len(log.records) - len(records)
        if tail is not None:
            records = records[-tail:] if tail > 0 else []
        try:
            while True:
                chunk = b"".join(
                    (now_rfc3339(stamp).encode() + b" " if timestamps else b"") + line for stamp, line in records
                )
                if limit is not None and sent + len(chunk) >= limit:
                    chunk = chunk[: limit - sent]
                if chunk:
                    handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    handler.wfile.flush()
                    sent += len(chunk)
                index += len(records) if index >= 0 else 0
                if not follow or (limit is not None and sent >= limit):
                    break
                with log.cond:
                    while len(log.records) <= index and not log.closed and not self.agent.stopping.is_set():
                        log.cond.wait(1)
                    records = log.records[index:]
                    if not records and (log.closed or self.agent.stopping.is_set()):
                        break
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            pass  # the apiserver (or its client) closed the stream


# --- the agent -------------------------------------------------------------------------------


class NodeAgent:
    """All nodes of the test cluster, sharing one sandbox (one bridge: every pod reaches every
    other, as on a cluster network)."""

    def __init__(self, config: Obj) -> None:
        self.workdir = Path(config["workdir"])
        self.log_dir = self.workdir / "containers"
        self.volume_dir = self.workdir / "volumes"
        self.missing_images = set(config.get("missing_images") or [])
        self.kubelet_version = config.get("kubelet_version", "v1.37.2")
        self.path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "/usr/bin:/bin")])
        self.stopping = threading.Event()
        self.sandbox = Sandbox.create(Path(config["state_dir"]), f"nodes-{os.getpid()}")
        self._hosts: dict[str, tuple[str, tuple[str, ...]]] = {}
        self._hosts_lock = threading.Lock()
        self._mount_points: set[Path] = set()
        self.nodes = [Node(self, NodeConfig(**n)) for n in config["nodes"]]
        self.control_port = int(config.get("control_port", 0))

    def log(self, message: str) -> None:
        print(f"{now_rfc3339()} {message}", file=sys.stderr, flush=True)

    def add_sandbox_pod(self, runner: PodRunner) -> Any:
        spec = runner.pod["spec"]
        hostname = spec.get("hostname") or runner.name
        names = [hostname]
        if spec.get("subdomain"):
            domain = f"{hostname}.{spec['subdomain']}"
            names = [
                f"{domain}.{runner.namespace}.svc.cluster.local",
                f"{domain}.{runner.namespace}.svc",
                domain,
                hostname,
            ]
        with self._hosts_lock:
            if self.stopping.is_set():  # shutdown destroys the sandbox: add nothing to it now
                raise RuntimeError("the node agent is stopping")
            (entry,) = self.sandbox.add_pods([runner.key])
            self._hosts[runner.key] = (entry.ip, tuple(names))
            self.sandbox.write_hosts(list(self._hosts.values()))
        return entry

    def remove_sandbox_pod(self, runner: PodRunner) -> None:
        with self._hosts_lock:
            if runner.key in self.sandbox.pods:
                self.sandbox.remove_pod(runner.key)
            if self._hosts.pop(runner.key, None) is not None:
                self.sandbox.write_hosts(list(self._hosts.values()))
        shutil.rmtree(self.volume_dir / runner.uid, ignore_errors=True)

    def runner(self, namespace: str, name: str) -> PodRunner | None:
        for node in self.nodes:
            found = node.find(namespace, name)
            if found is not None:
                return found
        return None

    def serve_control(self) -> int:
        """Loopback HTTP for the tests: evict a pod, mark an image missing, list running pods."""
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                query = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
                if url.path == "/evict":
                    runner = agent.runner(query["namespace"], query["pod"])
                    if runner is None:
                        _plain(self, 404, "no such pod on these nodes", close=True)
                        return
                    runner.evict(query.get("message", "The node was low on resource: memory. "))
                    _plain(self, 200, "evicted", close=True)
                elif url.path == "/missing-image":
                    agent.missing_images.add(query["image"])
                    _plain(self, 200, "ok", close=True)
                else:
                    _plain(self, 404, "unknown", close=True)

            def do_GET(self) -> None:
                pods = [f"{r.namespace}/{r.name}" for n in agent.nodes for r in n.pods.values() if not r.done.is_set()]
                _plain(self, 200, json.dumps({"pods": pods, "sandbox_pods": sorted(agent.sandbox.pods)}), close=True)

        server = ThreadingHTTPServer(("127.0.0.1", self.control_port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return int(server.server_address[1])

    def run(self) -> None:
        for node in self.nodes:
            node.serve_logs()
            node.register()
            threading.Thread(target=node.keep_alive, daemon=True).start()
            threading.Thread(target=node.watch_pods, daemon=True).start()
        port = self.serve_control()
        print(json.dumps({"ready": True, "control_port": port}), flush=True)
        self.stopping.wait()

    def shutdown(self) -> None:
        """Every pod stopped, the sandbox destroyed (the Node objects stay with the cluster)."""
        self.stopping.set()
        runners = [runner for node in self.nodes for runner in list(node.pods.values())]
        for runner in runners:
            runner.deleting.set()
            with contextlib.suppress(Exception):
                runner.kill(grace=0)
        deadline = time.monotonic() + 30
        for runner in runners:  # a runner may be adding its pod: let it finish first
            runner.thread.join(timeout=max(0.1, deadline - time.monotonic()))
        with self._hosts_lock:
            self.sandbox.destroy()
        shutil.rmtree(self.workdir, ignore_errors=True)
        # Only now: removing a mount point another pod still has mounted would unmount it there.
        for made in sorted(self._mount_points, key=lambda path: len(path.parts), reverse=True):
            with contextlib.suppress(OSError):
                made.rmdir()  # only if empty

    def make_mount_point(self, target: Path) -> None:
        """The directory a volume is mounted on, made on this machine (the pods share its files);
        what did not exist is removed when the agent stops."""
        missing = [target, *target.parents]
        missing = [path for path in missing if not path.exists()]
        target.mkdir(parents=True, exist_ok=True)
        with self._hosts_lock:
            self._mount_points.update(missing)


# --- small helpers ---------------------------------------------------------------------------


def _plain(handler: BaseHTTPRequestHandler, code: int, text: str, close: bool = False) -> None:
    body = text.encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "text/plain")
    handler.send_header("Content-Length", str(len(body)))
    if close:
        handler.send_header("Connection", "close")
    handler.end_headers()
    handler.wfile.write(body)


def _apply_fs_group(root: Path, gid: int, read_only: bool) -> None:
    """The kubelet's volume ownership for ``fsGroup``: every file and directory in the group,
    files group-readable (and writable unless read-only), directories setgid and searchable."""
    mask = 0o440 if read_only else 0o660
    for path in [root, *root.rglob("*")]:
        os.lchown(path, -1, gid)
        mode = path.stat().st_mode & 0o7777
        if path.is_dir():
            path.chmod(mode | mask | 0o2110)
        else:
            path.chmod(mode | mask)


def _terminated(exit_code: int, reason: str) -> Obj:
    now = now_seconds()
    return {"terminated": {"exitCode": exit_code, "reason": reason, "startedAt": now, "finishedAt": now}}


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (from /proc)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _container_pids(unshare_pid: int) -> list[int]:
    """The pod's init (the container's command) below ``ip netns exec``/setpriv/unshare."""
    pids = []
    for child in children(unshare_pid):
        pids += children(child) or [child]
    return pids or [unshare_pid]


def _no_escalation(container: Obj) -> bool:
    """Whether the container asks for no privilege escalation (``no_new_privs``)."""
    return (container.get("securityContext") or {}).get("allowPrivilegeEscalation") is False


def _run_as(spec: Obj, container: Obj) -> tuple[int, int] | None:
    context = {**(spec.get("securityContext") or {}), **(container.get("securityContext") or {})}
    uid = context.get("runAsUser")
    if uid in (None, 0):
        return None
    return int(uid), int(context.get("runAsGroup", uid))


def _qos(container: Obj) -> str:
    resources = container.get("resources") or {}
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    if not limits and not requests:
        return "BestEffort"
    if all(k in limits for k in ("cpu", "memory")) and all(
        requests.get(k, limits[k]) == limits[k] for k in ("cpu", "memory")
    ):
        return "Guaranteed"
    return "Burstable"


def _resource_value(container: Obj, ref: Obj) -> str:
    kind, _, name = ref["resource"].partition(".")
    value = str(((container.get("resources") or {}).get(kind) or {}).get(name, "0"))
    if name == "cpu" and value.endswith("m"):
        return str(max(1, -(-int(value[:-1]) // 1000)))
    return value


def _expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` references to variables defined before; ``$$`` is a literal ``$``;
    an unknown reference stays as written."""
    out, i = [], 0
    while i < len(value):
        if value.startswith("$$", i):
            out.append("$")
            i += 2
        elif value.startswith("$(", i) and ")" in value[i:]:
            end = value.index(")", i)
            name = value[i + 2 : end]
            out.append(env.get(name, value[i : end + 1]))
            i = end + 1
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def main(argv: list[str]) -> int:
    config = json.loads(Path(argv[0]).read_text())
    agent = NodeAgent(config)
    signal.signal(signal.SIGTERM, lambda *_: agent.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: agent.stopping.set())
    try:
        agent.run()
    finally:
        agent.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
