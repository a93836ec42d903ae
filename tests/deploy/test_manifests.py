"""Offline checks of the Kubernetes deployment (``deploy/kubernetes``, docs/deploy-kubernetes.md).

No cluster and no network: every manifest (multi-document files too) and the kernel pod
template, rendered the way gateway-provisioners' ``launch_kubernetes.py`` renders it, are
validated against the Kubernetes JSON schemas that ``kubernetes-validate`` ships (strict: an
unknown field fails). Then what the deployment promises: kustomization.yaml and the files agree,
the pods are sandboxed (non-root, read-only root, no service-account token where none is
needed), kernel pods reach nothing but the gateway unless their channel allows the network and
never PostgreSQL, which the bot reaches, and the bot's config.yaml matches the manifests: its
replicas run one Discord shard each, share the database named by a Secret that ships no real
password, and stop within their pods' grace, one at a time.
"""

from __future__ import annotations

import ipaddress
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jinja2
import kubernetes_validate
import pytest
import yaml

from bot.config import parse_settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
KERNELSPEC = DEPLOY / "images" / "kernel-gateway" / "kernelspec" / "python3"
TEMPLATE = KERNELSPEC / "scripts" / "kernel-pod.yaml.j2"
CONFIG = DEPLOY / "config" / "config.yaml"
POSTGRES_SECRET = DEPLOY / "examples" / "postgres-secret.yaml"
GUIDE = ROOT / "docs" / "deploy-kubernetes.md"
#: The oldest Kubernetes release these manifests are meant for, and the newest schemas shipped.
K8S_VERSIONS = ("1.29", kubernetes_validate.latest_version())

BOT_UID = 10001
WORKSPACE = "/data/workspaces/0123456789abcdef0123456789abcdef"


# --- loading -------------------------------------------------------------------------------


def manifest_files() -> list[Path]:
    """The files kustomize reads as resources: every YAML file at the top of deploy/kubernetes
    (config/ holds generator input, images/ the image build contexts)."""
    return sorted(p for p in DEPLOY.glob("*.y*ml") if p.name != "kustomization.yaml")


def documents() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in manifest_files():
        for index, doc in enumerate(yaml.safe_load_all(path.read_text(encoding="utf-8"))):
            if doc is not None:
                yield f"{path.name}#{index}:{doc.get('kind')}/{doc.get('metadata', {}).get('name')}", doc


DOCS = dict(documents())


def find(kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in DOCS.values() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in DOCS.values() if d["kind"] == kind]


def render_kernel_pod(**env: str) -> str:
    """The pod YAML as gateway-provisioners renders it (launch_kubernetes.py,
    generate_kernel_pod_yaml): every KERNEL_* variable of the kernel start, lower-cased and
    parsed with yaml.safe_load, into a jinja2 environment with trim_blocks and lstrip_blocks
    (autoescape is off for a ``.j2`` name)."""
    variables = {
        "KERNEL_ID": "5f0c9a1e-2b7d-4c1e-9a55-0c6f4b2f7a10",
        "KERNEL_USERNAME": "gateway",
        "KERNEL_POD_NAME": "gateway-5f0c9a1e-2b7d-4c1e-9a55-0c6f4b2f7a10",
        "KERNEL_NAMESPACE": "threadbook",
        "KERNEL_IMAGE": "registry.example.com/threadbook/kernel:0.1.0",
        "KERNEL_EXECUTOR_IMAGE": "registry.example.com/threadbook/kernel:0.1.0",
        "KERNEL_SERVICE_ACCOUNT_NAME": "threadbook-kernel",
        "KERNEL_UID": "1000",  # the provisioner's defaults: the template must not use them
        "KERNEL_GID": "100",
        "KERNEL_LANGUAGE": "python",
        "KERNEL_NAME": "python3",
        "KERNEL_WORKING_DIR": WORKSPACE,
        "KERNEL_NETWORK": "false",
    }
    variables.update(env)
    keywords = {name.lower(): yaml.safe_load(value) for name, value in variables.items() if name.startswith("KERNEL_")}
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE.parent),
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=jinja2.select_autoescape(disabled_extensions=("j2", "yaml"), default_for_string=True, default=True),
    )
    return environment.get_template(TEMPLATE.name).render(**keywords)


