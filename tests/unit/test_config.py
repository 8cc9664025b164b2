"""Settings: every source is checked the same way, and values survive the trip intact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.config.settings import (
    OTHER_ENV,
    Settings,
    bootstrap_servers_problem,
    load_settings,
    parse_kafka_settings,
)
from engine.core.errors import ConfigurationError


def test_defaults() -> None:
    assert load_settings(env={}) == Settings()


def test_environment_sets_settings() -> None:
    settings = load_settings(env={"TURNSTILE_PARTITIONS": "8", "TURNSTILE_NAMESPACE": "shop"})
    assert (settings.partitions, settings.namespace) == (8, "shop")


def test_an_unknown_turnstile_variable_is_an_error_with_a_suggestion() -> None:
    with pytest.raises(ConfigurationError, match="did you mean TURNSTILE_PARTITIONS"):
        load_settings(env={"TURNSTILE_PARTITONS": "8"})


def test_variables_read_elsewhere_are_not_settings_but_are_allowed() -> None:
    env = {name: "x" for name in OTHER_ENV if name != "TURNSTILE_CONFIG"}
    assert load_settings(env=env) == Settings()


def test_an_unknown_toml_key_is_an_error_with_a_suggestion(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text("[turnstile]\nnamespce = 'x'\n")
    with pytest.raises(ConfigurationError, match="did you mean namespace"):
        load_settings(path, env={})


def test_kafka_table_in_toml(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text(
        "[turnstile]\nnamespace = 'x'\n[kafka]\n'sasl.password' = 'a,b=c'\n'enable.ssl.x' = true\n"
    )
    settings = load_settings(path, env={})
    assert settings.extra_kafka == {"sasl.password": "a,b=c", "enable.ssl.x": "true"}


def test_kafka_table_in_a_toml_without_a_turnstile_section(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text("partitions = 4\n[kafka]\n'security.protocol' = 'SSL'\n")
    settings = load_settings(path, env={})
    assert settings.extra_kafka == {"security.protocol": "SSL"} and settings.partitions == 4


def test_extra_kafka_from_the_environment_keeps_commas_in_values() -> None:
    env = {"TURNSTILE_EXTRA_KAFKA": "sasl.password=a,b=c\nsasl.username=u"}
    assert load_settings(env=env).extra_kafka == {"sasl.password": "a,b=c", "sasl.username": "u"}


def test_extra_kafka_from_the_environment_as_json() -> None:
    env = {"TURNSTILE_EXTRA_KAFKA": json.dumps({"sasl.password": "a,b=c"})}
    assert load_settings(env=env).extra_kafka == {"sasl.password": "a,b=c"}


def test_flags_win_over_file_and_environment(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text("[kafka]\n'client.rack' = 'file'\n'linger.ms' = '7'\n")
    env = {"TURNSTILE_EXTRA_KAFKA": "client.rack=env"}
    settings = load_settings(path, env=env, kafka={"client.rack": "flag"})
    assert settings.extra_kafka == {"client.rack": "flag"}


@given(
    st.dictionaries(
        st.from_regex(r"[a-z][a-z.]{0,20}", fullmatch=True),
        st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), max_size=30).map(
            str.strip
        ),
        max_size=5,
    )
)
def test_kafka_lines_round_trip(pairs: dict[str, str]) -> None:
    text = "\n".join(f"{k}={v}" for k, v in pairs.items())
    assert parse_kafka_settings(text) == pairs


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"partitions": 0}, "partitions must be at least 1"),
        ({"replication_factor": -1}, "replication_factor must not be negative"),
        ({"max_batch_ms": -5}, "max_batch_ms must not be negative"),
        ({"worker_id": " "}, "worker_id must not be empty"),
        ({"connect_timeout_ms": 0}, "connect_timeout_ms must be at least 1"),
        ({"partitions": "many"}, "partitions='many' is not valid"),
        ({"partitions": 2.5}, "expected a whole number"),
    ],
)
def test_invalid_values_are_refused_with_the_setting_named(
    overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        load_settings(env={}, **overrides)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("http://localhost:9092", "web URL"),
        ("https://broker:9093", "web URL"),
        ("localhost", "HOST:PORT"),
        ("localhost:0", "HOST:PORT"),
        ("a:9092,,b:9092", "HOST:PORT"),
        ("", "HOST:PORT"),
    ],
)
def test_bad_bootstrap_servers(value: str, problem: str) -> None:
    assert problem in (bootstrap_servers_problem(value) or "")


@pytest.mark.parametrize(
    "value", ["127.0.0.1:9092", "a:1,b:65535", "SASL_SSL://broker:9093", "[::1]:9092"]
)
def test_good_bootstrap_servers(value: str) -> None:
    assert bootstrap_servers_problem(value) is None


def test_standby_replicas_need_liveness_and_static_membership() -> None:
    assert load_settings(env={"TURNSTILE_STANDBY_REPLICAS": "1"}).standby_replicas == 1
    for off in ({"TURNSTILE_LIVENESS_INTERVAL_MS": "0"}, {"TURNSTILE_STATIC_MEMBERSHIP": "false"}):
        with pytest.raises(ConfigurationError, match="set standby_replicas = 0"):
            load_settings(env={"TURNSTILE_STANDBY_REPLICAS": "1", **off})
    with pytest.raises(ConfigurationError, match="standby_replicas"):
        load_settings(env={"TURNSTILE_STANDBY_REPLICAS": "-1"})
