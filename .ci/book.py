#!/usr/bin/env python3
"""Checks the book (docs/) and the README, what `mdbook build` lets pass with exit code 0.

- Every ```rust block in docs/src is made of `{{#include ...}}` lines only: the book's code comes
  from files that CI compiles (examples/, tests/), never pasted.
- Every `{{#include path}}` names a file that exists, and `path:anchor` an anchor that the file
  opens (`ANCHOR: name`) and closes (`ANCHOR_END: name`); mdBook would show a missing anchor as
  an empty block.
- Every relative link of README.md and of the book's pages names a file that exists.

Exits 1 and names each problem.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "docs" / "src"
INCLUDE = re.compile(r"\{\{#include\s+([^}\s]+)\s*\}\}")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def includes(page, text, problems):
    for target in INCLUDE.findall(text):
        path, _, anchor = target.partition(":")
        file = (page.parent / path).resolve()
        if not file.is_file():
            problems.append(f"{page.relative_to(ROOT)}: includes {path}, which does not exist")
            continue
        if anchor and not anchor[0].isdigit():
            body = file.read_text()
            for mark in (f"ANCHOR: {anchor}", f"ANCHOR_END: {anchor}"):
                if not re.search(re.escape(mark) + r"\b", body):
                    problems.append(
                        f"{page.relative_to(ROOT)}: includes {target}, but {path} has no `{mark}`"
                    )


def rust_blocks(page, text, problems):
    for block in re.findall(r"^```rust[^\n]*\n(.*?)^```", text, re.S | re.M):
        lines = [line for line in block.splitlines() if line.strip()]
        if not lines or not all(INCLUDE.fullmatch(line.strip()) for line in lines):
            problems.append(
                f"{page.relative_to(ROOT)}: a ```rust block that is not only {{{{#include}}}} lines"
            )


def links(page, text, problems):
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#")[0]
        if path and not (page.parent / path).exists():
            problems.append(f"{page.relative_to(ROOT)}: a link to {target}, which does not exist")


def main():
    problems = []
    for page in sorted(SRC.rglob("*.md")):
        text = page.read_text()
        includes(page, text, problems)
        rust_blocks(page, text, problems)
        links(page, text, problems)
    readme = ROOT / "README.md"
    links(readme, readme.read_text(), problems)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        sys.exit(1)
    print(f"book: {len(list(SRC.rglob('*.md')))} pages, includes, code blocks and links ok")


if __name__ == "__main__":
    main()
