"""``ssl.principal.mapping.rules``: Kafka's ``SslPrincipalMapper``, rule for rule.

A rule list is ``DEFAULT`` (the distinguished name unchanged) or ``RULE:pattern/replacement/[LU]``
entries separated by commas, tried in order; the first whose pattern matches the *whole* DN gives the
name: every match of the pattern in the DN replaced by ``replacement`` (``$1`` … back references; a
reference to a group the pattern does not have is literal, ``\\`` escapes the next character), then
lower-cased (``L``) or upper-cased (``U``).  No rule matching is "no principal" (Kafka then fails the
authentication; kraft treats the caller as ``User:ANONYMOUS``).

Patterns are Python regular expressions; the ones Kafka's documentation and tests use (Java syntax) mean
the same in both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_RULES = "DEFAULT"

# Kafka's RULE_PATTERN / RULE_SPLITTER / RULE_PARSER, unchanged.
_RULE_PATTERN = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_RULE_SPLITTER = re.compile(r"\s*(" + _RULE_PATTERN + r")\s*(,\s*|$)")
_RULE_PARSER = re.compile(_RULE_PATTERN)
_BACK_REFERENCE = re.compile(r"\\(.)|\$(\d+)", re.DOTALL)


class MappingRuleError(ValueError):
    """An unparsable rule; the message names it."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule; ``pattern`` None is ``DEFAULT``."""

    pattern: re.Pattern[str] | None = None
    replacement: str = ""
    to_lower: bool = False
    to_upper: bool = False

    def apply(self, dn: str) -> str | None:
        if self.pattern is None:
            return dn
        if self.pattern.fullmatch(dn) is None:
            return None
        groups = self.pattern.groups
        replacement = self.replacement

        def expand(match: re.Match[str]) -> str:
            def one(ref: re.Match[str]) -> str:
                if ref.group(1) is not None:
                    return ref.group(1)
                number = int(ref.group(2))
                if number > groups:
                    return ref.group(0)  # Kafka escapes references past the group count: literal
                return match.group(number) or ""

            return _BACK_REFERENCE.sub(one, replacement)

        result = self.pattern.sub(expand, dn)
        if self.to_lower:
            return result.lower()
        if self.to_upper:
            return result.upper()
        return result

    def __str__(self) -> str:
        if self.pattern is None:
            return "DEFAULT"
        case = "L" if self.to_lower else "U" if self.to_upper else ""
        return f"RULE:{self.pattern.pattern}/{self.replacement}/{case}"


class SslPrincipalMapper:
    """Maps a certificate's distinguished name to a principal name by ``ssl.principal.mapping.rules``."""

    def __init__(self, rules: str | None = None) -> None:
        self.rules: tuple[Rule, ...] = parse_rules(DEFAULT_RULES if rules is None else rules)

    def name(self, dn: str) -> str | None:
        """The mapped name, or None when no rule applies."""
        for rule in self.rules:
            name = rule.apply(dn)
            if name is not None:
                return name
        return None

    def __str__(self) -> str:
        return ", ".join(str(rule) for rule in self.rules)


def _split(text: str) -> list[str]:
    return [match.group(1) for match in _RULE_SPLITTER.finditer(text.strip())]


def parse_rules(text: str) -> tuple[Rule, ...]:
    """Parse a rule list; raises :class:`MappingRuleError` with the offending rule."""
    rules: list[Rule] = []
    for raw in _split(text):
        match = _RULE_PARSER.match(raw)
        if match is None:  # pragma: no cover - the last alternative matches anything
            raise MappingRuleError(f"invalid rule: {raw}")
        if match.end() != len(raw):
            raise MappingRuleError(f"invalid rule {raw!r}: unmatched {raw[match.end() :]!r}")
        if match.group(1) is not None:
            rules.append(Rule())
        elif match.group(2) is not None:
            try:
                pattern = re.compile(match.group(2))
            except re.error as exc:
                raise MappingRuleError(f"invalid rule {raw!r}: bad pattern: {exc}") from None
            case = match.group(6)
            rules.append(Rule(pattern, match.group(4), case == "L", case == "U"))
        # an empty rule (e.g. between two commas) is ignored, as in Kafka
    return tuple(rules)
