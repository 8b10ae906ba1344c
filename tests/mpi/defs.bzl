"""A multi-process test that also runs over TCP."""

def mpi_test_on_both_paths(name, src, deps, size = "large"):
    """`name` (mpirun over shared memory without single-copy) and `name`_tcp (every mpirun over
    TCP: BIGMAC_TEST_MPI_PATH, tests/testing/run.h), the same cases compiled once. Both run alone
    and use the bigmac binary and the configs."""
    cases = name.replace("_test", "") + "_cases"
    native.cc_library(
        name = cases,
        testonly = True,
        srcs = [src],
        deps = deps,
        alwayslink = True,
    )
    for suffix, env in [("", {}), ("_tcp", {"BIGMAC_TEST_MPI_PATH": "tcp"})]:
        native.cc_test(
            name = name + suffix,
            size = size,
            data = [
                "//:bigmac",
                "//configs",
            ],
            env = env,
            tags = ["exclusive"],
            deps = [":" + cases],
        )
