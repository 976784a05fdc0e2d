"""Catalog specs: valid entries resolve, malformed ones name the file and the field."""

from __future__ import annotations

import os
import re

import pytest

from onboarding.common.config import StrictConfig, load_config_file
from onboarding.common.errors import ConfigError
from onboarding.common.names import is_dns1123_label, is_dns1123_subdomain, to_dns1123_label
from onboarding.common.paths import PROJECT_ROOT
from onboarding.fetch.catalog import load_catalog, parse_source, read_catalog


def test_shipped_catalog_is_valid():
    catalog = load_catalog(PROJECT_ROOT / "configs" / "models")
    assert "smollm2-135m" in catalog
    for key, spec in catalog.items():
        assert is_dns1123_label(key) and spec.id == key


def test_unknown_key_lists_known_models(tmp_path):
    (tmp_path / "a.yaml").write_text("id: a\nsource: s3://models/a/\nserved_name: a\n")
    with pytest.raises(ConfigError, match=r"'nope': not in the catalog \(known: a\)"):
        read_catalog(tmp_path).resolve("nope")


@pytest.mark.parametrize(("body", "expected"), [
    ("id: a\nsource: s3://models/a/\nserved_name: a\nprecison_ladder: [fp8]\n",
     r"field 'precison_ladder': unknown key"),
    ("id: a\nsource: s3://models/a/\n", r"field 'served_name': required but missing"),
    ("id: A_b\nsource: s3://models/a/\nserved_name: a\n", r"field 'id'.*not a DNS-1123 label"),
    ("id: a\nsource: ftp://x/y\nserved_name: a\n", r"field 'source'.*expected 's3://"),
    ("id: a\nsource: s3://models/a/\nserved_name: a\nprecision_ladder: [fp4]\n",
     r"field 'precision_ladder.0'"),
    ("id: a\nsource: s3://models/a/\nserved_name: a\nslo: {ttft_p95_s: -1}\n",
     r"field 'slo.ttft_p95_s'"),
    ("id: a\nsource: [s3://models/a/\n", r"line \d+, column \d+.*not valid YAML"),
    ("- just\n- a list\n", r"expected a mapping"),
])
def test_malformed_specs_name_file_and_field(tmp_path, body, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError, match=expected) as info:
        load_catalog(tmp_path)
    assert "bad.yaml" in str(info.value)


def test_one_broken_file_fails_only_its_own_model(tmp_path):
    """Per entry: a typo in one model's YAML never blocks the others; that model's own lookup
    fails with the file and the field, and the broken file is listed for reporting."""
    (tmp_path / "good.yaml").write_text("id: good\nsource: s3://models/g/\nserved_name: g\n")
    (tmp_path / "typo.yaml").write_text("id: typo\nsource: s3://models/t/\nserved_nam: t\n")
    catalog = read_catalog(tmp_path)
    assert catalog.resolve("good").source == "s3://models/g/"
    assert list(catalog.broken) == [str(tmp_path / "typo.yaml")]
    with pytest.raises(ConfigError, match=r"typo.yaml.*field 'served_nam': unknown key"):
        catalog.resolve("typo")
    with pytest.raises(ConfigError, match=r"not in the catalog.*1 catalog file\(s\) do not "
                       r"validate: .*typo.yaml"):
        catalog.resolve("other")


def test_a_discovered_spec_cannot_shadow_a_catalog_entry(tmp_path):
    models, found = tmp_path / "models", tmp_path / "found"
    models.mkdir(), found.mkdir()
    (models / "a.yaml").write_text("id: a\nsource: s3://models/a/\nserved_name: a\n")
    (found / "a.yaml").write_text("id: a\nsource: s3://models/elsewhere/\nserved_name: a\n")
    catalog = read_catalog(models, found)
    assert catalog.resolve("a").source == "s3://models/a/"
    assert "already defined by" in str(catalog.broken[str(found / "a.yaml")])


def test_duplicate_ids_are_refused(tmp_path):
    for name in ("one", "two"):
        (tmp_path / f"{name}.yaml").write_text("id: a\nsource: s3://models/a/\nserved_name: a\n")
    with pytest.raises(ConfigError, match="already defined"):
        load_catalog(tmp_path)


@pytest.mark.parametrize(("uri", "expected"), [
    ("hf://org/name@../../../outside", "revision '../../../outside' is not a branch, tag or"),
    ("hf://org/name@main/../../x", "is not a branch, tag or commit"),
    ("hf://org/name@refs/pr/1", "is not a branch, tag or commit"),
    ("hf://org/name@..", "is not a branch, tag or commit"),
    ("hf://org/..@main", "repository"),
    ("s3://models/a/../b/", "'..'"),
    ("s3://models/../other/", "'..'"),
    ("s3://models/a/./b/", "'.'"),
])
def test_sources_that_would_escape_their_place_are_refused(uri, expected):
    with pytest.raises(ValueError, match=re.escape(expected)):
        parse_source(uri)


def test_an_escaping_revision_in_a_spec_names_the_file_and_field(tmp_path):
    (tmp_path / "bad.yaml").write_text(
        "id: a\nsource: hf://org/name@../../../outside\nserved_name: a\n")
    with pytest.raises(ConfigError, match=r"bad.yaml.*field 'source'.*not a branch, tag or"):
        load_catalog(tmp_path)


@pytest.mark.parametrize("revision", ["main", "v1.0", "release-2024.1", "a" * 40, "my_branch"])
def test_branch_tag_and_commit_revisions_are_accepted(revision):
    assert parse_source(f"hf://org/name@{revision}").revision == revision