def kernel_pod(**env: str) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(render_kernel_pod(**env)) if d]
    assert [d["kind"] for d in docs] == ["Pod"], "launch_kubernetes.py creates one Pod per kernel"
    pod: dict[str, Any] = docs[0]
    return pod


def validate(doc: dict[str, Any]) -> None:
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = "/".join(str(p) for p in exc.path)
            pytest.fail(f"Kubernetes {version}: {doc['kind']}/{doc['metadata']['name']}: {path}: {exc.message}")


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "only matchLabels selectors are evaluated here"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = (
        doc["spec"]["template"]["spec"] if doc["kind"] in ("Deployment", "StatefulSet") else doc["spec"]
    )
    return spec


# --- schemas and kustomize -------------------------------------------------------------------


def test_there_are_manifests() -> None:
    kinds = {d["kind"] for d in DOCS.values()}
    assert {
        "Deployment",
        "StatefulSet",
        "Service",
        "PersistentVolumeClaim",
        "NetworkPolicy",
        "Role",
        "RoleBinding",
        "PodDisruptionBudget",
    } <= kinds


@pytest.mark.parametrize("name", sorted(DOCS))
def test_manifest_matches_the_kubernetes_schema(name: str) -> None:
    validate(DOCS[name])


@pytest.mark.parametrize("network", ["false", "true"])
@pytest.mark.parametrize("workspace", [WORKSPACE, "/data/workspaces/.warm/4be0a2c7"])
def test_kernel_pod_template_renders_a_valid_pod(network: str, workspace: str) -> None:
    pod = kernel_pod(KERNEL_NETWORK=network, KERNEL_WORKING_DIR=workspace)
    validate(pod)
    container = pod["spec"]["containers"][0]
    assert container["workingDir"] == workspace
    assert pod["metadata"]["labels"]["kernel_id"] == "5f0c9a1e-2b7d-4c1e-9a55-0c6f4b2f7a10"
    assert pod["metadata"]["labels"]["component"] == "kernel"  # the provisioner's selector
    assert pod["metadata"]["namespace"] == "threadbook"


@pytest.mark.parametrize(
    "workspace",
    [
        "/data/workspaces/../threadbook.db",
        "/data/workspaces/..",
        "/data/workspaces/",
        "/data/workspaces",
        "/data",
        "/etc",
        "/data/workspaces/a/b/c",
        "/data/workspaces//a",
        '/data/workspaces/a"b',
        "/data/workspaces/a\nb",
        "data/workspaces/abc",
    ],
)
def test_kernel_pod_template_refuses_a_working_dir_outside_the_workspaces(workspace: str) -> None:
    with pytest.raises(jinja2.UndefinedError, match="kernel_working_dir_must_be"):
        render_kernel_pod(KERNEL_WORKING_DIR=workspace)


def test_kernel_pod_template_refuses_a_start_without_working_dir() -> None:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE.parent), trim_blocks=True, lstrip_blocks=True
    )
    with pytest.raises(jinja2.UndefinedError):
        environment.get_template(TEMPLATE.name).render(kernel_id="x", kernel_network=False)


def test_kustomization_lists_exactly_the_manifest_files() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text(encoding="utf-8"))
    assert kustomization["kind"] == "Kustomization"
    assert kustomization["namespace"] == "threadbook"
    listed = kustomization["resources"]
    assert len(listed) == len(set(listed)), "a resource is listed twice"
    for entry in listed:
        assert (DEPLOY / entry).is_file(), f"kustomization.yaml lists {entry}, which does not exist"
    assert sorted(listed) == sorted(p.name for p in manifest_files()), "every manifest file is listed, and only those"
    for generator in kustomization.get("configMapGenerator", []):
        for entry in generator.get("files", []):
            source = entry.split("=", 1)[-1]
            assert (DEPLOY / source).is_file(), f"configMapGenerator {generator['name']}: {source} does not exist"
    for doc in DOCS.values():
        assert doc["metadata"].get("namespace") in (None, "threadbook"), "kustomize sets the namespace"


