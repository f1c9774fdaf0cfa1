"""Generated protobuf modules of proto/kvrail/v1 (gen_protos.py writes *_pb2.py here):
region_pb2 (RegionSpec, PagedKvLayout, ...), transfer_pb2 (TransferSpec, TransferStatus, ...),
admin_pb2 (ListRegionsResponse, Stats, ...), topology_pb2, config_pb2."""
