"""new_checkpoint_sensor and catalog_partitions_sensor against the real SeaweedFS and a real
Dagster instance; each tick is evaluated and its requests applied the way the daemon does."""

from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar

import dagster as dg
import pytest
import yaml

from assets.stack import current_stack
from onboarding.common.errors import FetchError
from onboarding.common.paths import PROJECT_ROOT
from onboarding.deploy.readiness import Readiness
from onboarding.fetch.discovery import ScanCursor
from pipelines.sensors import catalog_partitions_sensor, new_checkpoint_sensor
from resources.config_files import ConfigFiles
from resources.s3 import S3ObjectStore
from tests.conftest import write_spec
from tests.pipelines.automation_graph import build_defs, store_readiness
from tests.tiny_models import shard_names


@pytest.fixture
def watched(configs, unique_prefix) -> str:
    """The sensor watches `s3://models/<unique prefix>` only, so tests never see each other."""
    return unique_prefix


@pytest.fixture
def sensor_configs(configs, watched) -> ConfigFiles:
    return ConfigFiles(config_dir=configs.config_dir, discovered_dir=configs.discovered_dir,
                       discovery_bucket="models", discovery_prefix=watched)


@pytest.fixture
def model_spec(sensor_configs):
    """What every stage resolves for a partition."""
    return sensor_configs.spec


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        yield inst


class Ticker:
    """Evaluates ticks with the cursor carried over and applies partition requests and asset
    events to the instance, as the sensor daemon does."""

    def __init__(self, instance: dg.DagsterInstance, s3_store, configs: ConfigFiles,
                 sensor=new_checkpoint_sensor):
        self.instance, self.sensor, self.cursor = instance, sensor, None
        self.defs = build_defs({"s3": s3_store}, configs=configs)
        self.resources = {"s3": s3_store, "configs": configs,
                          "io_manager": self.defs.resources["io_manager"]}

    def __call__(self):
        with dg.build_sensor_context(instance=self.instance, cursor=self.cursor,
                                     instance_ref=self.instance.get_ref(),
                                     resources=self.resources, definitions=self.defs) as ctx:
            data = self.sensor.evaluate_tick(ctx)
        for req in data.dynamic_partitions_requests or []:
            self.instance.add_dynamic_partitions(req.partitions_def_name, req.partition_keys)
        for event in data.asset_events or []:
            self.instance.report_runless_asset_event(event)
        self.cursor = data.cursor
        return data

    def known(self) -> dict:
        return json_known(self.cursor)


class ListCountingS3(S3ObjectStore):
    """The real store; its client records each ListObjectsV2 request it sends (botocore event)."""

    calls: ClassVar[list[dict]] = []

    def client(self):
        client = super().client()
        if not getattr(client, "_onboarding_counted", False):
            client.meta.events.register("before-parameter-build.s3.ListObjectsV2",
                                        lambda params, **_: self.calls.append(dict(params)))
            client._onboarding_counted = True
        return client


def json_known(cursor: str) -> dict:
    return ScanCursor.from_json(cursor, json.loads(cursor)["where"]).known


def _upload(s3_store, src: Path, prefix: str, names: list[str]) -> None:
    for name in names:
        s3_store.client().upload_file(str(src / name), "models", prefix + name)


def _files(ckpt: Path) -> list[str]:
    return sorted(p.name for p in ckpt.iterdir() if p.is_file())


@pytest.mark.slow
def test_in_progress_upload_waits_then_onboards_exactly_once(
        instance, watched, s3_store, tiny_checkpoint, sensor_configs, model_spec):
    tick = Ticker(instance, s3_store, sensor_configs)
    folder = watched + "tiny-llama/"
    shards = shard_names(tiny_checkpoint)
    first_part = [f for f in _files(tiny_checkpoint) if f != shards[-1]]
    _upload(s3_store, tiny_checkpoint, folder, first_part)  # index names a shard not yet there

    waiting = tick()
    assert waiting.run_requests == [] and not waiting.dynamic_partitions_requests
    assert not waiting.asset_events  # no run, no stack observation
    assert tick.known()["tiny-llama"].state == "incomplete"
    assert shards[-1] in tick.known()["tiny-llama"].note

    _upload(s3_store, tiny_checkpoint, folder, [shards[-1]])
    done = tick()
    revision = s3_store.describe(model_spec("tiny-llama").source_ref).revision
    assert [(r.partition_key, r.run_key) for r in done.run_requests] == [
        ("tiny-llama", f"tiny-llama@{revision}")]
    # the verdict the run starts from, as the re-validation schedule reports it
    assert done.run_requests[0].tags["onboarding/ready_before"] == "not judged yet"
    assert instance.has_dynamic_partition("models", "tiny-llama")
    assert model_spec("tiny-llama").source == f"s3://models/{folder}"
    [stack] = done.asset_events  # observed before the run starts: its results get a fingerprint
    assert stack.asset_key == dg.AssetKey("serving_stack")
    assert stack.tags["dagster/data_version"] == current_stack(sensor_configs)[0]

    assert tick().run_requests == []  # the next tick: nothing new
    tick.cursor = None  # a lost cursor asks again, under the same run key the daemon dedupes
    again = tick()
    assert [r.run_key for r in again.run_requests] == [f"tiny-llama@{revision}"]
    assert not again.asset_events  # the stack is unchanged: no second observation


