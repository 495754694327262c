"""Volcano run out of cluster against the test control plane, installed as its Helm chart
installs it with the chart's defaults: its CRDs, the ClusterRole of each component
(vc-webhook-manager, vc-controller-manager, vc-scheduler) bound to a ServiceAccount of its own,
the webhook configurations the chart enables (pointed at the webhook manager on loopback by URL
instead of through a Service), and the scheduler's default actions and plugins.

The chart's templates are read from Volcano's own module (copied beside the binaries by
build.py) and rendered by the small subset of Helm's template language they use; a construct
outside that subset is an error, not a guess.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.build import COMPONENTS, assets_dir, bin_dir, is_built
from tests.cluster.controllers import WEBHOOK_KINDS, client_config, ensure_namespace, install_crds
from tests.cluster.controlplane import Process, free_port, wait_for
from tests.cluster.kubeapi import KubeApi, Obj

NAMESPACE = "volcano-system"
PROCESSES = ("vc-webhook-manager", "vc-controller-manager", "vc-scheduler")
RELEASE = "volcano"
# The chart's defaults (values.yaml): the admissions enabled, no common labels, no extra selector.
ENABLED_ADMISSIONS = (
    "/jobs/mutate,/jobs/validate,/podgroups/validate,/queues/mutate,/queues/validate,/hypernodes/validate,"
    "/cronjobs/validate"
)
_IF = re.compile(r"^\s*\{\{-?\s*if\s+(.*?)\s*-?\}\}\s*$")
_ELSE = re.compile(r"^\s*\{\{-?\s*else\s*-?\}\}\s*$")
_END = re.compile(r"^\s*\{\{-?\s*end\s*-?\}\}\s*$")
_REGEX_MATCH = re.compile(r'^\.Values\.custom\.enabled_admissions \| regexMatch "([^"]+)"$')
_FALSE_VALUES = {".Values.custom.common_labels", ".Values.custom.webhooks_namespace_selector_expressions"}


def chart_dir() -> Path:
    return assets_dir(COMPONENTS["volcano"]) / "installer" / "helm" / "chart" / "volcano"


def _condition(expression: str) -> bool:
    if expression == ".Values.custom.admission_enable":
        return True
    if expression in _FALSE_VALUES:
        return False
    match = _REGEX_MATCH.match(expression)
    if match:
        return match.group(1) in ENABLED_ADMISSIONS.split(",")
    raise ValueError(f"the Volcano chart uses a condition this renderer does not know: {expression!r}")


def render_template(text: str) -> str:
    """The chart's ``if``/``else``/``end`` blocks decided with its default values, and the
    release's name and namespace filled in."""
    out: list[str] = []
    stack: list[tuple[bool, bool]] = []  # (this branch taken, every enclosing branch taken)
    for line in text.splitlines():
        if match := _IF.match(line):
            enclosing = all(taken for taken, _ in stack)
            stack.append((_condition(match.group(1)) if enclosing else False, enclosing))
            continue
        if _ELSE.match(line):
            taken, enclosing = stack.pop()
            stack.append((enclosing and not taken, enclosing))
            continue
        if _END.match(line):
            stack.pop()
            continue
        if not all(taken for taken, _ in stack):
            continue
        line = line.replace("{{ .Release.Name }}", RELEASE).replace("{{ .Release.Namespace }}", NAMESPACE)
        if "{{" in line:
            raise ValueError(f"the Volcano chart uses a template this renderer does not know: {line.strip()!r}")
        out.append(line)
    if stack:
        raise ValueError("unbalanced if/end in the Volcano chart")
    return "\n".join(out) + "\n"


def chart_documents(template: str, kind: str) -> list[Obj]:
    """The ``kind`` documents of one template. webhooks.yaml is rendered whole (its blocks span
    documents); of the others only the ``kind`` documents are, since the Deployments around them
    use values this subset does not know."""
    raw = (chart_dir() / "templates" / template).read_text()
    if template == "webhooks.yaml":
        parts = [render_template(raw)]
    else:
        chosen = [d for d in re.split(r"^---\s*$", raw, flags=re.M) if re.search(rf"^kind: {kind}\s*$", d, re.M)]
        parts = [render_template(part) for part in chosen]
    return [doc for part in parts for doc in yaml.safe_load_all(part) if isinstance(doc, dict) and doc["kind"] == kind]


def webhook_configurations(url: str, ca_bundle: bytes) -> list[Obj]:
    """The chart's webhook configurations, each pointing at ``url`` + its path."""
    configurations = []
    for kind in WEBHOOK_KINDS:
        for config in chart_documents("webhooks.yaml", kind):
            for webhook in config["webhooks"]:
                path = webhook["clientConfig"]["service"]["path"]
                webhook["clientConfig"] = client_config(url + path, ca_bundle)
            configurations.append(config)
    return configurations


