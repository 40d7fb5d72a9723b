"""The MQTT topic scheme: building, parsing, and names that must not become topic levels."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared import NAME_PATTERN, ConfigError, Topics, validate_name

VALID_NAMES = st.from_regex(NAME_PATTERN, fullmatch=True)
# Big arrays and byte strings are the point here; a slow CI runner must not fail on them.
SLOW_DATA = [HealthCheck.too_slow, HealthCheck.data_too_large]


def test_default_topics() -> None:
    topics = Topics()
    assert topics.prefix == "tandem/v1"
    assert topics.infer("mnist") == "tandem/v1/infer/mnist"
    assert topics.reply("cam-1") == "tandem/v1/dev/cam-1/reply"
    assert topics.assign("cam-1") == "tandem/v1/dev/cam-1/assign"
    assert topics.status("cam-1") == "tandem/v1/dev/cam-1/status"
    assert topics.telemetry("cam-1") == "tandem/v1/dev/cam-1/telemetry"


def test_custom_prefix() -> None:
    topics = Topics("factory-7/tandem/v2")
    assert topics.infer("resnet_18.v2") == "factory-7/tandem/v2/infer/resnet_18.v2"
    assert topics.reply("A") == "factory-7/tandem/v2/dev/A/reply"
    assert Topics("solo").infer("m") == "solo/infer/m"


def test_shared_subscription_filter() -> None:
    topics = Topics()
    assert topics.infer_filter() == "tandem/v1/infer/+"
    assert topics.infer_filter("hubs") == "$share/hubs/tandem/v1/infer/+"
    for bad in ("", "a/b", "+", "#", "g roup"):
        with pytest.raises(ConfigError):
            topics.infer_filter(bad)


@settings(max_examples=100, deadline=None, suppress_health_check=SLOW_DATA)
@given(model=VALID_NAMES)
def test_model_round_trips_through_its_request_topic(model: str) -> None:
    topics = Topics()
    assert topics.model_from_infer_topic(topics.infer(model)) == model


@pytest.mark.parametrize(
    "topic",
    [
        "tandem/v1/infer/",
        "tandem/v1/infer/a/b",
        "tandem/v1/infer/+",
        "tandem/v1/dev/cam/reply",
        "other/v1/infer/mnist",
        "tandem/v1/inference/mnist",
        "tandem/v1/infer/-leading-dash",
        "tandem/v1/infer/" + "a" * 129,
        "",
    ],
)
def test_topics_that_name_no_model(topic: str) -> None:
    assert Topics().model_from_infer_topic(topic) is None


@settings(max_examples=100, deadline=None, suppress_health_check=SLOW_DATA)
@given(name=VALID_NAMES)
def test_valid_names_are_accepted(name: str) -> None:
    assert validate_name(name) == name
    assert 1 <= len(name) <= 128


@pytest.mark.parametrize(
    "name",
    [
        "",
        "a/b",
        "/a",
        "a/",
        "+",
        "a+",
        "#",
        "a#",
        "$SYS",
        "a" * 129,
        "a\0b",
        "a\nb",
        "name\n",
        "a\tb",
        "a\x7fb",
        "a b",
        "-a",
        ".a",
        "_a",
        "é",
        "\ud800",
        "٣",  # a digit, but not an ASCII one
        None,
        7,
        b"bytes",
    ],
)
def test_invalid_names_are_refused(name: Any) -> None:
    with pytest.raises(ConfigError):
        validate_name(name, "model name")
    topics = Topics()
    for build in (topics.infer, topics.reply, topics.assign, topics.status, topics.telemetry):
        with pytest.raises(ConfigError):
            build(name)


def test_the_longest_name_is_accepted() -> None:
    assert validate_name("a" * 128) == "a" * 128


def test_error_says_what_was_wrong() -> None:
    with pytest.raises(ConfigError, match="invalid device id"):
        Topics().reply("a/b")


@pytest.mark.parametrize(
    "prefix",
    [
        "",
        "/",
        "/tandem",
        "tandem/",
        "tandem//v1",
        "tandem/+",
        "tandem/#",
        "$SYS/tandem",
        "tandem/$v1",
        "tandem\0",
        "tan\ndem",
        "tandem/\x7f",
        "tandem/\ud800",
        "t" * 257,
        None,
        3,
    ],
)
def test_invalid_prefixes_are_refused(prefix: Any) -> None:
    with pytest.raises(ConfigError):
        Topics(prefix)


def test_long_but_valid_prefix_is_accepted() -> None:
    prefix = "/".join(["level"] * 42)  # 251 characters
    assert Topics(prefix).infer("m") == f"{prefix}/infer/m"


def test_topics_is_immutable_and_hashable() -> None:
    topics = Topics()
    with pytest.raises(AttributeError):
        topics.prefix = "x"  # type: ignore[misc]
    assert {topics, Topics()} == {Topics()}


def test_a_sticky_generate_topic_names_one_hub_replica_and_parses_back() -> None:
    topics = Topics("acme/v2")
    assert topics.device_generate("cam-1", "llm", "hub-7") == "acme/v2/dev/cam-1/generate/llm/hub-7"
    assert topics.device_generate("cam-1", "llm") == "acme/v2/dev/cam-1/generate/llm"
    assert topics.hub_generate_filter("hub-7") == "acme/v2/dev/+/generate/+/hub-7"
    assert (
        topics.hub_generate_filter("hub-7", "hubs") == "$share/hubs/acme/v2/dev/+/generate/+/hub-7"
    )
    parsed = topics.parse_text_topic("acme/v2/dev/cam-1/generate/llm/hub-7")
    assert parsed is not None and (parsed.device, parsed.model, parsed.hub) == (
        "cam-1",
        "llm",
        "hub-7",
    )
    parsed = topics.parse_text_topic("acme/v2/dev/cam-1/generate/llm")
    assert parsed is not None and parsed.hub is None  # any replica (old devices)
    for bad in ("", "a/b", "+", "#", "-x"):
        with pytest.raises(ConfigError):
            topics.device_generate("cam-1", "llm", bad)
        with pytest.raises(ConfigError):
            topics.hub_generate_filter(bad)


@pytest.mark.parametrize(
    "topic",
    [
        "tandem/v1/dev/cam/generate/llm/+",
        "tandem/v1/dev/cam/generate/llm/#",
        "tandem/v1/dev/cam/generate/llm/",
        "tandem/v1/dev/cam/generate/llm/hub/extra",
        "tandem/v1/dev/cam/generate/+/hub",
        "tandem/v1/dev/cam/generate/llm/" + "h" * 129,
        "tandem/v1/dev/cam/cancel/hub",
    ],
)
def test_topics_that_name_no_sticky_turn(topic: str) -> None:
    assert Topics().parse_text_topic(topic) is None


@settings(max_examples=50, deadline=None)
@given(device=VALID_NAMES, model=VALID_NAMES, hub=VALID_NAMES)
def test_a_sticky_turn_round_trips_through_its_topic(device: str, model: str, hub: str) -> None:
    topics = Topics()
    parsed = topics.parse_text_topic(topics.device_generate(device, model, hub))
    assert parsed is not None and (parsed.device, parsed.model, parsed.hub) == (device, model, hub)
