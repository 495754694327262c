"""The real controllers, run out of cluster against the test control plane, each with its own
CRDs and RBAC from its own module (copied beside its binaries by build.py): mpi-operator, Kueue
and Volcano. Each runs as a ServiceAccount bound to the ClusterRole its project ships, so a
permission the product's objects make it need is checked too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.cluster.build import COMPONENTS, assets_dir, bin_dir, is_built
from tests.cluster.controlplane import Process, wait_for
from tests.cluster.kubeapi import KubeApi, Obj

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def yaml_documents(path: Path) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if isinstance(doc, dict)]


def install_crds(api: KubeApi, paths: list[Path], timeout: float = 60) -> list[str]:
    """Create (or replace) the CRDs in ``paths`` and wait until each is Established."""
    names = []
    for path in paths:
        for crd in yaml_documents(path):
            if crd.get("kind") != "CustomResourceDefinition":
                continue
            api.apply_object(CRDS, crd)
            names.append(crd["metadata"]["name"])

    def established() -> bool:
        for name in names:
            conditions = api.get(f"{CRDS}/{name}").get("status", {}).get("conditions") or []
            if not any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                return False
        return True

    wait_for(f"CRDs {', '.join(names)} established", established, timeout)
    return names


def ensure_namespace(api: KubeApi, name: str) -> None:
    if api.get_or_none(f"/api/v1/namespaces/{name}") is None:
        api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


def start_mpi_operator(cluster: Any) -> Process:
    """mpi-operator with its CRD and ClusterRole; host names ``<pod>.<job>.<ns>.svc.cluster.local``
    in its hostfile (``-cluster-domain``), which the node agent's hosts files resolve."""
    component = COMPONENTS["mpi-operator"]
    if not is_built(component):
        raise RuntimeError("mpi-operator is not built: run `make cluster-build`")
    assets = assets_dir(component) / "manifests" / "base"
    api = cluster.api()
    install_crds(api, [assets / "kubeflow.org_mpijobs.yaml"])
    (role,) = [d for d in yaml_documents(assets / "cluster-role.yaml") if d["metadata"]["name"] == "mpi-operator"]
    ensure_namespace(api, "mpi-operator")
    kubeconfig = cluster.bind_service_account(
        "mpi-operator", "mpi-operator", role, cluster.workdir / "mpi-operator.kubeconfig"
    )
    process = Process(
        "mpi-operator",
        [str(bin_dir(component) / "mpi-operator"), "-kubeConfig", str(kubeconfig), "-lock-namespace", "mpi-operator",
         "-cluster-domain", "cluster.local", "-threadiness", "4"],
        cluster.workdir / "logs" / "mpi-operator.log",
    )  # fmt: skip
    process.start()
    # It reports nothing until it leads (leader election always runs); then it syncs MPIJobs.
    wait_for("mpi-operator leading", lambda: "Started workers" in process.tail(200), 90, process)
    return process