def _service_account(cluster: Any, template: str) -> Path:
    (role,) = chart_documents(template, "ClusterRole")
    name = role["metadata"]["name"]
    return cluster.bind_service_account(NAMESPACE, name, role, cluster.workdir / f"{name}.kubeconfig")


def start_volcano(cluster: Any) -> list[Process]:
    """vc-webhook-manager, vc-controller-manager and vc-scheduler, each as its own
    ServiceAccount; returns once the webhooks answer and the scheduler made its default queue."""
    component = COMPONENTS["volcano"]
    if not is_built(component):
        raise RuntimeError("Volcano is not built: run `make cluster-build`")
    api: KubeApi = cluster.api()
    install_crds(api, sorted(chart_dir().glob("**/crd/bases/*.yaml")))
    ensure_namespace(api, NAMESPACE)
    binaries = bin_dir(component)
    logs = cluster.workdir / "logs"
    pki = cluster.plane.pki
    serving = pki.issue("volcano-admission", "volcano-admission", server_ips=("127.0.0.1",), client=False)
    port = free_port()
    for config in webhook_configurations(f"https://127.0.0.1:{port}", pki.ca_pem):
        api.apply_object(f"/apis/admissionregistration.k8s.io/v1/{WEBHOOK_KINDS[config['kind']]}", config)
    loopback = "127.0.0.1"
    admission = Process("vc-webhook-manager", [
        str(binaries / "vc-webhook-manager"), f"--kubeconfig={_service_account(cluster, 'admission.yaml')}",
        f"--enabled-admission={ENABLED_ADMISSIONS}", f"--tls-cert-file={serving.cert}",
        f"--tls-private-key-file={serving.key}", f"--ca-cert-file={pki.ca.cert}",
        f"--webhook-url=https://{loopback}:{port}", f"--listen-address={loopback}", f"--port={port}",
        f"--healthz-address={loopback}:{free_port()}", "--graceful-shutdown-time=1s", "-v=2",
    ], logs / "vc-webhook-manager.log")  # fmt: skip
    controllers = Process("vc-controller-manager", [
        str(binaries / "vc-controller-manager"), f"--kubeconfig={_service_account(cluster, 'controllers.yaml')}",
        "--leader-elect=false", f"--healthz-address={loopback}:{free_port()}",
        f"--listen-address={loopback}:{free_port()}", "-v=2",
    ], logs / "vc-controller-manager.log")  # fmt: skip
    scheduler_conf = chart_dir() / "config" / "volcano-scheduler.conf"
    scheduler = Process("vc-scheduler", [
        str(binaries / "vc-scheduler"), f"--kubeconfig={_service_account(cluster, 'scheduler.yaml')}",
        f"--scheduler-conf={scheduler_conf}", "--leader-elect=false", "--schedule-period=500ms",
        f"--healthz-address={loopback}:{free_port()}", f"--listen-address={loopback}:{free_port()}", "-v=2",
    ], logs / "vc-scheduler.log")  # fmt: skip
    started: list[Process] = []
    try:
        for process in (admission, controllers, scheduler):
            process.start()
            started.append(process)
        # The webhooks answer once a queue is defaulted and validated through them.
        wait_for("Volcano's webhooks", lambda: _dry_run_queue(api), 90, admission)
        wait_for("Volcano's default queue", lambda: _queue_open(api, "default"), 30, scheduler)
    except BaseException:
        for process in reversed(started):
            process.stop()
        raise
    return started


def _dry_run_queue(api: KubeApi) -> bool:
    queue = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "probe"},
             "spec": {"weight": 1}}  # fmt: skip
    created = api.create("/apis/scheduling.volcano.sh/v1beta1/queues?dryRun=All", queue)
    # The mutating webhook gives every queue its state and reclaimable flag.
    return created.get("spec", {}).get("reclaimable") is not None


def _queue_open(api: KubeApi, name: str) -> bool:
    queue = api.get_or_none(f"/apis/scheduling.volcano.sh/v1beta1/queues/{name}")
    return queue is not None and queue.get("status", {}).get("state") == "Open"


def create_queue(api: KubeApi, name: str, capability: dict[str, str] | None = None) -> Obj:
    """A Volcano queue (cluster-scoped); ``capability`` bounds what its jobs may use at once."""
    spec: dict[str, Any] = {"weight": 1, "reclaimable": False}
    if capability:
        spec["capability"] = capability
    queue = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": name}, "spec": spec}
    return api.create("/apis/scheduling.volcano.sh/v1beta1/queues", queue)
