"""gRPC and what it needs, linked into a shared object from Debian's static archives.

For libraries loaded into processes that carry another gRPC (the Python wheel's libkvrail.so, the
NIXL plugin inside NIXL's agent): linked in and kept local by the library's version script, none
of these symbols is visible outside it. Debian's Abseil, protobuf and re2 archives are
position-dependent and cannot go into a shared object: they stay shared libraries.
"""

# The archives of //third_party/system:static_grpc_archives, in link order.
STATIC_GRPC_LIBS = [
    "grpc++",
    "grpc++_reflection",
    "grpc",
    "gpr",
    "upb",
    "cares",
    "address_sorting",
    "ssl",
    "crypto",
    "z",
]

def static_grpc_linkopts(version_script):
    """Link options for a cc_binary(linkshared) with additional_linker_inputs =
    ["//third_party/system:static_grpc_archives"] and `version_script` (a label in its srcs or
    data) naming what it exports."""
    return [
        "-Wl,--version-script=$(location %s)" % version_script,
        # On -L first, the folder makes every -lgrpc... of the deps resolve to the archive (ld
        # takes lib<name>.so or .a from the first folder that has either).
        "-L$(GENDIR)/third_party/system/static_grpc_archives",
        "-Wl,--start-group",
    ] + ["-l" + n for n in STATIC_GRPC_LIBS] + [
        "-Wl,--end-group",
        # What the static gRPC needs beyond //third_party/system:absl, shared.
        "-labsl_bad_optional_access",
        "-labsl_bad_variant_access",
        "-labsl_random_internal_pool_urbg",
        "-labsl_random_internal_randen_hwaes_impl",
        "-labsl_random_internal_randen_slow",
        "-lre2",
        # Every symbol resolves at link time, not at a user's dlopen.
        "-Wl,-z,defs",
    ]
