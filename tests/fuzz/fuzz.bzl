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

def kvrail_fuzz_replay(name, fuzzer, srcs, deps = [], max_inputs = 0, **kwargs):
    """A cc_test of the normal build (no libFuzzer) that runs `fuzzer`'s committed seed corpus
    (corpus/<fuzzer>/, at most `max_inputs` files when > 0) once through the same sources."""
    args = ["%s/corpus/%s" % (native.package_name(), fuzzer)]
    if max_inputs > 0:
        args = ["--max_inputs=%d" % max_inputs] + args
    native.cc_test(
        name = name,
        srcs = srcs + ["replay_main.cc"],
        deps = deps,
        data = native.glob(["corpus/%s/*" % fuzzer]),
        args = args,
        # The fabric calls the CUDA runtime (static in cuda_util): linked statically it resolves.
        linkstatic = True,
        **kwargs
    )
