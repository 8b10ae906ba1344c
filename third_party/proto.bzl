"""cc_proto: C++ code from a .proto with the system protoc (no protobuf rules, no downloads)."""

def cc_proto(name, src, deps = [], imports = [], visibility = None):
    """Generates <src>.pb.{h,cc} with the system `protoc` and wraps them in a cc_library.

    Args:
      name: name of the cc_library.
      src: the .proto file, in this package.
      deps: the cc_proto targets of the files `src` imports.
      imports: the .proto files `src` imports (labels), so protoc can read them.
      visibility: visibility of the cc_library.
    """
    base = src[:-len(".proto")]
    native.genrule(
        name = name + "_protoc",
        srcs = [src] + imports,
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
