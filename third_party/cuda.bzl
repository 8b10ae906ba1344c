"""cuda_library: compiles .cu files with nvcc (sm_90 code plus compute_90 PTX) into a cc_library."""

CUDA_ARCH_FLAGS = [
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], visibility = None):
    """One genrule per .cu file runs nvcc to an object; a cc_library links the objects.

    Args:
      name: name of the cc_library.
      srcs: .cu files.
      hdrs: headers the .cu files and their users include.
      deps: cc_library deps (headers for nvcc must come through hdrs here).
      copts: extra nvcc flags.
      visibility: visibility of the cc_library.
    """
    objs = []
    for src in srcs:
        obj = name + "_" + src.replace("/", "_").replace(".cu", ".o")
        native.genrule(
            name = obj + "_nvcc",
            srcs = [src] + hdrs,
            outs = [obj],
            tools = ["@cuda//:bin/nvcc"],
            # nvcc finds its own tools next to the real binary, so run it unsandboxed.
            local = True,
            cmd = " ".join([
                "$(location @cuda//:bin/nvcc)",
                "-std=c++20 -O3 -Xcompiler=-fPIC -I.",
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
