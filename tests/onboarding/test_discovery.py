"""Discovery rules without a server: scan paging, completeness, spec resolution, the cursor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onboarding.common.errors import ConfigError
from onboarding.common.paths import PROJECT_ROOT
from onboarding.fetch.catalog import ModelSpec, load_catalog, load_defaults
from onboarding.fetch.discovery import (
    Folder,
    Known,
    Listed,
    ScanCursor,
    advance,
    missing_parts,
    resolve_spec,
    write_discovered_spec,
)

MARKER = "ONBOARDING_COMPLETE"
URI = "s3://models/in/m/"


def _bucket(keys: list[str]):
    """A sorted key space answering ListObjectsV2-style pages (StartAfter, MaxKeys)."""
    keys = sorted(keys)
    pages: list[tuple[str, int]] = []

    def list_page(after: str, max_keys: int):
        pages.append((after, max_keys))
        rest = [k for k in keys if k > after]
        return [Listed(k, 1, "e") for k in rest[:max_keys]], len(rest) > max_keys

    return list_page, pages


def test_scan_is_bounded_per_tick_and_keeps_a_folder_across_ticks():
    keys = [f"in/a/log-{i:03d}.txt" for i in range(7)] + ["in/a/config.json", "in/b/config.json"]
    list_page, pages = _bucket(keys)
    cursor = ScanCursor()
    step = advance(cursor, list_page, "in/", MARKER, page_size=3, max_pages=2)
    assert step.pages == 2 and not step.pass_finished and step.closed == []
    assert cursor.open.name == "a" and cursor.open.other_keys == 5  # config.json + 5 logs
    cursor = ScanCursor.from_json(cursor.to_json(), "")  # survives the trip through the daemon
    assert ScanCursor.from_json(cursor.to_json(), "s3://other/").open is None
    step = advance(cursor, list_page, "in/", MARKER, page_size=3, max_pages=2)
    assert [f.name for f in step.closed] == ["a", "b"] and step.pass_finished
    assert step.closed[0].files == {"config.json": [1, "e"]}
    assert cursor.after == "" and cursor.passes == 1
    assert all(size == 3 for _, size in pages)


def test_a_folder_gone_from_a_finished_pass_is_reported_once():
    list_page, _ = _bucket(["in/a/config.json"])
    cursor = ScanCursor()
    advance(cursor, list_page, "in/", MARKER, 10, 1)
    cursor.known["a"] = Known("a", "s3-1", "submitted")
    cursor.known["gone"] = Known("gone", "s3-2", "submitted")
    step = advance(cursor, list_page, "in/", MARKER, 10, 1)
    assert list(step.deleted) == ["gone"] and "gone" not in cursor.known


def _folder(*names: str, marker: bool = False) -> Folder:
    return Folder("m", {n: [1, "e"] for n in names}, has_marker=marker)


INDEX = json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                   "b": "model-00002-of-00002.safetensors"}}).encode()


@pytest.mark.parametrize(("names", "marker", "require", "expect"), [
    (["config.json", "model.safetensors"], False, False, []),
    (["config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
      "model-00002-of-00002.safetensors"], False, False, []),
    (["config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors"],
     False, False, ["model-00002-of-00002.safetensors"]),
    (["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"],
     False, False, ["without their *.safetensors.index.json"]),
    (["model.safetensors"], False, False, ["config.json not uploaded yet"]),
    (["config.json", "model.safetensors"], False, True, [f"no {MARKER} marker"]),
    (["config.json", "model.safetensors"], True, True, []),
    (["model.safetensors"], True, False, [f"the {MARKER} marker is present but"]),
])
def test_completeness_rules(names, marker, require, expect):
    problems = missing_parts(_folder(*names, marker=marker), lambda key: INDEX, "in/m/",
                             MARKER, require)
    assert len(problems) == len(expect)
    for problem, needle in zip(problems, expect, strict=True):
        assert needle in problem


def test_a_half_written_index_waits():
    problems = missing_parts(_folder("config.json", "model.safetensors.index.json"),
                             lambda key: b'{"weight_map": {', "in/m/", MARKER, False)
    assert "not valid JSON" in problems[0]


def test_spec_beside_the_weights_defaults_and_overrides():
    spec, write = resolve_spec(URI, "My_Model.v2", "precision_ladder: [fp8]\n", {})
    assert write and spec.id == "my-model-v2" == spec.served_name
    assert spec.source == URI and spec.precision_ladder == ["fp8"]
    assert resolve_spec(URI, "m", None, {})[0].precision_ladder == ["nvfp4", "fp8", "bf16"]


PROJECT_DEFAULTS = load_defaults(PROJECT_ROOT / "configs" / "models")


def test_a_spec_beside_the_weights_keeps_its_fields_over_the_catalog_defaults():
    text = "scenarios: [chat]\nengine_args: {max_num_seqs: 8}\n"
    spec, _ = resolve_spec(URI, "m", text, {}, PROJECT_DEFAULTS, context_tokens=32768)
    assert spec.scenarios == ["chat"]
    assert spec.engine_args == {"max_model_len": 8192, "max_num_seqs": 8}  # merged by key
    assert spec.eval_tasks == PROJECT_DEFAULTS.eval_tasks and spec.eval_tasks
    spec, _ = resolve_spec(URI, "m", "engine_args: {max_model_len: 4096}\n", {},
                           PROJECT_DEFAULTS, context_tokens=256)
    assert spec.engine_args["max_model_len"] == 4096  # said by the spec: left to the engine
    spec, _ = resolve_spec(URI, "m", None, {}, PROJECT_DEFAULTS, context_tokens=2048)
    assert spec.engine_args["max_model_len"] == 2048


def test_the_catalog_defaults_file_is_strict_and_skipped_as_an_entry(tmp_path: Path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "_defaults.yaml").write_text("scenarios: [rag]\nengine_args: {max_model_len: 4096}\n")
    (models / "a.yaml").write_text("id: a\nsource: s3://models/a/\nserved_name: a\n"
                                   "engine_args: {max_num_seqs: 4}\n")
    catalog = load_catalog(models)
    assert list(catalog) == ["a"]
    assert catalog["a"].scenarios == ["rag"]
    assert catalog["a"].engine_args == {"max_model_len": 4096, "max_num_seqs": 4}
    (models / "_defaults.yaml").write_text("scenario: [rag]\n")
    with pytest.raises(ConfigError, match=r"_defaults.yaml.*scenario"):
        load_catalog(models)


@pytest.mark.parametrize(("text", "needles"), [
    ("precision_ladder: [fp8\n", ["onboarding.yaml line", "not valid YAML"]),
    ("- a list\n", ["expected a mapping"]),
    ("source: s3://models/elsewhere/\n", ["field 'source'", "Drop `source:`"]),
    ("served_nam: x\n", ["field 'served_nam'", "unknown key"]),
    ("id: Not_DNS\n", ["field 'id'", "DNS-1123"]),
])
def test_spec_errors_name_the_object_and_field(text, needles):
    with pytest.raises(ConfigError) as err:
        resolve_spec(URI, "m", text, {})
    assert str(err.value).startswith(URI + "onboarding.yaml")
    for needle in needles:
        assert needle in str(err.value)


def test_catalog_owns_its_folder_and_its_ids():
    owner = ModelSpec(id="owner", source=URI, served_name="o")
    assert resolve_spec(URI, "m", None, {"owner": owner}) == (owner, False)
    with pytest.raises(ConfigError, match="already describes this folder"):
        resolve_spec(URI, "m", "scenarios: [chat]\n", {"owner": owner})
    other = ModelSpec(id="m", source="s3://models/other/", served_name="m")
    with pytest.raises(ConfigError, match="already in the catalog"):
        resolve_spec(URI, "m", None, {"m": other})


def test_discovered_specs_join_the_project_catalog(tmp_path: Path, configs):
    spec, _ = resolve_spec(URI, "m", "scenarios: [rag]\n", {})
    path = write_discovered_spec(configs.discovered_path, spec, URI)
    mtime = path.stat().st_mtime_ns
    assert write_discovered_spec(configs.discovered_path, spec, URI).stat().st_mtime_ns == mtime
    assert configs.spec("m").scenarios == ["rag"]
    assert "m" not in configs.catalogued().specs
    (configs.models_path / "m.yaml").write_text(f"id: m\nsource: {URI}\nserved_name: m\n")
    catalog = configs.catalog()
    assert catalog.resolve("m").source == URI  # the catalog entry wins
    assert "already defined by" in str(catalog.broken[str(path)])
    with pytest.raises(ConfigError, match="already defined by"):
        load_catalog(configs.models_path, configs.discovered_path)