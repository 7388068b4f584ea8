#!/usr/bin/env python3
"""Keeps README.md and docs/*.md honest (tests/check_docs.sh):
  - every relative link resolves to a file of the repository;
  - every repository path a command or the text names (mpirun_examples/..., benchmarks/..., tests/...,
    cmake/..., apps/..., .ci/...) exists, and every build product it names (build/<preset>/apps/<app>,
    build/<preset>/mpirun_examples/<program>, build/<preset>/tests/<test>) has its source;
  - every `shard::name` in the API tables (the rows of docs/api.md and README.md) is declared in include/;
  - the README's first program is mpirun_examples/first_program.cpp, character for character.
Prints each problem and exits 1 if there is one."""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
pages = [root / "README.md"] + sorted((root / "docs").glob("*.md"))
problems = []

headers = "\n".join(p.read_text(errors="replace") for p in (root / "include").rglob("*.hpp"))
identifiers = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", headers))

path_re = re.compile(r"(?<![\w/.-])(?:\./)?((?:mpirun_examples|benchmarks|tests|cmake|apps|fuzz|\.ci)/[A-Za-z0-9_./-]*[A-Za-z0-9_])")
build_re = re.compile(r"build/[a-z-]+/(apps|mpirun_examples|tests)/((?:seeds/)?[A-Za-z0-9_]+)")
name_re = re.compile(r"shard::((?:[A-Za-z_][A-Za-z0-9_]*::)*)([A-Za-z_][A-Za-z0-9_]*)")

for page in pages:
    text = page.read_text()
    rel = page.relative_to(root)
    for target in re.findall(r"\[[^\]\[`]+\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (page.parent / target.split("#")[0]).resolve().exists():
            problems.append(f"{rel}: the link '{target}' leads nowhere")
    for m in path_re.finditer(text):
        p = m.group(1)
        if "*" in p or "<" in p:
            continue
        if not (root / p).exists():
            problems.append(f"{rel}: names '{p}', which does not exist")
    for kind, name in build_re.findall(text):
        if kind == "apps":
            ok = (root / "apps" / name).is_dir()
        elif kind == "mpirun_examples":
            ok = (root / "mpirun_examples" / f"{name}.cpp").exists()
        else:
            ok = any(root.glob(f"tests/**/{name}.cpp")) or any(root.glob(f"tests/**/{name}"))
        if not ok:
            problems.append(f"{rel}: names the build product '{kind}/{name}', which has no source")
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        for ns, name in name_re.findall(line):
            if name not in identifiers:
                problems.append(f"{rel}: the table names 'shard::{ns}{name}', which no header declares")

readme = (root / "README.md").read_text()
program = (root / "mpirun_examples" / "first_program.cpp").read_text()
if "```cpp\n" + program + "```" not in readme:
    problems.append("README.md: the first program differs from mpirun_examples/first_program.cpp")

for p in problems:
    print(p)
if problems:
    sys.exit(1)
print(f"check_docs: {len(pages)} pages, links, paths, API names and the first program check out")
