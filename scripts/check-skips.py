#!/usr/bin/env python3
"""Pins the test suites' skips to tests/expected-skips.txt.

A test that skips passes in ctest and in pytest, so a broken import or a
missing tool can turn a suite into "passed" while nothing ran. The test
command therefore writes every suite's report (GoogleTest XML through
GTEST_OUTPUT, pytest's --junitxml) under one folder, one name per suite,
and this script compares the skips in them with the list:

  check-skips.py DIR SUITE    checks DIR/SUITE (a folder of GoogleTest XML
                              files, or DIR/SUITE.xml from pytest): exit 1
                              if a test skipped that no line of the list
                              allows, or with another message than the line
                              says; prints the allowed skips it saw
  check-skips.py --summary DIR
                              one table of every suite's skips under DIR,
                              and the list's lines that no suite hit

Skips are GoogleTest's GTEST_SKIP and DISABLED_ tests, the tests ctest
itself skips (its --output-junit report, DIR/SUITE/ctest-junit.xml: by
SKIP_RETURN_CODE, SKIP_REGULAR_EXPRESSION or DISABLED; named ctest:NAME),
pytest's skips and xfails (module-level importorskip included). Standard
library only.
"""

from __future__ import annotations

import fnmatch
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import List, NamedTuple, Tuple

LIST = Path(__file__).resolve().parent.parent / "tests" / "expected-skips.txt"
CTEST_JUNIT = "ctest-junit.xml"


class Allowed(NamedTuple):
    suite: str  # glob over suite names: gtest-release, pytest-python, ...
    test: str  # glob over test ids: Suite.Name (GoogleTest), module::name (pytest)
    message: str  # the skip's message must contain this
    why: str  # why it is allowed on this machine
    line: int


class Skip(NamedTuple):
    suite: str
    test: str
    message: str


def read_list(path: Path = LIST) -> List[Allowed]:
    out = []
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = [f.strip() for f in line.split("|", 3)]  # WHY may hold a "|"
        if len(fields) != 4 or not all(fields):
            sys.exit(f"{path}:{n}: want 'SUITE | TEST | MESSAGE | WHY', four non-empty fields: {raw}")
        out.append(Allowed(*fields, line=n))
    return out


def gtest_skips(suite: str, folder: Path) -> Tuple[List[Skip], int]:
    """GoogleTest's XML reports in `folder`, and ctest's own (--output-junit
    ctest-junit.xml: its SKIP_RETURN_CODE, SKIP_REGULAR_EXPRESSION and
    DISABLED tests, named ctest:NAME)."""
    skips, ran = [], 0
    for f in sorted(folder.glob("*.xml")):
        ctest = f.name == CTEST_JUNIT
        for case in ET.parse(f).getroot().iter("testcase"):
            test = f"ctest:{case.get('name')}" if ctest else f"{case.get('classname')}.{case.get('name')}"
            ran += 0 if ctest else 1
            skipped = case.find("skipped")
            if skipped is not None:
                skips.append(Skip(suite, test, skipped.get("message", "")))
            elif case.get("status") in ("notrun", "disabled"):
                skips.append(Skip(suite, test, "disabled (not run)"))
    return skips, ran


def pytest_skips(suite: str, report: Path) -> Tuple[List[Skip], int]:
    skips, ran = [], 0
    for case in ET.parse(report).getroot().iter("testcase"):
        cls, name = case.get("classname", ""), case.get("name", "")
        test = f"{cls}::{name}" if cls else name  # a module skipped whole has no class
        ran += 1
        skipped = case.find("skipped")
        if skipped is not None:
            # A module skipped whole says "collection skipped"; the text has why.
            message = skipped.get("message", "")
            if not cls:
                message = f"{message}: {skipped.text or ''}"
            skips.append(Skip(suite, test, message))
    return skips, ran


def suite_skips(root: Path, suite: str) -> Tuple[List[Skip], int]:
    if (root / suite).is_dir():
        return gtest_skips(suite, root / suite)
    if (root / f"{suite}.xml").is_file():
        return pytest_skips(suite, root / f"{suite}.xml")
    sys.exit(f"check-skips: no report of suite {suite} under {root} (a folder of GoogleTest XML or {suite}.xml)")


def match(skip: Skip, allowed: List[Allowed]) -> Tuple[Allowed | None, Allowed | None]:
    """The line that allows `skip`, or the line that names it with another message."""
    named = None
    for a in allowed:
        if fnmatch.fnmatchcase(skip.suite, a.suite) and fnmatch.fnmatchcase(skip.test, a.test):
            if a.message in skip.message:
                return a, None
            named = named or a
    return None, named


def one_line(text: str) -> str:
    return " ".join(text.split())[:300]


def check(root: Path, suite: str) -> int:
    allowed = read_list()
    skips, ran = suite_skips(root, suite)
    bad = []
    for s in skips:
        ok, named = match(s, allowed)
        if ok:
            print(f"  expected skip [{suite}] {s.test}: {ok.why}")
        elif named:
            bad.append(f"  {s.test}: skipped saying '{one_line(s.message)}', but "
                       f"{LIST.name}:{named.line} allows it only with '{named.message}'")
        else:
            bad.append(f"  {s.test}: {one_line(s.message)}")
    print(f"check-skips [{suite}]: {ran} tests, {len(skips) - len(bad)} expected skips, {len(bad)} unexpected")
    if bad:
        print(f"FAIL: check-skips [{suite}]: tests skipped that {LIST} does not allow:", file=sys.stderr)
        print("\n".join(bad), file=sys.stderr)
        print(f"  Fix what made them skip, or, if the skip is right on this machine, add a line "
              f"'SUITE | TEST | MESSAGE | WHY' to {LIST} (README.md, Tests)", file=sys.stderr)
        return 1
    return 0


def summary(root: Path) -> int:
    allowed = read_list()
    suites = sorted({p.stem for p in root.glob("*.xml")} | {p.name for p in root.iterdir() if p.is_dir()})
    hit = set()
    print(f"Skips ({LIST.relative_to(LIST.parent.parent)}; any other skip fails the run):")
    for suite in suites:
        skips, ran = suite_skips(root, suite)
        print(f"  {suite}: {ran} tests, {len(skips)} skipped")
        for s in skips:
            ok, _ = match(s, allowed)
            if ok:
                hit.add(ok.line)
            print(f"    {s.test}: {ok.why if ok else 'UNEXPECTED: ' + one_line(s.message)}")
    unused = [a for a in allowed if a.line not in hit and any(fnmatch.fnmatchcase(s, a.suite) for s in suites)]
    for a in unused:
        print(f"  allowed, but no test skipped by it in this run: {a.test} [{a.suite}] (line {a.line})")
    return 0


def main(argv: List[str]) -> int:
    if len(argv) == 3 and argv[1] == "--summary":
        return summary(Path(argv[2]))
    if len(argv) == 3 and not argv[1].startswith("-"):
        return check(Path(argv[1]), argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
