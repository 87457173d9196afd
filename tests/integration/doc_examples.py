"""The ``kraft`` commands shown in the docs, their sample output, and the shape checks that compare a
real run with that sample — the pure half of ``test_executed_docs.py`` (no processes, no cluster).

**What counts as a command.** In every fenced code block of a document: a line ``$ …`` (a shell prompt)
whose command line runs ``kraft`` (first word, or after ``|``, ``;``, ``&&``, ``$(``) is an example, and
the lines below it up to the next prompt are its sample output; in a block without prompts every line that
starts with ``kraft `` is an example without sample output.  A trailing ``\\`` continues a command on the
next line; a `` # …`` comment after it is dropped.  ``(exit N)`` in an output states the exit status.

**Markers.**  HTML comments (invisible on GitHub) right above a block's opening fence decide how the block
runs; each names its reason, so a reviewer sees why a command shown to users is not executed::

    <!-- doc-test: skip reason="starts a cluster of its own; test_demo.py runs it" -->
    <!-- doc-test: skip command="kraft cluster down" reason="…" -->   (only commands with that prefix)
    <!-- doc-test: setup command="kraft topic create sized …" reason="…" -->   (run first, must exit 0)
    <!-- doc-test: output-of command="kraft cluster up --dir /tmp/c --profile fast" -->
    <!-- doc-test: run-first reason="…" -->  /  <!-- doc-test: run-last reason="…" -->

``output-of`` is for a block that shows only output (its command is in the prose above it).  Blocks run in
document order (``run-first`` ones before all others, ``run-last`` ones after).  A marker that is
malformed, not followed by a block, or (``skip command=``) matches no command of its block is an error,
so markers cannot silently go stale.

**Shape** (:func:`shape_problems`): what a sample shows is checked, not its values — the exit status
(0 unless the sample shows an ``error:`` line or ``(exit N)``), one ``error: CODE`` line with the code
shown, table header columns, ``Key: value`` keys, the keys of JSON output at every level (a ``…`` stands
for more), and every free-text line as a *skeleton*: its words with numbers, ids and paths masked.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

KINDS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    # kind: (required attributes, optional attributes)
    "skip": (frozenset({"reason"}), frozenset({"command"})),
    "setup": (frozenset({"command", "reason"}), frozenset()),
    "output-of": (frozenset({"command"}), frozenset()),
    "run-first": (frozenset({"reason"}), frozenset()),
    "run-last": (frozenset({"reason"}), frozenset()),
}
FIRST, MIDDLE, LAST = 0, 1, 2

_FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*doc-test:(?P<body>.*?)-->\s*$")
_PROMPT = re.compile(r"^\s*\$ (?P<command>.*)$")
# `kraft` in command position: first word, or after a pipe, a list operator or a command substitution.
_RUNS_KRAFT = re.compile(r"(?:^|[|;&]\s*|\$\(\s*)kraft(?:\s|$)")
_EXIT = re.compile(r"^\s*\(exit (?P<code>\d+)\)\s*$")
_HEADER_ROW = re.compile(r"^\s*┃(?P<cells>[^│]*)┃\s*$")
_KEY_VALUE = re.compile(r"^(?P<key>[A-Za-z][\w.-]*):(?:\s+\S.*)?$")
_ERROR = re.compile(r"^error: (?:(?P<code>[A-Z][A-Z0-9_]+): )?")
ELISION = "…"
_BOX = frozenset("┏┃┡│└┗╇━─┳┻┓┛┩┘┐┌")
# Words whose value differs from run to run: anything with a digit (ids, ports, offsets, counts), paths,
# and the 22-character base64 ids of clusters and directories.
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')
_VARIABLE_WORD = re.compile(r"^\W*(?:\S*\d\S*|\.?/\S*|[A-Za-z0-9_-]{22})\W*$")


class MarkupError(ValueError):
    """A doc-test marker that is malformed, misplaced or stale (the message names file and line)."""


@dataclass(frozen=True)
class Marker:
    kind: str
    attrs: dict[str, str]
    line: int


@dataclass(frozen=True)
class Example:
    """One command shown in a doc and the output shown for it (empty when the doc shows none)."""

    where: str  # path:line
    command: str
    output: tuple[str, ...]
    skip_reason: str | None = None

    @property
    def expected_exit(self) -> int:
        for line in self.output:
            match = _EXIT.match(line)
            if match:
                return int(match.group("code"))
        return 1 if any(_ERROR.match(line) for line in self.output) else 0

    @property
    def shown_output(self) -> list[str]:
        return [line for line in self.output if not _EXIT.match(line)]


@dataclass(frozen=True)
class Block:
    where: str  # path:line of the opening fence
    lines: tuple[str, ...]
    examples: tuple[Example, ...]
    setup: tuple[tuple[str, str], ...] = ()  # (command, reason)
    phase: int = MIDDLE
    markers: tuple[Marker, ...] = field(default=(), repr=False)


def parse_marker(body: str, where: str, line: int) -> Marker:
    """``skip command="kraft x" reason="why"`` → Marker; raises :class:`MarkupError`."""
    try:
        words = shlex.split(body)
    except ValueError as exc:
        raise MarkupError(f"{where}: doc-test marker is not shell-quoted correctly: {exc}") from None
    if not words or words[0] not in KINDS:
        raise MarkupError(
            f"{where}: doc-test marker kind must be one of {sorted(KINDS)}, got {body.strip()!r}"
        )
    kind, attrs = words[0], {}
    for word in words[1:]:
        key, sep, value = word.partition("=")
        if not sep or not value.strip():
            raise MarkupError(f'{where}: doc-test {kind}: {word!r} is not key="value"')
        attrs[key] = value.strip()
    required, optional = KINDS[kind]
    missing, unknown = required - attrs.keys(), attrs.keys() - required - optional
    if missing or unknown:
        raise MarkupError(
            f"{where}: doc-test {kind}: missing {sorted(missing)}, unknown {sorted(unknown)} "
            f"(every skip, setup and ordering states its reason)"
        )
    return Marker(kind, attrs, line)


def strip_comment(command: str) -> str:
    """``kraft x --y 1   # why`` → ``kraft x --y 1`` (a ``#`` inside quotes or a word is kept)."""
    quote = ""
    for index, char in enumerate(command):
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or command[index - 1].isspace()):
            return command[:index].rstrip()
    return command.rstrip()