KUSTOMIZE = shutil.which("kubectl") or shutil.which("kustomize")


@pytest.mark.skipif(KUSTOMIZE is None, reason="neither kubectl nor kustomize on PATH")
def test_kustomize_build_is_valid() -> None:
    assert KUSTOMIZE is not None
    command = (
        [KUSTOMIZE, "kustomize", str(DEPLOY)]
        if Path(KUSTOMIZE).name == "kubectl"
        else [KUSTOMIZE, "build", str(DEPLOY)]
    )
    built = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert built.returncode == 0, built.stderr
    docs = [d for d in yaml.safe_load_all(built.stdout) if d]
    for doc in docs:
        validate(doc)
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "threadbook"
    config_maps = [d for d in docs if d["kind"] == "ConfigMap"]
    bot_config = next(d for d in config_maps if d["metadata"]["name"].startswith("threadbook-config-"))
    assert bot_config["data"]["config.yaml"] == CONFIG.read_text(encoding="utf-8")
    gateway_settings = next(d for d in config_maps if d["metadata"]["name"].startswith("kernel-gateway-settings-"))
    assert gateway_settings["data"]["GP_IMAGE_NAME"]


# --- the sandbox -----------------------------------------------------------------------------


def assert_hardened(spec: dict[str, Any], what: str) -> None:
    pod_security = spec.get("securityContext", {})
    assert pod_security.get("runAsNonRoot") is True, f"{what}: runAsNonRoot"
    assert pod_security.get("runAsUser", 0) != 0, f"{what}: runAsUser"
    assert pod_security.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"{what}: seccomp"
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC"), what
    for container in spec["containers"] + spec.get("initContainers", []):
        security = container.get("securityContext", {})
        assert security.get("runAsNonRoot", pod_security.get("runAsNonRoot")) is True, f"{what}: runAsNonRoot"
        assert security.get("readOnlyRootFilesystem") is True, f"{what}/{container['name']}: readOnlyRootFilesystem"
        assert security.get("allowPrivilegeEscalation") is False, (
            f"{what}/{container['name']}: allowPrivilegeEscalation"
        )
        assert security.get("capabilities", {}).get("drop") == ["ALL"], f"{what}/{container['name']}: capabilities"
        assert not security.get("privileged"), what
        mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
        assert "/tmp" in mounts, f"{what}/{container['name']}: a writable /tmp (emptyDir)"
        assert container["resources"]["limits"]["memory"], what
    for volume in spec.get("volumes", []):
        assert "hostPath" not in volume, f"{what}: hostPath volume {volume['name']}"


def test_bot_is_sandboxed() -> None:
    spec = pod_spec(find("StatefulSet", "threadbook-bot"))
    assert_hardened(spec, "bot")
    assert spec["automountServiceAccountToken"] is False
    assert find("ServiceAccount", spec["serviceAccountName"])["automountServiceAccountToken"] is False


