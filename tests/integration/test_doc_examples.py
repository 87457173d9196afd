"""``doc_examples``: how the executed-docs test reads commands, sample output and doc-test markers out of
Markdown, and how it compares a real run with a sample.  Pure: no processes (it lives beside the test it
serves, so it is collected with the integration tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from doc_examples import (
    FIRST,
    LAST,
    MIDDLE,
    Example,
    MarkupError,
    SampleArray,
    SampleObject,
    documented_events,
    json_shape_problems,
    load_blocks,
    parse_document,
    parse_sample_json,
    shape_problems,
    skeleton,
    strip_comment,
)

FENCE = "```"


def doc(*lines: str) -> str:
    return "\n".join(lines) + "\n"


def test_prompts_give_commands_with_the_output_below_each() -> None:
    text = doc(
        "intro",
        FENCE,
        "$ kraft topic create orders \\",
        "    --partitions 4   # why",
        "topic orders created",
        "$ jq .x file",
        "not kraft output",
        "$ head -c 9 /dev/zero | kraft produce -t t",
        "error: MESSAGE_TOO_LARGE: too big",
        "$ kraft broker shutdown 102",
        "broker 102 is in controlled shutdown",
        "(exit 0)",
        FENCE,
    )
    (block,) = parse_document(text, "ops.md")
    assert block.where == "ops.md:2" and block.phase == MIDDLE
    commands = [(e.where, e.command, e.output) for e in block.examples]
    assert commands == [
        ("ops.md:3", "kraft topic create orders --partitions 4", ("topic orders created",)),
        ("ops.md:8", "head -c 9 /dev/zero | kraft produce -t t", ("error: MESSAGE_TOO_LARGE: too big",)),
        ("ops.md:10", "kraft broker shutdown 102", ("broker 102 is in controlled shutdown", "(exit 0)")),
    ]
    assert [e.expected_exit for e in block.examples] == [0, 1, 0]
    assert block.examples[2].shown_output == ["broker 102 is in controlled shutdown"]


def test_a_block_without_prompts_lists_commands_without_output() -> None:
    text = doc(
        "```sh",
        "make demo   # not kraft",
        "kraft cluster up --dir ./kc     # local cluster,",
        "                                # prints endpoints",
        "kraft storage format -c c.properties \\",
        '    --initial-controllers "1@h1:9093:X"',
        FENCE,
    )
    (block,) = parse_document(text, "README.md")
    assert [(e.command, e.output) for e in block.examples] == [
        ("kraft cluster up --dir ./kc", ()),
        ('kraft storage format -c c.properties --initial-controllers "1@h1:9093:X"', ()),
    ]


def test_comments_are_stripped_outside_quotes_only() -> None:
    assert strip_comment("kraft x -v 'a # b' # c") == "kraft x -v 'a # b'"
    assert strip_comment("kraft x --value id#1") == "kraft x --value id#1"
    assert strip_comment('kraft x -v "#"') == 'kraft x -v "#"'


def test_markers_skip_set_up_order_and_name_output_blocks(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text(
        doc(
            '<!-- doc-test: skip command="kraft cluster down" reason="run once at the end" -->',
            "",
            FENCE,
            "kraft topic list",
            "kraft cluster down --dir x",
            FENCE,
            '<!-- doc-test: run-last reason="stops it" -->',
            '<!-- doc-test: output-of command="kraft cluster down --dir /tmp/c" -->',
            FENCE,
            "broker-101: stopped",
            FENCE,
        )
    )
    (tmp_path / "b.md").write_text(
        doc(
            '<!-- doc-test: setup command="kraft topic create t" reason="the sample needs t" -->',
            FENCE,
            "$ kraft topic describe t",
            FENCE,
            '<!-- doc-test: run-first reason="starts the cluster" -->',
            "<!-- doc-test: output-of command='kraft cluster up --dir /tmp/c' -->",
            FENCE,
            "┃ id ┃ role ┃",
            FENCE,
            '<!-- doc-test: skip reason="starts a second cluster" -->',
            FENCE,
            "$ kraft demo",
            FENCE,
        )
    )
    blocks = load_blocks(tmp_path, ["a.md", "b.md"])
    assert [(b.where, b.phase) for b in blocks] == [
        ("b.md:7", FIRST),
        ("a.md:3", MIDDLE),
        ("b.md:2", MIDDLE),
        ("b.md:11", MIDDLE),
        ("a.md:9", LAST),
    ]
    up, listing, describe, demo, down = blocks
    assert up.examples == (Example("b.md:6", "kraft cluster up --dir /tmp/c", ("┃ id ┃ role ┃",)),)
    assert [(e.command, e.skip_reason) for e in listing.examples] == [
        ("kraft topic list", None),
        ("kraft cluster down --dir x", "run once at the end"),
    ]
    assert describe.setup == (("kraft topic create t", "the sample needs t"),)
    assert demo.examples[0].skip_reason == "starts a second cluster"
    assert down.examples[0].output == ("broker-101: stopped",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (doc("<!-- doc-test: explode -->", FENCE, "kraft x", FENCE), "kind must be one of"),
        (doc("<!-- doc-test: skip -->", FENCE, "kraft x", FENCE), "missing ['reason']"),
        (
            doc('<!-- doc-test: skip reason="r" colour="red" -->', FENCE, "kraft x", FENCE),
            "unknown ['colour']",
        ),
        (doc('<!-- doc-test: skip reason="r" -->', "prose", FENCE, "kraft x", FENCE), "not directly above"),
        (doc('<!-- doc-test: skip command="kraft y" reason="r" -->', FENCE, "kraft x", FENCE), "matches no"),
        (doc('<!-- doc-test: skip reason="r" -->', FENCE, "output only", FENCE), "matches no"),
        (doc('<!-- doc-test: output-of command="kraft y" -->', FENCE, "$ kraft x", FENCE), "shows its own"),
        (doc('<!-- doc-test: output-of command="ls" -->', FENCE, "x", FENCE), "does not run kraft"),
        (doc('<!-- doc-test: skip reason="unclosed -->', FENCE, "kraft x", FENCE), "not shell-quoted"),
        (doc("text", '<!-- doc-test: run-last reason="r" -->'), "end of the document"),
        (doc(FENCE, "kraft x"), "never closed"),
    ],
)
def test_bad_or_stale_markers_are_errors_naming_the_line(text: str, message: str) -> None:
    with pytest.raises(MarkupError, match=r"^d\.md:[0-9]+: ") as raised:
        parse_document(text, "d.md")
    assert message in str(raised.value)


TABLE = ["┏━━━━┳━━━━━━┓", "┃ id ┃ role ┃", "┡━━━━╇━━━━━━┩", "│ 1  │ ctl  │", "└────┴──────┘"]


def sample(*output: str) -> Example:
    return Example("d.md:1", "kraft x", output)


def test_a_matching_run_has_no_problems_whatever_the_values() -> None:
    shown = sample(
        *TABLE,
        "Id:    101",
        "State: ACTIVE",
        "produced 2 record(s) to orders-1 at offsets 0..1",
        "cluster rMMtcdxgeffNNGTLRz2aeQ in /tmp/c",
    )
    real = "\n".join(
        [
            "┏━━━━┳━━━━━━┓",
            "┃ id ┃ role ┃",
            "┡━━━━╇━━━━━━┩",
            "│ 7  │ broker │",
            "Id:    102",
            "State: FENCED",
            "produced 5 record(s) to t-0 at offsets 10..14",
            "cluster AbCdEfGhIjKlMnOpQrStUv in /var/tmp/x",
        ]
    )
    assert shape_problems(shown, 0, real, "") == []


def test_columns_keys_sentences_and_exit_status_that_differ_are_reported() -> None:
    shown = sample(*TABLE, "Id: 1", "Rack: -", "topic t deleted")
    real = "┃ id ┃ role ┃ pid ┃\nId: 1\nRack: -\nEpoch: 3\ntopic t removed\n"
    problems = shape_problems(shown, 2, real, "oops")
    assert len(problems) == 4, problems
    assert problems[0].startswith("exit status 2, the doc shows 0")
    assert "table columns [['id', 'role', 'pid']], the doc shows [['id', 'role']]" in problems[1]
    assert "keys ['Id', 'Rack', 'Epoch'], the doc shows ['Id', 'Rack']" in problems[2]
    assert "no line shaped like 'topic t deleted'" in problems[3]
    # an elided sample (…) needs its keys in order, not all of them
    assert shape_problems(sample("Id: 1", "…"), 0, "Id: 1\nRack: -\n", "") == []
    assert shape_problems(sample("Rack: -", "Id: 1", "…"), 0, "Id: 1\nRack: -\n", "")


def test_errors_are_one_line_with_the_code_shown() -> None:
    shown = sample("error: TOPIC_ALREADY_EXISTS: topic 't' already exists")
    assert shape_problems(shown, 1, "", "error: TOPIC_ALREADY_EXISTS: topic 't' exists!\n") == []
    wrong_code = shape_problems(shown, 1, "", "error: INVALID_REQUEST: no\n")
    assert wrong_code == [
        "error code INVALID_REQUEST, the doc shows TOPIC_ALREADY_EXISTS: 'error: INVALID_REQUEST: no'"
    ]
    assert shape_problems(shown, 1, "", "warning\nerror: TOPIC_ALREADY_EXISTS: x\n")[0].startswith(
        "the doc shows one error line"
    )
    assert shape_problems(sample("ok"), 0, "ok\n", "error: NOPE: x\n") == [
        "unexpected error: 'error: NOPE: x'"
    ]
    # (exit N) overrides what an error line implies
    assert sample("error: X: y", "(exit 0)").expected_exit == 0


def test_json_samples_parse_with_elisions_and_remarks() -> None:
    text = (
        '{"name": "orders", "configs": {}, "n": -1.5,\n'
        ' "partitions": [{"partition": 0, "isr": [1]},\n    … one object per partition …]}'
    )
    assert parse_sample_json(text) == SampleObject(
        {
            "name": "orders",
            "configs": SampleObject({}, False),
            "n": -1.5,
            "partitions": SampleArray(
                [SampleObject({"partition": 0, "isr": SampleArray([1], False)}, False)], True
            ),
        },
        False,
    )
    assert parse_sample_json('{"cluster_id": …, "a\\"b": true, …}') == SampleObject(
        {"cluster_id": "…", 'a"b': True}, True
    )
    with pytest.raises(ValueError, match="not a JSON sample"):
        parse_sample_json('{"a" 1}')


def test_json_shapes_compare_keys_at_every_level() -> None:
    sample = parse_sample_json(
        '{"nodes": [{"id": 1, "role": "controller"}, …], "configs": {}, "leader_id": 1}'
    )
    real = {
        "nodes": [{"id": 1, "role": "controller"}, {"id": 2, "role": "broker"}],
        "configs": {"x": "1"},
        "leader_id": None,
    }
    assert json_shape_problems(sample, real) == []
    renamed = {**real, "nodes": [{"id": 1, "kind": "controller"}]}
    assert json_shape_problems(sample, renamed) == [
        "$.nodes[0]: keys ['id', 'kind'], the doc shows ['id', 'role']"
    ]
    (added,) = json_shape_problems(sample, {**real, "healthy": True})
    assert added.endswith("'leader_id', 'healthy'], the doc shows ['nodes', 'configs', 'leader_id']")
    assert json_shape_problems(sample, {**real, "nodes": {}}) == [
        "$.nodes: an array in the doc, dict in the output"
    ]
    assert json_shape_problems(parse_sample_json('{"a": 1, …}'), {"a": 2, "b": 3}) == []
    assert json_shape_problems(parse_sample_json('{"a": 1, …}'), {"b": 3}) == [
        "$: keys ['b'], the doc shows ['a'] and more (…)"
    ]


def test_json_samples_in_output_are_compared_in_order() -> None:
    shown = sample(
        '{"name": "orders", "topic_id": "c1", "configs": {},', ' "partitions": [{"partition": 0}, … ]}'
    )
    real = {"name": "o", "topic_id": "x", "configs": {}, "partitions": [{"partition": 3}]}
    assert shape_problems(shown, 0, json.dumps(real, indent=2), "") == []
    extra = json.dumps({**real, "new_field": 1})
    assert shape_problems(shown, 0, extra, "")[0].startswith("$: keys ['name', 'topic_id', 'configs'")
    # jq -c prints several values: objects and arrays compared in order, scalars (true) as sentences
    lines = sample("true", '{"node": "controller-1", "status": "SERVING"}')
    assert shape_problems(lines, 0, 'true\n{"node":"c","status":"SERVING"}\n', "") == []
    assert shape_problems(lines, 0, "true\n", "") == ["the doc shows 1 JSON values, stdout has 0"]
    assert shape_problems(sample('{"a": 1}'), 0, "not json", "")[0].startswith(
        "the doc shows JSON; stdout is"
    )


def test_skeletons_hide_values_but_keep_the_words() -> None:
    assert skeleton("topic orders now has 4 partitions (new: 2 on 101,102)") == (
        "topic orders now has # partitions (new: # on #"
    )
    assert skeleton("  broker 101 /tmp/kc/data/broker-101: 825 of 2705 bytes usable") == (
        "broker # # # of # bytes usable"
    )
    assert skeleton("cluster rMMtcdxgeffNNGTLRzaeQa in ./kc") == "cluster # in #"
    assert (
        skeleton('| offset: 0 payload: {"key": {"text": "a \\"b\\""}}')
        == '| offset: # payload: {"#": {"#": "#"}}'
    )


def test_event_names_come_from_event_fields_and_event_tables() -> None:
    text = doc(
        "logs `event=partition_logs_closed count=…` and event=fatal.",
        "",
        "| event | logged by |",
        "|---|---|",
        "| `broker_session_expired` (warning) | controller |",
        "| `raft_peer_unreachable`; `raft_peer_reachable` | controller |",
        "",
        "| key | default |",
        "| `not_an_event` | 1 |",
    )
    assert documented_events(text) == {
        "partition_logs_closed",
        "fatal",
        "broker_session_expired",
        "raft_peer_unreachable",
        "raft_peer_reachable",
    }
