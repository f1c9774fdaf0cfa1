"""CUDA compilation with the toolkit's nvcc, offline (no rules_cuda)."""

NVCC = "/usr/local/cuda/bin/nvcc"
NVCC_FLAGS = "-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_90,code=compute_90 -Xcompiler -fPIC -lineinfo"

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
            cmd = "%s %s -I. -I$(GENDIR) -c $(location %s) -o $@" % (NVCC, NVCC_FLAGS, src),
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