def runs_kraft(command: str) -> bool:
    return _RUNS_KRAFT.search(command) is not None


def _join_continued(lines: Sequence[str], start: int, first: str) -> tuple[str, int]:
    """The command starting with ``first`` (line ``start``) with its ``\\`` continuation lines joined;
    returns it and the index of the next unread line."""
    parts, index = [first], start + 1
    while parts[-1].rstrip().endswith("\\") and index < len(lines):
        parts[-1] = parts[-1].rstrip()[:-1].rstrip()
        parts.append(lines[index].strip())
        index += 1
    return strip_comment(" ".join(parts)), index


def block_examples(lines: Sequence[str], path: str, first_line: int) -> list[Example]:
    """The examples of one block's lines (``first_line``: the line of ``lines[0]`` in document ``path``)."""
    examples: list[Example] = []
    if any(_PROMPT.match(line) for line in lines):
        index = 0
        while index < len(lines):
            prompt = _PROMPT.match(lines[index])
            if prompt is None:
                index += 1  # output of a non-kraft prompt, or text before the first prompt
                continue
            start = index
            command, index = _join_continued(lines, index, prompt.group("command"))
            output: list[str] = []
            while index < len(lines) and not _PROMPT.match(lines[index]):
                output.append(lines[index])
                index += 1
            if runs_kraft(command):
                examples.append(Example(f"{path}:{first_line + start}", command, tuple(output)))
        return examples
    index = 0
    while index < len(lines):
        text = lines[index].strip()
        if text.startswith("kraft "):
            start = index
            command, index = _join_continued(lines, index, text)
            examples.append(Example(f"{path}:{first_line + start}", command, ()))
        else:
            index += 1
    return examples


def _apply_markers(
    path: str, line: int, lines: tuple[str, ...], examples: list[Example], markers: list[Marker]
) -> Block:
    setup: list[tuple[str, str]] = []
    phase = MIDDLE
    # output-of first: it makes the example that a skip marker of the same block may name
    for marker in sorted(markers, key=lambda m: m.kind != "output-of"):
        at = f"{path}:{marker.line}"
        if marker.kind == "skip":
            prefix = marker.attrs.get("command")
            matched = False
            for position, example in enumerate(examples):
                if prefix is None or example.command.startswith(prefix):
                    examples[position] = Example(
                        example.where, example.command, example.output, marker.attrs["reason"]
                    )
                    matched = True
            if not matched:
                raise MarkupError(f"{at}: doc-test skip matches no command of the block below it")
        elif marker.kind == "setup":
            setup.append((marker.attrs["command"], marker.attrs["reason"]))
        elif marker.kind == "output-of":
            if examples:
                raise MarkupError(f"{at}: doc-test output-of on a block that shows its own commands")
            command = marker.attrs["command"]
            if not runs_kraft(command):
                raise MarkupError(f"{at}: doc-test output-of command does not run kraft: {command!r}")
            examples.append(Example(at, command, lines))
        else:
            phase = FIRST if marker.kind == "run-first" else LAST
    return Block(f"{path}:{line}", lines, tuple(examples), tuple(setup), phase, tuple(markers))


