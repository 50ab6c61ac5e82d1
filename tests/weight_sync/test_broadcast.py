"""The broadcast refit's wire protocol, both ends in this process (two threads, a real two-rank gloo group).

The receiver's consumer stands in for vLLM and says so: it reads each tensor some milliseconds after it was
handed over, as vLLM reads a layer only once the layer is complete. If a bucket's buffer were reused before
its tensors were consumed (the double buffering gone wrong), the late read would see the next bucket's bytes.
"""

import threading
import time

import pytest
import torch

from rlkit.distributed import broadcast, start_broadcast
from rlkit.weight_sync.broadcast import (BroadcastReceiver, as_bytes, bucket_layout, decode_header, encode_header,
                                        send_buckets)


class LateReader(BroadcastReceiver):
    """A receiver whose engine is a stand-in: ``update_weights`` reads each tensor 2 ms after getting it."""

    def __init__(self):
        self.loaded, self.finished = [], False

    def update_weights(self, weights):
        self.finished = False
        for name, tensor in weights:
            time.sleep(0.002)
            self.loaded.append((name, tensor.clone()))
        self.finished = True  # the stream ended cleanly: vLLM would finish its reload here


def random_buckets(seed=0):
    """Buckets of mixed dtypes and sizes (as exported: whole groups, some non-contiguous)."""
    g = torch.Generator().manual_seed(seed)
    buckets = []
    for k in range(7):
        bucket = [(f"layers.{k}.w", torch.randn(64 + k, 33, generator=g)),
                  (f"layers.{k}.b", torch.randn(17, generator=g).to(torch.bfloat16)),
                  (f"layers.{k}.t", torch.randn(9, 12, generator=g).t()),  # non-contiguous
                  (f"layers.{k}.i", torch.randint(0, 1000, (5 + k,), generator=g))]
        buckets.append(bucket[: 1 + k % 4])
    return buckets


def connect():
    """A two-rank gloo group, one rank per thread: (store, group) for the sender (0) and the receiver (1)."""
    import datetime

    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=60)
    master = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, timeout=timeout, wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", master.port, 2, is_master=False, timeout=timeout)
    ends = {}
    joiner = threading.Thread(target=lambda: ends.update(receiver=dist.ProcessGroupGloo(client, 1, 2, timeout)))
    joiner.start()
    ends["sender"] = dist.ProcessGroupGloo(master, 0, 2, timeout)
    joiner.join()
    return (master, ends["sender"]), (client, ends["receiver"])


def stream(buckets_per_refit):
    """Run one receive_weights per refit against send_buckets; returns the receiver and what each sent."""
    (store0, group0), (store1, group1) = connect()
    receiver = LateReader()
    receiver.weight_group = group1
    results = []
    for buckets in buckets_per_refit:
        receiver.loaded = []
        out = {}
        thread = threading.Thread(target=lambda: out.update(clock=receiver.receive_weights()))
        thread.start()
        sent = send_buckets(group0, buckets, wait=lambda works: [w.wait() for w in works])
        thread.join(timeout=60)
        assert not thread.is_alive()
        results.append((sent, receiver.loaded, out["clock"], [b.data_ptr() for b in receiver.receive_buffers or []]))
    return receiver, results


def test_overlapped_stream_delivers_identical_tensors_bucket_after_bucket():
    first, second = random_buckets(0), random_buckets(1)
    receiver, results = stream([first, second, first])
    for buckets, (sent, loaded, clock, _) in zip((first, second, first), results):
        expected = [pair for bucket in buckets for pair in bucket]
        assert sent == len(buckets) == 7
        assert [n for n, _ in loaded] == [n for n, _ in expected]
        for (_, got), (name, want) in zip(loaded, expected):
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert torch.equal(got, want), name  # bit for bit, though read 2 ms late
        assert clock["receive"] >= 0 and clock["load"] > 0
    # two receive buffers, allocated by the first refit and kept by the later ones (same sizes: same memory)
    buffers = [r[3] for r in results]
    assert len(buffers[0]) == 2 and buffers[0] == buffers[1] == buffers[2]
    ends = [bucket_layout(b)[0][-1].offset + bucket_layout(b)[0][-1].nbytes for b in first]
    assert max(b.numel() for b in receiver.receive_buffers) == max(ends)  # the largest bucket, no more


def test_an_empty_refit_is_one_end_header():
    _, [(sent, loaded, _, _)] = stream([[]])
    assert sent == 0 and loaded == []


def test_header_round_trip():
    bucket = [("a", torch.randn(3, 5)), ("b", torch.zeros(2, dtype=torch.bfloat16)), ("c", torch.arange(4))]
    specs, _ = bucket_layout(bucket)
    assert decode_header(encode_header(specs)) == specs


def test_a_sender_that_stops_mid_stream_ends_the_reload_and_raises():
    """The receiver ends the stream early, so the engine finishes its reload (vLLM would keep the old weights
    of the layers it did not get), then raises the transfer error (here the sender goes away mid-stream)."""
    (store0, group0), (store1, group1) = connect()
    receiver = LateReader()
    receiver.weight_group = group1
    out = {}

    def receive():
        try:
            receiver.receive_weights()
        except Exception as e:  # noqa: BLE001
            out["error"] = e

    thread = threading.Thread(target=receive)
    thread.start()
    bucket = random_buckets(0)[3]
    header = encode_header(bucket_layout(bucket)[0])
    for t in [torch.tensor([header.numel()]), header] + [as_bytes(t) for _, t in bucket]:
        broadcast(group0, t)
    start_broadcast(group0, torch.tensor([123]))  # a header whose bytes never come
    del group0, store0
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert "error" in out and receiver.finished
    assert len(receiver.loaded) < len(bucket)
