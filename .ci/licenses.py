#!/usr/bin/env python3
"""Checks the licence of every crate in the dependency graph against an allow-list.

cargo-deny's `licenses` check, without installing it: reads `cargo metadata` (the resolved
graph for all features and targets) and evaluates each crate's SPDX expression. A crate passes
when one alternative of its `OR` expression has every `AND` term allowed. Exits 1 and names the
crates that do not, or that declare no licence at all.
"""
import json
import re
import subprocess
import sys

ALLOWED = {
    "MIT", "MIT-0", "Apache-2.0", "BSD-2-Clause", "BSD-3-Clause", "ISC", "Zlib", "0BSD",
    "Unicode-3.0", "Unicode-DFS-2016", "CC0-1.0", "BSL-1.0", "Unlicense", "MPL-2.0", "CDLA-Permissive-2.0",
}
# Exceptions that only widen a licence (`Apache-2.0 WITH LLVM-exception`).
EXCEPTIONS = {"LLVM-exception"}


def term_ok(term: str) -> bool:
    term = term.strip().strip("()").strip()
    if " WITH " in term:
        base, exception = (part.strip() for part in term.split(" WITH ", 1))
        return base in ALLOWED and exception in EXCEPTIONS
    return term in ALLOWED


def expression_ok(expression: str) -> bool:
    # Old crates write `MIT/Apache-2.0`: the same as OR.
    expression = expression.replace("/", " OR ")
    flat = re.sub(r"[()]", " ", expression)
    return any(
        all(term_ok(t) for t in alternative.split(" AND "))
        for alternative in re.split(r"\s+OR\s+", flat)
    )


def self_check() -> None:
    """The evaluator must refuse what it should, or a green run means nothing."""
    assert expression_ok("MIT OR Apache-2.0")
    assert expression_ok("MIT/Apache-2.0")
    assert expression_ok("(MIT OR Apache-2.0) AND Unicode-3.0")
    assert expression_ok("Apache-2.0 WITH LLVM-exception")
    assert not expression_ok("GPL-3.0-only")
    assert not expression_ok("MIT AND GPL-2.0-or-later")
    assert expression_ok("GPL-2.0-or-later OR MIT")


def main() -> int:
    self_check()
    metadata = json.loads(subprocess.check_output(
        ["cargo", "metadata", "--format-version", "1", "--all-features", "--locked"]))
    workspace = set(metadata["workspace_members"])
    bad = []
    for package in metadata["packages"]:
        if package["id"] in workspace:
            continue
        licence = package.get("license")
        if not licence:
            bad.append(f'{package["name"]} {package["version"]}: no SPDX licence declared')
        elif not expression_ok(licence):
            bad.append(f'{package["name"]} {package["version"]}: {licence}')
    checked = len(metadata["packages"]) - len(workspace)
    if bad:
        print(f"licences: {len(bad)} of {checked} crates are not on the allow-list (.ci/licenses.py):")
        print("\n".join(sorted(set(bad))))
        return 1
    print(f"licences: all {checked} dependency crates allowed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
