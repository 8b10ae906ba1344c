"""CUDA targets and their emulated twins.

cuda_library compiles .cu files with nvcc (sm_90 code plus compute_90 PTX) into a cc_library;
cuda_cc_library is a cc_library of host code that calls CUDA libraries. Each also defines
`<name>_emulated` (testonly): the same sources built against the emulated CUDA device
(core/device/cuda/emulation/), the .cu files compiled as C++ by the host compiler. Shipping
binaries never depend on an _emulated target.
"""

# The CUDA libraries, replaced by the stand-ins in the emulated twins.
_CUDA_LIBRARIES = [
    "@cuda//:cudart",
    "@cuda//:cublas",
    "@cuda//:cublasLt",
    "@cuda//:cudnn",
    "@cuda//:nccl",
    "@cuda//:nvrtc",
]
_EMULATED_RUNTIME = "//core/device/cuda/emulation:runtime"

# Every target defined by cuda_library or cuda_cc_library (so it has an _emulated twin).
_TWINNED = [
    "//core/cli:cli",
    "//core/comm/cuda:cuda_probe",
    "//core/comm/nccl:nccl_check",
    "//core/comm/nccl:nccl_pipeline_comm",
    "//core/device/cuda:context",
    "//core/device/cuda:cuda_device",
    "//stages/cuda:gemm",
    "//stages/cuda:gemm_descriptors",
    "//stages/cuda:kernels",
    "//stages/cuda:layers",
    "//stages/cuda:sdpa",
    "//stages/gpt/cuda:cuda",
    "//stages/llama/cuda:cuda",
]

def _full_label(label):
    if label.startswith(":"):
        return "//" + native.package_name() + label
    if label.startswith("//") and ":" not in label:
        return label + ":" + label.split("/")[-1]
    return label

def emulated_deps(deps):
    """`deps` with every CUDA library and CUDA target replaced by its emulated twin."""
    out = []
    for dep in deps:
        full = _full_label(dep)
        if dep in _CUDA_LIBRARIES:
            mapped = _EMULATED_RUNTIME
        elif full in _TWINNED:
            mapped = full + "_emulated"
        else:
            mapped = dep
        if mapped not in out:
            out.append(mapped)
    return out

def cuda_cc_library(name, deps = [], tags = [], **kwargs):
    """A cc_library of host code that calls CUDA, and its emulated twin `<name>_emulated`."""
    native.cc_library(name = name, deps = deps, tags = tags, **kwargs)
    twin = dict(kwargs)
    twin.pop("visibility", None)
    native.cc_library(
        name = name + "_emulated",
        deps = emulated_deps(deps),
        tags = tags + ["emulated"],
        testonly = True,
        visibility = ["//visibility:public"],
        **twin
    )

def cuda_cc_test(name, deps = [], tags = [], **kwargs):
    """A cc_test of CUDA code: `name` runs on a GPU (tagged gpu: launch/test.sh leaves it to
    launch/device_check.sh), `<name>_emulated` runs the same cases on the emulated device."""
    native.cc_test(name = name, deps = deps, tags = tags + ["gpu"], **kwargs)
    native.cc_test(name = name + "_emulated", deps = emulated_deps(deps), tags = tags + ["emulated"], **kwargs)

def cuda_cc_binary(name, deps = [], **kwargs):
    """A cc_binary with CUDA, and its emulated twin `<name>_emulated` (testonly)."""
    native.cc_binary(name = name, deps = deps, **kwargs)
    twin = dict(kwargs)
    twin.pop("visibility", None)
    native.cc_binary(
        name = name + "_emulated",
        deps = emulated_deps(deps),
        testonly = True,
        visibility = ["//visibility:public"],
        **twin
    )

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

    # The emulated twin: the same .cu files, compiled as C++ with the device-side names of
    # core/device/cuda/emulation/device_code.h (a copy under a .cc name, since cc_library
    # compiles no .cu).
    copies = []
    for src in srcs:
        copy = name + "_emulated_" + src.replace("/", "_").replace(".cu", ".cc")
        native.genrule(
            name = copy + "_copy",
            srcs = [src],
            outs = [copy],
            # The #line keeps the .cu file's name in errors, debuggers and gcov.
            cmd = "(echo '#line 1 \"$<\"'; cat $<) > $@",
            testonly = True,
        )
        copies.append(copy)
    native.cc_library(
        name = name + "_emulated",
        srcs = copies,
        hdrs = hdrs,
        copts = [
            "-DBIGMAC_CUDA_EMULATION",
            "-include",
            "core/device/cuda/emulation/device_code.h",
        ],
        deps = emulated_deps(deps) + ["//core/device/cuda/emulation:device_code"],
        testonly = True,
        tags = ["emulated"],
        visibility = ["//visibility:public"],
        alwayslink = True,
        linkstatic = True,
    )
