"""kraft.observability: key=value log lines, Prometheus metrics scraped over HTTP, grpc health."""

from __future__ import annotations

import asyncio
import io
import logging
import re
import urllib.request
from collections.abc import Iterator

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kraft.netutil import free_port
from kraft.observability import health
from kraft.observability.logging import (
    KeyValueFormatter,
    configure_logging,
    format_value,
    get_logger,
    parse_level,
)
from kraft.observability.metrics import (
    BrokerMetrics,
    ControllerMetrics,
    RaftMetrics,
    ReplicationMetrics,
    render_metrics,
    start_metrics_server,
)

# --- logging -----------------------------------------------------------------------------------------


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = configure_logging("DEBUG", stream=stream)
    try:
        yield stream
    finally:
        logging.getLogger().removeHandler(handler)


LINE = re.compile(r"^ts=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z level=(\w+) logger=(\S+) event=(\S+)(.*)$")


def test_line_has_timestamp_level_logger_event_then_fields(log_stream: io.StringIO) -> None:
    get_logger("raft", node=1).info("became_leader", epoch=3)
    match = LINE.match(log_stream.getvalue().strip())
    assert match is not None
    assert match.groups() == ("info", "raft", "became_leader", " node=1 epoch=3")


@pytest.mark.parametrize(
    ("value", "rendered"),
    [
        ("plain", "plain"),
        ("two words", '"two words"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("a=b", '"a=b"'),
        ("back\\slash", '"back\\\\slash"'),
        ("line\nbreak", '"line\\nbreak"'),
        ("", '""'),
        (None, "null"),
        (True, "true"),
        (False, "false"),
        (42, "42"),
        (1.5, "1.5"),
        (("a", 1), "\"('a', 1)\""),
    ],
)
def test_values_are_quoted_only_when_needed(value: object, rendered: str) -> None:
    assert format_value(value) == rendered


def test_bind_adds_fields_without_changing_the_parent(log_stream: io.StringIO) -> None:
    parent = get_logger("controller", node=1)
    child = parent.bind(role="active", node=2)
    parent.info("parent_event")
    child.info("child_event", extra="x y")
    lines = log_stream.getvalue().splitlines()
    assert lines[0].endswith("event=parent_event node=1")
    assert lines[1].endswith('event=child_event node=2 role=active extra="x y"')


def test_context_provider_is_evaluated_per_line(log_stream: io.StringIO) -> None:
    state = {"role": "follower", "epoch": 1}
    log = get_logger("raft", node=3).with_context(lambda: state)
    log.info("tick")
    state.update(role="leader", epoch=2)
    log.info("tick", epoch=99)  # call fields win over context fields
    lines = log_stream.getvalue().splitlines()
    assert lines[0].endswith("event=tick node=3 role=follower epoch=1")
    assert lines[1].endswith("event=tick node=3 role=leader epoch=99")


def test_disabled_level_formats_nothing_and_skips_providers(log_stream: io.StringIO) -> None:
    configure_logging("WARNING", stream=log_stream)
    calls: list[int] = []

    def provider() -> dict[str, object]:
        calls.append(1)
        return {"role": "leader"}

    log = get_logger("raft").with_context(provider)
    log.debug("hot_path")
    log.info("hot_path")
    assert calls == []
    assert log_stream.getvalue() == ""
    log.warning("slow_fsync", ms=250)
    assert calls == [1]
    assert "level=warning" in log_stream.getvalue()


def test_failing_provider_does_not_break_logging(log_stream: io.StringIO) -> None:
    def broken() -> dict[str, object]:
        raise RuntimeError("boom")

    get_logger("raft").with_context(broken).error("still_logged")
    assert 'context_error="RuntimeError: boom"' in log_stream.getvalue()


def test_exception_is_one_line_with_type_message_and_escaped_traceback(log_stream: io.StringIO) -> None:
    try:
        raise ValueError("bad thing")
    except ValueError:
        get_logger("broker").exception("apply_failed", offset=7)
    output = log_stream.getvalue()
    assert output.count("\n") == 1
    assert "level=error" in output
    assert "offset=7 exc_type=ValueError" in output
    assert 'exc="bad thing"' in output
    assert "traceback=" in output and "\\n" in output


def test_foreign_stdlib_records_are_formatted_too(log_stream: io.StringIO) -> None:
    logging.getLogger("grpc._cython").warning("peer %s gone", "x")
    assert log_stream.getvalue().strip().endswith('level=warning logger=grpc._cython event="peer x gone"')


def test_configure_logging_replaces_its_previous_handler(log_stream: io.StringIO) -> None:
    second = io.StringIO()
    handler = configure_logging("INFO", stream=second)
    try:
        get_logger("raft").info("once")
        assert log_stream.getvalue() == ""
        assert second.getvalue().count("event=once") == 1
        assert sum(isinstance(h.formatter, KeyValueFormatter) for h in logging.getLogger().handlers) == 1
    finally:
        logging.getLogger().removeHandler(handler)


@pytest.mark.parametrize(
    ("text", "level"), [("debug", 10), ("INFO", 20), (" warn ", 30), ("ERROR", 40), (40, 40)]
)
def test_parse_level(text: str | int, level: int) -> None:
    assert parse_level(text) == level


def test_parse_level_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown log level 'TRACE'"):
        parse_level("TRACE")


# --- metrics -----------------------------------------------------------------------------------------


def _sample(text: str, name: str, **labels: str) -> float:
    label_text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.compile(rf"^{re.escape(name)}\{{{re.escape(label_text)}\}} (\S+)$", re.MULTILINE)
    match = pattern.search(text)
    assert match is not None, f"{name}{{{label_text}}} not exposed"
    return float(match.group(1))


def test_metrics_are_scraped_over_http_with_node_labels() -> None:
    raft = RaftMetrics.for_node(71)
    raft.set_state("Leader")
    raft.current_epoch.set(4)
    raft.high_watermark.set(120)
    raft.append_records.inc(5)
    raft.commit_latency.observe(0.004)
    controller = ControllerMetrics.for_node(71)
    controller.active_controller_count.set(1)
    controller.timed_out_broker_heartbeats.inc()
    broker = BrokerMetrics.for_node(171)
    broker.last_applied_record_offset.set(119)
    broker.metadata_apply_errors.inc(2)
    server = start_metrics_server(free_port(), addr="127.0.0.1")
    assert server is not None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as response:
            text = response.read().decode()
    finally:
        server.close()
    assert _sample(text, "kraft_raft_current_state", node="71", state="leader") == 1
    assert _sample(text, "kraft_raft_current_state", node="71", state="follower") == 0
    assert _sample(text, "kraft_raft_current_epoch", node="71") == 4
    assert _sample(text, "kraft_raft_high_watermark", node="71") == 120
    assert _sample(text, "kraft_raft_current_leader", node="71") == -1
    assert _sample(text, "kraft_raft_append_records_total", node="71") == 5
    assert _sample(text, "kraft_raft_commit_latency_seconds_count", node="71") == 1
    assert _sample(text, "kraft_controller_active_controller_count", node="71") == 1
    assert _sample(text, "kraft_controller_timed_out_broker_heartbeats_total", node="71") == 1
    assert _sample(text, "kraft_broker_last_applied_record_offset", node="171") == 119
    assert _sample(text, "kraft_broker_metadata_apply_errors_total", node="171") == 2


def test_raft_state_switch_leaves_exactly_one_state_set() -> None:
    raft = RaftMetrics.for_node(72)
    raft.set_state("candidate")
    raft.set_state("follower")
    text = render_metrics()
    states = {
        s: _sample(text, "kraft_raft_current_state", node="72", state=s) for s in ("candidate", "follower")
    }
    assert states == {"candidate": 0, "follower": 1}


def test_forgetting_a_nodes_replication_series_drops_them_from_the_registry_and_no_one_else_s() -> None:
    gone, kept = ReplicationMetrics.for_node("forget-gone"), ReplicationMetrics.for_node("forget-kept")
    gone.leader_count.set(3)
    gone.isr_shrinks.inc()
    kept.leader_count.set(5)
    ReplicationMetrics.forget("forget-gone")
    ReplicationMetrics.forget("forget-gone")  # idempotent
    ReplicationMetrics.forget("forget-never")  # never created: nothing to drop
    text = render_metrics()
    assert 'node="forget-gone"' not in text
    assert _sample(text, "kraft_broker_leader_count", node="forget-kept") == 5
    ReplicationMetrics.forget("forget-kept")
    assert 'node="forget-kept"' not in render_metrics()


def test_metrics_port_zero_means_off() -> None:
    assert start_metrics_server(0) is None


# --- health ------------------------------------------------------------------------------------------


async def test_health_statuses_per_service_and_unreachable_targets() -> None:
    server = grpc.aio.server()
    port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
    reporter = await health.add_health_service(server, (health.RAFT_SERVICE, health.CONTROLLER_SERVICE))
    await server.start()
    target = f"127.0.0.1:{port}"
    try:
        assert await health.check_health(target, timeout_s=5) is health.HealthStatus.SERVING
        assert await health.check_health(target, health.RAFT_SERVICE, 5) is health.HealthStatus.NOT_SERVING
        await reporter.set_serving(health.RAFT_SERVICE, True)
        assert await health.check_health(target, health.RAFT_SERVICE, 5) is health.HealthStatus.SERVING
        assert (
            await health.check_health(target, health.BROKER_SERVICE, 5) is health.HealthStatus.SERVICE_UNKNOWN
        )
        await reporter.shutdown()
        assert await health.check_health(target, health.RAFT_SERVICE, 5) is health.HealthStatus.NOT_SERVING
        assert await health.check_health(target, timeout_s=5) is health.HealthStatus.NOT_SERVING
    finally:
        await server.stop(grace=None)
    assert await health.check_health(target, timeout_s=1) is health.HealthStatus.UNREACHABLE


async def test_sync_health_check_matches_async() -> None:
    server = grpc.aio.server()
    port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
    await health.add_health_service(server, (health.BROKER_SERVICE,))
    await server.start()
    try:
        status = await asyncio.to_thread(
            health.check_health_sync, f"127.0.0.1:{port}", health.BROKER_SERVICE, 5.0
        )
        assert status is health.HealthStatus.NOT_SERVING
    finally:
        await server.stop(grace=None)
    unreachable = health.check_health_sync(f"127.0.0.1:{free_port()}", timeout_s=0.5)
    assert unreachable is health.HealthStatus.UNREACHABLE


async def test_health_refuses_undecodable_bytes_and_lists_its_services(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Like kraft's own services: INVALID_ARGUMENT and one warning, not UNKNOWN with a traceback logged
    at error level for each request (the issue #15 fuzzer found this on grpc.health.v1)."""
    caplog.set_level(logging.WARNING)
    server = grpc.aio.server()
    port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
    await health.add_health_service(server, (health.RAFT_SERVICE,))
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            for method in ("Check", "List"):
                with pytest.raises(grpc.aio.AioRpcError) as error:
                    await channel.unary_unary(f"/grpc.health.v1.Health/{method}", None, None)(
                        b"\x0f", timeout=5
                    )
                assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT, method
            watch = channel.unary_stream("/grpc.health.v1.Health/Watch", None, None)(b"\x0f", timeout=5)
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await watch.read()
            assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            listed = await health_pb2_grpc.HealthStub(channel).List(health_pb2.HealthListRequest(), timeout=5)
            assert {name: r.status for name, r in listed.statuses.items()} == {
                "": health_pb2.HealthCheckResponse.SERVING,
                health.RAFT_SERVICE: health_pb2.HealthCheckResponse.NOT_SERVING,
            }
            # Watch still streams a service's status.
            watching = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service=health.RAFT_SERVICE), timeout=5
            )
            first = await watching.read()
            assert isinstance(first, health_pb2.HealthCheckResponse)
            assert first.status == health_pb2.HealthCheckResponse.NOT_SERVING
            watching.cancel()
    finally:
        await server.stop(grace=None)
    warnings = [r for r in caplog.records if r.name == "kraft.observability.health"]
    assert len(warnings) == 1 and "health_bad_request" in warnings[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
