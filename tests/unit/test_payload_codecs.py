"""The payload codec chain: round trips through every chain, the chain recorded in each
payload, key rotation, a missing key named in the error, and one history holding payloads
written before and after the setting changed (replayed cold, with encryption's new bytes)."""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Registry, WorkflowContext
from engine.codec import decode_message, encode_message
from engine.codec.payload_codecs import AesGcmCodec, ZstdCodec
from engine.config.payloads import install_payload_codecs, payload_keys
from engine.config.settings import Settings, load_settings
from engine.core.errors import ConfigurationError, PayloadTooLargeError
from engine.core.history import ExecutionStarted, HistoryEvent, TaskCompleted, TaskScheduled
from engine.core.messages import ActivityResult, ActivityTask
from engine.core.payload_codecs import (
    PayloadCodecError,
    active_codecs,
    register_codec,
    split_encoding,
    use_codecs,
)
from engine.core.payloads import (
    JSON,
    Payload,
    from_payload,
    plain_payload,
    same_payload,
    to_payload,
    unseal,
)
from engine.runtime.fastjson import decode, encode
from engine.runtime.jsonhistory import history_to_json
from engine.services.worker.worker import Outbound, TaskRecord, Worker
from engine.testing import TestEngine
from engine.ui.source import readable_event
from tests import process_activities

KEY_1 = base64.b64encode(b"1" * 32).decode()
KEY_2 = base64.b64encode(b"2" * 32).decode()


class Reverse:
    """A user codec: reverses the bytes (enough to prove the chain runs it both ways)."""

    name = "reverse"

    def encode(self, data: bytes) -> bytes:
        return data[::-1]

    def decode(self, data: bytes) -> bytes:
        return data[::-1]


@pytest.fixture(autouse=True)
def _no_chain_after() -> Iterator[None]:
    """The chain is process-wide: every test leaves none behind."""
    yield
    install_payload_codecs(Settings())


def _install(codecs: tuple[str, ...], keys: str = f"k1:{KEY_1}") -> None:
    install_payload_codecs(Settings(payload_codecs=codecs, payload_keys=keys))


CHAINS = st.permutations(["zstd", "aes-gcm", "reverse"]).flatmap(
    lambda names: st.integers(0, 3).map(lambda n: tuple(names[:n]))
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=60, deadline=None)
@given(chain=CHAINS, value=JSON_VALUES, data=st.binary(max_size=4096))
def test_every_chain_round_trips_values_and_bytes(
    chain: tuple[str, ...], value: Any, data: bytes
) -> None:
    register_codec(Reverse())
    _install(chain)
    for original in (value, data):
        payload = to_payload(original)
        inner, names = split_encoding(payload.encoding)
        assert names == chain
        assert inner == ("binary" if isinstance(original, bytes) else JSON)
        assert from_payload(payload) == original
        assert decode(encode(original)) == original


def test_encryption_hides_the_value_and_compression_shrinks_it() -> None:
    _install(("zstd", "aes-gcm"))
    document = {"text": "lorem ipsum " * 2000}
    payload = to_payload(document)
    assert payload.encoding == "json;codecs=zstd,aes-gcm"
    assert b"lorem" not in payload.data
    assert len(payload.data) < len(plain_payload(document).data) // 20
    again = to_payload(document)
    assert again.data != payload.data  # a fresh nonce each time ...
    assert same_payload(again, payload)  # ... and still the same value for replay
    assert not same_payload(again, to_payload({"text": "other"}))


def test_old_keys_decrypt_after_a_rotation_and_the_newest_encrypts() -> None:
    _install(("aes-gcm",), f"k1:{KEY_1}")
    old = to_payload("written before the rotation")
    _install(("aes-gcm",), f"k1:{KEY_1},k2:{KEY_2}")
    new = to_payload("written after")
    assert from_payload(old) == "written before the rotation"
    assert from_payload(new) == "written after"
    assert AesGcmCodec({"k1": b"1" * 32, "k2": b"2" * 32}).encrypting_key == "k2"
    assert new.data[2:4] == b"k2" and old.data[2:4] == b"k1"


def test_a_missing_key_is_named_in_the_error() -> None:
    _install(("aes-gcm",), f"k2:{KEY_2}")
    payload = to_payload({"secret": 1})
    _install((), f"k1:{KEY_1}")
    with pytest.raises(PayloadCodecError, match=r"key id 'k2'.*its keys: k1"):
        from_payload(payload)


