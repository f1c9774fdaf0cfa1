"""kvrail_fuzzer: a libFuzzer target (clang, --config=fuzz only; tagged manual)."""

def kvrail_fuzzer(name, srcs, deps = [], **kwargs):
    native.cc_binary(
        name = name,
        srcs = srcs,
        deps = deps,
        # The objects are built with fuzzer-no-link by --config=fuzz; this links libFuzzer's main.
        linkopts = ["-fsanitize=fuzzer"],
        tags = ["manual", "fuzz"],
        testonly = True,
        **kwargs
    )
