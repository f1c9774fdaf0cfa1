"""CUDA compilation with the toolkit's nvcc, offline (no rules_cuda)."""

NVCC = "/usr/local/cuda/bin/nvcc"
# Kernels: SASS for sm_90a (H100, H200) and PTX for compute_90, which the driver compiles once
# for newer GPUs (JIT, kept in CUDA_CACHE_PATH). --config=release (the .deb and the image) adds
# sm_100 SASS (B200) so those start without the JIT; it costs ~60% more nvcc time on the largest
# kernel (docs/operations.md, "GPU support"), so CI's default build leaves it out. sm_80 and
# sm_89 cannot be added: the kernels use sm_90's bulk copies (TMA) and mbarriers.
NVCC_FLAGS = "-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_90,code=compute_90 -Xcompiler -fPIC -lineinfo"
NVCC_RELEASE_FLAGS = NVCC_FLAGS + " -gencode=arch=compute_100,code=sm_100"

def cuda_library(name, srcs, hdrs = [], deps = [], visibility = None, testonly = False):
    """Compiles each .cu in `srcs` with nvcc into an object, and links them with the static runtime.

    `hdrs` are the headers the .cu files include (workspace-relative includes, `-I.`).
    """
    objs = []
    for src in srcs:
        obj = src.replace(".cu", ".cu.o")
        native.genrule(
            name = name + "_" + src.replace("/", "_").replace(".", "_"),
            srcs = [src] + hdrs,
            outs = [obj],
            cmd = select({
                "//bazel:cuda_release_arches": "%s %s -I. -I$(GENDIR) -c $(location %s) -o $@" % (NVCC, NVCC_RELEASE_FLAGS, src),
                "//conditions:default": "%s %s -I. -I$(GENDIR) -c $(location %s) -o $@" % (NVCC, NVCC_FLAGS, src),
            }),
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
