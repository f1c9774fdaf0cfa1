"""CUDA compilation with the toolkit's nvcc, offline (no rules_cuda)."""

NVCC = "/usr/local/cuda/bin/nvcc"
# -Xfatbin=-compress-all: the fatbins' SASS compressed too (the driver inflates it once, at module
# load): a kernel library with three SASS architectures is then smaller than it was with one.
NVCC_COMMON = "-O3 -std=c++17 -Xcompiler -fPIC -lineinfo -Xfatbin=-compress-all"

# Kernels: SASS for sm_80 (A100; also runs on sm_86 and sm_87), sm_89 (L4, L40, L40S) and sm_90a
# (H100, H200), and PTX for compute_90, which the driver compiles once for newer GPUs (JIT, kept
# in CUDA_CACHE_PATH). Every kernel compiles for sm_80: the bulk-copy (TMA) and mbarrier forms
# exist only in sm_90 code and the host launches them only there (kernels/kernel_arch.h).
# --config=release (the .deb and the image) adds sm_100 SASS (B200) so those start without the
# JIT; nvcc time per architecture is in docs/operations.md ("GPU support").
GENCODE_DEFAULT = " ".join([
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_89,code=sm_89",
    "-gencode=arch=compute_90a,code=sm_90a",
    "-gencode=arch=compute_90,code=compute_90",
])
GENCODE_RELEASE = GENCODE_DEFAULT + " -gencode=arch=compute_100,code=sm_100"

# Hopper only: code that is built on bulk copies throughout (benchmarks of them).
GENCODE_HOPPER = "-gencode=arch=compute_90a,code=sm_90a"

# compute_80 PTX and nothing else: on an H100 the driver JIT-compiles it as sm_80 code, so a
# test binary built this way runs the kernels' pre-sm_90 forms on the GPU at hand.
GENCODE_PTX80 = "-gencode=arch=compute_80,code=compute_80"

NVCC_FLAGS = NVCC_COMMON + " " + GENCODE_DEFAULT
NVCC_RELEASE_FLAGS = NVCC_COMMON + " " + GENCODE_RELEASE

def cuda_library(name, srcs, hdrs = [], deps = [], visibility = None, testonly = False, gencode = None):
    """Compiles each .cu in `srcs` with nvcc into an object, and links them with the static runtime.

    `hdrs` are the headers the .cu files include (workspace-relative includes, `-I.`).
    `gencode`: the -gencode flags for every build configuration instead of the default ones
    (GENCODE_DEFAULT, GENCODE_RELEASE with --config=release).
    """
    objs = []
    for src in srcs:
        # A library with its own gencode may compile a source another library compiles too.
        obj = src.replace(".cu", ".cu.o") if gencode == None else name + "/" + src.replace(".cu", ".cu.o")
        native.genrule(
            name = name + "_" + src.replace("/", "_").replace(".", "_"),
            srcs = [src] + hdrs,
            outs = [obj],
            cmd = select({
                "//bazel:cuda_release_arches": "%s %s -I. -I$(GENDIR) -c $(location %s) -o $@" % (NVCC, NVCC_RELEASE_FLAGS, src),
                "//conditions:default": "%s %s -I. -I$(GENDIR) -c $(location %s) -o $@" % (NVCC, NVCC_FLAGS, src),
            }) if gencode == None else "%s %s %s -I. -I$(GENDIR) -c $(location %s) -o $@" % (NVCC, NVCC_COMMON, gencode, src),
            testonly = testonly,
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps,
        linkopts = ["-L/usr/local/cuda/lib64", "-lcudart_static", "-ldl", "-lrt", "-lpthread"],
        visibility = visibility,
        testonly = testonly,
        alwayslink = True,
    )
