"""cc_proto: C++ code from a .proto with the system protoc (no protobuf rules, no downloads)."""

def cc_proto(name, src, deps = [], visibility = None):
    """Generates <src>.pb.{h,cc} with the system `protoc` and wraps them in a cc_library.

    Args:
      name: name of the cc_library.
      src: the .proto file, in this package.
      deps: other cc_proto targets that `src` imports.
      visibility: visibility of the cc_library.
    """
    base = src[:-len(".proto")]
    native.genrule(
        name = name + "_protoc",
        srcs = [src],
        outs = [base + ".pb.h", base + ".pb.cc"],
        cmd = "protoc --proto_path=. --cpp_out=$(GENDIR) $(location %s)" % src,
    )
    native.cc_library(
        name = name,
        srcs = [base + ".pb.cc"],
        hdrs = [base + ".pb.h"],
        deps = deps + ["//third_party:protobuf"],
        visibility = visibility,
    )
