"""Validate rendered manifests against KServe's CRDs, and optionally the cluster.

The CRD's `openAPIV3Schema` is the contract of a KServe release. The default is the pinned
release's CRDs shipped in deploy/kserve-crds/ (SOURCE there names the tag); a user who runs
another KServe points `KSERVE_CRD_PATHS` at their cluster's own
(`kubectl get crd inferenceservices.serving.kserve.io -o yaml > isvc-crd.yaml`).
Two rules the API server applies but the schema does not spell out are added here, so a local
pass means the server would accept the object too:
- strict fields: an object schema with `properties` rejects unknown keys (kubectl's default
  `--validate=strict`), except where the CRD says `x-kubernetes-preserve-unknown-fields`;
- metadata: the CRD leaves it open, the API server checks it as ObjectMeta (name, labels).
Every error carries its exact JSON path (`$.spec.predictor.model.resources.limits`).
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import dagster as dg
import jsonschema
import yaml
from pydantic import Field

from onboarding.common.errors import ConfigError
from onboarding.common.names import DNS1123_LABEL, DNS1123_SUBDOMAIN, MAX_LABEL, MAX_SUBDOMAIN
from onboarding.common.paths import PROJECT_ROOT
from onboarding.deploy.kserve import check_pdb

CRD_PATHS_ENV = "KSERVE_CRD_PATHS"
KUBE_CONTEXT_ENV = "ONBOARDING_KUBE_CONTEXT"
DEFAULT_CRD_DIR = PROJECT_ROOT / "deploy" / "kserve-crds"  # the pinned release (SOURCE there)
DEFAULT_CRDS = ("serving.kserve.io_inferenceservices.yaml", "serving.kserve.io_servingruntimes.yaml",
                "serving.kserve.io_localmodelcaches.yaml",
                "serving.kserve.io_localmodelnodegroups.yaml",
                "serving.kserve.io_llminferenceservices.yaml",
                "serving.kserve.io_clusterstoragecontainers.yaml")
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
BUILTIN_CHECKS = {("policy/v1", "PodDisruptionBudget"): check_pdb}

_LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
_QUALIFIED_NAME = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
OBJECT_META_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "maxLength": MAX_SUBDOMAIN, "pattern": DNS1123_SUBDOMAIN},
        "namespace": {"type": "string", "maxLength": MAX_LABEL, "pattern": DNS1123_LABEL},
        "labels": {"type": "object",
                   "propertyNames": {"maxLength": 316, "pattern": _QUALIFIED_NAME},
                   "additionalProperties": {"type": "string", "maxLength": 63,
                                            "pattern": _LABEL_VALUE}},
        "annotations": {"type": "object", "propertyNames": {"pattern": _QUALIFIED_NAME},
                        "additionalProperties": {"type": "string"}},
        "generateName": {"type": "string"},
        "finalizers": {"type": "array", "items": {"type": "string"}},
        "ownerReferences": {"type": "array", "items": {"type": "object"}},
        "uid": {"type": "string"},
        "resourceVersion": {"type": "string"},
        "generation": {"type": "integer"},
        "creationTimestamp": {"type": ["string", "null"]},
        "deletionTimestamp": {"type": ["string", "null"]},
        "deletionGracePeriodSeconds": {"type": "integer"},
        "managedFields": {"type": "array"},
    },
}


def _strict(schema: Any) -> Any:
    """Close every object schema that lists properties and does not preserve unknown fields."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@dataclass(frozen=True)
class CrdSchema:
    group: str
    kind: str
    versions: dict[str, jsonschema.protocols.Validator]  # version -> validator
    path: str


@lru_cache(maxsize=8)
def _load_crd(path: str, mtime_ns: int) -> CrdSchema:
    try:
        crd = yaml.load(Path(path).read_text(), Loader=_LOADER)
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        versions = {}
        for v in crd["spec"]["versions"]:
            schema = copy.deepcopy(v["schema"]["openAPIV3Schema"])
            schema = _strict(schema)
            schema.setdefault("properties", {})["metadata"] = OBJECT_META_SCHEMA
            schema.setdefault("required", [])
            for key in ("apiVersion", "kind", "metadata", "spec"):
                if key not in schema["required"] and key in schema["properties"]:
                    schema["required"].append(key)
            cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
            versions[v["name"]] = cls(schema)
    except OSError as exc:
        raise ConfigError(
            path, f"cannot read the CRD ({exc.strerror})",
            f"Set {CRD_PATHS_ENV} to CRD files exported from your cluster "
            "(kubectl get crd inferenceservices.serving.kserve.io -o yaml).",
        ) from None
    except (yaml.YAMLError, KeyError, TypeError) as exc:
        raise ConfigError(
            path, f"not a CustomResourceDefinition with an openAPIV3Schema ({exc!r})",
            "Export the CRD with kubectl get crd <name> -o yaml.",
        ) from None
    return CrdSchema(group, kind, versions, path)