def parse_document(text: str, path: str) -> list[Block]:
    """Every fenced block of a Markdown document, with its examples and markers applied."""
    blocks: list[Block] = []
    lines = text.splitlines()
    pending: list[Marker] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        marker = _MARKER.match(line)
        fence = _FENCE.match(line)
        if marker:
            pending.append(parse_marker(marker.group("body"), f"{path}:{index + 1}", index + 1))
        elif fence:
            close = fence.group(2)
            end = index + 1
            while end < len(lines) and lines[end].strip() != close:
                end += 1
            if end == len(lines):
                raise MarkupError(f"{path}:{index + 1}: code block is never closed")
            body = tuple(lines[index + 1 : end])
            examples = block_examples(body, path, index + 2)
            blocks.append(_apply_markers(path, index + 1, body, examples, pending))
            pending = []
            index = end
        elif pending and line.strip():
            raise MarkupError(
                f"{path}:{pending[-1].line}: doc-test marker is not directly above a code block "
                f"(found {line.strip()[:60]!r} first)"
            )
        index += 1
    if pending:
        raise MarkupError(f"{path}:{pending[-1].line}: doc-test marker at the end of the document")
    return blocks


def load_blocks(root: Path, documents: Iterable[str]) -> list[Block]:
    """The blocks of ``documents`` (paths relative to ``root``) in run order: ``run-first`` blocks, the
    rest, then ``run-last`` blocks — each group in document order."""
    blocks = [b for doc in documents for b in parse_document((root / doc).read_text(encoding="utf-8"), doc)]
    return sorted(blocks, key=lambda block: block.phase)  # sorted() is stable: document order within a phase


# --- shape -------------------------------------------------------------------------------------------


def table_headers(lines: Iterable[str]) -> list[list[str]]:
    """The header row of every rich table (``┃ A ┃ B ┃``) in ``lines``, as lists of column names."""
    headers: list[list[str]] = []
    for line in lines:
        match = _HEADER_ROW.match(line)
        if match:
            headers.append([cell.strip() for cell in match.group("cells").split("┃")])
    return headers


def keys_of_key_values(lines: Iterable[str]) -> list[str]:
    """The keys of ``Key: value`` lines (``error:`` lines and table rows excluded), in order."""
    keys: list[str] = []
    for line in lines:
        match = _KEY_VALUE.match(line)
        if match and match.group("key") != "error":
            keys.append(match.group("key"))
    return keys


def json_texts(lines: Sequence[str]) -> list[str]:
    """The JSON objects/arrays shown in ``lines``: each starts on a line beginning with ``{`` or ``[`` and
    runs until its brackets balance (strings respected); a sample may elide parts with ``…``."""
    texts: list[str] = []
    index = 0
    while index < len(lines):
        if not lines[index].lstrip().startswith(("{", "[")):
            index += 1
            continue
        depth, collected = 0, []
        while index < len(lines):
            collected.append(lines[index])
            depth += _bracket_balance(lines[index])
            index += 1
            if depth <= 0:
                break
        texts.append("\n".join(collected))
    return texts


def _bracket_balance(text: str) -> int:
    depth, in_string, escaped = 0, False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
    return depth


@dataclass(frozen=True)
class SampleObject:
    """A JSON object of a sample: its keys (with their sample values) and whether ``…`` stands for more."""

    fields: dict[str, object]
    elided: bool


@dataclass(frozen=True)
class SampleArray:
    items: list[object]
    elided: bool


