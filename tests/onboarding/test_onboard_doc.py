"""docs/onboard-your-model.md against the catalog's schema: its annotated entry names every
field of a model spec (its SLO overrides and architecture hint included), is itself a valid
entry, and the defaults it states are those of configs/models/_defaults.yaml."""

from __future__ import annotations

import re

import yaml

from onboarding.common.paths import PROJECT_ROOT
from onboarding.fetch.catalog import (
    ArchitectureHint,
    ModelSpec,
    SloOverrides,
    SpecDefaults,
    load_defaults,
    parse_spec,
)

DOC = PROJECT_ROOT / "docs" / "onboard-your-model.md"


def _entry_block() -> str:
    text = DOC.read_text()
    section = text[text.index("## 3. A catalog entry, every field"):]
    return re.search(r"```yaml\n(.*?)```", section, re.DOTALL)[1]


def _keys(block: str) -> set[str]:
    """Every `key:` of the block, commented out or not."""
    return set(re.findall(r"^[#\s]*([a-z_0-9]+):", block, re.MULTILINE))


def test_the_annotated_entry_names_every_field_of_the_schema():
    keys = _keys(_entry_block())
    for model in (ModelSpec, SloOverrides, ArchitectureHint, SpecDefaults):
        missing = set(model.model_fields) - keys
        assert not missing, f"{model.__name__} fields the doc's entry does not name: {missing}"


def test_the_annotated_entry_is_a_valid_entry():
    spec = parse_spec(yaml.safe_load(_entry_block()), str(DOC))
    assert spec.id == "my-llama-8b" and not spec.plan_only


def test_the_defaults_the_doc_states_are_the_catalogs():
    defaults = load_defaults(PROJECT_ROOT / "configs" / "models")
    text = " ".join(DOC.read_text().split())
    assert defaults.scenarios and defaults.eval_tasks and defaults.engine_args
    assert f"the scenarios `[{', '.join(defaults.scenarios)}]`" in text
    assert f"the eval tasks `[{', '.join(defaults.eval_tasks)}]`" in text
    assert f"the ladder `[{', '.join(defaults.precision_ladder)}]`" in text
    assert f"`engine_args.max_model_len: {defaults.engine_args['max_model_len']}`" in text
