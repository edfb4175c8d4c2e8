"""Checks the cluster deployment files under cluster/: required fields, token auth, no public exposure.

Every YAML document under cluster/ is loaded (multi-document aware) and handed, by kind, to
a small checker that returns a list of problems (empty when the document is fine). The
tests run the checkers on the shipped files, and on broken copies made in memory, so each
check is also seen to catch what it is meant to catch.

Run:  python -m pytest -q tests/test_cluster_manifests.py
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "cluster"

TOKEN_SECRET_KEY = "auth_token"  # the data key KubeRay's authOptions.secretName expects
PUBLIC_CIDRS = ("0.0.0.0/0", "::/0")
PUBLIC_SERVICE_TYPES = {"LoadBalancer", "NodePort"}
# A committed secret would look like one of these: 32+ hex digits, or 40+ base64 characters.
TOKEN_LIKE = re.compile(r"[0-9a-fA-F]{32,}|[A-Za-z0-9+/]{40,}={0,2}")
# KubeRay splices a RayJob's entrypoint unquoted into the submitter's shell command.
SHELL_META = re.compile(r"[;&|`$<>()]")


# ----------------------------------------------------------------------------- loading


def load_manifests() -> dict[str, list[dict]]:
    """Every YAML document under cluster/, by path relative to the repository root."""
    out = {}
    for path in sorted([*CLUSTER.rglob("*.yaml"), *CLUSTER.rglob("*.yml")]):
        with open(path, encoding="utf-8") as f:
            out[path.relative_to(ROOT).as_posix()] = [d for d in yaml.safe_load_all(f) if d is not None]
    return out


def kind_of(doc: dict) -> str:
    """A Kubernetes kind, "CloudFormation", "RayLauncher", or "unknown"."""
    if isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc:
        return doc["kind"]
    if isinstance(doc, dict) and "AWSTemplateFormatVersion" in doc:
        return "CloudFormation"
    if isinstance(doc, dict) and "available_node_types" in doc and "provider" in doc:
        return "RayLauncher"
    return "unknown"


def walk(node, path: str = ""):
    """Yields (dotted path, key, value) for every mapping entry and list item, depth first."""
    if isinstance(node, dict):
        for k, v in node.items():
            p = f"{path}.{k}" if path else str(k)
            yield p, k, v
            yield from walk(v, p)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            p = f"{path}[{i}]"
            yield p, i, v
            yield from walk(v, p)


def strings(node):
    for path, _, v in walk(node):
        if isinstance(v, str):
            yield path, v


# ------------------------------------------------------------------- checks for any document


def exposure_problems(doc: dict) -> list[str]:
    """Anything that would make the cluster reachable from outside its network."""
    problems = []
    for path, v in strings(doc):
        for cidr in PUBLIC_CIDRS:
            if cidr in v:
                problems.append(f"{path}: {cidr} opens a port to the whole internet")
    for path, key, v in walk(doc):
        if key in ("type", "serviceType") and v in PUBLIC_SERVICE_TYPES:
            problems.append(f"{path}: Service type {v} exposes the head outside the cluster")
        if key == "enableIngress" and v is True:
            problems.append(f"{path}: an Ingress exposes the dashboard")
        if key == "hostNetwork" and v is True:
            problems.append(f"{path}: hostNetwork puts Ray's ports on the node's address")
        if key == "hostPort":
            problems.append(f"{path}: hostPort exposes a Ray port on the node's address")
    if kind_of(doc) in ("Ingress", "Route", "Gateway", "HTTPRoute"):
        problems.append(f"{kind_of(doc)}: exposes the cluster outside Kubernetes")
    return problems


def literal_token_problems(doc: dict) -> list[str]:
    """A token written into the file instead of read from a secret store."""
    problems = []
    for path, key, v in walk(doc):
        if isinstance(v, dict) and v.get("name") == "RAY_AUTH_TOKEN" and "value" in v:
            problems.append(f"{path}: RAY_AUTH_TOKEN has a literal value; use valueFrom.secretKeyRef")
    for path, v in strings(doc):
        if TOKEN_LIKE.search(v):
            problems.append(f"{path}: looks like a committed secret: {v[:16]}...")
        for m in re.finditer(r"RAY_AUTH_TOKEN=(\S*)", v):
            if not m.group(1).startswith(('"$(', "$(")):
                problems.append(f"{path}: RAY_AUTH_TOKEN set to a literal; read it from the secret store")
    return problems


# ------------------------------------------------------------------ Ray cluster launcher (AWS)


def _flag(cmd: str, name: str) -> list[str]:
    return re.findall(rf"--{name}(?:=|\s+)(\S+)", cmd)


def _node_setup(cfg: dict, node_type: str) -> list[str]:
    """The setup commands the launcher runs on a node of this type."""
    common = cfg.get("setup_commands", [])
    if node_type == cfg["head_node_type"]:
        return common + cfg.get("head_setup_commands", [])
    spec = cfg["available_node_types"][node_type]
    if "worker_setup_commands" in spec:  # replaces setup_commands + worker_setup_commands
        return spec["worker_setup_commands"]
    return common + cfg.get("worker_setup_commands", [])


def launcher_problems(cfg: dict) -> list[str]:
    """Required fields, CPU-only head, GPU workers, token auth, private dashboard, own security group."""
    problems = []
    for key in ("cluster_name", "provider", "available_node_types", "head_node_type"):
        if key not in cfg:
            problems.append(f"missing {key}")
    if problems:
        return problems
    provider, types, head = cfg["provider"], cfg["available_node_types"], cfg["head_node_type"]
    if not provider.get("type"):
        problems.append("provider.type is not set")
    if head not in types:
        return problems + [f"head_node_type {head!r} is not in available_node_types"]

    if types[head].get("resources", {}).get("CPU") != 0:
        problems.append(f"available_node_types.{head}.resources: the head must have CPU 0 (no work scheduled on it)")
    workers = {k: v for k, v in types.items() if k != head}
    gpu_types = [k for k, v in workers.items() if v.get("resources", {}).get("GPU", 0) >= 1]
    cpu_types = [k for k, v in workers.items() if not v.get("resources", {}).get("GPU")]
    if not gpu_types:
        problems.append("no worker node type with resources GPU >= 1")
    if not cpu_types:
        problems.append("no CPU-only worker node type")
    for name, spec in workers.items():
        lo, hi = spec.get("min_workers"), spec.get("max_workers")
        if lo is None or hi is None or lo > hi:
            problems.append(f"available_node_types.{name}: needs min_workers <= max_workers")

    # Given a security_group block, or a node type without SecurityGroupIds, Ray creates the
    # group itself and always adds SSH from 0.0.0.0/0 to it.
    if "security_group" in provider:
        problems.append("provider.security_group: Ray adds SSH from 0.0.0.0/0 to groups it creates; "
                        "name a prepared group in every node_config.SecurityGroupIds instead")
    for name, spec in types.items():
        if not spec.get("node_config", {}).get("SecurityGroupIds"):
            problems.append(f"available_node_types.{name}.node_config: no SecurityGroupIds, "
                            "so Ray would create a group open to SSH from 0.0.0.0/0")

    # Extras: faiss-gpu on GPU nodes, faiss-cpu elsewhere, never both; one pinned Ray everywhere.
    for name in types:
        setup = " ".join(_node_setup(cfg, name))
        want, never = (".[gpu]", ".[cpu]") if name in gpu_types else (".[cpu]", ".[gpu]")
        if want not in setup or never in setup:
            problems.append(f"{name}: setup must install the project with {want} and not {never}")
        if not re.search(r"\bray\[[^\]]*\]==\d", setup):
            problems.append(f"{name}: setup does not pin the Ray version (nodes would drift)")

    secret_refs = set()
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [c for c in cfg.get(key, []) if "ray start" in c]
        if not starts:
            problems.append(f"{key}: no `ray start` command")
        for cmd in starts:
            if not re.search(r"\bexport\s+RAY_AUTH_MODE=token\b", cmd):
                problems.append(f"{key}: `ray start` without `export RAY_AUTH_MODE=token` in the same command")
            m = re.search(r'RAY_AUTH_TOKEN="?\$\(aws (secretsmanager get-secret-value|ssm get-parameter)([^)]*)\)', cmd)
            if not m:
                problems.append(f"{key}: RAY_AUTH_TOKEN is not read from Secrets Manager or SSM at start")
            else:
                region = _flag(m.group(2), "region")
                if region and region[0] != provider.get("region"):
                    problems.append(f"{key}: reads the token in {region[0]}, the cluster is in {provider.get('region')}")
                secret_refs.update(_flag(m.group(2), "secret-id") + _flag(m.group(2), "name"))
        for cmd in cfg.get(key, []):
            for host in _flag(cmd, "dashboard-host"):
                if host != "127.0.0.1":
                    problems.append(f"{key}: --dashboard-host={host}; keep the dashboard on 127.0.0.1")
    if len(secret_refs) > 1:
        problems.append(f"head and workers read different token secrets: {sorted(secret_refs)}")
    head_start = [c for c in cfg.get("head_start_ray_commands", []) if "ray start" in c]
    if head_start and not any(_flag(c, "dashboard-host") == ["127.0.0.1"] for c in head_start):
        problems.append("head_start_ray_commands: set --dashboard-host=127.0.0.1 explicitly")
    return problems


# ----------------------------------------------------------------- CloudFormation (AWS network)


def _refers_to(value, resource: str) -> bool:
    return value in ({"Ref": resource}, {"Fn::GetAtt": [resource, "GroupId"]}, {"Fn::GetAtt": f"{resource}.GroupId"})


def cloudformation_problems(tpl: dict) -> list[str]:
    """Security groups admit only SSH from a parameter CIDR and traffic from themselves; the token is generated."""
    problems = []
    params, resources = tpl.get("Parameters", {}), tpl.get("Resources", {})
    groups = [n for n, r in resources.items() if r.get("Type") == "AWS::EC2::SecurityGroup"]
    for group in groups:
        rules = [(f"{group}.SecurityGroupIngress[{i}]", r)
                 for i, r in enumerate(resources[group].get("Properties", {}).get("SecurityGroupIngress", []))]
        rules += [(n, r.get("Properties", {})) for n, r in resources.items()
                  if r.get("Type") == "AWS::EC2::SecurityGroupIngress"
                  and _refers_to(r.get("Properties", {}).get("GroupId"), group)]
        ssh = self_rule = False
        for where, rule in rules:
            if _refers_to(rule.get("SourceSecurityGroupId"), group):
                self_rule = True
                continue
            cidr = rule.get("CidrIp")
            is_ssh = (str(rule.get("IpProtocol")), rule.get("FromPort"), rule.get("ToPort")) == ("tcp", 22, 22)
            if not is_ssh or not (isinstance(cidr, dict) and cidr.get("Ref") in params) or set(rule) & {
                    "CidrIpv6", "SourcePrefixListId", "SourceSecurityGroupName"}:
                problems.append(f"{where}: only SSH (22) from the admin CIDR parameter and traffic "
                                f"from the group itself may come in")
                continue
            ssh = True
            param = params[cidr["Ref"]]
            if "Default" in param:
                problems.append(f"Parameters.{cidr['Ref']}: no default admin CIDR; the deployer must name theirs")
            pattern = param.get("AllowedPattern")
            if not pattern or re.fullmatch(pattern, "0.0.0.0/0") or not re.fullmatch(pattern, "203.0.113.7/32"):
                problems.append(f"Parameters.{cidr['Ref']}.AllowedPattern must refuse 0.0.0.0/0 and accept a /32")
        if not ssh:
            problems.append(f"{group}: no SSH rule from the admin CIDR (ray up needs one)")
        if not self_rule:
            problems.append(f"{group}: no rule admitting traffic from the group itself (Ray nodes talk to each other)")
    if not groups:
        problems.append("no AWS::EC2::SecurityGroup")
    for name, r in resources.items():
        if r.get("Type") == "AWS::SecretsManager::Secret" and "SecretString" in r.get("Properties", {}):
            problems.append(f"{name}: a literal SecretString; let AWS generate it (GenerateSecretString)")
    return problems


# ------------------------------------------------------------------------------ KubeRay


def _containers(pod_template: dict) -> list[dict]:
    return (pod_template or {}).get("spec", {}).get("containers", [])


def container_auth_problems(where: str, env: list[dict] | None, secret: str | None) -> list[str]:
    """RAY_AUTH_MODE=token, and RAY_AUTH_TOKEN from the cluster's Secret, never a literal."""
    by_name = {e.get("name"): e for e in env or []}
    problems = []
    if by_name.get("RAY_AUTH_MODE", {}).get("value") != "token":
        problems.append(f"{where}: env RAY_AUTH_MODE must be token")
    token = by_name.get("RAY_AUTH_TOKEN")
    ref = (token or {}).get("valueFrom", {}).get("secretKeyRef")
    if token is None or "value" in token or not ref:
        problems.append(f"{where}: env RAY_AUTH_TOKEN must come from valueFrom.secretKeyRef, never a literal value")
    elif secret and (ref.get("name") != secret or ref.get("key") != TOKEN_SECRET_KEY):
        problems.append(f"{where}: RAY_AUTH_TOKEN must read key {TOKEN_SECRET_KEY} of Secret {secret}, "
                        f"not {ref.get('key')} of {ref.get('name')}")
    return problems


