"""ManifestValidator against the pinned KServe release's CRDs in deploy/kserve-crds/ (the default).

The golden manifests must validate; deliberately broken copies must fail with the exact JSON
path of each error. `kubectl` is a named fake here (no cluster on CI): it only shows that the
dry run is invoked with the configured context and that its failure reaches the result.
"""

from __future__ import annotations

import copy
import os
import stat
from pathlib import Path

import pytest
import yaml

from onboarding.common.errors import ConfigError
from onboarding.common.paths import PROJECT_ROOT
from resources.manifest_validator import CRD_PATHS_ENV, DEFAULT_CRD_DIR, ManifestValidator

GOLDEN = sorted((PROJECT_ROOT / "tests" / "golden").glob("*.yaml"))


@pytest.fixture(scope="module")
def validator() -> ManifestValidator:
    return ManifestValidator()


def golden_isvc() -> dict:
    docs = list(yaml.safe_load_all(GOLDEN[0].read_text()))
    return copy.deepcopy(next(d for d in docs if d["kind"] == "InferenceService"))


@pytest.mark.slow
def test_goldens_exist_and_validate(validator: ManifestValidator):
    assert len(GOLDEN) >= 4
    for path in GOLDEN:
        results = validator.validate_file(path)
        kinds = {k.split("/")[0] for k in results}
        # one serving object per file: an InferenceService with its runtime, or an
        # LLMInferenceService (KServe's preset is its runtime)
        assert {"ServingRuntime", "InferenceService"} <= kinds or \
            ("LLMInferenceService" in kinds and "InferenceService" not in kinds), path.name
        assert results == {k: [] for k in results}, path.name
    every = {k.split("/")[0] for p in GOLDEN for k in validator.validate_file(p)}
    # The goldens hold every kind rendered
    assert {"LocalModelCache", "LocalModelNodeGroup", "LLMInferenceService"} <= every


@pytest.mark.slow
def test_the_default_crds_are_the_pinned_release_shipped_with_the_project():
    """A plain clone validates: the default set lives in the repository, from the KServe release
    configs/stack.yaml pins (SOURCE names that tag), under its license, and is the release's
    own files (each a CRD of the group the manifests use, serving the versions they render)."""
    stack = yaml.safe_load((PROJECT_ROOT / "configs" / "stack.yaml").read_text())
    pinned = stack["versions"]["kserve"]
    assert DEFAULT_CRD_DIR.is_relative_to(PROJECT_ROOT)
    source = (DEFAULT_CRD_DIR / "SOURCE").read_text()
    assert source.startswith(f"kserve/kserve @ v{pinned} ("), source
    assert "Apache License" in (DEFAULT_CRD_DIR / "LICENSE").read_text()
    served = {}
    for path in ManifestValidator().resolved_crd_paths():
        crd = yaml.safe_load(Path(path).read_text())
        assert Path(path).stem.removeprefix("serving.kserve.io_") in source, path
        served[crd["spec"]["names"]["kind"]] = {v["name"] for v in crd["spec"]["versions"]}
    assert "v1alpha2" in served["LLMInferenceService"]
    assert "v1beta1" in served["InferenceService"]
    assert {"LocalModelCache", "LocalModelNodeGroup", "ServingRuntime"} <= set(served)


@pytest.mark.slow
def test_wrong_type_is_reported_with_its_path(validator: ManifestValidator):
    doc = golden_isvc()
    doc["spec"]["predictor"]["minReplicas"] = "one"
    doc["spec"]["predictor"]["model"]["startupProbe"]["failureThreshold"] = "180"
    errors = validator.validate(doc)
    assert any(e.startswith("$.spec.predictor.minReplicas: 'one' is not of type 'integer'")
               for e in errors), errors
    assert any(e.startswith("$.spec.predictor.model.startupProbe.failureThreshold:")
               for e in errors), errors


def test_unknown_field_under_a_strict_section_is_reported(validator: ManifestValidator):
    doc = golden_isvc()
    doc["spec"]["predictor"]["model"]["resources"]["limit"] = {"cpu": "1"}
    doc["spec"]["predictor"]["gpuCount"] = 2
    errors = validator.validate(doc)
    assert "$.spec.predictor.model.resources.limit: unknown field (not in the CRD schema)" \
        in errors
    assert "$.spec.predictor.gpuCount: unknown field (not in the CRD schema)" in errors


