"""The `quality:` and `expectations:` settings of tables.yaml (and the CLI's and DAG params' quarantine limit),
parsed and validated against the expectations' records. Pure Python: the registry reads them at DAG parse time."""

from __future__ import annotations

import json
import re
from typing import Any

from spark_jobs.errors import ConfigError
from spark_jobs.quality.expectations import ACTIONS, EXPECTATIONS, WARN, Quality, UserExpectation


def parse_share(value: Any, where: str) -> float:
    """`5%` or a fraction such as 0.05."""
    text = str(value).strip()
    try:
        share = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        share = -1.0
    if not 0 <= share <= 1:
        raise ConfigError(f"{where}: 'max_quarantined' must be a share like 5% or 0.05, got {value!r}")
    return share


def parse_quality(spec: Any, where: str, layers: tuple[str, ...], base: Quality = Quality()) -> Quality:
    """`quality: {max_quarantined: 5%, min_quarantined_to_fail: 2, checks: {expectation: warn|quarantine|fail}}`
    over `base`."""
    if spec is None:
        return base
    if not isinstance(spec, dict) or set(spec) - {"max_quarantined", "min_quarantined_to_fail", "checks", "actions"}:
        raise ConfigError(f"{where}: field 'quality' takes max_quarantined, min_quarantined_to_fail, checks and "
                          f"actions, got {spec!r}")
    checks = spec.get("checks") or {}
    if not isinstance(checks, dict):
        raise ConfigError(f"{where}: 'quality.checks' must map expectation names to actions, got {checks!r}")
    overrides = dict(base.overrides)
    for name, action in checks.items():
        expectation = EXPECTATIONS.get(name)
        if expectation is None or not set(expectation.layers) & set(layers):
            known = ", ".join(n for n, e in EXPECTATIONS.items() if set(e.layers) & set(layers))
            raise ConfigError(f"{where}: unknown expectation {name!r} in quality.checks; known: {known}")
        if action not in expectation.actions:
            raise ConfigError(f"{where}: expectation {name!r} takes action {' | '.join(expectation.actions)}, "
                              f"got {action!r}")
        overrides[name] = action
    share = parse_share(spec["max_quarantined"], where) if "max_quarantined" in spec else base.max_quarantined
    least = spec.get("min_quarantined_to_fail", base.min_quarantined_to_fail)
    if isinstance(least, bool) or not isinstance(least, int) or least < 1:
        raise ConfigError(f"{where}: field 'min_quarantined_to_fail' must be a whole number of records, 1 or more, "
                          f"got {least!r}")
    actions = spec.get("actions", None)
    if actions is not None and (not isinstance(actions, list) or not all(
            isinstance(a, dict) and isinstance(a.get("type"), str) and isinstance(a.get("name"), str) for a in actions)):
        raise ConfigError(f"{where}: 'quality.actions' must be a list of GX Checkpoint actions, each with a type "
                          f"and a name (e.g. {{type: slack, name: alert, slack_webhook: ..}}), got {actions!r}")
    return Quality(max_quarantined=share, overrides=tuple(sorted(overrides.items())), min_quarantined_to_fail=least,
                   actions=base.actions if actions is None else tuple(json.dumps(a, sort_keys=True) for a in actions))


_EXPECTATION_NAME = re.compile(r"^expect_[a-z0-9_]+$")


def parse_expectations(spec: Any, where: str, layers: tuple[str, ...] = ("silver",)) -> tuple[UserExpectation, ...]:
    """`expectations:` a list of `{<gx expectation>: {arguments}, action: warn|quarantine|fail, description: ..,
    layer: ..}` (action defaults to warn, layer to the first of `layers`). Only the shape is checked here; GX
    checks names and arguments at job start."""
    if spec is None:
        return ()
    if not isinstance(spec, list):
        raise ConfigError(f"{where}: field 'expectations' must be a list, got {spec!r}")
    parsed = []
    for item in spec:
        names = [k for k in item if k not in ("action", "description", "layer")] if isinstance(item, dict) else []
        if len(names) != 1:
            raise ConfigError(f"{where}: each expectation is {{expect_...: {{arguments}}, action: warn|quarantine|fail}}"
                              f", got {item!r}")
        name, arguments = names[0], item[names[0]]
        if not _EXPECTATION_NAME.match(str(name)):
            raise ConfigError(f"{where}: {name!r} is not a GX expectation name (snake case, expect_...)")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict) or not all(isinstance(k, str) for k in arguments):
            raise ConfigError(f"{where}: expectation {name!r} takes a mapping of arguments, got {arguments!r}")
        action = item.get("action", WARN)
        if action not in ACTIONS:
            raise ConfigError(f"{where}: expectation {name!r} takes action {' | '.join(ACTIONS)}, got {action!r}")
        description = item.get("description")
        if description is not None and not isinstance(description, str):
            raise ConfigError(f"{where}: expectation {name!r}: 'description' must be text, got {description!r}")
        layer = item.get("layer", layers[0])
        if layer not in layers:
            raise ConfigError(f"{where}: expectation {name!r} takes layer {' | '.join(layers)}, got {layer!r}")
        parsed.append(UserExpectation(name, json.dumps(arguments, sort_keys=True, default=str), action, where,
                                      description, layer))
    return tuple(parsed)