def ray_cluster_spec_problems(spec: dict, where: str, dashboard_on_pod_network: bool = False) -> list[str]:
    """A RayClusterSpec: CPU-only head, a GPU group, token auth on every container, private dashboard.

    Args:
        dashboard_on_pod_network: accept dashboard-host 0.0.0.0 (a RayJob's cluster, whose
            dashboard the operator must reach); otherwise it must be 127.0.0.1.
    """
    problems = []
    head = spec.get("headGroupSpec")
    groups = spec.get("workerGroupSpecs") or []
    if not head:
        return [f"{where}: no headGroupSpec"]
    if not groups:
        problems.append(f"{where}: no workerGroupSpecs")

    auth = spec.get("authOptions") or {}
    secret = auth.get("secretName")
    if auth.get("mode") != "token" or not secret:
        problems.append(f"{where}.authOptions: needs mode token and the secretName of the token Secret")

    params = head.get("rayStartParams") or {}
    if str(params.get("num-cpus")) != "0":
        problems.append(f"{where}.headGroupSpec.rayStartParams: num-cpus must be \"0\" (no work on the head)")
    allowed = {"127.0.0.1", "0.0.0.0"} if dashboard_on_pod_network else {"127.0.0.1"}
    host = params.get("dashboard-host")
    if host is None:  # KubeRay's default is 0.0.0.0
        problems.append(f"{where}.headGroupSpec.rayStartParams: set dashboard-host explicitly (KubeRay defaults to 0.0.0.0)")
    elif host not in allowed:
        problems.append(f"{where}.headGroupSpec.rayStartParams: dashboard-host {host}; must be one of {sorted(allowed)}")
    service_type = head.get("serviceType", "ClusterIP")
    head_svc_type = (head.get("headService") or {}).get("spec", {}).get("type", "ClusterIP")
    if service_type != "ClusterIP" or head_svc_type != "ClusterIP":
        problems.append(f"{where}.headGroupSpec: the head Service must be ClusterIP")

    containers = [(f"{where}.headGroupSpec", c) for c in _containers(head.get("template"))]
    has_gpu_group = has_cpu_group = False
    for g in groups:
        name = g.get("groupName", "?")
        gpus = [c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu") for c in _containers(g.get("template"))]
        if any(n and int(n) >= 1 for n in gpus):
            has_gpu_group = True
        else:
            has_cpu_group = True
        lo, n, hi = g.get("minReplicas", 0), g.get("replicas", 0), g.get("maxReplicas")
        if hi is None or not lo <= n <= hi:
            problems.append(f"{where}.workerGroupSpecs[{name}]: needs minReplicas <= replicas <= maxReplicas")
        containers += [(f"{where}.workerGroupSpecs[{name}]", c) for c in _containers(g.get("template"))]
    if not has_gpu_group:
        problems.append(f"{where}: no worker group whose container limits include nvidia.com/gpu")
    if not has_cpu_group:
        problems.append(f"{where}: no CPU-only worker group")

    for w, c in containers:
        problems += container_auth_problems(f"{w}.{c.get('name', '?')}", c.get("env"), secret)
    if spec.get("enableInTreeAutoscaling"):
        problems += container_auth_problems(f"{where}.autoscalerOptions", (spec.get("autoscalerOptions") or {}).get("env"), secret)
    images = {c.get("image") for _, c in containers}
    if len(images) != 1:
        problems.append(f"{where}: head and workers must run one image (one Ray version), found {sorted(map(str, images))}")
    return problems


def ray_cluster_problems(doc: dict) -> list[str]:
    problems = [] if doc.get("apiVersion") == "ray.io/v1" else ["RayCluster: apiVersion must be ray.io/v1"]
    return problems + ray_cluster_spec_problems(doc.get("spec", {}), "RayCluster.spec")


def _policy_selects(policy: dict, labels: dict) -> bool:
    wanted = policy.get("spec", {}).get("podSelector", {}).get("matchLabels", {})
    return "Ingress" in policy.get("spec", {}).get("policyTypes", ["Ingress"]) and all(
        labels.get(k) == v for k, v in wanted.items())


def ray_job_problems(doc: dict, network_policies: list[dict], root: Path = ROOT) -> list[str]:
    """A RayJob: runs a shipped job file, cleans up, and its cluster passes the cluster checks."""
    problems = [] if doc.get("apiVersion") == "ray.io/v1" else ["RayJob: apiVersion must be ray.io/v1"]
    spec = doc.get("spec", {})
    entrypoint = spec.get("entrypoint", "")
    m = re.search(r"\baugsbert run (\S+\.ya?ml)\b", entrypoint)
    if not m or not m.group(1).startswith("jobs/"):
        problems.append(f"RayJob.spec.entrypoint: must run `augsbert run jobs/<file>.yaml`, got {entrypoint!r}")
    elif not (root / m.group(1)).is_file():
        problems.append(f"RayJob.spec.entrypoint: {m.group(1)} does not exist in the repository")
    if SHELL_META.search(entrypoint):
        problems.append("RayJob.spec.entrypoint: no shell operators; KubeRay splices it unquoted into a shell command")
    if spec.get("shutdownAfterJobFinishes") is not True:
        problems.append("RayJob.spec.shutdownAfterJobFinishes must be true (no idle GPUs left behind)")

    cluster = spec.get("rayClusterSpec")
    if cluster is None and not spec.get("clusterSelector"):
        problems.append("RayJob.spec: needs rayClusterSpec or clusterSelector")
    secret = None
    if cluster is not None:
        problems += ray_cluster_spec_problems(cluster, "RayJob.spec.rayClusterSpec", dashboard_on_pod_network=True)
        secret = (cluster.get("authOptions") or {}).get("secretName")
        head = cluster.get("headGroupSpec", {})
        if (head.get("rayStartParams") or {}).get("dashboard-host") != "127.0.0.1":
            labels = head.get("template", {}).get("metadata", {}).get("labels", {})
            if not any(_policy_selects(p, labels) for p in network_policies):
                problems.append("RayJob.spec.rayClusterSpec: the dashboard is on the pod network, "
                                "but no NetworkPolicy selects the head pod's labels")
    for c in _containers(spec.get("submitterPodTemplate")):
        problems += container_auth_problems(f"RayJob.spec.submitterPodTemplate.{c.get('name', '?')}", c.get("env"), secret)
    return problems


def network_policy_problems(doc: dict) -> list[str]:
    """Ingress limited to named peers: no rule that admits everyone, no all-namespaces selector."""
    spec = doc.get("spec", {})
    problems = []
    if "Ingress" not in spec.get("policyTypes", ["Ingress"]):
        problems.append("NetworkPolicy: policyTypes must include Ingress")
    for i, rule in enumerate(spec.get("ingress", [])):
        peers = rule.get("from") or []
        if not peers:
            problems.append(f"NetworkPolicy.spec.ingress[{i}]: no `from`, so it admits every source")
        for peer in peers:
            if peer.get("namespaceSelector") == {} or "ipBlock" in peer:
                problems.append(f"NetworkPolicy.spec.ingress[{i}]: {peer} admits sources outside the cluster's namespaces")
    return problems


def secret_problems(doc: dict) -> list[str]:
    """A committed Secret may only hold placeholders."""
    values = {**(doc.get("stringData") or {}), **(doc.get("data") or {})}
    problems = [f"Secret {doc.get('metadata', {}).get('name')}: {k} holds a value, not a REPLACE placeholder"
                for k, v in values.items() if "REPLACE" not in str(v).upper()]
    if TOKEN_SECRET_KEY not in values:
        problems.append(f"Secret: no {TOKEN_SECRET_KEY} key (the key KubeRay reads)")
    return problems


# --------------------------------------------------------------------------------- dispatch

KNOWN_KINDS = {"RayLauncher", "CloudFormation", "RayCluster", "RayJob", "Secret", "NetworkPolicy",
               "PersistentVolumeClaim"}


def manifest_problems(manifests: dict[str, list[dict]]) -> list[str]:
    """Every problem in a set of files (path -> documents), each prefixed by its file."""
    policies = [d for docs in manifests.values() for d in docs if kind_of(d) == "NetworkPolicy"]
    problems = []
    for path, docs in manifests.items():
        for doc in docs:
            kind = kind_of(doc)
            found = exposure_problems(doc) + literal_token_problems(doc)
            if kind == "RayLauncher":
                found += launcher_problems(doc)
            elif kind == "CloudFormation":
                found += cloudformation_problems(doc)
            elif kind == "RayCluster":
                found += ray_cluster_problems(doc)
            elif kind == "RayJob":
                found += ray_job_problems(doc, policies)
            elif kind == "Secret":
                found += secret_problems(doc)
            elif kind == "NetworkPolicy":
                found += network_policy_problems(doc)
            elif kind not in KNOWN_KINDS:
                found.append(f"unknown document kind {kind!r}: add a check for it")
            problems += [f"{path}: {p}" for p in found]
    return problems


# ------------------------------------------------------------------------ tests: real files

MANIFESTS = load_manifests()


def _only(kind: str) -> dict:
    docs = [d for ds in MANIFESTS.values() for d in ds if kind_of(d) == kind]
    assert len(docs) == 1, f"expected one {kind} under cluster/, found {len(docs)}"
    return docs[0]


def test_every_expected_file_is_there():
    kinds = [kind_of(d) for docs in MANIFESTS.values() for d in docs]
    for kind in ("RayLauncher", "CloudFormation", "RayCluster", "RayJob", "Secret"):
        assert kind in kinds, f"no {kind} under cluster/"


@pytest.mark.parametrize("path", sorted(MANIFESTS))
def test_shipped_file_passes_every_check(path):
    assert manifest_problems({path: MANIFESTS[path]} | _policies_elsewhere(path)) == []


def _policies_elsewhere(path: str) -> dict:
    """The NetworkPolicy files, which a RayJob's checks look at."""
    return {p: d for p, d in MANIFESTS.items() if p != path and any(kind_of(x) == "NetworkPolicy" for x in d)}


def test_launcher_matches_rays_own_schema():
    """The launcher config validates against the JSON schema shipped inside Ray."""
    import jsonschema
    spec = importlib.util.find_spec("ray")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("ray is not installed")
    schema_path = Path(spec.submodule_search_locations[0]) / "autoscaler" / "ray-schema.json"
    if not schema_path.is_file():
        pytest.skip("this Ray ships no autoscaler schema")
    jsonschema.validate(_only("RayLauncher"), json.loads(schema_path.read_text(encoding="utf-8")))


def test_one_ray_version_everywhere():
    """The launcher's pin, the image's base tag and every rayVersion name the same Ray."""
    launcher = _only("RayLauncher")
    pins = {m for cmd in launcher["setup_commands"] for m in re.findall(r"\bray\[[^\]]*\]==([\d.]+)", cmd)}
    dockerfile = (CLUSTER / "kuberay" / "Dockerfile").read_text(encoding="utf-8")
    pins |= set(re.findall(r"rayproject/ray:([\d.]+)", dockerfile))
    pins |= {_only("RayCluster")["spec"]["rayVersion"], _only("RayJob")["spec"]["rayClusterSpec"]["rayVersion"]}
    assert len(pins) == 1, f"Ray versions differ across cluster/: {sorted(pins)}"


def test_aws_files_agree():
    """The launcher reads the secret the template creates, and the head may end only its own cluster's nodes."""
    launcher, tpl = _only("RayLauncher"), _only("CloudFormation")
    secret_ids = {m for c in launcher["head_start_ray_commands"] + launcher["worker_start_ray_commands"]
                  for m in _flag(c, "secret-id")}
    assert secret_ids == {tpl["Parameters"]["TokenSecretName"]["Default"]}
    conditions = [st["Condition"]["StringEquals"]["ec2:ResourceTag/ray-cluster-name"]
                  for st in tpl["Resources"]["HeadRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]
                  if "ec2:TerminateInstances" in st["Action"]]
    assert conditions == [launcher["cluster_name"]]


# --------------------------------------------------------------- tests: the checks can fail


def _set(doc: dict, dotted: str, value):
    """Sets a value at a dotted path with [i] list indices, e.g. spec.workerGroupSpecs[1].replicas."""
    keys = [int(k) if k.isdigit() else k for k in re.findall(r"[^.\[\]]+", dotted)]
    node = doc
    for k in keys[:-1]:
        node = node[k]
    node[keys[-1]] = value


def _del(doc: dict, dotted: str):
    keys = [int(k) if k.isdigit() else k for k in re.findall(r"[^.\[\]]+", dotted)]
    node = doc
    for k in keys[:-1]:
        node = node[k]
    del node[keys[-1]]


HEAD = "spec.headGroupSpec"
GPU_ENV = "spec.workerGroupSpecs[1].template.spec.containers[0].env"
JOB_HEAD = "spec.rayClusterSpec.headGroupSpec"
START = "head_start_ray_commands[1]"
WORKER_START = "worker_start_ray_commands[1]"

# (kind, mutation, a phrase the problem must contain)
BREAKAGES = [
    ("RayCluster", lambda d: _set(d, f"{HEAD}.serviceType", "LoadBalancer"), "LoadBalancer"),
    ("RayCluster", lambda d: _set(d, f"{HEAD}.headService", {"spec": {"type": "NodePort"}}), "NodePort"),
    ("RayCluster", lambda d: _set(d, f"{HEAD}.enableIngress", True), "Ingress"),
    ("RayCluster", lambda d: _set(d, f"{GPU_ENV}[1]", {"name": "RAY_AUTH_TOKEN", "value": "s3cret"}), "literal"),
    ("RayCluster", lambda d: _del(d, f"{GPU_ENV}[0]"), "RAY_AUTH_MODE"),
    ("RayCluster", lambda d: _set(d, f"{GPU_ENV}[1].valueFrom.secretKeyRef.name", "other"), "Secret"),
    ("RayCluster", lambda d: _del(d, "spec.autoscalerOptions.env"), "autoscalerOptions"),
    ("RayCluster", lambda d: _set(d, f"{HEAD}.rayStartParams.dashboard-host", "0.0.0.0"), "dashboard-host"),
    ("RayCluster", lambda d: _del(d, f"{HEAD}.rayStartParams.dashboard-host"), "dashboard-host"),
    ("RayCluster", lambda d: _del(d, f"{HEAD}.rayStartParams.num-cpus"), "num-cpus"),
    ("RayCluster", lambda d: _del(d, "spec.workerGroupSpecs[1]"), "nvidia.com/gpu"),
    ("RayCluster", lambda d: _del(d, "spec.authOptions"), "authOptions"),
    ("RayCluster", lambda d: _set(d, "apiVersion", "ray.io/v1alpha1"), "apiVersion"),
    ("RayCluster", lambda d: _set(d, "spec.workerGroupSpecs[0].template.spec.containers[0].image", "x:1"), "one image"),
    ("RayJob", lambda d: _set(d, "spec.entrypoint", "augsbert run jobs/no-such-job.yaml"), "does not exist"),
    ("RayJob", lambda d: _set(d, "spec.entrypoint", "python train.py"), "augsbert run jobs/"),
    ("RayJob", lambda d: _set(d, "spec.entrypoint", "cd /app && augsbert run jobs/smoke.yaml"), "shell"),
    ("RayJob", lambda d: _set(d, "spec.shutdownAfterJobFinishes", False), "shutdownAfterJobFinishes"),
    ("RayJob", lambda d: _set(d, f"{JOB_HEAD}.serviceType", "NodePort"), "NodePort"),
    ("RayJob", lambda d: _set(d, f"{JOB_HEAD}.rayStartParams.dashboard-host", "10.0.0.1"), "dashboard-host"),
    ("RayJob", lambda d: _set(d, f"{JOB_HEAD}.template.metadata.labels", {}), "NetworkPolicy"),
    ("RayJob", lambda d: _del(d, "spec.submitterPodTemplate.spec.containers[0].env[1]"), "submitterPodTemplate"),
    ("RayLauncher", lambda d: _set(d, "available_node_types.head.resources", {"CPU": 4}), "CPU 0"),
    ("RayLauncher", lambda d: _del(d, "available_node_types.gpu_worker"), "GPU"),
    ("RayLauncher", lambda d: _del(d, "head_node_type"), "head_node_type"),
    ("RayLauncher", lambda d: _set(d, "provider.security_group", {"GroupName": "x"}), "security_group"),
    ("RayLauncher", lambda d: _del(d, "available_node_types.cpu_worker.node_config.SecurityGroupIds"), "SecurityGroupIds"),
    ("RayLauncher", lambda d: _set(d, START, d["head_start_ray_commands"][1].replace("RAY_AUTH_MODE=token", "")),
     "RAY_AUTH_MODE"),
    ("RayLauncher", lambda d: _set(d, WORKER_START, "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=hunter2 && "
                                   "ray start --address=$RAY_HEAD_IP:6379"), "literal"),
    ("RayLauncher", lambda d: _set(d, WORKER_START, "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=\"$(cat /t)\" && "
                                   "ray start --address=$RAY_HEAD_IP:6379"), "Secrets Manager"),
    ("RayLauncher", lambda d: _set(d, START, d["head_start_ray_commands"][1].replace("127.0.0.1", "0.0.0.0")),
     "dashboard"),
    ("RayLauncher", lambda d: _set(d, START, d["head_start_ray_commands"][1].replace("us-west-2", "eu-west-1")),
     "eu-west-1"),
    ("RayLauncher", lambda d: d["available_node_types"]["gpu_worker"]["worker_setup_commands"].append(
        'pip install -e ".[cpu]"'), ".[gpu]"),
    ("RayLauncher", lambda d: _set(d, "setup_commands", [c for c in d["setup_commands"] if "ray[" not in c]), "pin"),
    ("CloudFormation", lambda d: d["Resources"]["ClusterSecurityGroup"]["Properties"]["SecurityGroupIngress"].append(
        {"IpProtocol": "tcp", "FromPort": 8265, "ToPort": 8265, "CidrIp": "0.0.0.0/0"}), "0.0.0.0/0"),
    ("CloudFormation", lambda d: d["Resources"]["ClusterSecurityGroup"]["Properties"]["SecurityGroupIngress"].append(
        {"IpProtocol": "tcp", "FromPort": 6379, "ToPort": 6379, "CidrIp": {"Ref": "AdminCidr"}}), "only SSH"),
    ("CloudFormation", lambda d: _set(d, "Parameters.AdminCidr.Default", "0.0.0.0/0"), "0.0.0.0/0"),
    ("CloudFormation", lambda d: _set(d, "Parameters.AdminCidr.AllowedPattern", ".*"), "AllowedPattern"),
    ("CloudFormation", lambda d: _del(d, "Resources.ClusterIntraGroupIngress"), "from the group itself"),
    ("CloudFormation", lambda d: _set(d, "Resources.AuthToken.Properties.SecretString", "abc"), "SecretString"),
    ("NetworkPolicy", lambda d: d["spec"]["ingress"].append({}), "admits every source"),
    ("NetworkPolicy", lambda d: d["spec"]["ingress"][0]["from"].append({"namespaceSelector": {}}), "outside"),
    ("Secret", lambda d: _set(d, "stringData.auth_token", "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"),
     "placeholder"),
]


@pytest.mark.parametrize("kind,breakage,phrase", BREAKAGES, ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(BREAKAGES)])
def test_a_broken_copy_fails_the_checks(kind, breakage, phrase):
    path, index = next((p, i) for p, docs in MANIFESTS.items() for i, d in enumerate(docs) if kind_of(d) == kind)
    broken = copy.deepcopy(MANIFESTS[path])
    breakage(broken[index])
    problems = manifest_problems({path: broken} | _policies_elsewhere(path))
    assert problems, f"breaking {kind} went unnoticed"
    assert any(phrase in p for p in problems), f"no problem mentions {phrase!r}: {problems}"


def test_a_public_service_anywhere_fails():
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "dash"},
           "spec": {"type": "LoadBalancer", "ports": [{"port": 8265}]}}
    assert any("LoadBalancer" in p for p in manifest_problems({"cluster/extra.yaml": [svc]}))


def test_an_unknown_kind_must_get_a_check():
    assert any("unknown document kind" in p for p in manifest_problems({"x.yaml": [{"hello": 1}]}))
