"""A kubelet for the Kubernetes API double that runs pods for real, with the local backend's
namespace runner: each pod's command with its env, its volumes (ConfigMap, Secret, emptyDir,
hostPath) at their mount paths, its host name, and ``<hostname>.<subdomain>`` resolving to it,
so real sshd and mpiexec run behind real HTTP. Needs what the local backend needs (root, ...).

The "image" is this machine: the pods run its files, with this interpreter first on PATH.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from airflow_mpi.backends.sandbox import Sandbox
from airflow_mpi.backends.sandbox_pod import Mount
from tests.doubles.kube_double import (
    KubeDouble,
    Obj,
    _set_running,
    _set_scheduled,
    _set_terminated,
    _set_waiting,
)

VOLUME_WAIT = 10.0  # seconds a pod waits for a Secret or ConfigMap it mounts to be created


class RealKubelet:
    def __init__(self, state_dir: Path, path: str | None = None) -> None:
        self.state_dir = state_dir
        self.name = f"kdouble-{uuid.uuid4().hex[:8]}"
        self.path = path or os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "/usr/bin:/bin")])
        self._sandbox: Sandbox | None = None
        self._lock = threading.Lock()
        self._hosts: dict[str, tuple[str, tuple[str, ...]]] = {}
        self._stopping: set[str] = set()

    def sandbox(self) -> Sandbox:
        with self._lock:
            if self._sandbox is None:
                self._sandbox = Sandbox.create(self.state_dir, self.name)
            return self._sandbox

    # --- Kubelet protocol -----------------------------------------------------------------

    def start(self, double: KubeDouble, pod: Obj) -> None:
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        spec = pod["spec"]
        container = spec["containers"][0]
        double.update_pod_status(
            namespace, name, lambda p: _set_scheduled(p, container["name"], container.get("image", ""))
        )
        sandbox = self.sandbox()
        try:
            with self._lock:
                (entry,) = sandbox.add_pods([name])
                hostname = spec.get("hostname") or name
                names = [hostname]
                if spec.get("subdomain"):
                    domain = f"{hostname}.{spec['subdomain']}"
                    names = [domain, f"{domain}.{namespace}.svc.cluster.local", hostname]
                self._hosts[name] = (entry.ip, tuple(names))
                sandbox.write_hosts(list(self._hosts.values()))
            mounts = self._mounts_when_there(double, namespace, name, spec, container)
        except Exception as error:  # a volume the double cannot provide
            message = str(error)
            double.update_pod_status(namespace, name, lambda p: _set_waiting(p, "CreateContainerConfigError", message))
            return
        env = {"PATH": self.path, "HOME": "/root", "LANG": "C.UTF-8", "USER": "root"}
        env.update({e["name"]: _env_value(pod, e) for e in container.get("env") or []})
        argv = [*(container.get("command") or []), *(container.get("args") or [])]
        proc = sandbox.start(name, argv, env, mounts, subprocess.PIPE, hostname=spec.get("hostname"))
        double.update_pod_status(namespace, name, lambda p: _set_running(p, ready=False, ip=entry.ip))
        probe = (container.get("readinessProbe") or {}).get("tcpSocket")
        if probe:
            port = int(probe["port"])
            threading.Thread(
                target=self._probe, args=(double, namespace, name, entry.ip, port, proc), daemon=True
            ).start()
        else:
            double.update_pod_status(namespace, name, lambda p: _set_running(p, ready=True))
        self._pump(double, namespace, name, proc)

    def _pump(self, double: KubeDouble, namespace: str, name: str, proc: subprocess.Popen[bytes]) -> None:
        """The container's output into the double's log buffer, each line stamped by the node clock."""
        buffer = double.logs.get((namespace, name))
        assert proc.stdout is not None
        try:
            for raw in iter(proc.stdout.readline, b""):
                if buffer is not None:
                    buffer.append(double.node_time_ns(), raw.decode("utf-8", "replace").rstrip("\n"))
        except (ValueError, OSError):
            if name not in self._stopping:
                raise
            # stop() removed the pod and its process, closing this stream under the read
        code = proc.wait()
        if name in self._stopping:
            return
        exit_code = code if code >= 0 else 128 - code
        double.update_pod_status(
            namespace, name, lambda p: _set_terminated(p, exit_code, "Completed" if exit_code == 0 else "Error")
        )
        if buffer is not None:
            buffer.close()

    def _probe(
        self, double: KubeDouble, namespace: str, name: str, ip: str, port: int, proc: subprocess.Popen[bytes]
    ) -> None:
        """The readiness probe: a TCP connect to the pod's port, from the node (the bridge)."""
        while proc.poll() is None and name not in self._stopping:
            with contextlib.suppress(OSError), socket.create_connection((ip, port), timeout=0.5):
                double.update_pod_status(namespace, name, lambda p: _set_running(p, ready=True))
                return
            time.sleep(0.05)

    def _mounts(self, double: KubeDouble, namespace: str, name: str, spec: Obj, container: Obj) -> list[Mount]:
        # What a container has of its own: /tmp and sshd's run directory.
        mounts = [Mount("/tmp", tmpfs_size="50%", tmpfs_mode="1777"), Mount("/run/sshd", tmpfs_size="1m")]
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        root = self.sandbox().dir / "kubelet" / name
        binds = []
        for volume_mount in container.get("volumeMounts") or []:
            volume = volumes[volume_mount["name"]]
            target = volume_mount["mountPath"]
            Path(target).mkdir(parents=True, exist_ok=True)
            read_only = bool(volume_mount.get("readOnly"))
            if "configMap" in volume or "secret" in volume:
                source = self._materialize(double, namespace, volume, root / volume["name"])
                binds.append(Mount(target, source=str(source), read_only=read_only))
            elif "emptyDir" in volume:
                empty = volume["emptyDir"] or {}
                if empty.get("medium") == "Memory":
                    mounts.append(Mount(target, tmpfs_size=tmpfs_size(empty.get("sizeLimit", "64Mi"))))
                else:
                    path = root / volume["name"]
                    path.mkdir(parents=True, exist_ok=True)
                    binds.append(Mount(target, source=str(path), read_only=read_only))
            elif "hostPath" in volume:
                source = Path(volume["hostPath"]["path"]) / volume_mount.get("subPath", "")
                if source != Path(target) or read_only:
                    binds.append(Mount(target, source=str(source), read_only=read_only))
            else:
                raise ValueError(f"volume {volume['name']}: only configMap, secret, emptyDir, hostPath here")
        return mounts + binds

    def _mounts_when_there(
        self, double: KubeDouble, namespace: str, name: str, spec: Obj, container: Obj
    ) -> list[Mount]:
        """As the kubelet's volume manager: a Secret or ConfigMap not there yet (created right
        after the object that made the pod) is tried again, for a while."""
        give_up = time.monotonic() + VOLUME_WAIT
        while True:
            try:
                return self._mounts(double, namespace, name, spec, container)
            except _VolumeMissing:
                if time.monotonic() > give_up or name in self._stopping:
                    raise
                time.sleep(0.2)

    def _materialize(self, double: KubeDouble, namespace: str, volume: Obj, path: Path) -> Path:
        if "configMap" in volume:
            source, plural, key = volume["configMap"], "configmaps", "name"
        else:
            source, plural, key = volume["secret"], "secrets", "secretName"
        obj = double.get(plural, namespace, source[key])
        if obj is None:
            raise _VolumeMissing(f"{plural[:-1]} {source[key]} not found")
        data: dict[str, bytes] = {}
        for item_key, value in (obj.get("data") or {}).items():
            data[item_key] = base64.b64decode(value) if plural == "secrets" else value.encode()
        items = source.get("items") or [{"key": k, "path": k} for k in data]
        mode = int(source.get("defaultMode", 0o644))
        path.mkdir(parents=True, exist_ok=True, mode=0o755)
        for item in items:
            target = path / item["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data[item["key"]])
            target.chmod(int(item.get("mode", mode)))
        return path

    def stop(self, double: KubeDouble, pod: Obj) -> None:
        name = pod["metadata"]["name"]
        self._stopping.add(name)
        sandbox = self._sandbox
        if sandbox is None or name not in sandbox.pods:
            return
        with self._lock:
            sandbox.remove_pod(name)
            self._hosts.pop(name, None)
            sandbox.write_hosts(list(self._hosts.values()))
        shutil.rmtree(sandbox.dir / "kubelet" / name, ignore_errors=True)

    def shutdown(self) -> None:
        with self._lock:
            if self._sandbox is not None:
                self._sandbox.destroy()
                self._sandbox = None

    def leftovers(self) -> list[str]:
        sandbox = self._sandbox or Sandbox.load(self.state_dir, self.name)
        return sandbox.leftovers() if sandbox is not None else []


def tmpfs_size(quantity: str) -> str:
    """A Kubernetes quantity (``16Mi``) as a tmpfs size (``16m``)."""
    units = {"Ki": "k", "Mi": "m", "Gi": "g", "Ti": "t", "K": "k", "M": "m", "G": "g"}
    for suffix, unit in units.items():
        if quantity.endswith(suffix):
            return quantity[: -len(suffix)] + unit
    return quantity


def _env_value(pod: Obj, item: Obj) -> str:
    """A container variable: its value, or the downward API's ``metadata.name``/``namespace``."""
    field = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
    if field in ("metadata.name", "metadata.namespace"):
        return str(pod["metadata"].get(field.split(".", 1)[1], ""))
    return str(item.get("value", ""))


class _VolumeMissing(ValueError):
    """A Secret or ConfigMap a pod mounts is not there (yet)."""
