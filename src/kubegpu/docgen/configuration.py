"""``docs/configuration.md``, generated from the config models and the commands that read them.

Run ``python -m kubegpu.docgen.configuration --write`` from the repository root after changing
a config model or a flag (``--check`` exits 1 when the file is stale; plain prints to stdout).

What is read, and from where, so the reference says only what the code does:

* the node agent's file: every field of :class:`kubegpu.config.model.AgentConfig`, walked
  through pydantic's ``model_fields`` (YAML key = the field's alias, type from the annotation,
  default from the field, bounds from its ``Ge``/``Gt``/``Le`` metadata, allowed values from
  ``Literal``); the description is the field's ``description`` and nothing else (for a field
  holding a model, followed by that model's docstring), the one text ``--help`` shows too;
* which flag and environment variables override a field: ``kubegpu device-plugin``'s click
  parameters and the flag -> config table the command makes them from and applies
  (``kubegpu.cli.device_plugin.CONFIG_FLAGS``); environment names are the ones click would
  read, explicit ``envvar`` first, then the ``KUBEGPU_<COMMAND>_<OPTION>`` name click derives;
* the extender: the fields of the :class:`kubegpu.config.extender.ExtenderConfig` model,
  each matched to the ``kubegpu extender`` option that sets it (the settings file's keys are
  those option names); the description is the option's help, which the option takes from the
  field (or, for the resource names and compat modes, from the node agent's field it must
  equal);
* rules that span fields (:data:`AGENT_RULES`, :data:`EXTENDER_RULES`) cannot be read off a
  type, so they are written here as data *with a bad input each*; ``tests/docs`` feeds every
  bad input to the real loader or command and checks that it is refused as the rule says.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import re
import sys
import types
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import annotated_types
import click
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from kubegpu.cli.main import cli as root_command
from kubegpu.config.extender import CONFIG_API_VERSION, CONFIG_KIND, ExtenderConfig
from kubegpu.config.model import AgentConfig
from kubegpu.docgen.output import emit
from kubegpu.placement.policies import POLICIES, extender_names, names_in_prose

DEFAULT_OUTPUT = Path("docs/configuration.md")
REGENERATE = "python -m kubegpu.docgen.configuration --write"


@dataclass(frozen=True)
class Rule:
    """A check that spans fields or is coded in a validator, with an input that breaks it."""

    text: str
    bad_input: Any  # agent: a config mapping; extender: ``kubegpu extender`` arguments
    fragment: str  # part of the error message the bad input must produce


AGENT_RULES: tuple[Rule, ...] = (
    Rule(
        "Unknown keys are errors at every level (a typo is never silently ignored).",
        {"flags": {"plugin": {"passDeviceSpec": True}}},
        "unknown field",
    ),
    Rule(
        "Resource names: a bare name gets `nvidia.com/`; a full name needs a DNS domain that "
        "is not `kubernetes.io` and may not start with `requests.` (the kubelet's rules).",
        {"resources": {"gpus": [{"pattern": "*", "name": "kubernetes.io/gpu"}]}},
        "not a valid extended resource name",
    ),
    Rule(
        "`resources.gpus` may not be empty.",
        {"resources": {"gpus": []}},
        "at least one GPU resource is required",
    ),
    Rule(
        "`flags.plugin.deviceListStrategy` takes a list, one string or a comma list, and may "
        "not be empty.",
        {"flags": {"plugin": {"deviceListStrategy": []}}},
        "at least one device list strategy is required",
    ),
    Rule(
        "`flags.plugin.cdiKind` must look like `vendor.com/class`.",
        {"flags": {"plugin": {"cdiKind": "nvidia"}}},
        "CDI kind must look like vendor.com/class",
    ),
    Rule(
        "A time-sliced resource must be one of `resources.gpus[].name`, or under "
        "`flags.migStrategy: mixed` a MIG profile's `nvidia.com/mig-<profile>`.",
        {"sharing": {"timeSlicing": {"resources": [{"name": "example.com/gpu", "replicas": 2}]}}},
        "is not one of the GPU resources",
    ),
    Rule(
        "A resource is time-sliced at most once.",
        {
            "sharing": {
                "timeSlicing": {
                    "resources": [
                        {"name": "nvidia.com/gpu", "replicas": 2},
                        {"name": "nvidia.com/gpu", "replicas": 3},
                    ]
                }
            }
        },
        "is shared twice",
    ),
    Rule(
        "Time-slicing a subset of GPUs (`devices` other than `all`) needs `rename` or "
        "`renameByDefault`, or shared and unshared GPUs would mix under one name.",
        {
            "sharing": {
                "timeSlicing": {
                    "resources": [{"name": "nvidia.com/gpu", "replicas": 2, "devices": [0]}]
                }
            }
        },
        "needs rename or renameByDefault",
    ),
    Rule(
        "A device count (`devices: N`) is 1 to 1024, a device index 0 to 1023.",
        {"sharing": {"gpuShare": {"devices": 0}}},
        "a device count must be 1 to 1024",
    ),
    Rule(
        "An Xid in `health.ignoredXids` or `health.criticalXids` is 0 to 65535.",
        {"health": {"criticalXids": [70000]}},
        "an Xid must be 0 to 65535",
    ),
    Rule(
        "The three `sharing.gpuShare` share resource names need a domain (`kubegpu.io/x`).",
        {"sharing": {"gpuShare": {"memoryResourceName": "gpu-memory"}}},
        "a share resource needs a domain",
    ),
    Rule(
        "With `sharing.gpuShare.enabled`, `wholeResourceName` must be one of "
        "`resources.gpus[].name`.",
        {"sharing": {"gpuShare": {"enabled": True, "wholeResourceName": "example.com/gpu"}}},
        "sharing.gpuShare.wholeResourceName",
    ),
    Rule(
        "With `sharing.gpuShare.enabled`, `resourceName` may not also be a whole-GPU resource.",
        {
            "resources": {
                "gpus": [
                    {"pattern": "*T4*", "name": "kubegpu.io/gpu-shared"},
                    {"pattern": "*", "name": "nvidia.com/gpu"},
                ]
            },
            "sharing": {"gpuShare": {"enabled": True}},
        },
        "is already a GPU resource",
    ),
    Rule(
        "With `sharing.gpuShare.enabled`, its whole-GPU resource cannot also be time-sliced: "
        "card-level sharing needs whole cards.",
        {
            "sharing": {
                "gpuShare": {"enabled": True},
                "timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]},
            }
        },
        "card-level sharing needs whole cards",
    ),
    Rule(
        "`flags.migStrategy: mixed` cannot go with `sharing.gpuShare.enforcement: mps` "
        "(NVIDIA's plugin refuses mixed with MPS too).",
        {
            "flags": {"migStrategy": "mixed"},
            "sharing": {"gpuShare": {"enabled": True, "enforcement": "mps"}},
        },
        "using --mig-strategy=mixed is not supported with MPS",
    ),
    Rule(
        "With `exporter.enabled`, `exporter.listen` and `flags.healthListen` need different "
        "ports (the same port on the same address, or either on every address, `0.0.0.0`).",
        {
            "flags": {"healthListen": "0.0.0.0:9401"},
            "exporter": {"enabled": True, "listen": "127.0.0.1:9401"},
        },
        "the metrics and the health endpoints need a port each",
    ),
)

EXTENDER_RULES: tuple[Rule, ...] = (
    Rule(
        f"`policy` must be {names_in_prose(f'`{n}`' for n in extender_names())}, or a placement "
        "engine policy: "
        + names_in_prose(f"`{n}`" for n in POLICIES if n not in extender_names())
        + ".",
        ["--policy", "roundrobin"],
        "unknown; choose one of",
    ),
    Rule(
        "`tls-cert-file` and `tls-key-file` are given together or not at all.",
        ["--tls-cert-file", "cert.pem"],
        "tls-cert-file and tls-key-file go together",
    ),
    Rule(
        "`client-ca-file` needs `tls-cert-file` and `tls-key-file`.",
        ["--client-ca-file", "ca.pem"],
        "client-ca-file needs tls-cert-file and tls-key-file",
    ),
    Rule(
        "Plain HTTP is refused on any address but loopback unless `allow-insecure-http` is set "
        "(on the verbs' listener: the metrics listener is plain HTTP on any address, as it "
        "serves only `/metrics`, `/healthz` and `/readyz` and changes nothing).",
        ["--host", "0.0.0.0"],
        "refusing plain HTTP on 0.0.0.0",
    ),
    Rule(
        "`max-body-bytes` is at least 1024.",
        ["--max-body-bytes", "100"],
        "Invalid value for '--max-body-bytes'",
    ),
    Rule(
        "`max-inflight-body-bytes` is at least `max-body-bytes`.",
        ["--max-body-bytes", "4096", "--max-inflight-body-bytes", "2048"],
        "no full-size request could be served",
    ),
    Rule(
        "`bind-attempts` is 1 to 100.",
        ["--bind-attempts", "0"],
        "Invalid value for '--bind-attempts'",
    ),
    Rule(
        "`leader-lease` is set: the namespace/name of the Lease of the kube-scheduler that "
        "calls the extender, or `none` where exactly one extender can ever run.",
        [],
        "leader-lease is not set",
    ),
    Rule(
        "`metrics-host` is an IP address (or `localhost`); it is used only with `metrics-port`.",
        ["--metrics-port", "9402", "--metrics-host", "metrics.example"],
        "is not an IP address",
    ),
    Rule(
        "`metrics-port` is not `port` on the same address (or on every address, `0.0.0.0`).",
        ["--port", "9402", "--metrics-port", "9402"],
        "the verbs and the metrics listener need a port each",
    ),
    Rule(
        "The four resource names are distinct, each `domain/name`.",
        ["--gpu-memory-resource", "kubegpu.io/gpu-compute"],
        "GPU resource names must be distinct",
    ),
    Rule(
        "A settings file must have `apiVersion: kubegpu.io/v1alpha1` and `kind: ExtenderConfig`.",
        None,  # needs a file; the test writes one
        "apiVersion/kind must be",
    ),
)


# --- types, defaults, bounds ---------------------------------------------------------------


def _is_model(annotation: object) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _list_item_model(annotation: object) -> type[BaseModel] | None:
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation)
        if _is_model(item):
            return typing.cast(type[BaseModel], item)
    return None


_SCALARS = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null"}


def type_text(annotation: object) -> str:
    """A reader's name for a type: ``"uuid" | "index"``, ``list of integer``, ``object``."""
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    if _is_model(annotation):
        return "object"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return " \\| ".join(f"`{json.dumps(a)}`" for a in args)
    if origin is list:
        inner = type_text(args[0])
        return f"list of ({inner})" if "|" in inner else f"list of {inner}"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_text(a) for a in args)
    if isinstance(annotation, type):
        return "path" if issubclass(annotation, Path) else annotation.__name__
    return str(annotation)