def test_gateway_is_sandboxed_and_holds_only_pod_rights() -> None:
    spec = pod_spec(find("Deployment", "kernel-gateway"))
    assert_hardened(spec, "kernel gateway")
    assert find("Deployment", "kernel-gateway")["spec"]["replicas"] == 1
    # It needs its token (it creates the kernel pods); that token may touch pods only.
    account = spec["serviceAccountName"]
    bindings = [b for b in of_kind("RoleBinding") if any(s["name"] == account for s in b["subjects"])]
    assert [b["roleRef"]["kind"] for b in bindings] == ["Role"], "a namespaced Role, no ClusterRole"
    role = find("Role", bindings[0]["roleRef"]["name"])
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete", "get", "list", "watch"]}
    ]
    assert not of_kind("ClusterRole") and not of_kind("ClusterRoleBinding")
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    assert env["KG_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "threadbook-secrets"
    assert env["GP_MIRROR_WORKING_DIRS"]["value"] == "True", "gateway-provisioners drops KERNEL_WORKING_DIR otherwise"
    assert env["KG_LIST_KERNELS"]["value"] == "True"
    assert env["GP_DEFAULT_KERNEL_SERVICE_ACCOUNT_NAME"]["value"] == "threadbook-kernel"


@pytest.mark.parametrize("network", ["false", "true"])
def test_kernel_pod_is_sandboxed(network: str) -> None:
    pod = kernel_pod(KERNEL_NETWORK=network)
    spec = pod["spec"]
    assert_hardened(spec, "kernel pod")
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsUser"] == BOT_UID, "the bot's uid: it owns the workspaces (mode 0700)"
    assert spec["restartPolicy"] == "Never"
    account = find("ServiceAccount", spec["serviceAccountName"])
    assert account["automountServiceAccountToken"] is False
    assert not [
        b for b in of_kind("RoleBinding") if any(s["name"] == account["metadata"]["name"] for s in b["subjects"])
    ]
    limits = spec["containers"][0]["resources"]["limits"]
    assert limits["memory"] == "2Gi" and limits["cpu"]
    # One folder of the shared volume: this thread's, at the bot's path; nothing else persistent.
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v
    }
    assert list(claims.values()) == ["threadbook-shared"]
    assert all("emptyDir" in v or "persistentVolumeClaim" in v for v in spec["volumes"])
    mounts = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] in claims]
    assert mounts == [
        {"name": "workspace", "mountPath": WORKSPACE, "subPath": "workspaces/" + WORKSPACE.rsplit("/", 1)[1]}
    ]


def test_kernel_pod_ignores_identity_and_volumes_sent_by_the_client() -> None:
    pod = kernel_pod(
        KERNEL_UID="0",
        KERNEL_GID="0",
        KERNEL_SERVICE_ACCOUNT_NAME="default",
        KERNEL_VOLUMES="[{name: root, hostPath: {path: /}}]",
        KERNEL_VOLUME_MOUNTS="[{name: root, mountPath: /host}]",
        KERNEL_MEMORY_LIMIT="64Gi",
    )
    spec = pod["spec"]
    assert spec["securityContext"]["runAsUser"] == BOT_UID
    assert spec["serviceAccountName"] == "threadbook-kernel"
    assert {v["name"] for v in spec["volumes"]} == {"workspace", "tmp", "shm"}
    assert spec["containers"][0]["resources"]["limits"]["memory"] == "2Gi"


# --- the network -----------------------------------------------------------------------------


def policies_for(labels: dict[str, str], policy_type: str) -> list[dict[str, Any]]:
    return [
        p
        for p in of_kind("NetworkPolicy")
        if matches(p["spec"]["podSelector"], labels) and policy_type in p["spec"]["policyTypes"]
    ]


def gateway_labels() -> dict[str, str]:
    labels: dict[str, str] = find("Deployment", "kernel-gateway")["spec"]["template"]["metadata"]["labels"]
    return labels


def bot_labels() -> dict[str, str]:
    labels: dict[str, str] = find("StatefulSet", "threadbook-bot")["spec"]["template"]["metadata"]["labels"]
    return labels


def test_kernel_pod_without_network_reaches_only_the_gateway() -> None:
    labels = kernel_pod(KERNEL_NETWORK="false")["metadata"]["labels"]
    egress = policies_for(labels, "Egress")
    assert egress, "no NetworkPolicy restricts the kernel pods' egress"
    for policy in egress:
        for rule in policy["spec"].get("egress", []):
            assert rule.get("to"), f"{policy['metadata']['name']}: an egress rule without `to` allows everything"
            for peer in rule["to"]:
                assert set(peer) == {"podSelector"}, f"{policy['metadata']['name']}: egress beyond pods: {peer}"
                assert matches(peer["podSelector"], gateway_labels())
            assert rule.get("ports") == [{"protocol": "TCP", "port": 8877}]
    ingress = policies_for(labels, "Ingress")
    assert ingress
    for policy in ingress:
        for rule in policy["spec"].get("ingress", []):
            assert rule.get("from") and all(
                set(p) == {"podSelector"} and matches(p["podSelector"], gateway_labels()) for p in rule["from"]
            )