def test_marker_required_waits_for_the_marker(
        instance, watched, s3_store, tiny_checkpoint, config_dir, sensor_configs):
    cfg_path = config_dir / "automation.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["discovery"]["require_marker"] = True
    cfg_path.write_text(yaml.safe_dump(cfg))
    tick = Ticker(instance, s3_store, sensor_configs)
    s3_store.upload_dir(tiny_checkpoint, "models", watched + "m/")
    assert tick().run_requests == []
    assert "ONBOARDING_COMPLETE" in tick.known()["m"].note
    s3_store.client().put_object(Bucket="models", Key=watched + "m/ONBOARDING_COMPLETE", Body=b"")
    assert [r.partition_key for r in tick().run_requests] == ["m"]


def test_new_revision_is_picked_up_and_same_bytes_are_not(
        instance, watched, s3_store, tiny_checkpoint, sensor_configs, model_spec):
    tick = Ticker(instance, s3_store, sensor_configs)
    folder = watched + "tiny/"
    s3_store.upload_dir(tiny_checkpoint, "models", folder)
    first = tick().run_requests
    assert len(first) == 1

    _upload(s3_store, tiny_checkpoint, folder, ["config.json"])  # the same bytes again
    assert tick().run_requests == []

    shard = shard_names(tiny_checkpoint)[0]
    data = bytearray((tiny_checkpoint / shard).read_bytes())
    data[-1] ^= 0xFF
    s3_store.client().put_object(Bucket="models", Key=folder + shard, Body=bytes(data))
    second = tick().run_requests
    revision = s3_store.describe(model_spec("tiny").source_ref).revision
    assert [r.run_key for r in second] == [f"tiny@{revision}"]
    assert second[0].run_key != first[0].run_key


def test_malformed_spec_is_reported_and_other_models_carry_on(
        instance, watched, s3_store, tiny_checkpoint, capfd, sensor_configs, model_spec):
    tick = Ticker(instance, s3_store, sensor_configs)
    s3_store.upload_dir(tiny_checkpoint, "models", watched + "bad/")
    s3_store.client().put_object(Bucket="models", Key=watched + "bad/onboarding.yaml",
                                 Body=b"precision_ladder: [int3]\nserved_nam: x\n")
    s3_store.upload_dir(tiny_checkpoint, "models", watched + "good/")
    s3_store.client().put_object(
        Bucket="models", Key=watched + "good/onboarding.yaml",
        Body=yaml.safe_dump({"id": "good-custom", "precision_ladder": ["fp8", "bf16"],
                             "scenarios": ["chat", "rag"]}).encode())

    capfd.readouterr()
    result = tick()
    tick_log = capfd.readouterr().err
    assert [r.partition_key for r in result.run_requests] == ["good-custom"]
    bad = tick.known()["bad"]
    assert bad.state == "invalid"
    for needle in (f"s3://models/{watched}bad/onboarding.yaml", "precision_ladder",
                   "served_nam", "unknown key"):
        assert needle in bad.note
    assert "ERROR - new checkpoint not onboarded" in tick_log and "precision_ladder" in tick_log
    spec = model_spec("good-custom")  # what every stage resolves
    assert spec.precision_ladder == ["fp8", "bf16"] and spec.scenarios == ["chat", "rag"]
    assert spec.source == f"s3://models/{watched}good/"
    assert not instance.has_dynamic_partition("models", "bad")

    assert tick().run_requests == []
    assert "precision_ladder" not in capfd.readouterr().err  # once per content, not every tick

    s3_store.client().put_object(Bucket="models", Key=watched + "bad/onboarding.yaml",
                                 Body=b"precision_ladder: [fp8]\n")
    assert [r.partition_key for r in tick().run_requests] == ["bad"]