class _SampleParser:
    """JSON as docs show it: ``…`` may stand for a value, for more keys or items, or open a free-text
    remark (``… one object per partition …``) that runs to the next ``,``, ``]`` or ``}``."""

    def __init__(self, text: str) -> None:
        self.text, self.at = text, 0

    def _skip(self) -> str:
        while self.at < len(self.text) and self.text[self.at].isspace():
            self.at += 1
        return self.text[self.at] if self.at < len(self.text) else ""

    def _expect(self, char: str) -> None:
        if self._skip() != char:
            raise ValueError(f"expected {char!r} at {self.at} of {self.text[:80]!r}")
        self.at += 1

    def _remark(self) -> None:
        depth = 0
        while self.at < len(self.text):
            char = self.text[self.at]
            if char in "{[":
                depth += 1
            elif char in "}]" and depth:
                depth -= 1
            elif char in ",}]" and not depth:
                return
            self.at += 1

    def _string(self) -> str:
        self._expect('"')
        start = self.at
        while self.text[self.at] != '"':
            self.at += 2 if self.text[self.at] == "\\" else 1
        self.at += 1
        return str(json.loads(self.text[start - 1 : self.at]))

    def value(self) -> object:
        char = self._skip()
        if char == "{":
            return self._object()
        if char == "[":
            return self._array()
        if char == '"':
            return self._string()
        if char == ELISION:
            self._remark()
            return ELISION
        start = self.at
        while (
            self.at < len(self.text) and self.text[self.at] not in ",]}" and not self.text[self.at].isspace()
        ):
            self.at += 1
        return json.loads(self.text[start : self.at])  # a number, true, false or null

    def _object(self) -> SampleObject:
        self._expect("{")
        fields: dict[str, object] = {}
        elided = False
        while self._skip() != "}":
            if self._skip() == ELISION:
                self._remark()
                elided = True
            else:
                key = self._string()
                self._expect(":")
                fields[key] = self.value()
            if self._skip() == ",":
                self.at += 1
        self.at += 1
        return SampleObject(fields, elided)

    def _array(self) -> SampleArray:
        self._expect("[")
        items: list[object] = []
        elided = False
        while self._skip() != "]":
            if self._skip() == ELISION:
                self._remark()
                elided = True
            else:
                items.append(self.value())
            if self._skip() == ",":
                self.at += 1
        self.at += 1
        return SampleArray(items, elided)


