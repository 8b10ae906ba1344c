"""cuda_library: compiles .cu files with nvcc (sm_90 code plus compute_90 PTX) into a cc_library."""

CUDA_ARCH_FLAGS = [
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

def cuda_library(name, srcs, hdrs = [], deps = [], cuda_hdrs = [], copts = [], visibility = None):
    """One genrule per .cu file runs nvcc to an object; a cc_library links the objects.

    nvcc uses the C++ toolchain's compiler as its host compiler (-ccbin), so host code in .cu
    files and the .cc files of the same binary agree on the ABI. -lineinfo keeps source lines for
    compute-sanitizer and ncu without slowing the code.

    Args:
      name: name of the cc_library.
      srcs: .cu files.
      hdrs: headers the .cu files and their users include.
      deps: cc_library deps of the library.
      cuda_hdrs: headers of other targets that the .cu files include (a genrule sees only the
        files it lists; headers of deps must be named here to be inputs of nvcc).
      copts: extra nvcc flags.
      visibility: visibility of the cc_library.
    """
    objs = []
    for src in srcs:
        obj = name + "_" + src.replace("/", "_").replace(".cu", ".o")
        native.genrule(
            name = obj + "_nvcc",
            srcs = [src] + hdrs + cuda_hdrs,
            outs = [obj],
            tools = ["@cuda//:bin/nvcc"],
            toolchains = ["@bazel_tools//tools/cpp:current_cc_toolchain"],
            # nvcc finds its own tools next to the real binary, so run it unsandboxed.
            local = True,
            cmd = " ".join([
                "$(location @cuda//:bin/nvcc)",
                "-ccbin $(CC)",
                "-std=c++20 -O3 -lineinfo -Xcompiler=-fPIC -I.",
                "-I$(GENDIR)",
                " ".join(CUDA_ARCH_FLAGS),
                " ".join(copts),
                "-c $(location %s) -o $@" % src,
            ]),
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        visibility = visibility,
        alwayslink = True,
        # Link the objects into the executable: a shared library would miss the static cudart symbols.
        linkstatic = True,
    )