def test_a_dropped_checkpoint_gets_what_a_catalogued_one_gets(
        instance, watched, s3_store, tiny_checkpoint, config_dir, sensor_configs, model_spec):
    """The project's catalog defaults (configs/models/_defaults.yaml) for both: the same
    scenarios, eval tasks and ladder; max_model_len the default cut to the checkpoint's own
    context (the tiny model's config.json allows 256 tokens, the engine refuses more)."""
    shutil.copy(PROJECT_ROOT / "configs" / "models" / "_defaults.yaml", config_dir / "models")
    write_spec(config_dir, "catalogued", "s3://models/elsewhere/")
    s3_store.upload_dir(tiny_checkpoint, "models", watched + "dropped/")
    assert [r.partition_key for r in Ticker(instance, s3_store, sensor_configs)().run_requests
            ] == ["dropped"]
    dropped, catalogued = model_spec("dropped"), model_spec("catalogued")
    assert dropped.scenarios == catalogued.scenarios == ["chat", "rag", "codegen"]
    assert dropped.eval_tasks == catalogued.eval_tasks == ["onb_facts_mc", "onb_arith_gen"]
    assert dropped.precision_ladder == catalogued.precision_ladder
    assert catalogued.engine_args["max_model_len"] == 8192
    context = json.loads((tiny_checkpoint / "config.json").read_text())
    assert dropped.engine_args["max_model_len"] == context["max_position_embeddings"] == 256


@pytest.mark.slow
def test_an_edited_spec_beside_the_weights_is_a_new_revision(
        instance, watched, s3_store, tiny_checkpoint, sensor_configs, model_spec):
    tick = Ticker(instance, s3_store, sensor_configs)
    folder = watched + "spec-edit/"
    s3_store.upload_dir(tiny_checkpoint, "models", folder)
    s3_store.client().put_object(Bucket="models", Key=folder + "onboarding.yaml",
                                 Body=b"precision_ladder: [nvfp4, bf16]\n")
    first = tick().run_requests
    assert model_spec("spec-edit").precision_ladder == ["nvfp4", "bf16"]
    s3_store.client().put_object(Bucket="models", Key=folder + "onboarding.yaml",
                                 Body=b"precision_ladder: [fp8]\n")
    second = tick().run_requests
    assert [r.partition_key for r in second] == ["spec-edit"]
    assert second[0].run_key != first[0].run_key
    assert model_spec("spec-edit").precision_ladder == ["fp8"]


def test_catalog_entry_owning_the_folder_wins(
        instance, watched, s3_store, tiny_checkpoint, config_dir, sensor_configs):
    write_spec(config_dir, "catalogued", f"s3://models/{watched}weights/")
    tick = Ticker(instance, s3_store, sensor_configs)
    s3_store.upload_dir(tiny_checkpoint, "models", watched + "weights/")
    assert [r.partition_key for r in tick().run_requests] == ["catalogued"]


def test_deleted_checkpoint_is_reported_on_the_checkpoint_asset(
        instance, watched, s3_store, tiny_checkpoint, sensor_configs):
    tick = Ticker(instance, s3_store, sensor_configs)
    keys = s3_store.upload_dir(tiny_checkpoint, "models", watched + "gone/")
    assert len(tick().run_requests) == 1
    s3_store.client().delete_objects(Bucket="models",
                                     Delete={"Objects": [{"Key": k} for k in keys]})
    result = tick()
    assert result.run_requests == []
    [event] = result.asset_events
    assert event.asset_key == dg.AssetKey("checkpoint") and event.partition == "gone"
    assert event.metadata["deleted_at_source"].value == f"s3://models/{watched}gone/"
    recorded = instance.fetch_observations(dg.AssetKey("checkpoint"), limit=1).records
    assert recorded[0].asset_observation.partition == "gone"
    assert "gone" not in tick.known()