def parse_sample_json(text: str) -> object:
    """A JSON sample of the docs as :class:`SampleObject` / :class:`SampleArray` / scalars; raises
    ``ValueError`` when it is not JSON even allowing for ``…``."""
    try:
        return _SampleParser(text).value()
    except (IndexError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise ValueError(f"not a JSON sample ({exc}): {text[:80]!r}") from exc


def json_shape_problems(sample: object, real: object, path: str = "$") -> list[str]:
    """Where ``real`` (parsed output) lacks the structure of ``sample``: the keys of every object the
    sample shows (all of them unless it elides some with ``…``), arrays, objects and their nesting.
    Values are not compared, and an empty sample object (``{}``) is a map whose keys are data."""
    if isinstance(sample, SampleObject):
        if not isinstance(real, dict):
            return [f"{path}: an object in the doc, {type(real).__name__} in the output"]
        if not sample.fields:
            return []
        shown, got = list(sample.fields), list(real)
        if not set(shown) <= set(got) or (not sample.elided and set(shown) != set(got)):
            more = " and more (…)" if sample.elided else ""
            return [f"{path}: keys {got}, the doc shows {shown}{more}"]
        return [
            p
            for key, value in sample.fields.items()
            for p in json_shape_problems(value, real[key], f"{path}.{key}")
        ]
    if isinstance(sample, SampleArray):
        if not isinstance(real, list):
            return [f"{path}: an array in the doc, {type(real).__name__} in the output"]
        if not real:
            return []
        return [
            p
            for index, item in enumerate(sample.items)
            for p in json_shape_problems(item, real[min(index, len(real) - 1)], f"{path}[{index}]")
        ]
    return []


def real_json_values(text: str) -> list[object]:
    """Every JSON value printed in ``text`` (one document, ``jq -c`` lines, …), in order."""
    decoder, values, index = json.JSONDecoder(), [], 0
    while index < len(text):
        while index < len(text) and text[index].isspace():
            index += 1
        if index >= len(text):
            break
        value, index = decoder.raw_decode(text, index)
        values.append(value)
    return values


def skeleton(line: str) -> str:
    """``line`` with every double-quoted string (JSON-ish data) and every word whose value varies (see
    ``_VARIABLE_WORD``) replaced by ``#``: the shape of a sentence the CLI prints, e.g. ``produced #
    record(s) to # at offsets #``."""
    line = _QUOTED.sub('"#"', line)
    return " ".join("#" if _VARIABLE_WORD.match(word) else word for word in line.split())


def sentence_lines(lines: Sequence[str]) -> list[str]:
    """The lines of a sample that are free text: not part of a table, JSON, ``Key: value`` or ``error:``
    line, not elided (``…``), not blank."""
    in_json = {line for text in json_texts(lines) for line in text.splitlines()}
    return [
        line
        for line in lines
        if line.strip()
        and line not in in_json
        and not _BOX.intersection(line.strip()[:1])
        and not _KEY_VALUE.match(line)
        and not _ERROR.match(line)
        and not _EXIT.match(line)
        and ELISION not in line
    ]


def _is_subsequence(small: Sequence[str], big: Sequence[str]) -> bool:
    it = iter(big)
    return all(item in it for item in small)


def shape_problems(example: Example, code: int, stdout: str, stderr: str) -> list[str]:
    """What differs between the sample of ``example`` and a real run (``code``, ``stdout``, ``stderr``):
    empty when the shape matches."""
    shown = example.shown_output
    problems: list[str] = []
    expected = example.expected_exit
    if code != expected:
        problems.append(f"exit status {code}, the doc shows {expected} (stderr: {stderr.strip()[:300]!r})")
    doc_errors = [m for m in (_ERROR.match(line) for line in shown) if m]
    real_errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    if doc_errors:
        if len(stderr.strip().splitlines()) != 1 or not real_errors:
            problems.append(f"the doc shows one error line; stderr was {stderr.strip()[:300]!r}")
        else:
            want = doc_errors[0].group("code")
            got_match = _ERROR.match(real_errors[0])
            got = got_match.group("code") if got_match else None
            if want and want != got:
                problems.append(f"error code {got}, the doc shows {want}: {real_errors[0][:200]!r}")
    elif real_errors and expected == 0:
        problems.append(f"unexpected error: {real_errors[0][:300]!r}")
    real_lines = stdout.splitlines()
    doc_headers, real_headers = table_headers(shown), table_headers(real_lines)
    if doc_headers and doc_headers != real_headers[: len(doc_headers)]:
        problems.append(f"table columns {real_headers}, the doc shows {doc_headers}")
    doc_json = json_texts(shown)
    if doc_json:
        try:
            values = [v for v in real_json_values(stdout) if isinstance(v, dict | list)]
        except ValueError as exc:
            problems.append(f"the doc shows JSON; stdout is not JSON ({exc}): {stdout[:200]!r}")
            values = None
        if values is not None and len(values) < len(doc_json):
            problems.append(f"the doc shows {len(doc_json)} JSON values, stdout has {len(values)}")
        for sample, value in zip(doc_json, values or [], strict=False):
            try:
                problems.extend(json_shape_problems(parse_sample_json(sample), value))
            except ValueError as exc:
                problems.append(f"the doc's JSON sample cannot be read: {exc}")
    else:
        doc_keys = keys_of_key_values(shown)
        real_keys = keys_of_key_values(real_lines)
        elided = any(ELISION in line for line in shown)
        if doc_keys and (not _is_subsequence(doc_keys, real_keys) or (not elided and doc_keys != real_keys)):
            problems.append(f"keys {real_keys}, the doc shows {doc_keys}")
    real_sentences = {skeleton(line) for line in stdout.splitlines() + stderr.splitlines()}
    for line in sentence_lines(shown):
        if skeleton(line) not in real_sentences:
            problems.append(f"no line shaped like {skeleton(line)!r} (the doc shows {line.strip()!r})")
    return problems


# --- event names -------------------------------------------------------------------------------------

_EVENT_REF = re.compile(r"event=([a-z][a-z0-9_]*)")
_TABLE_EVENT = re.compile(r"`([a-z][a-z0-9_]*)`")


def documented_events(text: str) -> set[str]:
    """``event=NAME`` anywhere in a document, and the names in the first column of a Markdown table whose
    first header cell is ``event``."""
    names = set(_EVENT_REF.findall(text))
    in_event_table = False
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if not cells:
            in_event_table = False
        elif cells[0] == "event":
            in_event_table = True
        elif in_event_table and not set(cells[0]) <= set("-: "):
            names.update(_TABLE_EVENT.findall(cells[0]))
    return names
