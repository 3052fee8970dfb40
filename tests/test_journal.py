"""The resume state of one session (sessions/journal.py): what a resuming client gets, and when it is refused."""

from __future__ import annotations

import asyncio
import json

import pytest

from rtc_omni.sessions.journal import EventJournal, Resumable, ResumeRefused, envelope


def resumable(max_bytes: int = 1 << 20) -> Resumable:
    return Resumable("s1", grace_s=0.2, max_bytes=max_bytes, retain_s=60.0)


def sent(texts: list[str | bytes]) -> list[dict[str, object]]:
    return [json.loads(t) for t in texts if isinstance(t, str)]


def test_events_are_numbered_and_created_carries_the_credentials() -> None:
    state = resumable()
    created = json.loads(state.stamp({"type": "session.created", "session": {"model": "m"}}))
    assert created["resume_token"] == state.token and created["attachment_generation"] == 1
    assert created["session_id"] == "s1" and "server_event_seq" not in created
    seqs = [json.loads(state.stamp({"type": "x"}))["server_event_seq"] for _ in range(3)]
    assert seqs == [1, 2, 3]


def test_resume_replays_what_was_missed_in_order_and_rotates_the_token() -> None:
    state = resumable()
    state.stamp({"type": "session.updated", "session": {"instructions": "be brief"}})
    for n in range(5):
        state.stamp({"type": "delta", "n": n})
    state.record_bytes(b"video")
    state.stamp({"type": "done"})
    old = state.token
    first = state.resume(old, last_seq=3)
    resumed, *rest = first
    resumed_event = json.loads(resumed)
    assert resumed_event["type"] == "session.resumed" and resumed_event["session"] == {"instructions": "be brief"}
    assert resumed_event["resume_token"] == state.token != old and resumed_event["attachment_generation"] == 2
    assert [e["server_event_seq"] for e in sent(rest)] == [4, 5, 6, 7]
    assert b"video" in rest and rest.index(b"video") == 3  # right after the event that announced it
    # Until the new connection is confirmed the old token still works; after, it does not.
    state.resume(old, last_seq=7)
    state.confirm()
    with pytest.raises(ResumeRefused) as refused:
        state.resume(old, last_seq=7)
    assert refused.value.code == "invalid_resume_token" and refused.value.status == 401


def test_a_gap_is_refused_unless_the_client_allows_a_resync() -> None:
    state = resumable(max_bytes=200)
    for n in range(20):
        state.stamp({"type": "delta", "n": n})
    assert state.journal.bytes <= 200 and state.journal.dropped_through > 0
    with pytest.raises(ResumeRefused) as refused:
        state.resume(state.token, last_seq=0)
    assert refused.value.code == "journal_gap" and refused.value.status == 409
    resync, resumed, *rest = sent(state.resume(state.token, last_seq=0, allow_resync=True))
    assert resync == {"type": "session.resync_required", "session_id": "s1", "reason": "journal_gap"}
    assert resumed["type"] == "session.resumed" and rest == []
    with pytest.raises(ResumeRefused):  # a seq never sent
        state.resume(state.token, last_seq=99)


def test_acks_free_the_journal_and_age_prunes_it_only_while_attached() -> None:
    now = [0.0]
    journal = EventJournal(1 << 20, retain_s=10.0, clock=lambda: now[0])
    for n in range(4):
        journal.record({"type": "x", "n": n})
    journal.acknowledge(2)
    assert journal.kept_after(2) is not None and journal.kept_after(1) is None
    now[0] = 11.0
    journal.prune()
    assert journal.bytes == 0 and journal.kept_after(4) == []


async def test_the_grace_ends_a_session_that_is_not_resumed() -> None:
    state, ended = resumable(), asyncio.Event()

    async def expire() -> None:
        ended.set()

    state.detach(expire)
    assert not state.attached
    await asyncio.wait_for(ended.wait(), 2)
    state.detach(expire)
    state.attach()  # resumed in time: the timer is stopped
    await asyncio.sleep(0.3)
    state.close()


def test_envelope_messages_are_answered_by_the_transport() -> None:
    state = resumable()
    state.stamp({"type": "x"})
    assert envelope('{"type":"conversation.item.create"}') is None
    assert envelope('{"type":"session.update","session":{}}') is None
    heartbeat = envelope('{"type":"session.heartbeat"}')
    assert heartbeat is not None
    assert json.loads(state.answer_envelope(heartbeat) or "") == {
        "type": "session.heartbeat_ack",
        "session_id": "s1",
        "server_event_seq": 1,
    }
    ack = envelope('{"type":"session.event_ack","server_event_seq":1}')
    assert ack is not None and state.answer_envelope(ack) is None and state.journal.bytes == 0
    bad = envelope('{"type":"session.event_ack","server_event_seq":"1"}')
    assert bad is not None and json.loads(state.answer_envelope(bad) or "")["error"]["code"] == "invalid_event_ack"


def test_more_missed_than_the_connection_takes_at_once_is_a_gap() -> None:
    state = resumable()
    for n in range(10):
        state.stamp({"type": "delta", "text": "x" * 100, "n": n})
    with pytest.raises(ResumeRefused) as refused:
        state.resume(state.token, last_seq=0, max_bytes=500)
    assert refused.value.code == "journal_gap"
    assert len(state.resume(state.token, last_seq=8, max_bytes=500)) == 3  # resumed, events 9 and 10
