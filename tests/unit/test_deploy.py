"""The deployment files hold together: the Kubernetes manifests validate against the Kubernetes schemas (bundled in
kubernetes-validate), and their images, ports, probes, environment and selectors, the replicas' compose file and
HAProxy's config agree with the code and with each other."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gateway.config.servers import parse_config
from gateway.config.settings import FILE_KEYS, Settings

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
REPLICAS = ROOT / "deploy" / "replicas"
KUBERNETES_VERSION = "1.33"
PROBE_PATHS = {"/healthz", "/readyz"}


def documents() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for path in sorted(KUBERNETES.glob("*.yaml")):
        found.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return found


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in documents() if d["kind"] == kind]


def the_gateway() -> dict[str, Any]:
    (deployment,) = [d for d in of_kind("Deployment") if d["metadata"]["name"] == "manifold"]
    return deployment


def exposed_port() -> int:
    match = re.search(r"^EXPOSE (\d+)$", (ROOT / "Dockerfile").read_text(), re.M)
    assert match is not None
    return int(match.group(1))


def settings_variables() -> set[str]:
    return {f"MANIFOLD_{name.upper()}" for name in Settings.model_fields}


@pytest.mark.parametrize("document", documents(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_each_manifest_is_valid_kubernetes(document: dict[str, Any]) -> None:
    kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_the_gateway_runs_the_image_on_its_port_with_probes_the_code_serves() -> None:
    pod = the_gateway()["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert container["image"] == compose["services"]["manifold"]["image"], "the image the repository builds"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == exposed_port()
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] in PROBE_PATHS and get["port"] in ("http", exposed_port())
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    env = {e["name"]: e for e in container["env"]}
    (configmap,) = of_kind("ConfigMap")
    referenced = set(re.findall(r"\$\{(\w+)", configmap["data"]["manifold.yaml"]))
    unknown = set(env) - settings_variables() - referenced
    assert not unknown, f"variables neither a setting nor named in the config: {unknown}"
    assert env["MANIFOLD_PORT"]["value"] == str(exposed_port())
    assert pod["securityContext"]["runAsUser"] == 10001, "the Dockerfile's user"


def test_secrets_are_read_from_the_secret_and_the_config_from_the_configmap() -> None:
    (container,) = the_gateway()["spec"]["template"]["spec"]["containers"]
    (secret,) = of_kind("Secret")
    for item in container["env"]:
        ref = item.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:
            assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"]
    assert {"MANIFOLD_TOKEN", "MANIFOLD_STORE"} <= {e["name"] for e in container["env"] if "valueFrom" in e}, (
        "a token and the store URL never sit in plain env values"
    )
    assert secret["stringData"]["MANIFOLD_STORE"].startswith("redis://"), "replicas share a Redis store"
    (configmap,) = of_kind("ConfigMap")
    config = yaml.safe_load(configmap["data"]["manifold.yaml"])
    parse_config(config, FILE_KEYS)  # raises ConfigError naming every problem
    mount = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["config"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MANIFOLD_CONFIG"] == f"{mount}/manifold.yaml"


def test_selectors_reach_the_pods() -> None:
    labels = the_gateway()["spec"]["template"]["metadata"]["labels"]
    (service,) = [s for s in of_kind("Service") if s["metadata"]["name"] == "manifold"]
    (budget,) = of_kind("PodDisruptionBudget")
    assert service["spec"]["selector"].items() <= labels.items()
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert budget["spec"]["minAvailable"] < the_gateway()["spec"]["replicas"], "a node can still be drained"
    assert "sessionAffinity" not in service["spec"], "any replica serves any request"
    (redis_service,) = [s for s in of_kind("Service") if s["metadata"]["name"] == "manifold-redis"]
    (secret,) = of_kind("Secret")
    host = secret["stringData"]["MANIFOLD_STORE"].split("//")[1].split(":")[0]
    assert host == redis_service["metadata"]["name"]


def test_the_replicas_compose_file_and_haproxy_agree() -> None:
    compose = yaml.safe_load((REPLICAS / "compose.yaml").read_text())
    services = compose["services"]
    assert {"manifold", "redis", "haproxy"} <= set(services)
    gateway = services["manifold"]
    assert gateway["deploy"]["replicas"] == 3
    assert gateway["environment"]["MANIFOLD_STORE"].startswith("redis://redis:")
    referenced = set(re.findall(r"\$\{(\w+)", (REPLICAS / "manifold.yaml").read_text()))
    assert set(gateway["environment"]) <= settings_variables() | referenced
    for service in services.values():
        check = service.get("healthcheck", {}).get("test")
        assert check is None or check[0] == "CMD-SHELL"
    haproxy = (REPLICAS / "haproxy.cfg").read_text()
    assert re.search(rf"server-template \w+ 3 manifold:{exposed_port()}\b", haproxy)
    assert re.search(r"^\s*balance roundrobin$", haproxy, re.M)
    assert not re.search(r"^\s*(cookie|stick|hash-type|balance source)", haproxy, re.M), "no affinity"
    assert "retry-on conn-failure\n" in haproxy, "a request that reached a replica is never sent again"
    parse_config(yaml.safe_load((REPLICAS / "manifold.yaml").read_text()), FILE_KEYS)
