"""How Open MPI moves BigMac's messages in a bench run (issue 34): one mpirun option set per path.

  cma   shared memory with single-copy (the default on one host)
  tcp   `--mca btl self,tcp`, as between hosts
  copy  shared memory without single-copy (`--mca btl_vader_single_copy_mechanism none`, as in
        containers without ptrace rights, and as tests/ and the bundle run)
"""

MPI_PATHS = {
    "cma": [],
    "tcp": ["--mca", "btl", "self,tcp"],
    "copy": ["--mca", "btl", "self,vader", "--mca", "btl_vader_single_copy_mechanism", "none"],
}

DESCRIPTIONS = {
    "cma": "shared memory with single-copy (Open MPI's default)",
    "tcp": "TCP (--mca btl self,tcp, as between hosts)",
    "copy": "shared memory without single-copy (btl_vader_single_copy_mechanism none)",
}
