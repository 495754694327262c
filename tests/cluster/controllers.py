"""The real controllers, run out of cluster against the test control plane, each with its own
CRDs and RBAC from its own module (copied beside its binaries by build.py): mpi-operator, Kueue
and Volcano. Each runs as a ServiceAccount bound to the ClusterRole its project ships, so a
permission the product's objects make it need is checked too."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.build import COMPONENTS, assets_dir, bin_dir, is_built
from tests.cluster.controlplane import Process, host_lock, wait_for
from tests.cluster.kubeapi import KubeApi, Obj

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
MPI_OPERATOR_PORT_WAIT = 1800.0  # seconds for another session's mpi-operator to end (a whole tier)


def yaml_documents(path: Path) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if isinstance(doc, dict)]


def install_crds(api: KubeApi, paths: list[Path], timeout: float = 60) -> list[str]:
    """Create (or replace) the CRDs in ``paths`` and wait until each is Established."""
    return install_crd_documents(api, [doc for path in paths for doc in yaml_documents(path)], timeout)


def install_crd_documents(api: KubeApi, documents: list[Obj], timeout: float = 60) -> list[str]:
    """Create (or replace) the CRDs among ``documents`` and wait until each is Established."""
    names = []
    for crd in documents:
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
    # It serves its health check on :8080, a port it does not let one change: one mpi-operator at
    # a time on this host (another test session's cluster may run one: tests/lanes.py).
    lock = host_lock("mpi-operator-health-8080", MPI_OPERATOR_PORT_WAIT)
    process = Process(
        "mpi-operator",
        [str(bin_dir(component) / "mpi-operator"), "-kubeConfig", str(kubeconfig), "-lock-namespace", "mpi-operator",
         "-cluster-domain", "cluster.local", "-threadiness", "4"],
        cluster.workdir / "logs" / "mpi-operator.log",
        pass_fds=(lock,),
    )  # fmt: skip
    try:
        process.start()
    finally:
        os.close(lock)
    # It reports nothing until it leads (leader election always runs); then it syncs MPIJobs.
    wait_for("mpi-operator leading", lambda: "Started workers" in process.tail(200), 90, process)
    return process


# --- Kueue ---------------------------------------------------------------------------------

KUEUE_NAMESPACE = "kueue-system"
# The CRDs its kustomize gives a conversion webhook (config/components/crd/kustomization.yaml):
# they store v1beta2 and serve v1beta1 too, which the product's Workload requests use.
KUEUE_CONVERTED_CRDS = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")
# Its webhook kustomization keeps the pod-level webhooks off these namespaces.
KUEUE_POD_LEVEL_WEBHOOKS = ("mpod.kb.io", "mdeployment.kb.io", "mstatefulset.kb.io",
                            "vpod.kb.io", "vdeployment.kb.io", "vstatefulset.kb.io")  # fmt: skip
KUEUE_FRAMEWORKS = ("pod", "kubeflow.org/mpijob", "trainer.kubeflow.org/trainjob")
# Kueue reads its metrics serving certificate from this fixed path when it does not manage its
# certificates itself (cmd/kueue/main.go): it sees it through an overlay on /etc in a mount
# namespace of its own, so nothing is written to this machine's /etc.
KUEUE_METRICS_CERTS = "kueue/metrics/certs"
WEBHOOK_KINDS = {"MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
                 "ValidatingWebhookConfiguration": "validatingwebhookconfigurations"}  # fmt: skip


def client_config(url: str, ca_bundle: bytes) -> Obj:
    """A webhook's clientConfig calling ``url`` on loopback, trusting the test CA (what a
    Service reference and an injected caBundle give in a cluster)."""
    import base64

    return {"url": url, "caBundle": base64.b64encode(ca_bundle).decode()}


def kueue_webhook_configurations(assets: Path, url: str, ca_bundle: bytes) -> list[Obj]:
    """Kueue's webhook configurations as its kustomize makes them (``kueue-`` name prefix, the
    namespace selector of the pod-level webhooks), each calling ``url`` + its path."""
    configurations = []
    for doc in yaml_documents(assets / "webhook" / "manifests.yaml"):
        doc["metadata"]["name"] = "kueue-" + doc["metadata"]["name"]
        for webhook in doc["webhooks"]:
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = client_config(url + path, ca_bundle)
            if webhook["name"] in KUEUE_POD_LEVEL_WEBHOOKS:
                webhook["namespaceSelector"] = {"matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                     "values": ["kube-system", KUEUE_NAMESPACE]}]}  # fmt: skip
        configurations.append(doc)
    return configurations


def kueue_crd_paths(assets: Path) -> list[Path]:
    return sorted((assets / "crd" / "bases").glob("*.yaml"))


def install_kueue_crds(api: KubeApi, assets: Path, url: str, ca_bundle: bytes) -> list[str]:
    """Kueue's CRDs with the conversion webhook its kustomize patches in (at ``url``/convert)."""
    documents = [doc for path in kueue_crd_paths(assets) for doc in yaml_documents(path)]
    for crd in documents:
        if crd.get("kind") == "CustomResourceDefinition" and crd["spec"]["names"]["plural"] in KUEUE_CONVERTED_CRDS:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": client_config(url + "/convert", ca_bundle),
                    "conversionReviewVersions": ["v1"],
                },
            }
    return install_crd_documents(api, documents)


