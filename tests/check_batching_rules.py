#!/usr/bin/env python3
"""tests/check_batching_rules.py [repo]: walks the op table and fails on any primitive without a
batching rule (vmap; DESIGN.md "jit and vmap").

The op table is every struct deriving from shard::Primitive (directly, or through a base such as
ReshapeLike<Self>) in include/ and src/. Each must give, in its own body or in the body of the
base it derives from, a batching rule: a member `batch(...)` (ops/batching.hpp) or, for a
primitive over a list of operands, `batch_list(...)`. A primitive without one raises under vmap
(or runs as a loop when asked for), so a new primitive must come with its rule.

tests/mpi/test_vmap.cpp checks each rule against the loop over the examples."""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
files = [p for d in ("include", "src") for p in (root / d).rglob("*") if p.suffix in (".hpp", ".cpp")]

struct_re = re.compile(r"\bstruct\s+(\w+)\s*(?:final\s*)?:\s*(?:public\s+)?([\w:<>, ]+?)\s*\{")


def body_at(text, start):
    """The text of the braced body opening at text[start] == '{'."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i + 1]
    return text[start:]


structs = {}  # name -> (bases, body, file)
for f in files:
    text = re.sub(r"//[^\n]*", "", f.read_text())  # comments (doc examples) are not the table
    for m in struct_re.finditer(text):
        name, bases = m.group(1), m.group(2)
        structs[name] = (bases, body_at(text, m.end() - 1), f.relative_to(root))


def derives_primitive(name, seen=()):
    if name not in structs or name in seen:
        return False
    bases = structs[name][0]
    if re.search(r"\bPrimitive\b", bases):
        return True
    return any(derives_primitive(b, seen + (name,)) for b in re.findall(r"(\w+)\s*(?:<|$|,)", bases))


def has_rule(name, seen=()):
    if name not in structs or name in seen:
        return False
    bases, body, _ = structs[name]
    if re.search(r"\bbatch(_list)?\s*\(", body):
        return True
    return any(has_rule(b, seen + (name,)) for b in re.findall(r"(\w+)\s*(?:<|$|,)", bases))


# A base other primitives derive from (ReshapeLike<Self>) is checked through them.
bases_of_others = {b for n, (bases, _, _) in structs.items() for b in re.findall(r"(\w+)\s*(?:<|$|,)", bases)}
prims = sorted(n for n in structs if derives_primitive(n) and n != "Primitive" and n not in bases_of_others)
missing = [n for n in prims if not has_rule(n)]
for n in missing:
    print(f"check_batching_rules: primitive {n} ({structs[n][2]}) has no batching rule: give it a "
          f"batch() member (ops/batching.hpp), or batch_list() for a list primitive", file=sys.stderr)
if len(prims) < 20:
    print(f"check_batching_rules: found only {len(prims)} primitives; the walk is broken", file=sys.stderr)
    sys.exit(1)
print(f"check_batching_rules: {len(prims)} primitives, {len(prims) - len(missing)} with a batching rule:",
      " ".join(prims))
sys.exit(1 if missing else 0)