def test_only_kernel_pods_of_network_channels_get_the_internet() -> None:
    allowed = kernel_pod(KERNEL_NETWORK="true")["metadata"]["labels"]
    denied = kernel_pod(KERNEL_NETWORK="false")["metadata"]["labels"]
    extra = [p for p in policies_for(allowed, "Egress") if p not in policies_for(denied, "Egress")]
    assert [p["metadata"]["name"] for p in extra] == ["kernels-network-allowed"]
    blocks = [peer["ipBlock"] for rule in extra[0]["spec"]["egress"] for peer in rule["to"] if "ipBlock" in peer]
    v4 = next(b for b in blocks if b["cidr"] == "0.0.0.0/0")
    for private in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"):
        assert private in v4["except"], f"network-allowed kernels must not reach {private}"
    # Only a YAML true opens the network (the launcher parses KERNEL_* values with yaml.safe_load).
    for value in ("false", "no", "off", "0", "1", "", "allowed", "'true'"):
        assert kernel_pod(KERNEL_NETWORK=value)["metadata"]["labels"]["threadbook.io/network"] == "denied", value


def test_gateway_api_is_reachable_only_from_the_bot() -> None:
    policies = policies_for(gateway_labels(), "Ingress")
    assert policies
    kernel = kernel_pod(KERNEL_NETWORK="true")["metadata"]["labels"]
    for policy in policies:
        for rule in policy["spec"]["ingress"]:
            ports = {p["port"] for p in rule["ports"]}
            for peer in rule["from"]:
                if matches(peer["podSelector"], kernel):
                    assert ports == {8877}, "kernel pods reach the response port only, never the API"
                else:
                    assert matches(peer["podSelector"], bot_labels()) and ports == {8888}


#: A pod elsewhere in the cluster: (its namespace, its labels).
Pod = tuple[str, dict[str, str]]


def peer_matches(peer: dict[str, Any], address: str, pod: Pod | None) -> bool:
    if "ipBlock" in peer:
        ip = ipaddress.ip_address(address)
        block = ipaddress.ip_network(peer["ipBlock"]["cidr"])
        excepted = [ipaddress.ip_network(e) for e in peer["ipBlock"].get("except", [])]
        return (
            ip.version == block.version
            and ip in block
            and not any(ip.version == e.version and ip in e for e in excepted)
        )
    if pod is None:
        return False
    namespace, labels = pod
    if "namespaceSelector" in peer:
        in_namespace = matches(peer["namespaceSelector"], {"kubernetes.io/metadata.name": namespace})
    else:
        in_namespace = namespace == "threadbook"
    return in_namespace and matches(peer.get("podSelector", {}), labels)


def may_reach(source: dict[str, str], port: int, address: str, pod: Pod | None = None, protocol: str = "TCP") -> bool:
    """Whether the egress policies let the pod labelled ``source`` (in this namespace) open
    ``port`` on ``address``, which is ``pod``'s address when it is a pod. Where network plugins
    differ this errs towards "reachable": an ipBlock is taken to match pod addresses as well
    (Calico does, Cilium does not)."""
    policies = policies_for(source, "Egress")
    if not policies:
        return True
    for policy in policies:
        for rule in policy["spec"].get("egress", []):
            ports = rule.get("ports")
            if ports is not None and not any(
                p.get("protocol", "TCP") == protocol and p.get("port") == port for p in ports
            ):
                continue
            if "to" not in rule or any(peer_matches(peer, address, pod) for peer in rule["to"]):
                return True
    return False


def postgres_port() -> int:
    url = yaml.safe_load(POSTGRES_SECRET.read_text(encoding="utf-8"))["stringData"]["url"]
    return urlsplit(url).port or 5432


#: Where PostgreSQL may live: a managed service's private address (IPv4, IPv6), and the pods
#: of an operator (CloudNativePG) in a namespace of their own, or in this one.
POSTGRES_PLACES: list[tuple[str, Pod | None]] = [
    ("10.20.0.5", None),
    ("fd12:3456::5", None),
    ("10.244.3.9", ("databases", {"cnpg.io/cluster": "threadbook", "cnpg.io/instanceRole": "primary"})),
    ("10.244.1.9", ("threadbook", {"cnpg.io/cluster": "threadbook", "cnpg.io/instanceRole": "primary"})),
]