def kueue_configuration(webhook_port: int, cert_dir: Path, health_port: int, metrics_port: int) -> Obj:
    """Kueue's Configuration: served on loopback with the test CA's certificate, no leader
    election, no certificate management, no visibility server (an aggregated API it would serve
    on all interfaces), the plain-pod, MPIJob and TrainJob integrations in every namespace but its own and
    kube-system (its default), jobs without a queue name left alone."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "manageJobsWithoutQueueName": False,
        "managedJobsNamespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", KUEUE_NAMESPACE]}]},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "clientConnection": {"qps": 50, "burst": 100},
        "integrations": {"frameworks": list(KUEUE_FRAMEWORKS)},
        "featureGates": {"VisibilityOnDemand": False},
    }  # fmt: skip


def kueue_dry_run(api: KubeApi) -> bool:
    """A v1beta1 ClusterQueue through the apiserver: the conversion, mutating and validating
    webhooks all answer."""
    body = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": "kueue-ready-check"},
            "spec": {"namespaceSelector": {}}}  # fmt: skip
    api.request("POST", "/apis/kueue.x-k8s.io/v1beta1/clusterqueues", body, query={"dryRun": "All"})
    return True


def integration_crds() -> list[list[Path]]:
    """The CRDs of the integrations Kueue is started with, of the controllers that are built:
    Kueue sets up an integration whose CRD is missing only after a back-off."""
    found = []
    if is_built(COMPONENTS["mpi-operator"]):
        found.append([assets_dir(COMPONENTS["mpi-operator"]) / "manifests" / "base" / "kubeflow.org_mpijobs.yaml"])
    if is_built(COMPONENTS["jobset"]) and is_built(COMPONENTS["trainer"]):
        jobset = assets_dir(COMPONENTS["jobset"]) / "config" / "components" / "crd" / "bases"
        found.append([jobset / "jobset.x-k8s.io_jobsets.yaml"])
        found.append(sorted((assets_dir(COMPONENTS["trainer"]) / "manifests" / "base" / "crds").glob("*.yaml")))
    return found


def start_kueue(cluster: Any) -> Process:
    """Kueue as its release installs it: its CRDs (with their conversion webhook), its ClusterRole
    (manager-role) bound to a ServiceAccount in kueue-system, its webhook configurations
    pointing at it on loopback by URL (a serving certificate for 127.0.0.1 signed by the cluster
    CA), and the integrations the product uses: plain pods, MPIJobs and TrainJobs, whose CRDs are
    installed first when their controllers are built (``integration_crds``)."""
    import http.client
    import shutil

    from tests.cluster.controlplane import free_port

    component = COMPONENTS["kueue"]
    if not is_built(component):
        raise RuntimeError("kueue is not built: run `make cluster-build`")
    assets = assets_dir(component) / "config" / "components"
    api = cluster.api()
    pki = cluster.plane.pki
    work = cluster.workdir / "kueue"
    webhook_port, health_port, metrics_port = free_port(), free_port(), free_port()
    url = f"https://127.0.0.1:{webhook_port}"

    serving = pki.issue("kueue-webhook", "kueue-webhook", server_ips=("127.0.0.1",), client=False)
    cert_dir = work / "certs"
    metrics_certs = work / "etc-upper" / KUEUE_METRICS_CERTS
    (work / "etc-work").mkdir(parents=True, exist_ok=True, mode=0o700)
    for directory in (cert_dir, metrics_certs):
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        shutil.copyfile(serving.cert, directory / "tls.crt")
        shutil.copyfile(serving.key, directory / "tls.key")

    for crds in integration_crds():
        install_crds(api, crds)
    install_kueue_crds(api, assets, url, pki.ca_pem)
    ensure_namespace(api, KUEUE_NAMESPACE)
    (role,) = [d for d in yaml_documents(assets / "rbac" / "role.yaml") if d["metadata"]["name"] == "manager-role"]
    # And the Role its kustomize binds in its own namespace: the Secrets there (it watches them).
    (secrets,) = yaml_documents(assets / "rbac" / "manager_secrets_role.yaml")
    cluster.bind_service_account(KUEUE_NAMESPACE, "kueue", secrets, cluster.workdir / "kueue-secrets.kubeconfig")
    kubeconfig = cluster.bind_service_account(KUEUE_NAMESPACE, "kueue", role, cluster.workdir / "kueue.kubeconfig")
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(kueue_configuration(webhook_port, cert_dir, health_port, metrics_port)))

    overlay = 'mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1,workdir=$2" /etc && shift 2 && exec "$@"'
    process = Process(
        "kueue",
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", overlay, "sh",
         str(work / "etc-upper"), str(work / "etc-work"),
         str(bin_dir(component) / "kueue"), f"--config={config}", f"--kubeconfig={kubeconfig}"],
        cluster.workdir / "logs" / "kueue.log",
    )  # fmt: skip
    process.start()

    def ready() -> bool:
        connection = http.client.HTTPConnection("127.0.0.1", health_port, timeout=5)
        try:
            connection.request("GET", "/readyz")
            return connection.getresponse().status == 200
        finally:
            connection.close()

    # Its webhooks are registered once it serves them, and removed if it does not answer: they
    # fail closed, and would refuse every pod of the session's later tests.
    webhooks = kueue_webhook_configurations(assets, url, pki.ca_pem)
    try:
        wait_for("kueue's webhook server", ready, 90, process)
        for configuration in webhooks:
            api.apply_object(f"/apis/admissionregistration.k8s.io/v1/{WEBHOOK_KINDS[configuration['kind']]}",
                             configuration)  # fmt: skip
        wait_for("kueue's webhooks answering the apiserver", lambda: kueue_dry_run(api), 60, process)
    except BaseException:
        process.stop()
        for configuration in webhooks:
            api.delete(f"/apis/admissionregistration.k8s.io/v1/{WEBHOOK_KINDS[configuration['kind']]}/"
                       f"{configuration['metadata']['name']}")  # fmt: skip
        raise
    return process


# --- JobSet and Kubeflow Trainer -------------------------------------------------------------

JOBSET_NAMESPACE = "jobset-system"
TRAINER_NAMESPACE = "kubeflow-system"


def _health(port: int) -> bool:
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/readyz")
        return connection.getresponse().status == 200
    finally:
        connection.close()


def _serving_pair(cluster: Any, name: str, directory: Path) -> None:
    """A webhook serving certificate for 127.0.0.1 signed by the test CA, as ``tls.crt`` and
    ``tls.key`` in ``directory``: both managers start their webhook server whatever their
    configuration says, and exit without one. No webhook configuration points at them (the
    product refuses what they would, before it creates anything)."""
    import shutil

    serving = cluster.plane.pki.issue(name, name, server_ips=("127.0.0.1",), client=False)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    shutil.copyfile(serving.cert, directory / "tls.crt")
    shutil.copyfile(serving.key, directory / "tls.key")


def start_jobset(cluster: Any) -> Process:
    """The JobSet controller with its CRD and ClusterRole: no leader election (on by default, and
    out of cluster it has no namespace to elect in), no certificate management, its webhook
    server, health and metrics on ports of its own."""
    from tests.cluster.controlplane import free_port

    component = COMPONENTS["jobset"]
    if not is_built(component):
        raise RuntimeError("jobset is not built: run `make cluster-build`")
    assets = assets_dir(component) / "config" / "components"
    api = cluster.api()
    install_crds(api, [assets / "crd" / "bases" / "jobset.x-k8s.io_jobsets.yaml"])
    (role,) = [d for d in yaml_documents(assets / "rbac" / "role.yaml") if d["kind"] == "ClusterRole"]
    ensure_namespace(api, JOBSET_NAMESPACE)
    kubeconfig = cluster.bind_service_account(JOBSET_NAMESPACE, "jobset-controller", role,
                                              cluster.workdir / "jobset.kubeconfig")  # fmt: skip
    work = cluster.workdir / "jobset"
    _serving_pair(cluster, "jobset-webhook", work / "certs")
    health = free_port()
    config = {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": free_port(), "certDir": str(work / "certs")},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        "clientConnection": {"qps": 50, "burst": 100},
    }
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    process = Process(
        "jobset",
        [str(bin_dir(component) / "jobset"), f"--config={work / 'config.yaml'}", f"--kubeconfig={kubeconfig}"],
        cluster.workdir / "logs" / "jobset.log",
    )
    process.start()
    wait_for("the JobSet controller ready", lambda: _health(health), 90, process)
    return process


def start_trainer(cluster: Any) -> Process:
    """The Kubeflow Trainer v2 controller manager with its CRDs and ClusterRole, after JobSet
    (it watches JobSets, and exits when their CRD is missing). It has no setting for its
    webhook certificate's directory: controller-runtime's default under ``$TMPDIR``, here a
    directory of the cluster's own."""
    from tests.cluster.controlplane import free_port

    component = COMPONENTS["trainer"]
    if not is_built(component):
        raise RuntimeError("trainer is not built: run `make cluster-build`")
    cluster.controller("jobset")
    assets = assets_dir(component) / "manifests" / "base"
    api = cluster.api()
    install_crds(api, sorted((assets / "crds").glob("*.yaml")))
    if is_built(COMPONENTS["volcano"]):  # its Volcano plugin watches PodGroups only if they exist at start
        volcano_crds = assets_dir(COMPONENTS["volcano"]) / "installer" / "helm" / "chart" / "volcano" / "crd" / "bases"
        install_crds(api, [volcano_crds / "scheduling.volcano.sh_podgroups.yaml"])
    (role,) = [d for d in yaml_documents(assets / "rbac" / "role.yaml") if d["kind"] == "ClusterRole"]
    ensure_namespace(api, TRAINER_NAMESPACE)
    kubeconfig = cluster.bind_service_account(TRAINER_NAMESPACE, "kubeflow-trainer", role,
                                              cluster.workdir / "trainer.kubeconfig")  # fmt: skip
    work = cluster.workdir / "trainer"
    _serving_pair(cluster, "trainer-webhook", work / "tmp" / "k8s-webhook-server" / "serving-certs")
    health = free_port()
    config = {
        "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
        "kind": "Configuration",
        "certManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": free_port()},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        "statusServer": {"port": free_port()},
        "clientConnection": {"qps": 50, "burst": 100},
    }
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    process = Process(
        "trainer",
        [str(bin_dir(component) / "trainer-controller-manager"), f"--config={work / 'config.yaml'}",
         f"--kubeconfig={kubeconfig}"],
        cluster.workdir / "logs" / "trainer.log",
        env=dict(os.environ, TMPDIR=str(work / "tmp")),
    )  # fmt: skip
    process.start()
    wait_for("the Trainer controller manager ready", lambda: _health(health), 120, process)
    return process