def test_a_wrong_key_under_the_right_id_is_refused() -> None:
    payload = Payload(AesGcmCodec({"k1": b"x" * 32}).encode(b"1"), "json;codecs=aes-gcm")
    _install(())
    with pytest.raises(PayloadCodecError, match="does not decrypt"):
        from_payload(payload)


def test_payloads_written_before_a_chain_stay_readable_and_stay_as_written() -> None:
    _install(())
    before = to_payload([1, 2, 3])
    _install(("zstd",))
    assert before.encoding == JSON
    assert from_payload(before) == [1, 2, 3]
    assert to_payload(before) is before  # a stored payload is never encoded twice


def test_an_unregistered_codec_is_named_with_what_to_do() -> None:
    use_codecs(("rot13",))
    with pytest.raises(PayloadCodecError, match=r"no payload codec .rot13.*register_codec"):
        to_payload("x")
    with pytest.raises(PayloadCodecError, match="no payload codec 'rot13'"):
        from_payload(Payload(b"x", "json;codecs=rot13"))


def test_the_settings_come_from_the_payloads_table_and_the_environment(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text(f"# oldest first\nk1:{KEY_1}\nk2:{KEY_2}  # the newest encrypts\n")
    config = tmp_path / "turnstile.toml"
    config.write_text(f'[payloads]\ncodecs = ["zstd", "aes-gcm"]\nkey_file = "{keys}"\n')
    loaded = load_settings(config, env={"TURNSTILE_PAYLOAD_KEYS": f"k3:{KEY_1}"})
    assert loaded.payload_codecs == ("zstd", "aes-gcm")
    assert list(payload_keys(loaded)) == ["k1", "k2", "k3"]
    assert "k3:" not in repr(loaded)
    from_env = load_settings(env={"TURNSTILE_PAYLOAD_CODECS": "zstd"})
    assert from_env.payload_codecs == ("zstd",)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"payload_codecs": "aes-gcm"}, "aes-gcm but no key"),
        ({"payload_codecs": "zstd,zstd"}, "names a codec twice"),
    ],
)
def test_settings_that_cannot_work_are_refused(values: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        load_settings(env={f"TURNSTILE_{k.upper()}": v for k, v in values.items()})


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ("k1", "not KEY_ID:BASE64"),
        ("k1:not base64!", "not valid base64"),
        (f"k1:{base64.b64encode(b'short').decode()}", "16, 24 or 32"),
    ],
)
def test_bad_keys_are_refused_at_start_up(keys: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        _install(("aes-gcm",), keys)


def test_a_key_file_that_is_missing_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"payload_key_file .*cannot be read"):
        install_payload_codecs(Settings(payload_key_file=str(tmp_path / "none.txt")))


def test_zstd_refuses_bytes_that_are_not_zstd() -> None:
    with pytest.raises(PayloadCodecError, match="not valid zstd"):
        ZstdCodec().decode(os.urandom(64))


app = Registry()


@app.activity(name="codecs.shout")
def shout(text: str) -> str:
    return text.upper()


@app.workflow(name="codecs.twice")
async def twice(ctx: WorkflowContext, text: str) -> list[str]:
    first = await ctx.call_activity(shout, text)
    more = await ctx.wait_for_event("more")
    second = await ctx.call_activity(shout, more)
    return [first, second]


def test_one_history_mixes_payloads_before_and_after_the_chain_and_replays_cold() -> None:
    """Two instances and a cache of one: every turn replays its instance from the history,
    re-encoding each activity input (new ciphertext each time) to compare with the record."""
    plain = Settings(cache_instances=1)
    with TestEngine(app, settings=plain) as env:
        runs = [env.start("codecs.twice", f"run {n}") for n in range(2)]
        env.run()
        _install(("zstd", "aes-gcm"))
        assert active_codecs() == ("zstd", "aes-gcm")
        for n, run in enumerate(runs):
            env.raise_event(run, "more", f"event {n}")
        states = [env.wait_for_completion(run) for run in runs]
        history = env.history(runs[0])
    assert [s.output for s in states] == [["RUN 0", "EVENT 0"], ["RUN 1", "EVENT 1"]]
    encodings = [
        unseal_check(e.body.input if not isinstance(e.body, TaskCompleted) else e.body.output)
        for e in history
        if isinstance(e.body, ExecutionStarted | TaskScheduled | TaskCompleted)
    ]
    assert encodings[:3] == [JSON, JSON, JSON]  # start, first call and its result: before
    assert encodings[3:] == ["json;codecs=zstd,aes-gcm"] * 2  # the second call and result


def unseal_check(payload: Payload | None) -> str:
    """The payload's stored encoding, after checking it decodes."""
    assert payload is not None
    assert unseal(payload).encoding == JSON
    return payload.encoding