@pytest.mark.parametrize(("address", "pod"), POSTGRES_PLACES)
def test_the_bot_reaches_postgres_and_kernel_pods_do_not(address: str, pod: Pod | None) -> None:
    port = postgres_port()
    assert may_reach(bot_labels(), port, address, pod), "the bot must reach PostgreSQL"
    for network in ("false", "true"):
        kernel = kernel_pod(KERNEL_NETWORK=network)["metadata"]["labels"]
        assert not may_reach(kernel, port, address, pod), f"a kernel pod (network: {network}) reaches PostgreSQL"


def test_the_bot_reaches_everything_else_it_needs() -> None:
    gateway = find("Service", "kernel-gateway")["spec"]["ports"][0]["port"]
    assert may_reach(bot_labels(), gateway, "10.244.1.2", ("threadbook", gateway_labels()))
    assert may_reach(bot_labels(), 53, "10.96.0.10", protocol="UDP") and may_reach(bot_labels(), 53, "169.254.20.10")
    settings = parse_settings(yaml.safe_load(CONFIG.read_text(encoding="utf-8")), env=bot_env(pod_index=0))
    # The LLM, Slack's Web API, Discord (REST and gateway: https and wss) at public addresses.
    for url in (settings.llm.base_url, settings.slack.api_url, "https://discord.com/api", "wss://gateway.discord.gg"):
        parts = urlsplit(url)
        port = parts.port or {"https": 443, "wss": 443}[parts.scheme]
        assert may_reach(bot_labels(), port, "203.0.113.10"), f"the bot's egress policy blocks {url}"
        assert may_reach(bot_labels(), port, "2001:db8::10"), f"the bot's egress policy blocks {url} (IPv6)"


# --- the bot's config and the images agree with the manifests --------------------------------


def bot_env(pod_index: int) -> dict[str, str]:
    """The bot's environment as Kubernetes would give it to replica ``pod_index``: literal values
    as written, the pod index from its label, secrets as fakes (the storage URL a valid one)."""
    env: dict[str, str] = {}
    for entry in bot_container()["env"]:
        source = entry.get("valueFrom", {})
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        elif source.get("fieldRef", {}).get("fieldPath") == "metadata.labels['apps.kubernetes.io/pod-index']":
            env[entry["name"]] = str(pod_index)
        elif "secretKeyRef" in source:
            env[entry["name"]] = (
                "postgresql://bot:pw@db:5432/threadbook" if entry["name"] == "THREADBOOK_STORAGE_URL" else "x"
            )
        else:
            raise AssertionError(f"unexpected env source for {entry['name']}: {source}")
    return env


def test_every_variable_the_config_needs_is_in_the_bot_env() -> None:
    values = yaml.safe_dump(yaml.safe_load(CONFIG.read_text(encoding="utf-8")))  # comments left out
    required = set(re.findall(r"\$\{([A-Za-z0-9_]+)\}", values))  # ${VAR} without a default
    defined = {e["name"] for e in bot_container()["env"]}
    assert required <= defined, f"config.yaml needs {sorted(required - defined)}, which the bot's env lacks"


def test_replicas_run_one_discord_shard_each_and_share_postgres() -> None:
    bot = find("StatefulSet", "threadbook-bot")
    replicas = bot["spec"]["replicas"]
    assert replicas >= 2 and bot["spec"]["podManagementPolicy"] == "Parallel"
    governing = find("Service", bot["spec"]["serviceName"])
    assert governing["spec"]["clusterIP"] == "None" and matches(
        {"matchLabels": governing["spec"]["selector"]}, bot["spec"]["template"]["metadata"]["labels"]
    )
    raw = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    shards: set[int] = set()
    for index in range(replicas):
        settings = parse_settings(raw, env=bot_env(pod_index=index))
        assert settings.discord.shard_count == replicas, "discord.shard_count must equal the replica count"
        assert settings.discord.shard_ids == (index,), "a replica runs the shard of its pod index"
        shards.update(settings.discord.shard_ids)
        assert settings.storage.resolved_url == "postgresql://bot:pw@db:5432/threadbook"
    assert shards == set(range(replicas)), "the replicas together run every shard, each its own"
    url = next(e for e in bot_container()["env"] if e["name"] == "THREADBOOK_STORAGE_URL")
    assert url["valueFrom"]["secretKeyRef"] == {"name": "threadbook-postgres", "key": "url"}
    # Slack's Events API: one Service (one public URL behind the Ingress) over every replica.
    events = find("Service", "threadbook-bot")
    assert events["spec"].get("clusterIP") != "None"
    assert matches({"matchLabels": events["spec"]["selector"]}, bot["spec"]["template"]["metadata"]["labels"])
    settings = parse_settings(raw, env=bot_env(pod_index=0))
    assert [p["port"] for p in events["spec"]["ports"]] == [settings.slack.http_port]


