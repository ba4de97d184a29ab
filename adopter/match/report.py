"""Machine-readable scan output: JSON records and SARIF 2.1.0 for code-scanning tools."""

from __future__ import annotations

from pathlib import Path

from .. import __version__
from ..dsl.syntax import Rule
from .matcher import Site

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def json_records(sites: list[Site]) -> list[dict[str, object]]:
    return [site.as_record() for site in sites]


def sarif_log(sites: list[Site], rules: list[Rule]) -> dict[str, object]:
    """A SARIF log with one run; each site is a ``note``-level result at its line and column."""
    rule_index = {rule.id: index for index, rule in enumerate(rules)}
    driver_rules = [
        {
            "id": rule.id,
            "name": rule.name,
            "shortDescription": {"text": rule.description or rule.name},
            "fullDescription": {"text": rule.doc or rule.description or rule.name},
            "help": {"text": rule.doc or rule.description or rule.name},
            "properties": {"kernel": rule.kernel, "thirdPartyKernel": rule.third_party_kernel},
        }
        for rule in rules
    ]
    results = []
    for site in sites:
        result: dict[str, object] = {
            "ruleId": site.rule.id,
            "level": "note",
            "message": {
                "text": site.message
                if site.applicable
                else f"{site.message} (not applicable: {site.reason})"
            },
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": Path(site.path).as_posix()},
                        "region": {"startLine": site.line, "startColumn": site.column},
                    },
                    "logicalLocations": [
                        {
                            "fullyQualifiedName": f"{site.cls}.{site.method}"
                            if site.cls
                            else site.method,
                            "kind": "function",
                        }
                    ],
                }
            ],
        }
        if site.rule.id in rule_index:
            result["ruleIndex"] = rule_index[site.rule.id]
        results.append(result)
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "adopter",
                        "version": __version__,
                        "informationUri": "https://pypi.org/project/adopter/",
                        "rules": driver_rules,
                    }
                },
                "results": results,
                # Columns count characters (a line of Chinese comments before a site is no
                # longer three times as wide); SARIF's default would be UTF-16 code units.
                "columnKind": "unicodeCodePoints",
            }
        ],
    }
