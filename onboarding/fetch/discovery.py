"""Finding checkpoints in a bucket: a bounded, resumable scan and the rules for "complete".

Layout: every first-level folder under the watched prefix is one model
(`s3://models/incoming/llama-3-8b/config.json`). A scan walks the flat, sorted key listing in
pages; a tick reads at most `max_pages` pages and keeps its place in a small JSON cursor, so a
bucket of millions of keys costs the same per tick as a small one (the scan just takes more
ticks to come round). Only checkpoint files (`is_checkpoint_file`) are remembered per folder;
other keys are counted.

A folder is complete when (a) its completion marker exists, or (b) unless the marker is
required, it has `config.json` and either a `*.safetensors.index.json` whose every named shard
is present, or un-sharded `*.safetensors` only. S3 shows an object only once its upload
finished, so presence means the object is whole; the rules above catch the folder that is not.

The content id is the same as `S3ObjectStore.describe`'s revision (keys, sizes, ETags of the
checkpoint files), so the run key `model@content-id` names what the run will fetch: a re-upload
of the same bytes never launches twice, a new revision does.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from onboarding.common.errors import ConfigError
from onboarding.common.names import to_dns1123_label
from onboarding.fetch.catalog import ModelSpec, SpecDefaults, parse_source, parse_spec
from onboarding.fetch.checkpoint_manifest import is_checkpoint_file

SPEC_FILE = "onboarding.yaml"
CURSOR_VERSION = 1
_SHARDED = re.compile(r"-\d+-of-\d+\.safetensors$")


@dataclass(frozen=True)
class Listed:
    key: str
    size: int
    etag: str | None


# (start_after, max_keys) -> (objects in key order, whether more keys follow)
ListPage = Callable[[str, int], tuple[list[Listed], bool]]
ReadObject = Callable[[str], bytes]


@dataclass
class Folder:
    """One model folder as listed so far: checkpoint files by relative path -> [size, etag]."""

    name: str
    files: dict[str, list] = field(default_factory=dict)
    has_marker: bool = False
    other_keys: int = 0


@dataclass
class Known:
    """What the sensor concluded about a folder's current content."""

    model: str
    content_id: str
    state: str  # "submitted" | "incomplete" | "invalid"
    note: str = ""
    marker: bool = False  # the completion marker was present (it is not part of the content id)

    def unchanged(self, folder: Folder) -> bool:
        return self.content_id == content_id(folder) and self.marker == folder.has_marker


@dataclass
class ScanCursor:
    where: str = ""  # s3://bucket/prefix the cursor belongs to; another one starts afresh
    after: str = ""  # last key read; "" starts a pass
    open: Folder | None = None  # a folder whose keys continue past the last page read
    seen: list[str] = field(default_factory=list)  # folders seen in the current pass
    known: dict[str, Known] = field(default_factory=dict)
    passes: int = 0

    def to_json(self) -> str:
        return json.dumps({"v": CURSOR_VERSION, **asdict(self)}, sort_keys=True,
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | None, where: str) -> ScanCursor:
        """The cursor for `where`; an empty one for another bucket/prefix or an older layout
        (a fresh pass: run keys still keep what was launched from launching again)."""
        body = json.loads(raw) if raw else {}
        if body.pop("v", None) != CURSOR_VERSION or body.get("where") != where:
            return cls(where=where)
        open_ = body.pop("open")
        known = {k: Known(**v) for k, v in body.pop("known").items()}
        return cls(open=Folder(**open_) if open_ else None, known=known, **body)


@dataclass
class ScanStep:
    closed: list[Folder]  # folders whose keys were all read this tick
    pass_finished: bool
    deleted: dict[str, Known]  # folders known before, absent from the finished pass
    pages: int
    keys: int


def _split(key: str, prefix: str) -> tuple[str, str] | None:
    rel = key[len(prefix):]
    if "/" not in rel:
        return None  # a loose object beside the model folders
    name, rest = rel.split("/", 1)
    return (name, rest) if rest and not rest.endswith("/") else None