def test_the_postgres_secret_is_an_example_kubectl_apply_never_writes() -> None:
    secret = yaml.safe_load(POSTGRES_SECRET.read_text(encoding="utf-8"))
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(secret, version, strict=True)
    assert secret["kind"] == "Secret" and secret["metadata"]["name"] == "threadbook-postgres"
    url = urlsplit(secret["stringData"]["url"])
    assert url.scheme == "postgresql" and url.username and url.hostname and url.path.strip("/")
    kustomization = (DEPLOY / "kustomization.yaml").read_text(encoding="utf-8")
    assert "examples" not in kustomization and "Secret" not in {d["kind"] for d in DOCS.values()}
    # The bot takes storage.url from it, and does not start without it.
    reference = next(e for e in bot_container()["env"] if e["name"] == "THREADBOOK_STORAGE_URL")["valueFrom"][
        "secretKeyRef"
    ]
    assert reference["name"] == secret["metadata"]["name"] and reference["key"] in secret["stringData"]
    assert not reference.get("optional", False)


#: What a password may be where one is shown: an obvious placeholder, never a real-looking one.
PLACEHOLDER_PASSWORDS = {"PASSWORD", "CHANGE-ME"}


def test_no_real_looking_database_password_is_shipped() -> None:
    texts = [*manifest_files(), CONFIG, *sorted((DEPLOY / "examples").iterdir()), GUIDE]
    found = 0
    for path in texts:
        for url in re.findall(r"postgres(?:ql)?://[^\s'\"`]+", path.read_text(encoding="utf-8")):
            found += 1
            password = urlsplit(url).password
            assert password is None or password in PLACEHOLDER_PASSWORDS, (
                f"{path.name}: {url} holds a real-looking password"
            )
    assert found, "the example Secret and the guide show the URL's shape"


def test_disruptions_and_shutdown_leave_the_others_answering() -> None:
    bot = find("StatefulSet", "threadbook-bot")
    budget = find("PodDisruptionBudget", "threadbook-bot")
    assert matches(budget["spec"]["selector"], bot["spec"]["template"]["metadata"]["labels"])
    assert budget["spec"]["maxUnavailable"] == 1 < bot["spec"]["replicas"]
    settings = parse_settings(yaml.safe_load(CONFIG.read_text(encoding="utf-8")), env=bot_env(pod_index=0))
    assert "shutdown_grace_s" in yaml.safe_load(CONFIG.read_text(encoding="utf-8"))["ops"], "set, not a default"
    grace = pod_spec(bot)["terminationGracePeriodSeconds"]
    assert grace > settings.ops.shutdown_grace_s + 10, "room after the turns' grace to save variables and sign off"
    assert not matches(budget["spec"]["selector"], gateway_labels()), "the gateway runs one replica: no budget"


def bot_container() -> dict[str, Any]:
    container: dict[str, Any] = pod_spec(find("StatefulSet", "threadbook-bot"))["containers"][0]
    return container