def _jsonable(value: object) -> object:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def default_text(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    return f"`{json.dumps(_jsonable(value))}`"


_BOUND_WORDS = (
    (annotated_types.Ge, "ge", "≥"),
    (annotated_types.Gt, "gt", ">"),
    (annotated_types.Le, "le", "≤"),
    (annotated_types.Lt, "lt", "<"),
)


def bounds_text(info: FieldInfo) -> str:
    parts = []
    for meta in info.metadata:
        for kind, attr, symbol in _BOUND_WORDS:
            if isinstance(meta, kind):
                parts.append(f"{symbol} {getattr(meta, attr)}")
    return ", ".join(parts)


# --- overrides: flags and environment ------------------------------------------------------


@dataclass(frozen=True)
class Override:
    flags: tuple[str, ...]
    envvars: tuple[str, ...]


# The subcommands documented here and where their click commands live (the same targets as
# ``kubegpu.cli.main``'s registrations; a test holds them equal).
COMMANDS: dict[str, str] = {
    "device-plugin": "kubegpu.cli.device_plugin:device_plugin",
    "extender": "kubegpu.cli.extender:extender_command",
    "labels": "kubegpu.cli.labels:labels_command",
    "exporter": "kubegpu.cli.exporter:exporter_command",
}


def command(name: str) -> click.Command:
    """A documented ``kubegpu`` subcommand's click command."""
    module_name, _, attr = COMMANDS[name].partition(":")
    found = getattr(importlib.import_module(module_name), attr)
    assert isinstance(found, click.Command)
    return found


def _auto_prefix(name: str) -> str:
    parent = click.Context(root_command, info_name="kubegpu", auto_envvar_prefix="KUBEGPU")
    prefix = click.Context(command(name), info_name=name, parent=parent).auto_envvar_prefix
    assert prefix is not None
    return prefix


def params(name: str) -> list[click.Option]:
    return [
        p
        for p in command(name).params
        if isinstance(p, click.Option) and p.name != "help" and not p.hidden
    ]


def override_of(name: str, param: click.Option) -> Override:
    """The flags and environment variables click reads for ``param`` of ``kubegpu NAME``."""
    explicit = param.envvar
    envvars = [explicit] if isinstance(explicit, str) else list(explicit or ())
    if param.allow_from_autoenv and param.name is not None:
        envvars.append(f"{_auto_prefix(name)}_{param.name.upper()}")
    return Override(tuple(param.opts + param.secondary_opts), tuple(dict.fromkeys(envvars)))


def agent_overrides() -> dict[str, Override]:
    """Config path → what overrides it, from the command's own flag → config table."""
    from kubegpu.cli.device_plugin import FLAG_TO_CONFIG

    by_name = {p.name: p for p in params("device-plugin")}
    found: dict[str, Override] = {}
    for option, path in FLAG_TO_CONFIG.items():
        found[path] = override_of("device-plugin", by_name[option])
    return found


# --- the node agent's file -----------------------------------------------------------------


@dataclass(frozen=True)
class FieldDoc:
    path: str
    type: str
    default: str
    bounds: str
    description: str
    override: Override | None
    section: bool  # an object holding further fields


@dataclass(frozen=True)
class SectionDoc:
    path: str  # "" for the root
    intro: str
    fields: tuple[FieldDoc, ...]


def _describe(*parts: str | None) -> str:
    seen: list[str] = []
    for part in parts:
        text = (part or "").strip()
        if text and not any(text.rstrip(".").lower() in s.lower() for s in seen):
            seen.append(text)
    sentences = [p[0].upper() + p[1:] for p in seen]
    return " ".join(p if p.endswith((".", ")")) else p + "." for p in sentences)


def _class_intro(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    inherited = inspect.getdoc(BaseModel) or ""
    return "" if doc == inherited else " ".join(doc.split())


def field_description(info: FieldInfo) -> str:
    """A field's text in the reference: its ``description``, then, for a field holding a
    model, that model's docstring (what such a section is, wherever it is used)."""
    annotation = info.annotation
    intro = _class_intro(typing.cast(type, annotation)) if _is_model(annotation) else None
    return _describe(info.description, intro)


def agent_sections() -> list[SectionDoc]:
    """Every section of the agent config, depth first, with every field."""
    overrides = agent_overrides()
    sections: list[SectionDoc] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        fields: list[FieldDoc] = []
        nested: list[tuple[type[BaseModel], str]] = []
        for name, info in model.model_fields.items():
            key = info.alias or name
            path = f"{prefix}.{key}" if prefix else key
            annotation = info.annotation
            item = _list_item_model(annotation)
            section = _is_model(annotation) or item is not None
            default = "" if _is_model(annotation) else default_text(info)
            fields.append(
                FieldDoc(
                    path=path,
                    type=type_text(annotation) if item is None else "list of objects",
                    default=default,
                    bounds=bounds_text(info),
                    description=field_description(info),
                    override=overrides.get(path),
                    section=section,
                )
            )
            if _is_model(annotation):
                nested.append((typing.cast(type[BaseModel], annotation), path))
            elif item is not None:
                nested.append((item, f"{path}[]"))
        sections.append(SectionDoc(prefix, _class_intro(model), tuple(fields)))
        for child, child_prefix in nested:
            walk(child, child_prefix)

    walk(AgentConfig, "")
    return sections


def agent_fields() -> Iterator[FieldDoc]:
    for section in agent_sections():
        yield from section.fields


# --- the extender --------------------------------------------------------------------------


@dataclass(frozen=True)
class SettingDoc:
    field: str  # ExtenderConfig attribute (dotted into ``names``)
    key: str  # settings-file key = long option name
    type: str
    default: str
    bounds: str
    description: str
    override: Override


def _click_bounds(param: click.Option) -> str:
    kind = param.type
    if isinstance(kind, click.IntRange | click.FloatRange):
        parts = []
        if kind.min is not None:
            parts.append(f"{'>' if kind.min_open else '≥'} {kind.min}")
        if kind.max is not None:
            parts.append(f"{'<' if kind.max_open else '≤'} {kind.max}")
        return ", ".join(parts)
    if isinstance(kind, click.Choice):
        return ", ".join(f"`{c}`" for c in kind.choices)
    return ""


def _click_default(param: click.Option) -> str:
    if param.is_flag and not param.secondary_opts:
        return f"`{json.dumps(param.default is True)}`"
    value = param.default() if callable(param.default) else param.default
    # click marks "no default" with None or, since 8.3, its own UNSET sentinel.
    if not isinstance(value, str | int | float | bool | list | tuple | Path):
        return "unset"
    return f"`{json.dumps(_jsonable(value))}`"


def _extender_fields() -> Iterator[tuple[str, str, object, object]]:
    """(dotted field, option name, type, dataclass default) for every setting."""
    from kubegpu.cli.extender import OPTION_FIELDS

    option_for = {field: option for option, field in OPTION_FIELDS.items()}
    for name, info in ExtenderConfig.model_fields.items():
        kind = info.annotation
        if dataclasses.is_dataclass(kind):
            inner_type = typing.cast(type, kind)
            inner_hints = typing.get_type_hints(inner_type)
            for g in dataclasses.fields(inner_type):
                # names.peers comes from --peer-compat (with its unit and compute options).
                if g.name == "peers":  # no modes: the option's empty comma list
                    yield f"{name}.{g.name}", "peer_compat", str, ""
                    continue
                yield f"{name}.{g.name}", f"{g.name}_resource", inner_hints[g.name], g.default
        else:
            option = option_for.get(name, name)
            # A default_factory has no default to compare, as with a dataclass field.
            default = dataclasses.MISSING if info.default_factory else info.default
            yield name, option, kind, default


def extender_settings() -> list[SettingDoc]:
    by_name = {p.name: p for p in params("extender")}
    found: list[SettingDoc] = []
    for dotted, option, kind, _default in _extender_fields():
        param = by_name.get(option)
        if param is None:
            raise LookupError(
                f"ExtenderConfig.{dotted} has no `kubegpu extender --{option.replace('_', '-')}`"
                " option; declare it with kubegpu.cli.extender._setting"
            )
        found.append(
            SettingDoc(
                field=dotted,
                key=param.opts[0].removeprefix("--"),
                type=type_text(kind),
                default=_click_default(param),
                bounds=_click_bounds(param),
                description=_describe(param.help),
                override=override_of("extender", param),
            )
        )
    return found


def extender_defaults_agree() -> list[str]:
    """Settings whose dataclass default differs from the option's default (should be none)."""
    by_name = {p.name: p for p in params("extender")}
    differing = []
    for dotted, option, _kind, default in _extender_fields():
        param = by_name[option]
        if isinstance(default, dataclasses._MISSING_TYPE):  # default_factory (names)
            continue
        cli_default = param.default
        if param.is_flag and not param.secondary_opts:
            cli_default = cli_default is True
        elif not isinstance(cli_default, str | int | float | bool | Path):
            cli_default = None  # click's UNSET
        if _jsonable(default) != _jsonable(cli_default):
            differing.append(f"{dotted}: dataclass {default!r}, option {cli_default!r}")
    return differing


# --- rendering -----------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") if "\\|" not in text else text


def _override_lines(override: Override | None) -> list[str]:
    if override is None:
        return []
    lines = [f"- Flag: {', '.join(f'`{f}`' for f in override.flags)}"]
    if override.envvars:
        lines.append(f"- Environment: {', '.join(f'`{e}`' for e in override.envvars)}")
    return lines


def _option_table(name: str, skip: set[str] | None = None) -> list[str]:
    rows = [
        "| Option | Environment | Default | Allowed | Description |",
        "| --- | --- | --- | --- | --- |",
    ]
    for param in params(name):
        if skip and param.name in skip:
            continue
        override = override_of(name, param)
        rows.append(
            "| "
            + " | ".join(
                [
                    " ".join(f"`{f}`" for f in override.flags),
                    " ".join(f"`{e}`" for e in override.envvars),
                    _click_default(param),
                    _cell(_click_bounds(param)),
                    _cell(" ".join((param.help or "").split())),
                ]
            )
            + " |"
        )
    return rows


def _agent_part() -> list[str]:
    from kubegpu.cli.device_plugin import FLAG_TO_CONFIG

    out = [
        "## Node agent: `kubegpu device-plugin --config FILE`",
        "",
        "A versioned YAML (or JSON) file, `version: v1`, shaped like NVIDIA's device plugin",
        "config where the concepts match. Every section is optional (a field marked `required`",
        "is required only in a list entry you write) and unknown keys are errors.",
        "Precedence: flag > environment variable > file > default. `SIGHUP` re-reads the file",
        "and applies the flags and environment again on top. An invalid file, flag or",
        "environment value exits with code 2 and a message naming the field path and the value",
        "(see [troubleshooting.md](troubleshooting.md#node-agent-configuration)). A commented",
        "example with every field is shipped as `src/kubegpu/config/example-config.yaml`;",
        "the manifests' copy is `deploy/base/node-agent-config.yaml`.",
        "",
        "`kubegpu labels --config` and `kubegpu exporter --config` read the same file: the",
        "labels take the sharing strategy and replicas from `sharing`, both take the health",
        "policy from `health`.",
        "",
        "### Summary",
        "",
        "| YAML path | Type | Default | Bounds | Flag |",
        "| --- | --- | --- | --- | --- |",
    ]
    for doc in agent_fields():
        if doc.section and doc.type == "object":
            continue
        flag = " ".join(f"`{f}`" for f in doc.override.flags) if doc.override else ""
        out.append(
            f"| [`{doc.path}`](#{_anchor(doc.path)}) | {_cell(doc.type)} | {_cell(doc.default)} "
            f"| {doc.bounds} | {flag} |"
        )
    out.append("")
    for section in agent_sections():
        title = f"`{section.path}`" if section.path else "Top level"
        out += [f"### {title}", ""]
        if section.intro:
            out += [section.intro, ""]
        for doc in section.fields:
            out += [f"#### `{doc.path}`", ""]
            if doc.description:
                out += [doc.description, ""]
            if doc.section and doc.type == "object":
                out += [f"- Type: object, see the fields below ({doc.path}.*)", ""]
                continue
            out.append(f"- Type: {doc.type}")
            out.append(f"- Default: {doc.default}")
            if doc.bounds:
                out.append(f"- Bounds: {doc.bounds}")
            out += _override_lines(doc.override)
            out.append("")
    out += [
        "### Rules across fields",
        "",
        "Checked when the file is loaded (and again on every reload); each is refused with exit",
        "code 2 and the quoted fragment in the message:",
        "",
    ]
    out += [f"- {rule.text} (`{rule.fragment}`)" for rule in AGENT_RULES]
    out += [
        "",
        "### Environment read by the health checks",
        "",
        "NVIDIA's variables are honoured on top of `health` (the agent reads them at start and",
        "on reload):",
        "",
        "- `DP_DISABLE_HEALTHCHECKS`: `all` or `xids` turns Xid health checking off; a comma",
        "  list of Xids adds them to the ignored ones.",
        "- `DP_ENABLE_HEALTHCHECKS`: a comma list of Xids (or `all`) that are critical whatever",
        "  else says; with `DP_DISABLE_HEALTHCHECKS=all` it is an allow-list.",
        "",
        "Unlike NVIDIA's plugin, a token that is not a number, `all` or `xids` is an error",
        "(exit 2) instead of being dropped.",
        "",
        "### Options that are not in the file",
        "",
    ]
    out += _option_table("device-plugin", skip=set(FLAG_TO_CONFIG))
    out += [
        "",
        "The config-file options above also accept the environment variable names NVIDIA's",
        "plugin reads (`DEVICE_LIST_STRATEGY`, `PASS_DEVICE_SPECS`, ...) where the concept",
        "matches; the list per field is under *Environment*, in the order click tries them.",
        "",
    ]
    return out


def _extender_part() -> list[str]:
    out = [
        "## Scheduler extender: `kubegpu extender`",
        "",
        "Settings come from flags, `KUBEGPU_EXTENDER_*` environment variables, or a settings",
        "file passed with `--config` (flag > environment > file > default). The file's keys",
        "are the long option names (`-` or `_` both work):",
        "",
        "```yaml",
        f"apiVersion: {CONFIG_API_VERSION}",
        f"kind: {CONFIG_KIND}",
        "settings:",
    ]
    for setting in extender_settings():
        if setting.default not in ("unset",) and setting.key not in ("allow-insecure-http",):
            out.append(f"  {setting.key}: {json.loads(setting.default.strip('`'))}")
    out += [
        "```",
        "",
        "(the values shown are the defaults; `deploy/scheduler/extender-config.yaml` is the",
        "shipped file). The resolved settings are logged once at start; an invalid setting",
        "exits with code 2 (`kubegpu extender: <message>`).",
        "",
        "| Settings key | Type | Default | Allowed | Environment | Description |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for s in extender_settings():
        env = " ".join(f"`{e}`" for e in s.override.envvars)
        out.append(
            f"| `{s.key}` | {_cell(s.type)} | {_cell(s.default)} | {_cell(s.bounds)} | {env} "
            f"| {_cell(s.description)} |"
        )
    out += [
        "",
        "`--config FILE` itself can be given as `KUBEGPU_EXTENDER_CONFIG`.",
        "",
        "### Rules across settings",
        "",
    ]
    out += [f"- {rule.text} (`{rule.fragment}`)" for rule in EXTENDER_RULES]
    out += [
        "",
        "The resource names must equal the node agent's `sharing.gpuShare` names",
        "(`resourceName` = `share-slot-resource`, `memoryResourceName`, `computeResourceName`,",
        "`wholeResourceName`); nothing checks that at run time, the shipped manifests are",
        "checked by `tests/deploy`.",
        "",
    ]
    return out


def _other_roles_part() -> list[str]:
    out = [
        "## Other node roles",
        "",
        "These run as their own processes (or, for the exporter, inside the node agent) and",
        "take flags only; `--config` points at the node agent's file above.",
        "",
    ]
    for name in ("labels", "exporter"):
        out += [f"### `kubegpu {name}`", ""]
        out += _option_table(name)
        out.append("")
    out += [
        "### Global options",
        "",
        "Before the subcommand: `kubegpu --log-level debug|info|warning|error` (default `info`,",
        "environment `KUBEGPU_LOG_LEVEL`) and `--log-format text|json` (default `text`,",
        "`KUBEGPU_LOG_FORMAT`).",
        "",
    ]
    return out


def _anchor(path: str) -> str:
    # GitHub's heading anchors: lower case, punctuation other than - and _ dropped.
    return re.sub(r"[^a-z0-9_\- ]", "", path.lower()).replace(" ", "-")


def render() -> str:
    lines = [
        "<!-- Generated by `python -m kubegpu.docgen.configuration --write` from the config",
        "     models and the click commands. Do not edit by hand: tests/docs fails when this",
        "     file differs from what the generator writes. -->",
        "",
        "# Configuration reference",
        "",
        "Every setting of the long-running roles: the node agent's config file",
        "(`kubegpu device-plugin`), the scheduler extender's settings (`kubegpu extender`) and",
        "the flags of `kubegpu labels` and `kubegpu exporter`. For what the settings are for,",
        "see [install.md](install.md), [sharing.md](sharing.md) and",
        "[architecture.md](architecture.md).",
        "",
        "The node agent's `gpuAllocation` picks how a node's GPUs are handed out: the device",
        "plugin with the scheduler extender (`devicePlugin`), or Dynamic Resource Allocation",
        "(`dra`, `kubegpu dra-driver`, [dra.md](dra.md)). Not implemented, so not configurable:",
        "MIG strategies other than `none` (MIG GPUs are advertised whole).",
        "",
    ]
    lines += _agent_part()
    lines += _extender_part()
    lines += _other_roles_part()
    return "\n".join(lines).rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kubegpu.docgen.configuration", description=__doc__.split("\n")[0]
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help=f"write {DEFAULT_OUTPUT}")
    group.add_argument("--check", action="store_true", help=f"exit 1 if {DEFAULT_OUTPUT} is stale")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    return emit(render(), args.output, write=args.write, check=args.check, regenerate=REGENERATE)


if __name__ == "__main__":
    sys.exit(main())
