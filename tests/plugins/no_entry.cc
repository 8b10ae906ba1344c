// A shared library without bigmac_plugin_register: loading it must say so.
extern "C" __attribute__((visibility("default"))) int some_other_function() { return 42; }