def test_bot_config_loads_and_matches_the_manifests() -> None:
    raw = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    settings = parse_settings(raw, env=bot_env(pod_index=0))
    kernels = settings.kernels
    gateway = find("Service", "kernel-gateway")
    assert kernels.gateway.url == f"http://{gateway['metadata']['name']}:{gateway['spec']['ports'][0]['port']}"
    assert kernels.gateway.kernel_name == "python3" == KERNELSPEC.name
    # Paths: the workspaces on the shared claim (the template's root), scratch on /tmp; the
    # root file system is read-only. State is in PostgreSQL: the bot has no claim of its own.
    mounts = {m["mountPath"]: m["name"] for m in bot_container()["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(find("StatefulSet", "threadbook-bot"))["volumes"]}

    def claim_of(path: Path) -> str:
        owner = max((m for m in mounts if path.is_relative_to(m)), key=len)
        claim: str = volumes[mounts[owner]]["persistentVolumeClaim"]["claimName"]
        return claim

    assert str(kernels.workspace_root) == "/data/workspaces"
    assert '{% set root = "/data/workspaces/" %}' in TEMPLATE.read_text(encoding="utf-8")
    assert claim_of(kernels.workspace_root) == "threadbook-shared"
    assert find("PersistentVolumeClaim", "threadbook-shared")["spec"]["accessModes"] == ["ReadWriteMany"]
    assert kernels.packages.dir.is_relative_to("/tmp") and "emptyDir" in volumes[mounts["/tmp"]]
    assert settings.storage.resolved_url.startswith("postgresql://") and settings.storage.sqlite_path is None
    assert [c["metadata"]["name"] for c in of_kind("PersistentVolumeClaim")] == ["threadbook-shared"]
    assert sorted(
        v["persistentVolumeClaim"]["claimName"] for v in volumes.values() if "persistentVolumeClaim" in v
    ) == ["threadbook-shared"]
    assert "volumeClaimTemplates" not in find("StatefulSet", "threadbook-bot")["spec"], (
        "replicas keep no state of their own"
    )
    config_dir = next(p for p, name in mounts.items() if "configMap" in volumes[name])
    assert volumes[mounts[config_dir]]["configMap"]["name"] == "threadbook-config"
    assert bot_container()["args"][-2:] == ["--config", f"{config_dir}/config.yaml"]


def test_images_agree_with_the_manifests() -> None:
    kernel_dockerfile = (DEPLOY / "images" / "kernel" / "Dockerfile").read_text(encoding="utf-8")
    gateway_dockerfile = (DEPLOY / "images" / "kernel-gateway" / "Dockerfile").read_text(encoding="utf-8")
    assert f"--uid {BOT_UID} " in (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert f"--uid {BOT_UID} " in kernel_dockerfile
    assert pod_spec(find("StatefulSet", "threadbook-bot"))["securityContext"]["runAsUser"] == BOT_UID
    gateway_uid = pod_spec(find("Deployment", "kernel-gateway"))["securityContext"]["runAsUser"]
    assert f"--uid {gateway_uid} " in gateway_dockerfile
    # The launcher in the kernel pod answers the provisioner in the gateway: one version.
    version = re.compile(r"ARG GATEWAY_PROVISIONERS_VERSION=(\S+)")
    assert version.findall(kernel_dockerfile) == version.findall(gateway_dockerfile) != []
    # The command the pod template runs is what the kernel image installs.
    command = kernel_pod()["spec"]["containers"][0]["command"]
    assert command == ["/usr/local/bin/bootstrap-kernel.sh"]
    assert f"COPY --from=launchers {command[0]} {command[0]}" in kernel_dockerfile


def test_kernelspec_uses_the_kubernetes_provisioner() -> None:
    spec = yaml.safe_load((KERNELSPEC / "kernel.json").read_text(encoding="utf-8"))
    provisioner = spec["metadata"]["kernel_provisioner"]
    assert provisioner["provisioner_name"] == "kubernetes-provisioner"
    assert "image_name" not in provisioner.get("config", {}), "the image comes from GP_IMAGE_NAME (kustomization.yaml)"
    launcher = Path(spec["argv"][1])
    assert launcher.name == "launch_kubernetes.py" and launcher.parent.name == "scripts"
    assert launcher.parent.parent == Path("/usr/local/share/jupyter/kernels") / KERNELSPEC.name
    gateway_dockerfile = (DEPLOY / "images" / "kernel-gateway" / "Dockerfile").read_text(encoding="utf-8")
    assert f"{launcher.parent}/{TEMPLATE.name}" in gateway_dockerfile
    assert f"{launcher.parent.parent}/kernel.json" in gateway_dockerfile
