"""One verified copy of the weights per node, and no pod before it is complete, against KServe
v0.20.0's own behaviour and the real local S3 server:
- a cached predictor is started on whatever its node folder holds: the pod mutator only mounts
  the PVC (pkg/webhook/admission/pod/storage_initializer_injector.go InjectStorageInitializer),
  so the rendered init container holds the pod until the filler has marked the folder complete;
- the agent launches the download Job for a folder without ModelDownloaded status even when it
  exists (pkg/controller/v1alpha1/localmodelnode/controller.go downloadModels), so the folder
  `published_variant` pre-fills must be one the Job's filler finds verified: nothing fetched."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from onboarding.deploy.kserve import (
    CACHE_COMPLETE,
    CACHE_WAIT_CONTAINER,
    CACHE_WAIT_MOUNT,
    PVC_SOURCE_VOLUME,
    agent_model_dir,
    cache_name,
    node_group_name,
    storage_key,
)
from onboarding.fetch.checkpoint_manifest import MANIFEST_NAME, CheckpointManifest
from onboarding.quantize.variants import write_manifest
from resources.cache_filler import fill, prefill
from resources.manifest_validator import ManifestValidator
from resources.publisher import publish_variant
from tests.onboarding.test_kserve import _published, configured, rendered

BUCKET = "model-serving"


@pytest.fixture
def published(s3_store, tiny_checkpoint, tmp_path):
    variant = tmp_path / "variant"
    shutil.copytree(tiny_checkpoint, variant)
    write_manifest(variant, "test", "r1")
    pub = publish_variant(s3_store, variant, "tiny", "fp8",
                          f"s3://{BUCKET}/t-{uuid.uuid4().hex[:8]}/fp8/", read_back_mib=1,
                          log=print)
    return pub, variant


def _cached_manifest():
    _, _, config = configured("qwen3-235b-a22b-instruct", "b300")
    pub = dataclasses.replace(_published("qwen3-235b-a22b-instruct", config.precision),
                              total_bytes=134 * 10**9)
    r = rendered("qwen3-235b-a22b-instruct", "b300", published={config.precision: pub})
    return r, pub, config


def _kserve_add_model_mount(pod_spec: dict, pvc: str) -> dict:
    """pkg/utils/storage.go AddModelMount at v0.20.0 for the cached source (VolumeName
    kserve-pvc-source): the mount goes on kserve-container; a volume of that name already on
    the pod is kept, else one is added."""
    spec = {**pod_spec, "volumes": list(pod_spec.get("volumes", []))}
    if not any(v["name"] == PVC_SOURCE_VOLUME for v in spec["volumes"]):
        spec["volumes"].append({"name": PVC_SOURCE_VOLUME,
                                "persistentVolumeClaim": {"claimName": pvc}})
    return spec


@pytest.mark.slow
def test_a_cached_pod_waits_for_the_node_folder_kserve_mounts():
    r, pub, config = _cached_manifest()
    isvc = next(d for d in r.docs if d["kind"] == "InferenceService")
    pred = isvc["spec"]["predictor"]
    [init] = pred["initContainers"]
    assert init["name"] == CACHE_WAIT_CONTAINER
    # the PVC KServe's defaulter names for this ISVC: <LocalModelCache>-<nodegroup annotation>
    lmc = next(d for d in r.docs if d["kind"] == "LocalModelCache")
    group = isvc["metadata"]["annotations"]["serving.kserve.io/nodegroup"]
    assert group in lmc["spec"]["nodeGroups"]
    pvc = f"{lmc['metadata']['name']}-{group}"
    assert lmc["metadata"]["name"] == cache_name("qwen3-235b-a22b-instruct", config.precision,
                                                 pub.uri)
    assert group == node_group_name("b300")
    # after KServe's mutator: one volume, that claim, and the init container sees the folder the
    # engine gets (pvc://<pvc>/models/<storage key>)
    pod = _kserve_add_model_mount(pred, pvc)
    vols = [v for v in pod["volumes"] if v["name"] == PVC_SOURCE_VOLUME]
    assert len(vols) == 1 and vols[0]["persistentVolumeClaim"]["claimName"] == pvc
    [mount] = init["volumeMounts"]
    assert mount["name"] == PVC_SOURCE_VOLUME
    assert mount["subPath"] == f"models/{storage_key(pub.uri)}"
    assert isvc["metadata"]["labels"]["model-onboarding.io/qos-class"] == "Guaranteed"
    for doc in r.docs:
        assert ManifestValidator().validate(doc) == [], doc["kind"]


def test_an_uncached_pod_has_no_gate():
    r = rendered("qwen3-235b-a22b-instruct", "b300")
    pred = next(d for d in r.docs if d["kind"] == "InferenceService")["spec"]["predictor"]
    assert "initContainers" not in pred
    assert not any(v["name"] == PVC_SOURCE_VOLUME for v in pred.get("volumes", []))


def _gate_script(folder: Path) -> list[str]:
    r, _, _ = _cached_manifest()
    pred = next(d for d in r.docs if d["kind"] == "InferenceService")["spec"]["predictor"]
    cmd = pred["initContainers"][0]["command"]
    return [cmd[0], cmd[1], cmd[2].replace(CACHE_WAIT_MOUNT, str(folder))]


@pytest.mark.slow
def test_the_gate_holds_until_the_filler_completes_the_folder(s3_store, published, tmp_path):
    """The init container's own command, run against the node folder: it keeps waiting on an
    empty one and on the files without the filler's last step, and ends once `fill` (the
    download Job's container) has verified and completed it."""
    pub, variant = published
    folder = Path(agent_model_dir(str(tmp_path / "cache"), pub.uri))
    folder.mkdir(parents=True)
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(_gate_script(folder), timeout=2, capture_output=True, check=False)
    for f in variant.iterdir():  # every file there, yet not verified by the filler
        shutil.copy(f, folder / f.name)
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(_gate_script(folder), timeout=2, capture_output=True, check=False)
    fill(s3_store, pub.uri, folder, log=print)
    done = subprocess.run(_gate_script(folder), timeout=60, capture_output=True, text=True,
                          check=True)
    assert pub.uri in done.stdout