def test_sources_parse():
    s3 = parse_source("s3://models/llama/v1")
    assert (s3.kind, s3.location, s3.path) == ("s3", "models", "llama/v1/")
    hf = parse_source("hf://meta-llama/Llama-3.1-8B@abc123")
    assert (hf.kind, hf.location, hf.revision) == ("hf", "meta-llama/Llama-3.1-8B", "abc123")


@pytest.mark.parametrize("raw", ["Meta-Llama/Llama-3.1-70B_Instruct", "a" * 80, "x.y/Z"])
def test_any_model_id_becomes_a_dns1123_label(raw):
    assert is_dns1123_label(to_dns1123_label(raw))


@pytest.mark.parametrize(("name", "ok"), [
    ("gpu-node-01.example.com", True), ("a" * 63 + "." + "b" * 189, True),
    ("a" * 63 + "." + "b" * 190, False), ("GPU_01", False), ("a..b", False), ("-a.b", False),
    ("a.b-", False), ("", False),
])
def test_dns1123_subdomains_as_kubernetes_checks_node_and_object_names(name, ok):
    assert is_dns1123_subdomain(name) is ok


TWIN = ("id: t\nsource: s3://models/twins/t/\nserved_name: t\nweights: random\n"
        "architecture: {params_billion: 8.03, num_layers: 32, num_kv_heads: 8, head_dim: 128}\n")


def test_shipped_twins_are_twins_of_their_real_entries():
    """Each twin has the shape of the real model it stands for, and random weights."""
    catalog = load_catalog(PROJECT_ROOT / "configs" / "models")
    for size in ("8b", "70b"):
        real = catalog[f"llama-3-1-{size}-instruct"]
        twin = catalog[f"llama-3-1-{size}-instruct-twin"]
        assert twin.is_twin and not twin.plan_only and not real.is_twin
        assert twin.architecture.model_dump(exclude_none=True).items() >= \
            real.architecture.model_dump(exclude_none=True).items()
        assert twin.precision_ladder == real.precision_ladder
        assert twin.engine_args == real.engine_args and twin.slo == real.slo
        assert twin.served_name != real.served_name


def test_a_twin_validates_and_real_weights_are_the_default(tmp_path):
    (tmp_path / "t.yaml").write_text(TWIN)
    (tmp_path / "r.yaml").write_text("id: r\nsource: s3://models/r/\nserved_name: r\n")
    catalog = load_catalog(tmp_path)
    assert catalog["t"].is_twin and catalog["t"].weights == "random"
    assert not catalog["r"].is_twin and catalog["r"].weights == "real"


@pytest.mark.parametrize(("edit", "expected"), [
    ("plan_only: true\n", r"field 'weights': random weights make a .*drop plan_only"),
    ("engine_args: {load_format: safetensors}\n",
     r"field 'weights': a performance twin .*remove engine_args.load_format \('safetensors'\)"),
    ("weights: randm\n", r"field 'weights'"),
])
def test_a_twin_that_cannot_be_measured_names_file_and_field(tmp_path, edit, expected):
    body = TWIN.replace("weights: random\n", "") if edit.startswith("weights") else TWIN
    (tmp_path / "bad.yaml").write_text(body + edit)
    with pytest.raises(ConfigError, match=expected) as info:
        load_catalog(tmp_path)
    assert "bad.yaml" in str(info.value)


def test_a_twin_needs_an_architecture_and_a_real_model_no_dummy_weights(tmp_path):
    (tmp_path / "bad.yaml").write_text(TWIN.split("architecture")[0])
    with pytest.raises(ConfigError, match=r"bad.yaml.*field 'weights'.*no weights to count: "
                       r"add `architecture:`"):
        load_catalog(tmp_path)
    (tmp_path / "bad.yaml").write_text("id: r\nsource: s3://models/r/\nserved_name: r\n"
                                       "engine_args: {load_format: dummy}\n")
    with pytest.raises(ConfigError, match=r"field 'weights'.*write `weights: random`"):
        load_catalog(tmp_path)


class _Tiny(StrictConfig):
    n: int


def test_a_config_file_is_read_again_only_when_it_changes(tmp_path):
    path = tmp_path / "tiny.yaml"
    with pytest.raises(ConfigError, match=r"tiny\.yaml: does not exist.*Restore configs/tiny"):
        load_config_file(_Tiny, path, "Fix tiny.yaml.")
    path.write_text("n: 1\n")
    first = load_config_file(_Tiny, path, "Fix tiny.yaml.")
    assert first.n == 1 and load_config_file(_Tiny, path, "Fix tiny.yaml.") is first
    path.write_text("n: 2\n")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
    assert load_config_file(_Tiny, path, "Fix tiny.yaml.").n == 2
    path.write_text("n: two\n")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 2_000_000))
    with pytest.raises(ConfigError, match=r"field 'n'.*Fix tiny\.yaml"):
        load_config_file(_Tiny, path, "Fix tiny.yaml.")


@pytest.mark.parametrize("key", ["Qwen3-32B", "org/name", "a_b", "-a"])
def test_a_refused_model_id_names_the_rule_it_broke(tmp_path, key):
    (tmp_path / "a.yaml").write_text("id: a\nsource: s3://models/a/\nserved_name: a\n")
    with pytest.raises(ConfigError, match="DNS-1123 label") as info:
        read_catalog(tmp_path).resolve(key)
    assert "not in the catalog" not in str(info.value)
