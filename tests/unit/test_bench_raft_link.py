"""bench.raft_link's JSON shape and its native link's frame bound, without starting a process.

``run`` is driven with its per-arm measurement replaced by fixed numbers: the JSON it writes must keep
the shape docs/internals/raft-performance.md reads (rounds alternating their order, load per round, the
burner round kept out of the summary and summarized on its own, p50 pairs against grpc_stream counted).
No timing is asserted: the bench's numbers are read by people, not checked here."""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path
from typing import Any

import pytest

import bench.raft_link as link


class _NoBurner:
    """Stands in for the burner process: nothing runs, kill and wait return at once."""

    def kill(self) -> None:
        pass

    def wait(self, timeout: float | None = None) -> int:
        return 0


def _args(rounds: int, burner: bool) -> argparse.Namespace:
    return link.parse_args(
        ["--rounds", str(rounds), *(["--burner"] if burner else []), "--arms", "grpc_stream,native"]
    )


def test_run_writes_alternating_rounds_a_burner_round_apart_and_p50_pairs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[str] = []
    counter = itertools.count(1)

    def fake_arm(
        arm: str, sizes: tuple[int, ...], seconds: float, warmup: int, tls_dir: Path
    ) -> dict[str, Any]:
        calls.append(arm)
        assert (tls_dir / "ca.pem").exists()  # the mTLS arms' material is written once, before the rounds
        # grpc_stream slower than native in every quiet round; the burner round's numbers stand out
        base = 1000.0 if len(calls) > 4 else (400.0 if arm == "grpc_stream" else 100.0)
        step = float(next(counter))
        return {
            str(size): {
                "round_trips": 10,
                "p50_us": base + step,
                "p99_us": 2 * base,
                "mean_us": base,
                "client_cpu_us_per_rt": base / 2,
                "server_cpu_us_per_rt": base / 4,
            }
            for size in sizes
        }

    monkeypatch.setattr(link, "run_arm", fake_arm)
    monkeypatch.setattr(link, "_burner", _NoBurner)
    result = link.run(_args(rounds=2, burner=True))

    assert calls == ["grpc_stream", "native", "native", "grpc_stream", "grpc_stream", "native"]
    assert [r["order"] for r in result["rounds"]] == [
        ["grpc_stream", "native"],
        ["native", "grpc_stream"],
        ["grpc_stream", "native"],
    ]
    assert [r["burner"] for r in result["rounds"]] == [False, False, True]
    for one in result["rounds"]:
        assert len(one["load_average_before"]) == 3 and len(one["load_average_after"]) == 3
    assert result["sizes"] == [300, 4096]
    assert len(result["load_average_before"]) == 3 and len(result["load_average_after"]) == 3

    summary = result["summary"]
    assert set(summary) == {"grpc_stream", "native"}
    for size in ("300", "4096"):
        native = summary["native"][size]
        assert set(native) == {*link.MEASURES, "p50_below_grpc_stream"}
        assert native["p50_below_grpc_stream"] == [2, 2]  # the burner round is not a quiet pair
        assert native["p50_us"] < 400  # the burner round's 1000 µs stays out of the quiet medians
        assert "p50_below_grpc_stream" not in summary["grpc_stream"][size]
    burner = result["burner_summary"]["native"]["300"]
    assert burner["p50_us"] > 1000 and burner["p50_below_grpc_stream"] == [0, 1]


def test_a_run_without_the_burner_has_no_burner_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_arm(
        arm: str, sizes: tuple[int, ...], seconds: float, warmup: int, tls_dir: Path
    ) -> dict[str, Any]:
        return {str(s): dict.fromkeys(("round_trips", "mean_us", *link.MEASURES), 1.0) for s in sizes}

    monkeypatch.setattr(link, "run_arm", fake_arm)
    result = link.run(_args(rounds=1, burner=False))
    assert "burner_summary" not in result
    assert [r["burner"] for r in result["rounds"]] == [False]


def test_the_frame_reader_splits_frames_across_reads_and_refuses_an_oversized_header_at_once() -> None:
    reader = link.FrameReader(max_bytes=8)
    stream = link.frame(b"abc") + link.frame(b"") + link.frame(b"12345678")
    assert reader.feed(stream[:2]) == []
    assert reader.feed(stream[2:9]) == [b"abc"]  # the empty frame's header is half in
    assert reader.feed(stream[9:]) == [b"", b"12345678"]
    # a header announcing 9 bytes fails before any payload byte arrives: nothing is buffered for it
    with pytest.raises(link.FrameTooLarge):
        link.FrameReader(max_bytes=8).feed((9).to_bytes(link.HEADER_BYTES, "big"))


def test_the_bench_messages_are_the_sizes_asked_for() -> None:
    assert len(link.fetch_response(300).records) == 300
    assert link.fetch_request(4096).max_bytes == 4096  # the server picks the answer by it
    assert (
        link.peer_common_name({"subject": ((("organizationName", "kraft"),), (("commonName", "c-1"),))})
        == "c-1"
    )
    assert link.peer_common_name(None) is None
