"""Both sides learn the outcome (notifications), transfers listed by region/label/key, and a
daemon restart seen as "session lost" with the regions registered again by recover()."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import kvrail
from kvrail import transfer_pb2
from kvtest import Pool, layout

SUCCEEDED = transfer_pb2.TRANSFER_STATE_SUCCEEDED


def test_the_prefill_side_is_notified_when_decode_pulls(daemon):
    with kvrail.connect(daemon.socket) as prefill, kvrail.connect(daemon.socket) as decode:
        src = Pool(prefill, layout(), writable=False, name="prefill pool")
        dst = Pool(decode, layout(), writable=True, name="decode pool")
        src.fill_random(5)
        assert prefill.poll_notifications() == []
        # The prefill side owns its pool: the decode side reads it with a grant (without one:
        # refused, and nothing moves).
        with pytest.raises(kvrail.KvrailError, match="spec.src.region_id") as denied:
            decode.transfer(src.id, [4, 9], dst.region, [0, 1])
        assert denied.value.code == kvrail.StatusCode.PERMISSION_DENIED
        assert (dst.view.view(np.uint8) == 0xAB).all()
        grant = src.region.grant()
        assert grant.startswith("kvg1.")
        t = decode.transfer(src.id, [4, 9], dst.region, [0, 1], notification=b"request-42",
                            src_grant=grant)
        assert t.result(timeout=30).state == SUCCEEDED
        got = prefill.poll_notifications(timeout=10)
        assert len(got) == 1
        n = got[0]
        assert n.notification == b"request-42"
        assert n.transfer_id == t.id
        assert n.region_id == src.id and n.region_is_source
        assert n.state == SUCCEEDED and n.error_code == 0
        # The submitter is not told about its own transfer; each notification is taken once.
        assert decode.poll_notifications(timeout=0.05) == []
        assert prefill.poll_notifications() == []
        np.testing.assert_array_equal(dst.tokens([0, 1], 8), src.tokens([4, 9], 8))


def test_a_failed_pull_is_notified_with_its_error(daemon):
    with kvrail.connect(daemon.socket) as prefill, kvrail.connect(daemon.socket) as decode:
        src = Pool(prefill, layout(), writable=False)
        dst = Pool(decode, layout(), writable=True)
        # Layer-wise and cancelled before any layer is ready.
        t = decode.transfer(src.id, [1], dst.region, [2], layerwise=True,
                            notification=b"cancel-me", src_grant=src.region.grant())
        t.cancel()
        got = list(prefill.notifications(idle_timeout=5))
        assert [n.notification for n in got] == [b"cancel-me"]
        assert got[0].state == transfer_pb2.TRANSFER_STATE_CANCELLED
        assert got[0].error_code == kvrail.StatusCode.CANCELLED


def test_notification_errors_are_named(client):
    src = Pool(client, layout(), writable=False)
    dst = Pool(client, layout(), writable=True)
    with pytest.raises(kvrail.InvalidArgumentError, match="spec.notification"):
        client.transfer(src.region, [0], dst.region, [0], notification=b"x" * 1025)
    with pytest.raises(ValueError, match="timeout"):
        client.poll_notifications(timeout=61)


def test_list_transfers_by_region_label_and_key(client):
    a = Pool(client, layout(), writable=True, name="a")
    b = Pool(client, layout(), writable=True, name="b")
    c = Pool(client, layout(), writable=True, name="c")
    t1 = client.transfer(a.region, [0], b.region, [0], label="req-1", idempotency_key="k-1")
    t2 = client.transfer(b.region, [1], c.region, [1], label="req-2")
    t1.result(timeout=30), t2.result(timeout=30)
    ids = lambda **kw: [s.transfer_id for s in client.list_transfers(**kw)]  # noqa: E731
    assert ids(region=a.region) == [t1.id]
    assert ids(region=b.id) == [t2.id, t1.id]
    assert ids(region=c.region) == [t2.id]
    assert ids(label="req-2") == [t2.id]
    assert ids(idempotency_key="k-1") == [t1.id]
    assert ids(label="req-1", region=c.region) == []
    assert ids(states=[transfer_pb2.TRANSFER_STATE_FAILED], label="req-1") == []


def test_a_daemon_restart_is_session_lost_and_recover_registers_again(fresh_daemon):
    client = kvrail.connect(fresh_daemon.socket)
    try:
        lost = threading.Event()
        seen = []
        client.on_session_lost(lambda error: (seen.append(error), lost.set()))
        src = Pool(client, layout(), writable=False, name="src")
        dst = Pool(client, layout(), writable=True, name="dst")
        src.fill_random(9)
        client.transfer(src.region, [3], dst.region, [4]).result(timeout=30)
        old_ids = (src.id, dst.id)
        instance = client.stats().instance_id
        assert len(instance) == 32

        assert fresh_daemon.restart() == 0
        # The library's monitor sees the session socket close: the callback runs by itself.
        assert lost.wait(10), "no session-lost callback"
        assert isinstance(seen[0], kvrail.SessionLostError)
        assert seen[0].code == kvrail.StatusCode.FAILED_PRECONDITION
        assert client.session_lost
        with pytest.raises(kvrail.SessionLostError, match="session lost"):
            client.transfer(src.region, [3], dst.region, [5])
        assert client.stats().instance_id != instance

        moved = client.recover()
        assert not client.session_lost
        assert set(moved) == set(old_ids)
        assert (src.id, dst.id) == (moved[old_ids[0]], moved[old_ids[1]])
        # Ids of the new instance count from another random base: the old ids name nothing.
        assert not set(old_ids) & {src.id, dst.id}
        dst.view[:, :, 5] = 0xAB
        client.transfer(src.region, [3], dst.region, [5]).result(timeout=30)
        np.testing.assert_array_equal(dst.tokens([5], 4), src.tokens([3], 4))
    finally:
        client.close()


def test_a_stale_region_id_after_restart_is_not_another_clients_region(fresh_daemon):
    with kvrail.connect(fresh_daemon.socket) as first:
        mine = Pool(first, layout(), writable=True)
        stale = mine.id
    fresh_daemon.restart()
    with kvrail.connect(fresh_daemon.socket) as second:
        theirs = Pool(second, layout(), writable=True)
        assert theirs.id != stale
        with pytest.raises(kvrail.NotFoundError):
            second.transfer(theirs.region, [0], stale, [0])


def test_grants_are_the_owners_to_give_and_revoke(daemon):
    with kvrail.connect(daemon.socket) as owner, kvrail.connect(daemon.socket) as other:
        src = Pool(owner, layout(), writable=False)
        mine = Pool(other, layout(), writable=True)
        theirs = Pool(owner, layout(), writable=True)
        src.fill_random(3)
        # Another session can neither grant the owner's region nor unregister it.
        with pytest.raises(kvrail.KvrailError, match="region_id") as e:
            other._message_call(kvrail._lib.lib().kvrail_create_grant, transfer_pb2.Grant,
                                src.id, 1, 0, 0, 0)
        assert e.value.code == kvrail.StatusCode.PERMISSION_DENIED
        with pytest.raises(kvrail.KvrailError) as e:
            other.unregister_region(src.id)
        assert e.value.code == kvrail.StatusCode.PERMISSION_DENIED
        # A read-only region is never granted for writing; a read grant does not write.
        with pytest.raises(kvrail.FailedPreconditionError, match="not writable"):
            src.region.grant(write=True)
        read = theirs.region.grant()
        with pytest.raises(kvrail.KvrailError, match="spec.dst.grant") as e:
            other.transfer(mine.region, [0], theirs.region, [0], dst_grant=read)
        assert e.value.code == kvrail.StatusCode.PERMISSION_DENIED
        # A revoked grant reads nothing.
        grant = src.region.grant()
        other.transfer(src.id, [2], mine.region, [3], src_grant=grant).result(timeout=30)
        np.testing.assert_array_equal(mine.tokens([3], 4), src.tokens([2], 4))
        owner.revoke_grant(grant)
        with pytest.raises(kvrail.KvrailError, match="revoked or expired"):
            other.transfer(src.id, [2], mine.region, [4], src_grant=grant)
        # Cancelling another session's transfer is refused; its submitter may.
        t = owner.transfer(src.region, [1], theirs.region, [1], layerwise=True)
        with pytest.raises(kvrail.KvrailError, match="transfer_id") as e:
            other.cancel(t)
        assert e.value.code == kvrail.StatusCode.PERMISSION_DENIED
        with pytest.raises(kvrail.KvrailError, match="transfer_id"):
            other.mark_ready(t, 0)
        assert t.cancel().state == transfer_pb2.TRANSFER_STATE_CANCELLED