def _json_path(parts: Any) -> str:
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def _error_lines(err: jsonschema.ValidationError) -> list[str]:
    path = _json_path(err.absolute_path)
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        allowed = set(err.schema.get("properties", {}))
        extra = sorted(k for k in err.instance if k not in allowed)
        return [f"{path}.{k}: unknown field (not in the CRD schema)" for k in extra]
    if err.validator == "required":
        missing = err.message.split("'")[1] if "'" in err.message else err.message
        return [f"{path}.{missing}: required field missing"]
    return [f"{path}: {err.message}"]


@dataclass(frozen=True)
class DryRun:
    ran: bool
    ok: bool
    output: str


class ManifestValidator(dg.ConfigurableResource):
    """jsonschema against configured CRDs; `kubectl apply --dry-run=server` with a context."""

    crd_paths: list[str] = Field(
        default_factory=list,
        description=f"CRD YAML files; empty: ${CRD_PATHS_ENV} (os.pathsep-separated), else the "
        "pinned release's copies in deploy/kserve-crds/",
    )
    kube_context: str = Field(
        default="", description=f"kubectl context for server dry runs; empty: ${KUBE_CONTEXT_ENV}"
        ", else no dry run")
    kubectl: str = "kubectl"
    dry_run_timeout_s: float = 120.0

    def resolved_crd_paths(self) -> list[str]:
        if self.crd_paths:
            return list(self.crd_paths)
        return [str(DEFAULT_CRD_DIR / name) for name in DEFAULT_CRDS]

    def _schemas(self) -> dict[tuple[str, str], CrdSchema]:
        out = {}
        for p in self.resolved_crd_paths():
            path = Path(p)
            if not path.is_file():
                raise ConfigError(p, "CRD file does not exist",
                                  f"Point {CRD_PATHS_ENV} (or crd_paths) at your KServe CRDs.")
            crd = _load_crd(str(path.resolve()), path.stat().st_mtime_ns)
            out[(crd.group, crd.kind)] = crd
        return out

    def validate(self, doc: Any) -> list[str]:
        """Every schema error of one manifest as `<json path>: <problem>`; empty when valid."""
        if not isinstance(doc, dict):
            return [f"$: expected a Kubernetes object (mapping), got {type(doc).__name__}"]
        api, kind = doc.get("apiVersion"), doc.get("kind")
        if not isinstance(api, str) or "/" not in api or not isinstance(kind, str):
            return ["$.apiVersion/$.kind: required (group/version and kind)"]
        group, version = api.rsplit("/", 1)
        if (api, kind) in BUILTIN_CHECKS:  # Kubernetes' own kinds: no CRD, checked as the server does
            return BUILTIN_CHECKS[(api, kind)](doc)
        schemas = self._schemas()
        crd = schemas.get((group, kind))
        if crd is None:
            known = ", ".join(f"{g}/{k}" for g, k in sorted(schemas))
            return [f"$.kind: no CRD configured for {group}/{kind} (configured: {known})"]
        validator = crd.versions.get(version)
        if validator is None:
            return [(f"$.apiVersion: {crd.kind} CRD at {crd.path} serves versions "
                     f"{sorted(crd.versions)}, not {version}")]
        lines: list[str] = []
        for err in validator.iter_errors(doc):
            lines += _error_lines(err)
        return sorted(set(lines))

    def validate_file(self, path: Path) -> dict[str, list[str]]:
        """Errors per document (`<kind>/<name>`) of a multi-document YAML file."""
        out = {}
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc is None:
                continue
            name = f"{doc.get('kind', '?')}/{(doc.get('metadata') or {}).get('name', i)}"
            out[name] = self.validate(doc)
        return out

    def context(self) -> str:
        return self.kube_context.strip()

    def dry_run(self, path: Path) -> DryRun:
        """`kubectl apply --dry-run=server` when a context is configured; not run otherwise."""
        ctx = self.context()
        if not ctx:
            return DryRun(False, True, "no kube context configured: server dry run skipped")
        exe = shutil.which(self.kubectl)
        if exe is None:
            raise ConfigError(
                f"kubectl {self.kubectl!r}", f"not found on PATH, and kube context {ctx!r} is set",
                f"Install kubectl, or unset {KUBE_CONTEXT_ENV} to skip the server dry run.",
            )
        proc = subprocess.run(
            [exe, "--context", ctx, "apply", "--dry-run=server", "-f", str(path)],
            capture_output=True, text=True, timeout=self.dry_run_timeout_s, check=False,
        )
        return DryRun(True, proc.returncode == 0, (proc.stdout + proc.stderr).strip())
