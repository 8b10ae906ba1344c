#!/usr/bin/env python3
"""Reads a run directory's TensorBoard event file with TensorBoard's own reader (EventAccumulator,
PyPI `tensorboard`) and prints its scalars and text summaries as JSON, for tests/mpi/tensorboard_test.

Usage: tensorboard_read.py RUN_DIR
"""
import glob
import json
import sys

from tensorboard.backend.event_processing import event_accumulator


def main():
    run_dir = sys.argv[1]
    files = sorted(glob.glob(run_dir + "/events.out.tfevents.*"))
    accumulator = event_accumulator.EventAccumulator(
        run_dir, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
    accumulator.Reload()
    tags = accumulator.Tags()
    out = {"files": [f.rsplit("/", 1)[-1] for f in files], "python": sys.executable,
           "scalars": {}, "text": {}, "plugins": {}}
    for tag in tags["scalars"]:
        out["scalars"][tag] = [[e.step, e.value] for e in accumulator.Scalars(tag)]
    for tag in tags["tensors"]:
        out["text"][tag] = [[e.step, b"".join(e.tensor_proto.string_val).decode("utf-8", "replace")]
                            for e in accumulator.Tensors(tag)]
        out["plugins"][tag] = accumulator.SummaryMetadata(tag).plugin_data.plugin_name
    print(json.dumps(out))


if __name__ == "__main__":
    main()