@pytest.mark.slow
def test_thousands_of_keys_are_listed_in_bounded_pages(
        instance, watched, s3_store, tiny_checkpoint, config_dir, sensor_configs):
    page_size, max_pages, junk = 250, 2, 3000
    cfg_path = config_dir / "automation.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["discovery"].update(page_size=page_size, max_pages_per_tick=max_pages)
    cfg_path.write_text(yaml.safe_dump(cfg))

    client = s3_store.client()
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: client.put_object(Bucket="models", Key=f"{watched}aaa-logs/"
                                                  f"{i:05d}.txt", Body=b"x"), range(junk)))
    print(f"put {junk} keys in {time.monotonic() - started:.1f} s")
    s3_store.upload_dir(tiny_checkpoint, "models", watched + "zzz-model/")
    total_keys = junk + len(_files(tiny_checkpoint))

    calls: list[dict] = []
    counting = ListCountingS3(**s3_store.model_dump())
    ListCountingS3.calls = calls
    tick = Ticker(instance, counting, sensor_configs)
    ticks, found = 0, []
    while not found:
        before = len(calls)
        found = tick().run_requests
        ticks += 1
        assert len(calls) - before <= max_pages
        assert all(c["MaxKeys"] == page_size for c in calls[before:])
        assert ticks <= total_keys // (page_size * max_pages) + 1
    assert [r.partition_key for r in found] == ["zzz-model"]
    assert ticks == -(-total_keys // (page_size * max_pages))
    assert len(calls) == -(-total_keys // page_size)  # every key listed once in the pass


def test_a_missing_bucket_fails_the_tick_instead_of_looking_empty(
        instance, watched, s3_store, sensor_configs):
    elsewhere = ConfigFiles(config_dir=sensor_configs.config_dir,
                            discovered_dir=sensor_configs.discovered_dir,
                            discovery_bucket="no-such-bucket-here", discovery_prefix=watched)
    with pytest.raises(Exception) as err:
        Ticker(instance, s3_store, elsewhere)()
    chain = [err.value, err.value.__cause__]
    assert any(isinstance(e, FetchError) and "bucket does not exist" in str(e) for e in chain)


def test_catalog_partitions_sensor_registers_every_catalog_model(
        instance, config_dir, s3_store, sensor_configs):
    write_spec(config_dir, "alpha", "s3://models/alpha/")
    write_spec(config_dir, "beta", "hf://org/beta@main")
    tick = Ticker(instance, s3_store, sensor_configs, sensor=catalog_partitions_sensor)
    tick()
    assert sorted(instance.get_dynamic_partitions("models")) == ["alpha", "beta"]
    assert tick().skip_message.startswith("all 2 catalog models")


def test_a_broken_catalog_file_is_reported_once_and_blocks_no_one(
        instance, config_dir, s3_store, sensor_configs, capfd):
    write_spec(config_dir, "alpha", "s3://models/alpha/")
    (config_dir / "models" / "typo.yaml").write_text("id: typo\nsource: s3://x/y/\nsrved_name: t\n")
    tick = Ticker(instance, s3_store, sensor_configs, sensor=catalog_partitions_sensor)
    first = tick()
    assert instance.get_dynamic_partitions("models") == ["alpha"]
    assert first.dynamic_partitions_requests
    second = tick()
    assert "1 broken catalog file(s)" in second.skip_message and "typo.yaml" in second.skip_message
    logged = capfd.readouterr().err
    assert logged.count("field 'srved_name': unknown key") == 1  # reported once, not per tick


@pytest.mark.slow
def test_a_new_checkpoint_of_a_judged_model_says_what_it_was_before(
        instance, watched, s3_store, tiny_checkpoint, sensor_configs):
    """A new upload of a model already judged: the run request carries that verdict, from the
    `readiness` asset's latest stored value of each judged cell (the same words the report
    shows), node type by node type."""
    instance.add_dynamic_partitions("models", ["tiny-llama"])
    instance.add_dynamic_partitions("node_types", ["cpu", "h200"])
    store_readiness(instance, Readiness("tiny-llama", False,
                                        reasons=("SLO missed at concurrency 32",)), "h200")
    store_readiness(instance, Readiness("tiny-llama", False,
                                        reasons=("cold start 41 s > 30 s",)), "cpu")
    tick = Ticker(instance, s3_store, sensor_configs)
    _upload(s3_store, tiny_checkpoint, watched + "tiny-llama/", _files(tiny_checkpoint))
    [run] = tick().run_requests
    assert run.tags["onboarding/ready_before"] == (
        "cpu: not ready: cold start 41 s > 30 s; h200: not ready: SLO missed at concurrency 32")
