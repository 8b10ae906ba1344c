#!/usr/bin/env python3
"""Counts test cases from the gtest XML of the test targets that ran.

Usage: count_tests.py TESTLOGS_DIR TARGET... [--not-run TARGET...]   (targets as //pkg:name)
Prints one line per failed case, then `tests: N passed, M failed[, K skipped]`.
A target with no XML (it failed to build or crashed before writing it), or named after --not-run
(bazel reported it as not built or not run, so its XML is stale), counts as one failure.
"""
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def main() -> int:
    logs = Path(sys.argv[1])
    args = sys.argv[2:]
    not_run = set(args[args.index("--not-run") + 1:]) if "--not-run" in args else set()
    targets = args[:args.index("--not-run")] if "--not-run" in args else args
    passed = failed = skipped = 0
    for target in targets:
        package, name = target.lstrip("/").split(":")
        xml = logs / package / name / "test.xml"
        if target in not_run:
            print(f"FAILED {target}: not built or not run")
            failed += 1
            continue
        if not xml.is_file():
            print(f"FAILED {target}: no test results (build failure or crash)")
            failed += 1
            continue
        for case in parse_cases(xml):
            label = f"{target} {case.get('classname', '')}.{case.get('name', '')}"
            if case.find("failure") is not None or case.find("error") is not None:
                print(f"FAILED {label}")
                failed += 1
            elif case.get("result") == "skipped" or case.find("skipped") is not None or case.get("status") == "notrun":
                print(f"SKIPPED {label}")
                skipped += 1
            else:
                passed += 1
    summary = f"tests: {passed} passed, {failed} failed"
    if skipped:
        summary += f", {skipped} skipped"
    print(summary)
    return 1 if failed or passed == 0 else 0


def parse_cases(xml):
    """The <testcase> elements of a gtest XML. A failure message that quotes a hostile input can
    hold control bytes XML forbids; those are dropped, so the cases still count."""
    try:
        return list(ET.parse(xml).getroot().iter("testcase"))
    except ET.ParseError:
        text = xml.read_bytes().decode("utf-8", errors="replace")
        text = re.sub(r"[\x00-\x08\x0b\x0c\x0e-\x1f]", "", text)
        return list(ET.fromstring(text).iter("testcase"))


if __name__ == "__main__":
    sys.exit(main())
