"""fuzz_target: a libFuzzer binary (manual; launch/fuzz.sh) and a replay test of its seeds."""

def fuzz_target(name, deps, hdrs = [], data = []):
    native.cc_binary(
        name = name + "_fuzzer",
        srcs = [name + "_fuzzer.cc", "fuzz_util.h"] + hdrs,
        deps = deps,
        tags = ["manual"],
    )
    native.cc_test(
        name = name + "_replay_test",
        size = "small",
        srcs = [name + "_fuzzer.cc", "fuzz_util.h", "replay_test.cc"] + hdrs,
        local_defines = ["FUZZ_TARGET=\\\"%s\\\"" % name],
        data = native.glob(["corpus/%s/*" % name]) + data,
        deps = deps + ["//third_party:gtest_main"],
    )