def advance(cursor: ScanCursor, list_page: ListPage, prefix: str, marker: str,
            page_size: int, max_pages: int) -> ScanStep:
    """Read up to `max_pages` pages from where the cursor stopped; mutates `cursor`."""
    closed: list[Folder] = []
    pages = keys = 0
    finished = False

    def close_open() -> None:
        if cursor.open is not None:
            closed.append(cursor.open)
            cursor.seen.append(cursor.open.name)
            cursor.open = None

    while pages < max_pages:
        objects, truncated = list_page(cursor.after, page_size)
        pages += 1
        keys += len(objects)
        for obj in objects:
            cursor.after = obj.key
            parts = _split(obj.key, prefix)
            if parts is None:
                continue
            name, rel = parts
            if cursor.open is None or cursor.open.name != name:
                close_open()
                cursor.open = Folder(name)
            if rel == marker:
                cursor.open.has_marker = True
            elif is_checkpoint_file(rel):
                cursor.open.files[rel] = [obj.size, obj.etag]
            else:
                cursor.open.other_keys += 1
        if not truncated:
            finished = True
            break
    deleted: dict[str, Known] = {}
    if finished:
        close_open()
        seen = set(cursor.seen)
        deleted = {n: k for n, k in cursor.known.items() if n not in seen}
        for name in deleted:
            del cursor.known[name]
        cursor.after, cursor.seen, cursor.passes = "", [], cursor.passes + 1
    return ScanStep(closed, finished, deleted, pages, keys)


def content_id(folder: Folder) -> str:
    """`S3ObjectStore.describe`'s revision for the same objects."""
    h = hashlib.sha256()
    for rel in sorted(folder.files):
        size, etag = folder.files[rel]
        h.update(f"{rel}\0{size}\0{etag or None}\n".encode())
    return "s3-" + h.hexdigest()[:16]


def missing_parts(folder: Folder, read: ReadObject, folder_key: str, marker: str,
                  require_marker: bool) -> list[str]:
    """Why a folder is not yet a complete checkpoint; empty when it is."""
    if require_marker and not folder.has_marker:
        return [f"no {marker} marker yet (automation.yaml requires one)"]
    files = folder.files
    problems = [] if "config.json" in files else ["config.json not uploaded yet"]
    indexes = sorted(p for p in files if p.endswith(".safetensors.index.json"))
    weights = sorted(p for p in files if p.endswith(".safetensors"))
    for index in indexes:
        try:
            names = set(json.loads(read(folder_key + index)).get("weight_map", {}).values())
        except ValueError:
            problems.append(f"{index} is not valid JSON (still being written, or corrupt)")
            continue
        base = PurePosixPath(index).parent
        absent = sorted(n for n in names if str(base / n).removeprefix("./") not in files)
        if absent:
            problems.append(f"{index} names {len(absent)} shard(s) not uploaded yet: "
                            + ", ".join(absent[:5]) + (" …" if len(absent) > 5 else ""))
    if not indexes:
        if any(_SHARDED.search(w) for w in weights):
            problems.append("sharded *.safetensors without their *.safetensors.index.json")
        elif not weights:
            problems.append("no *.safetensors uploaded yet")
    if folder.has_marker and problems:
        return [f"the {marker} marker is present but: " + "; ".join(problems)]
    return problems


def folder_uri(bucket: str, prefix: str, name: str) -> str:
    return f"s3://{bucket}/{prefix}{name}/"


