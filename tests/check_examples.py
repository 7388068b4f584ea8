#!/usr/bin/env python3
"""Every C++ example in the docs and the headers compiles (tests/check_examples.sh runs this).

Examples are the ```cpp blocks of README.md and docs/*.md, and the indented blocks of a
header's leading comment (lines "///   code" after a "///" line). A block with its own main()
is compiled as it is; any other block is the body of a function, after the lines it starts
with that read "// given: <statements>" (the names it assumes, shown to the reader too).
Usage: check_examples.py <c++ compiler> <build dir for the generated sources> <flags...>
"""
import concurrent.futures
import pathlib
import re
import subprocess
import sys

root = pathlib.Path(__file__).resolve().parent.parent
cxx, out_dir, flags = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3:]
out_dir.mkdir(parents=True, exist_ok=True)


def doc_blocks(path):
    lines = path.read_text().split("\n")
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```cpp":
            start = i + 1
            j = start
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            yield start + 1, "\n".join(lines[start:j])
            i = j
        i += 1


def looks_like_code(block):
    """Every line ends like C++ (';', '{', '}', ')', ',' or a // comment) and one ends with ';'
    (an indented prose list or table in a header comment is not an example)."""
    ends = [re.sub(r"\s*//.*$", "", line).rstrip() for line in block if line.strip()]
    if not ends or not any(e.endswith(";") for e in ends):
        return False
    return all(e == "" or e[-1] in ";{}),(" or e.startswith("//") for e in ends)


def header_blocks(path):
    lines = path.read_text().split("\n")
    i = 0
    while i < len(lines) and (lines[i].startswith("///") or lines[i].startswith("#pragma")):
        if lines[i].startswith("///   ") and lines[i - 1].rstrip() == "///":
            start = i
            while i < len(lines) and lines[i].startswith("///   "):
                i += 1
            block = [line[3:] for line in lines[start:i]]
            indent = min(len(b) - len(b.lstrip()) for b in block if b.strip())
            block = [b[indent:] for b in block]
            if looks_like_code(block):
                yield start + 1, "\n".join(block)
        i += 1


def source_of(code):
    if re.search(r"\bint main\s*\(", code):
        return code + "\n"
    prelude = ("#include <shard/shard.hpp>\n#include <cstdio>\n#include <map>\n#include <string>\n#include <tuple>\n"
               "#include <vector>\nusing namespace shard;\n")
    if re.match(r"\s*(struct|class|template|namespace)\b", code):  # declarations: at namespace scope
        return prelude + "namespace example {\n" + code + "\n}  // namespace example\n"
    given = []
    body = []
    for line in code.split("\n"):
        m = re.match(r"\s*// given: (.*)", line)
        if m and not body:
            given.append(m.group(1))
        else:
            body.append(line)
    return (prelude + "[[maybe_unused]] static void example(Runtime& rt) {\n  (void)rt;\n"
            + "\n".join("  " + g for g in given) + "\n" + "\n".join(body) + "\n}\n")


examples = []
for md in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
    for line, code in doc_blocks(md):
        examples.append((f"{md.relative_to(root)}:{line}", code))
for hpp in sorted((root / "include" / "shard").rglob("*.hpp")):
    for line, code in header_blocks(hpp):
        examples.append((f"{hpp.relative_to(root)}:{line}", code))


def check(k_where_code):
    k, (where, code) = k_where_code
    src = out_dir / f"example_{k}.cpp"
    src.write_text(f"// {where}\n" + source_of(code))
    r = subprocess.run([cxx, "-std=c++20", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-Wno-unused-variable", "-Wno-unused-but-set-variable", *flags, str(src)],
                       capture_output=True, text=True)
    return where, src, r


failed = 0
with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    for where, src, r in pool.map(check, enumerate(examples)):
        if r.returncode != 0:
            failed += 1
            print(f"check_examples: the example at {where} does not compile ({src}):")
            print("\n".join(r.stderr.split("\n")[:30]))
        else:
            print(f"check_examples: {where} compiles")
print(f"check_examples: {len(examples) - failed} of {len(examples)} examples compile")
sys.exit(1 if failed else 0)