def test_missing_required_field_is_reported(validator: ManifestValidator):
    doc = golden_isvc()
    del doc["spec"]["predictor"]["model"]["modelFormat"]["name"]
    doc["spec"]["predictor"]["tolerations"] = [{"operator": "Exists"}]
    doc["spec"]["predictor"]["model"]["env"] = [{"value": "1"}]
    errors = validator.validate(doc)
    assert "$.spec.predictor.model.modelFormat.name: required field missing" in errors
    assert "$.spec.predictor.model.env[0].name: required field missing" in errors


def test_metadata_is_checked_like_the_api_server(validator: ManifestValidator):
    doc = golden_isvc()
    doc["metadata"]["name"] = "Llama_3.1"
    doc["metadata"]["labels"]["model-onboarding.io/model"] = "x" * 64
    errors = validator.validate(doc)
    assert any(e.startswith("$.metadata.name:") for e in errors), errors
    assert any(e.startswith("$.metadata.labels.model-onboarding.io/model:") for e in errors)
    del doc["metadata"]
    assert "$.metadata: required field missing" in validator.validate(doc)


def test_unknown_kind_or_version_is_an_error_not_a_pass(validator: ManifestValidator):
    doc = golden_isvc()
    doc["apiVersion"] = "serving.kserve.io/v1alpha9"
    assert "serves versions" in validator.validate(doc)[0]
    doc["apiVersion"], doc["kind"] = "apps/v1", "Deployment"
    assert "no CRD configured" in validator.validate(doc)[0]


def test_crd_paths_are_configuration(tmp_path: Path):
    v = ManifestValidator(crd_paths=[str(tmp_path / "missing.yaml")])
    assert v.resolved_crd_paths() == [str(tmp_path / "missing.yaml")]
    with pytest.raises(ConfigError, match="CRD file does not exist"):
        v.validate(golden_isvc())
    only_isvc = str(DEFAULT_CRD_DIR / "serving.kserve.io_inferenceservices.yaml")
    assert ManifestValidator(crd_paths=[only_isvc]).validate(golden_isvc()) == []


def test_crd_paths_and_context_are_wired_from_the_environment(monkeypatch, tmp_path: Path):
    from pipelines.resources import build_resources

    only_isvc = str(DEFAULT_CRD_DIR / "serving.kserve.io_inferenceservices.yaml")
    monkeypatch.setenv(CRD_PATHS_ENV, f"{only_isvc}{os.pathsep}{tmp_path / 'x.yaml'}")
    monkeypatch.setenv("ONBOARDING_KUBE_CONTEXT", "prod")
    v = build_resources()["manifest_validator"]
    assert v.resolved_crd_paths() == [only_isvc, str(tmp_path / "x.yaml")]
    assert v.kube_context.get_value() == "prod"  # an EnvVar: resolved when a run starts


def test_no_context_means_no_dry_run(validator: ManifestValidator, monkeypatch):
    monkeypatch.delenv("ONBOARDING_KUBE_CONTEXT", raising=False)
    result = validator.dry_run(GOLDEN[0])
    assert not result.ran and result.ok and "skipped" in result.output


def _fake_kubectl(tmp_path: Path, rc: int) -> Path:
    """FAKE kubectl: records its argv and answers like an API server would reject/accept."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "kubectl"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" > "{tmp_path}/argv"\n'
        + ('echo \'Error from server (BadRequest): admission webhook denied the request\' >&2\n'
           if rc else 'echo "inferenceservice.serving.kserve.io/x created (server dry run)"\n')
        + f"exit {rc}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bin_dir


@pytest.mark.parametrize("rc", [0, 1])
def test_server_dry_run_with_a_configured_context(tmp_path: Path, monkeypatch, rc: int):
    bin_dir = _fake_kubectl(tmp_path, rc)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    result = ManifestValidator(kube_context="staging").dry_run(GOLDEN[0])
    argv = (tmp_path / "argv").read_text().split()
    assert argv[:2] == ["--context", "staging"]
    assert "--dry-run=server" in argv and str(GOLDEN[0]) in argv
    assert result.ran and result.ok == (rc == 0)
    assert ("denied" in result.output) == (rc == 1)


def test_context_without_kubectl_is_a_clear_error(monkeypatch):
    with pytest.raises(ConfigError, match="not found on PATH"):
        ManifestValidator(kube_context="x", kubectl="kubectl-that-does-not-exist").dry_run(
            GOLDEN[0])
