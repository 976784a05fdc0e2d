"""Config files: strict pydantic models, YAML read with errors that name the file, line and field.

Every loader under configs/ (the model catalog, stack, gates, nodes, acceptance, ...) goes
through these, so a typo is an error naming the file and the field, never a silently ignored
key. No other onboarding package is imported here.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from onboarding.common.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

class StrictConfig(BaseModel):
    """Base of every config model: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def format_validation_error(where: Path | str, err: ValidationError) -> str:
    """Pydantic's errors as `<where>: field 'a.b': what was expected`, joined for one message."""
    lines = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "<top level>"
        if e["type"] == "extra_forbidden":
            lines.append(f"{where}: field '{field}': unknown key (check its spelling)")
        elif e["type"] == "missing":
            lines.append(f"{where}: field '{field}': required but missing")
        else:
            lines.append(f"{where}: field '{field}': {e['msg'].removeprefix('Value error, ')}")
    return "; ".join(lines)


def validate_config(model: type[M], data: Any, path: Path | str, where: Path | str,
                    fix: str) -> M:
    """`model.model_validate(data)`, or a ConfigError naming the file, `where` and each field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(str(path), format_validation_error(where, exc), fix) from None


def load_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(
            f"{path}{where}", f"not valid YAML ({getattr(exc, 'problem', exc)})", "Fix the syntax."
        ) from None
    except OSError as exc:
        raise ConfigError(str(path), f"cannot be read ({exc.strerror})", "Check the path.") from None


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`override` on top of `base`: mappings merge key by key, anything else is replaced."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def load_config_file(model: type[M], path: Path, fix: str) -> M:
    """A configs/ file validated as `model`, read again only when its mtime changes: sensors
    and every asset ask for the same file many times a minute."""
    if not path.is_file():
        raise ConfigError(str(path), "does not exist",
                          f"Restore configs/{path.name} or set ONBOARDING_CONFIG_DIR.")
    return _load_config_file(model, path, path.stat().st_mtime_ns, fix)


@lru_cache(maxsize=32)
def _load_config_file(model: type[M], path: Path, mtime_ns: int, fix: str) -> M:
    return validate_config(model, load_yaml(path), path, path, fix)