def resolve_spec(uri: str, name: str, spec_text: str | None,
                 catalog: dict[str, ModelSpec], defaults: SpecDefaults | None = None,
                 context_tokens: int | None = None) -> tuple[ModelSpec, bool]:
    """The spec for a discovered folder and whether it must be written as a discovered spec.

    A catalog entry whose source is this folder wins (nothing is written). Otherwise the spec
    file beside the weights, if any, is validated like a catalog entry, with the folder's URI as
    source, a DNS-1123 form of the folder name as id and served name unless it sets them, and
    the catalog's defaults beneath it. A default max_model_len beyond the checkpoint's own
    context (`context_tokens`, config.json's max_position_embeddings) is cut to it: the engine
    refuses a longer one.
    """
    for spec in catalog.values():
        if spec.source_ref.kind == "s3" and spec.source_ref.uri == uri:
            if spec_text is not None:
                raise ConfigError(f"{uri}{SPEC_FILE}", f"the catalog entry {spec.id!r} already "
                                  "describes this folder", "Remove the spec file beside the "
                                  "weights or the catalog entry; only one may say how to "
                                  "onboard it.")
            return spec, False
    origin = f"{uri}{SPEC_FILE}"
    data: Any = {}
    if spec_text is not None:
        try:
            data = yaml.safe_load(spec_text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ConfigError(f"{origin}{where}", f"not valid YAML "
                              f"({getattr(exc, 'problem', exc)})",
                              "Fix the syntax and upload the file again.") from None
        data = {} if data is None else data
        if not isinstance(data, dict):
            raise ConfigError(origin, f"expected a mapping of spec fields, got "
                              f"{type(data).__name__}", "Write the spec as YAML key: value "
                              "pairs (see configs/models/*.yaml).")
        if "source" in data and _normalized(data["source"]) != uri:
            raise ConfigError(origin, f"field 'source': {data['source']!r} is not the folder "
                              f"the spec sits in ({uri})", "Drop `source:` from a spec beside "
                              "the weights; the folder is the source.")
    try:
        default_id = to_dns1123_label(name)
    except ValueError as exc:
        raise ConfigError(uri, str(exc), "Rename the folder or set `id:` in its "
                          f"{SPEC_FILE}.") from None
    defaults = defaults or SpecDefaults()
    default_len = (defaults.engine_args or {}).get("max_model_len")
    if (context_tokens and isinstance(default_len, int) and default_len > context_tokens
            and "max_model_len" not in (data.get("engine_args") or {})):
        defaults = defaults.model_copy(update={"engine_args": {
            **(defaults.engine_args or {}), "max_model_len": context_tokens}})
    spec = parse_spec({"served_name": data.get("id", default_id), **data, "source": uri},
                      origin, default_id=default_id, defaults=defaults)
    if spec.id in catalog:
        raise ConfigError(origin, f"model id {spec.id!r} is already in the catalog with source "
                          f"{catalog[spec.id].source}", f"Set another `id:` in {SPEC_FILE}.")
    return spec, True


def _context_tokens(read: ReadObject, config_key: str) -> int | None:
    """config.json's max_position_embeddings; None where it has none (missing_parts has already
    checked that the file is there)."""
    try:
        config = json.loads(read(config_key))
    except ValueError:
        return None
    value = config.get("max_position_embeddings") if isinstance(config, dict) else None
    return value if isinstance(value, int) and value > 0 else None


def _normalized(source: Any) -> str:
    try:
        return parse_source(str(source)).uri
    except ValueError:
        return str(source)


def write_discovered_spec(directory: Path, spec: ModelSpec, found_at: str) -> Path:
    """Write atomically; an unchanged spec leaves the file (and its mtime) alone."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{spec.id}.yaml"
    body = (f"# Written by new_checkpoint_sensor for {found_at}; edit the spec beside the "
            "weights instead.\n" + yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
    if path.is_file() and path.read_text() == body:
        return path
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(body)
    tmp.replace(path)
    return path


@dataclass
class Verdict:
    """What to do about one folder whose content changed since the sensor last looked."""

    known: Known
    message: str
    spec: ModelSpec | None = None  # set when the folder is to be onboarded
    write: bool = False  # the spec is to be stored as a discovered spec
    error: bool = False


def evaluate(folder: Folder, before: Known | None, *, bucket: str, prefix: str,
             read: ReadObject, marker: str, require_marker: bool,
             catalog: dict[str, ModelSpec], discovered: dict[str, ModelSpec],
             owners: dict[str, str], defaults: SpecDefaults | None = None) -> Verdict | None:
    """None when there is nothing new (not a model folder, or unchanged content).

    `catalog` is what people wrote (configs/models), `discovered` what the sensor or
    register_model stored, `owners` model id -> folder for the folders already onboarded,
    `defaults` the catalog's defaults (a dropped model gets what a catalogued one gets).
    """
    if not folder.files or (before is not None and before.unchanged(folder)):
        return None
    cid = content_id(folder)
    uri = folder_uri(bucket, prefix, folder.name)
    key_prefix = f"{prefix}{folder.name}/"
    missing = missing_parts(folder, read, key_prefix, marker, require_marker)
    if missing:
        return Verdict(Known(before.model if before else "", cid, "incomplete",
                             "; ".join(missing), folder.has_marker),
                       f"{uri}: not complete yet ({'; '.join(missing)})")
    try:
        text = read(key_prefix + SPEC_FILE).decode() if SPEC_FILE in folder.files else None
        context = (_context_tokens(read, key_prefix + "config.json")
                   if defaults and (defaults.engine_args or {}).get("max_model_len") else None)
        spec, write = resolve_spec(uri, folder.name, text, catalog, defaults, context)
        other, taken = owners.get(spec.id), discovered.get(spec.id)
        if other not in (None, folder.name):
            raise ConfigError(uri, f"model id {spec.id!r} is already taken by "
                              f"{folder_uri(bucket, prefix, other)}",
                              f"Set another `id:` in {uri}{SPEC_FILE}.")
        if write and taken is not None and taken.source != uri:
            raise ConfigError(uri, f"model id {spec.id!r} is already registered for "
                              f"{taken.source}", f"Set another `id:` in {uri}{SPEC_FILE}.")
    except ConfigError as exc:
        return Verdict(Known("", cid, "invalid", str(exc), folder.has_marker),
                       f"new checkpoint not onboarded: {exc}", error=True)
    return Verdict(Known(spec.id, cid, "submitted", marker=folder.has_marker),
                   f"{uri}: complete, content id {cid}; onboarding {spec.id!r}", spec, write)
