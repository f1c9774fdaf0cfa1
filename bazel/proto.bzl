"""Protobuf/gRPC C++ code generation with the system protoc and grpc_cpp_plugin (offline)."""

def kvrail_proto_library(name, srcs, deps = [], grpc = False, visibility = None):
    """Generates C++ for `srcs` (paths relative to the workspace root) and wraps it in a cc_library.

    Imports resolve from the workspace root, so `import "proto/kvrail/v1/x.proto"` works.
    """
    outs = []
    for src in srcs:
        base = src[:-len(".proto")]
        outs += [base + ".pb.h", base + ".pb.cc"]
        if grpc:
            outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    short = [o[len(native.package_name()) + 1:] if o.startswith(native.package_name() + "/") else o for o in outs]
    dep_srcs = [d + "_srcs" for d in deps]
    cmd = "protoc -I. --cpp_out=$(GENDIR) "
    if grpc:
        cmd += "--grpc_out=$(GENDIR) --plugin=protoc-gen-grpc=$$(which grpc_cpp_plugin) "
    cmd += " ".join(["$(location %s)" % s for s in srcs])
    native.filegroup(name = name + "_srcs", srcs = srcs + dep_srcs, visibility = visibility)
    native.genrule(
        name = name + "_gen",
        srcs = srcs + dep_srcs,
        outs = short,
        cmd = cmd,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in short if o.endswith(".cc")],
        hdrs = [o for o in short if o.endswith(".h")],
        deps = deps + ["//third_party/system:grpc" if grpc else "//third_party/system:protobuf"],
        include_prefix = "",
        visibility = visibility,
    )
