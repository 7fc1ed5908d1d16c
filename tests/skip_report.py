#!/usr/bin/env python3
"""Prints every test ctest skipped, with the reason the test printed.

    skip_report.py JUNIT.xml

JUNIT.xml is ctest's --output-junit file (tests/run.sh writes it). ctest
itself only says "Skipped" (SKIP_RETURN_CODE 77, SKIP_REGULAR_EXPRESSION)
or "Not Run"; the reason is in the test's output: its lines that mention
skipping (`SKIP: ...`), else its last lines. Prints nothing when nothing
was skipped; always exits 0 (a report, not a test).
"""
import re
import sys
import xml.etree.ElementTree as ET


def reason(out, limit=3):
    lines = [l.strip() for l in (out or "").splitlines() if l.strip()]
    said = [l for l in lines if re.search(r"\bskip", l, re.I)]
    return (said or lines[-2:])[:limit]


def main():
    try:
        root = ET.parse(sys.argv[1]).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"skip_report: cannot read {sys.argv[1]}: {e}")
        return 0
    skipped = []
    for tc in root.iter("testcase"):
        sk = tc.find("skipped")
        if tc.get("status") != "notrun" and sk is None:
            continue
        why = sk.get("message", "") if sk is not None else "not run"
        skipped.append((tc.get("name"), why, reason(tc.findtext("system-out"))))
    if not skipped:
        return 0
    print(f"\n{len(skipped)} test(s) skipped, with the reason each printed:")
    for name, why, lines in sorted(skipped):
        print(f"  {name} ({why}):")
        for l in lines or ["(printed no reason)"]:
            print(f"      {l}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
