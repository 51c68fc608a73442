"""Resource change messages: what a replica announces, and how a listener reads odd input."""

from __future__ import annotations

from orchestration.resource_changes import MAX_IDS, ResourceChanges


def test_a_message_round_trips() -> None:
    changes = ResourceChanges(nodes={"n1"}, clusters={"c1"}, accelerators={"a1", "a2"}, topology=True)
    message = changes.to_message("me")
    assert message["origin"] == "me"
    assert ResourceChanges.from_message(message) == changes


def test_too_many_ids_travel_as_everything() -> None:
    changes = ResourceChanges(accelerators={f"a{i}" for i in range(MAX_IDS + 1)})
    assert ResourceChanges.from_message(changes.to_message("me")) == ResourceChanges(everything=True)


def test_a_malformed_message_reads_as_everything_never_as_nothing() -> None:
    for message in ({"nodes": 5}, {"nodes": None}, {"accelerators": 3.5}, {"nodes": "n1"}, {"clusters": [1]}):
        assert ResourceChanges.from_message(message).everything  # type: ignore[arg-type]
    assert not ResourceChanges.from_message({"origin": "x"})  # a well-formed empty message is nothing
