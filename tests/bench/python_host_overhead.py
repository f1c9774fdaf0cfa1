#!/usr/bin/env python3
"""Host-engine Python overhead probe (build machine, no GPU): times spec building, submit,
wait and a whole Client.transfer()+wait of 256+256 block ids against a running kvraild.

  PYTHONPATH=<kvrail package with generated protos> KVRAIL_LIB=.../libkvrail.so \
      python3 tests/bench/python_host_overhead.py SOCKET
"""
import sys, time, statistics
import kvrail
from kvrail import transfer_pb2
from kvrail.layouts import PagedLayout
sock = sys.argv[1]
layout = PagedLayout(num_layers=1, num_parts=2, num_blocks=512, tokens_per_block=1, num_heads=1, head_dim=8)
with kvrail.connect(sock) as c:
    a = kvrail.HostBuffer(layout.nbytes); b = kvrail.HostBuffer(layout.nbytes)
    ra = c.register_host_buffer(a, layout=layout); rb = c.register_host_buffer(b, layout=layout, writable=True)
    src = [(i*7)%512 for i in range(256)]; dst = [511-i for i in range(256)]
    def t(fn, n=500):
        xs=[]
        for _ in range(n):
            t0=time.perf_counter(); fn(); xs.append((time.perf_counter()-t0)*1e6)
        return statistics.median(xs)
    def build():
        spec = transfer_pb2.TransferSpec()
        spec.src.region_id = ra.id; spec.dst.region_id = rb.id
        spec.src.block_ids.extend(int(x) for x in src); spec.dst.block_ids.extend(int(x) for x in dst)
        return spec.SerializeToString()
    print("build+serialize us", t(build))
    spec = transfer_pb2.TransferSpec(); spec.src.region_id=ra.id; spec.dst.region_id=rb.id; spec.src.block_ids.extend(src); spec.dst.block_ids.extend(dst)
    tr = [None]
    print("submit prebuilt us", t(lambda: tr.__setitem__(0, c.submit(spec))))
    print("wait done us", t(lambda: c.wait(tr[0].id)))
    print("full transfer()+wait us", t(lambda: c.transfer(ra, src, rb, dst).wait()))
    print("submit+wait prebuilt us", t(lambda: c.wait(c.submit(spec).id)))
    st = c.wait(tr[0].id); print("status bytes", len(st.SerializeToString()))
    print("parse status us", t(lambda: transfer_pb2.TransferStatus.FromString(st.SerializeToString())))