def test_publishing_prefills_the_node_folder_so_the_download_job_fetches_nothing(
        s3_store, published, tmp_path):
    """`prefill` (what published_variant runs on its node) places the pipeline's own verified
    files in KServe's folder with no byte over the wire and one copy on disk; the download
    Job's filler then finds it verified and fetches nothing."""
    pub, variant = published
    folder = Path(agent_model_dir(str(tmp_path / "cache"), pub.uri))
    pre = prefill(s3_store, pub.uri, folder, variant, log=print)
    assert pre.bytes_fetched == 0 and pre.files > 0
    assert (folder / CACHE_COMPLETE).is_file()
    manifest = CheckpointManifest.read(variant / MANIFEST_NAME)
    for f in manifest.files:
        assert os.path.samefile(folder / f.path, variant / f.path), f.path  # one inode
    job = fill(s3_store, pub.uri, folder, log=print)
    assert job.warm and job.bytes_fetched == 0


def test_a_local_file_that_differs_from_the_published_one_is_fetched_not_trusted(
        s3_store, published, tmp_path):
    """The pipeline's copy is checked, not assumed: a local file of the right size with other
    bytes fails the sha256 the store recorded, and the fill fetches the published one."""
    from onboarding.fetch.checkpoint_manifest import sha256_file

    pub, variant = published
    local = tmp_path / "local"
    shutil.copytree(variant, local)
    manifest = CheckpointManifest.read(variant / MANIFEST_NAME)
    victim = max(manifest.files, key=lambda f: f.size)
    data = bytearray((local / victim.path).read_bytes())
    data[-1] ^= 0xFF
    (local / victim.path).write_bytes(bytes(data))
    folder = Path(agent_model_dir(str(tmp_path / "cache"), pub.uri))
    result = prefill(s3_store, pub.uri, folder, local, log=print)
    assert sha256_file(folder / victim.path) == victim.sha256
    assert result.bytes_fetched >= victim.size  # that file came from the store
    assert (folder / CACHE_COMPLETE).is_file() and result.files == len(manifest.files)
    # the pipeline's own file was replaced in the folder, never written through
    assert (local / victim.path).read_bytes() == bytes(data)
