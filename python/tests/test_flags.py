"""Layer readiness flags from Python: a producer's ready flags release a layer-wise transfer layer
by layer, the daemon's arrival flags say which layers landed, and the GPU mapping fails cleanly
where there is no GPU (its stream behaviour is exercised on the GPU machine by
tests/gpu/model_handover.py)."""
from __future__ import annotations

import numpy as np
import pytest

import kvrail
from kvrail import transfer_pb2
from kvrail.flags import FlagArray
from kvtest import Pool, layout

SUCCEEDED = transfer_pb2.TRANSFER_STATE_SUCCEEDED


@pytest.fixture
def flag_words(client):
    buffer = kvrail.HostBuffer(4096, "flags")
    region = client.register_host_buffer(buffer, writable=True, name="flags")
    yield buffer, region


def test_ready_flags_release_layers_and_arrival_flags_report_them(client, flag_words):
    buffer, region = flag_words
    ready = FlagArray(buffer, region, offset=0, count=3)
    arrived = FlagArray(buffer, region, offset=64, count=3)
    src = Pool(client, layout(), writable=False)
    dst = Pool(client, layout(), writable=True)
    src.fill_random(9)
    transfer = client.transfer(src.region, [1, 2], dst.region, [5, 6],
                               ready_flags=ready.spec(7), arrival_flags=arrived.spec(7))
    # Nothing is ready: nothing lands.
    assert not arrived.wait(0, 7, timeout=0.2)
    assert not transfer.done()
    ready.signal(0, 7)
    assert arrived.wait(0, 7, timeout=30)
    assert not arrived.is_set(1, 7) and not arrived.is_set(2, 7)
    np.testing.assert_array_equal(dst.tokens([5, 6], 8)[0], src.tokens([1, 2], 8)[0])
    assert (dst.view[1:, :, 5:7].view(np.uint8) == 0xAB).all()  # layers 1-2 not yet written
    ready.signal(1, 7)
    ready.signal(2, 8)  # later epochs count as set (wrapping order)
    assert transfer.result(timeout=30).state == SUCCEEDED
    assert all(arrived.is_set(i, 7) for i in range(3))
    np.testing.assert_array_equal(dst.tokens([5, 6], 8), src.tokens([1, 2], 8))


def test_flag_array_arguments_are_checked(flag_words):
    buffer, region = flag_words
    with pytest.raises(ValueError, match="offset"):
        FlagArray(buffer, region, offset=2)
    with pytest.raises(ValueError, match="count"):
        FlagArray(buffer, region, offset=4092, count=2)
    flags = FlagArray(buffer, region, count=2)
    with pytest.raises(IndexError):
        flags.signal(2, 1)
    with pytest.raises(ValueError, match="value"):
        flags.spec(0)
    assert flags.spec(5).byte_offset == 0 and flags.spec(5).region_id == region.id
    # Wrapping order: 2^32 - 1 is "before" 1.
    flags.signal(0, 0xFFFFFFFF)
    assert not flags.is_set(0, 1)
    flags.signal(0, 1)
    assert flags.is_set(0, 0xFFFFFFFF)


def test_gpu_mapping_without_a_gpu_fails_cleanly(flag_words):
    buffer, region = flag_words
    flags = FlagArray(buffer, region, count=4)
    try:
        gpu = flags.for_gpu(0)
    except kvrail.KvrailError as e:
        assert e.code != 0 and e.message  # no GPU here: the CUDA error, named
        return
    with gpu:  # a machine with a GPU: the mapping works and checks indices
        with pytest.raises(kvrail.KvrailError) as out_of_range:
            gpu.signal(4, 1)
        assert out_of_range.value.code == kvrail.StatusCode.OUT_OF_RANGE
    with pytest.raises(ValueError, match="closed"):
        gpu.signal(0, 1)