def test_the_client_refuses_an_oversize_payload_before_sending_it() -> None:
    small = Settings(max_workflow_input_bytes=1000, max_event_bytes=500)
    with TestEngine(app, settings=small) as env:
        sent = len(env.records(env.topics.commands))
        with pytest.raises(PayloadTooLargeError, match="the workflow input is 1202 bytes"):
            env.start("codecs.twice", "x" * 1200)
        run = env.start("codecs.twice", "small")
        with pytest.raises(PayloadTooLargeError, match="max_event_bytes"):
            env.raise_event(run, "more", "y" * 600)
        with pytest.raises(PayloadTooLargeError, match="the event payload"):
            env.signal_with_start("codecs.twice", run, "more", "y" * 600)
        assert len(env.records(env.topics.commands)) == sent + 1  # only the small start


def test_the_codecs_are_safe_in_threads_as_workers_run_activities() -> None:
    """zstd's contexts are not thread-safe; sharing one across threads corrupted payloads."""
    _install(("zstd", "aes-gcm"))
    values = [{"n": n, "text": f"value {n} " * (50 + n)} for n in range(400)]

    def round_trip(value: dict[str, Any]) -> bool:
        return bool(from_payload(to_payload(value)) == value)

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(round_trip, values))


DRIFT = {"value": "first secret"}


@app.workflow(name="codecs.drifts")
async def drifts(ctx: WorkflowContext, _: Any) -> int:
    await ctx.call_activity(shout, DRIFT["value"])
    await ctx.wait_for_event("go")
    return 1


def test_a_non_determinism_error_names_an_encrypted_input_without_its_value() -> None:
    """Failure texts are stored in the clear: an encrypted value stays out of them."""
    keyed = Settings(
        cache_instances=1,
        park_workflow_errors=False,
        payload_codecs=("aes-gcm",),
        payload_keys=f"k1:{KEY_1}",
    )
    DRIFT["value"] = "first secret"
    with TestEngine(app, settings=keyed) as env:
        run = env.start("codecs.drifts")
        env.run()
        env.advance(timedelta(minutes=2))  # idle long enough for the cache to let it go first
        env.start("codecs.drifts")  # takes the one cache place: the next turn of run replays
        env.run()
        DRIFT["value"] = "second secret"
        env.raise_event(run, "go")
        state = env.wait_for_completion(run)
    assert state.failure is not None and state.failure.type == "NonDeterminismError"
    assert "bytes json;codecs=aes-gcm" in state.failure.message
    assert "secret" not in state.failure.message


def test_the_dashboard_timeline_shows_values_where_the_keys_are() -> None:
    _install(("zstd", "aes-gcm"))
    body = ExecutionStarted(name="w", input=to_payload({"secret": 1}))
    event = HistoryEvent("i", 1, 0, 0, body)
    [shown] = history_to_json([readable_event(event)])
    assert shown["body"]["input"] == {"json": {"secret": 1}}
    _install((), f"k9:{KEY_2}")  # without the key the stored bytes are shown as they are
    [stored] = history_to_json([readable_event(event)])
    assert stored["body"]["input"]["encoding"] == "json;codecs=zstd,aes-gcm"


def test_a_result_made_in_a_spawned_activity_process_gets_the_workers_chain() -> None:
    """A spawned child has none of the worker's settings: the worker seals what it returns."""
    _install(("zstd", "aes-gcm"))
    reg = Registry()
    reg.add_activity(process_activities.quick, name="quick")
    worker = Worker(reg, source_topic="t.activity-tasks", concurrency=1, executor="process")
    worker.assigned([0])
    task = ActivityTask("i", 0, 1, 1, "quick", to_payload(21))
    worker.accept([TaskRecord(0, 0, b"i", encode_message(task), 0)])
    out: list[Outbound] = []
    deadline = time.monotonic() + 60
    while not out and time.monotonic() < deadline:
        out.extend(worker.collect(0.05))
    worker.shutdown()
    [result] = [decode_message(r.value) for r in out]
    assert isinstance(result, ActivityResult) and result.output is not None
    assert split_encoding(result.output.encoding)[1] == ("zstd", "aes-gcm")
    assert from_payload(result.output)[0] == 42


def test_a_chain_that_cannot_work_stops_the_process_at_start_up() -> None:
    with pytest.raises(
        ConfigurationError, match=r"payload codecs: the aes-gcm payload codec has no key"
    ):
        install_payload_codecs(Settings(payload_codecs=("aes-gcm",), payload_key_file=""))
