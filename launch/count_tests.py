#!/usr/bin/env python3
"""Counts test cases from the gtest XML of the test targets that ran.

Usage: count_tests.py TESTLOGS_DIR TARGET...   (targets as //pkg:name)
Prints one line per failed case, then `tests: N passed, M failed[, K skipped]`.
A target with no XML (it failed to build or crashed before writing it) counts as one failure.
"""
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def main() -> int:
    logs = Path(sys.argv[1])
    passed = failed = skipped = 0
    for target in sys.argv[2:]:
        package, name = target.lstrip("/").split(":")
        xml = logs / package / name / "test.xml"
        if not xml.is_file():
            print(f"FAILED {target}: no test results (build failure or crash)")
            failed += 1
            continue
        for case in ET.parse(xml).getroot().iter("testcase"):
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


if __name__ == "__main__":
    sys.exit(main())
