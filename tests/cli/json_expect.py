#!/usr/bin/python3
"""Runs a command that prints one JSON document and checks fields of it.

  json_expect.py CHECK... -- COMMAND [ARG...]

Each CHECK is PATH OP VALUE, with PATH a dotted path into the document
(list items by index: results.0.policy) and OP one of
  ==   equal to the JSON VALUE (8, true, "scheduled", null)
  >=   a number at least VALUE          <=  a number at most VALUE
  ^=   a string starting with VALUE     ~=  a string matching the regex VALUE
  :    of the JSON type VALUE (number, string, bool, list, object)
The command must exit 0 and its standard output must be one JSON document
(text before the first '{' or '[' is ignored: some commands print a banner).
Checks read fields by name, so they do not depend on key order or layout.
Exits 0 when every check holds, 1 otherwise, naming each failed check.
"""
import json
import re
import subprocess
import sys

TYPES = {"number": (int, float), "string": str, "bool": bool, "list": list, "object": dict}


def lookup(doc, path):
    node = doc
    for part in path.split("."):
        if isinstance(node, list):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise KeyError(f"no field '{part}' in '{path}'")
    return node


def holds(value, op, expected):
    if op == ":":
        want = TYPES[expected]
        return isinstance(value, want) and not (expected == "number" and isinstance(value, bool))
    if op == "==":
        return value == json.loads(expected)
    if op == ">=":
        return isinstance(value, (int, float)) and value >= float(expected)
    if op == "<=":
        return isinstance(value, (int, float)) and value <= float(expected)
    if op == "^=":
        return isinstance(value, str) and value.startswith(expected)
    if op == "~=":
        return isinstance(value, str) and re.search(expected, value) is not None
    raise ValueError(op)


def main(argv):
    if "--" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    split = argv.index("--")
    checks, command = argv[:split], argv[split + 1:]
    parsed = []
    for check in checks:
        m = re.fullmatch(r"([A-Za-z0-9_.]+)\s*(==|>=|<=|\^=|~=|:)\s*(.*)", check)
        if not m:
            print(f"json_expect: cannot read check '{check}'", file=sys.stderr)
            return 2
        parsed.append(m.groups())
    run = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    if run.returncode != 0:
        print(f"json_expect: {' '.join(command)} exited {run.returncode}", file=sys.stderr)
        return 1
    out = run.stdout
    starts = [i for i in (out.find("{"), out.find("[")) if i >= 0]
    try:
        doc = json.loads(out[min(starts):]) if starts else json.loads(out)
    except json.JSONDecodeError as e:
        print(f"json_expect: the output is not one JSON document ({e}):\n{out[:2000]}", file=sys.stderr)
        return 1
    failed = 0
    for path, op, expected in parsed:
        try:
            value = lookup(doc, path)
            ok = holds(value, op, expected)
        except (KeyError, IndexError, ValueError) as e:
            value, ok = f"<{e}>", False
        if not ok:
            failed += 1
            print(f"json_expect: FAILED {path} {op} {expected} (got {json.dumps(value)})", file=sys.stderr)
    print(f"json_expect: {len(parsed) - failed} of {len(parsed)} checks hold")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
