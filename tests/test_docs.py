"""The docs cannot drift from the program (issue 24). Every doc of the project (README.md, docs/*.md):

(a) its ```python snippets run (a snippet whose first line says `# needs a GPU` or `# needs a server` is skipped),
    and a value a line shows after `# ->` is what the line gives;
(b) every `decodegap ...` command line uses only options its subcommand's --help lists (any other `--flag` is an
    option of some decodegap command, or of a benchmark script, or of the program a record command runs); the
    cheap commands run: a ``` block of `$ decodegap ...` is the command and its exact output, a region between
    `<!-- output of: decodegap ... -->` and `<!-- end of output -->` is the exact output of its command, and the
    figures the prose quotes from the program (CLAIMS below) are what it prints;
(c) the JSON keys docs/report-schema.md (and the README) name exist in docs/report.schema.json (the diff's, in a real
    `decodegap diff` output), and the value lists it gives are the ones the code emits;
(d) a figure measured by a benchmark is marked with the benchmark that makes it (`benchmarks/...`, which must
    exist); a passage that reads as a measurement and names no benchmark fails, unless MEASURED_ELSEWHERE says
    where it comes from.
Commands run in-process from the repository root, as the docs write them (relative paths)."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import decodegap
from decodegap.cli import COMMAND_MODULES, main

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# The README shows the bundled example's absolute path as it reads in a checkout at /home/you/decodegap.
SHOWN_EXAMPLE = "/home/you/decodegap/src/decodegap/data/example_trace.json.gz"
SKIP_SNIPPET = re.compile(r"^#\s*needs an? (GPU|server)\b")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.M | re.S)


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _text(path: Path) -> str:
    return path.read_text()


def _fences(path: Path) -> list[tuple[str, str, int]]:
    """(language, body, line number) of every fenced block."""
    text = _text(path)
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)]


def run(args: list[str], capsys, monkeypatch, env: dict[str, str] | None = None,
        cwd: Path = ROOT) -> tuple[int, str, str]:
    """The command line in this process, from the repository root: exit code, stdout, stderr."""
    monkeypatch.chdir(cwd)
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    code = 0
    try:
        main(args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out = capsys.readouterr()
    for key in env or {}:
        monkeypatch.delenv(key)
    return code, out.out, out.err


def _argv(command: str) -> tuple[dict[str, str], list[str]]:
    """`COLUMNS=120 decodegap analyze ...` -> ({COLUMNS: 120}, [analyze, ...])."""
    words = shlex.split(command)
    env = {}
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    while words and words[0] in ("python", "python3", "-m"):
        words.pop(0)
    assert words and words[0] == "decodegap", command
    return env, words[1:]


# --- (a) the Python snippets ------------------------------------------------------------------------------------

def _snippets() -> list[tuple[str, str, int]]:
    return [(_rel(p), body, line) for p in DOCS for lang, body, line in _fences(p) if lang == "python"]


def _expected_outputs(source: str) -> dict[int, str]:
    """Line number (1-based) of a statement's last line -> the text after its `# ->` and the comment lines below."""
    lines = source.splitlines()
    out = {}
    for i, line in enumerate(lines):
        if "# ->" not in line:
            continue
        text = [line.split("# ->", 1)[1].strip()]
        for more in lines[i + 1:]:
            if not more.lstrip().startswith("#") or "`decodegap " in more:
                break
            text.append(more.lstrip()[1:].strip())
        out[i + 1] = "\n".join(t for t in text if t)
    return out


NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _numbers(text: str) -> list[str]:
    return [n.replace(",", "") for n in NUMBER.findall(text)]


def _matches(expected: str, value) -> bool:
    """A Python literal must equal the value; other text (a repr, a table) must quote only numbers the value's
    printed form holds (to the digits the doc shows)."""
    try:
        literal = ast.literal_eval(expected)
    except (ValueError, SyntaxError):
        shown = {float(n) for n in _numbers(str(value) + " " + repr(value))}
        for n in _numbers(expected):
            digits = len(n.split(".")[1]) if "." in n else 0
            if not any(round(s, digits) == float(n) for s in shown):
                return False
        return True
    return value == literal


@pytest.mark.parametrize(("doc", "source", "line"), _snippets(), ids=[f"{d}:{n}" for d, _, n in _snippets()])
def test_python_snippets_run_and_show_what_they_give(doc, source, line, tmp_path, monkeypatch, capsys):
    if SKIP_SNIPPET.match(source):
        pytest.skip(source.splitlines()[0])
    monkeypatch.chdir(tmp_path)
    for command in re.findall(r"#\s*`(decodegap [^`]+)`", source):  # what the snippet reads, made first
        env, args = _argv(command)
        code, _, err = run(args, capsys, monkeypatch, env, cwd=tmp_path)
        assert code == 0, f"{doc}:{line}: {command}: {err}"
    expected = _expected_outputs(source)
    namespace: dict = {"__name__": "__doc_snippet__"}
    tree = ast.parse(source)
    for stmt in tree.body:
        want = expected.get(stmt.end_lineno)
        if want is not None and isinstance(stmt, ast.Expr):
            value = eval(compile(ast.Expression(stmt.value), doc, "eval"), namespace)  # noqa: S307
            assert _matches(want, value), f"{doc}:{line + stmt.lineno}: shows {want!r}, gives {value!r}"
        else:
            assert want is None, f"{doc}:{line + stmt.lineno}: `# ->` on a line that is not an expression"
            exec(compile(ast.Module([stmt], []), doc, "exec"), namespace)  # noqa: S102


# --- (b) command lines against --help ------------------------------------------------------------------------------

COMMAND = re.compile(r"(?:^|[\s`(])((?:[A-Z_]+=\S+ )*(?:python3? -m )?decodegap (?:analyze|floor|record|diff|demo)"
                     r"(?:[^`\n]|\\\n)*)")
# Flags of the programs a record command runs, and of other tools the docs name (not decodegap's own).
OTHER_PROGRAMS = {"--model-path": "sglang.launch_server", "--disable-cuda-graph": "sglang.launch_server",
                  "--tp": "sglang.launch_server", "--address": "ray"}


def _doc_commands() -> list[tuple[str, str]]:
    """(doc, command line) for every decodegap command the docs show, continuation lines joined."""
    out = []
    for path in DOCS:
        # continuation lines: a trailing backslash, or a usage line's options indented below it
        text = re.sub(r"\n {4,}(?=[\[-])", " ", _text(path).replace("\\\n", " "))
        for match in COMMAND.finditer(text):
            out.append((_rel(path), " ".join(match.group(1).split())))
    return out


_HELP: dict[str, set[str]] = {}


def _help_options(sub: str) -> set[str]:
    if sub not in _HELP:
        command = importlib.import_module(COMMAND_MODULES[sub]).command
        import click

        with click.Context(command, info_name=sub) as ctx:
            text = command.get_help(ctx)
        _HELP[sub] = set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", text))
    return _HELP[sub]


def _options(words: list[str]) -> list[str]:
    out = []
    for word in words:
        if word in ("--", "|", ">", "&&", ";"):  # then the program record runs (its own flags), or a pipe
            break
        for part in word.strip("[]()").split("/"):
            part = part.split("=", 1)[0].rstrip(",;:.")
            if re.fullmatch(r"--?[a-zA-Z][\w-]*", part):
                out.append(part)
    return out


def test_every_command_line_uses_options_its_help_lists():
    bad = []
    commands = _doc_commands()
    assert len(commands) > 30
    for doc, command in commands:
        words = command.split()
        start = words.index("decodegap")
        sub = words[start + 1]
        unknown = [o for o in _options(words[start + 2:]) if o not in _help_options(sub)]
        if unknown:
            bad.append(f"{doc}: `{command}`: {unknown} not in `decodegap {sub} --help`")
    assert not bad, "\n".join(bad)


def _benchmark_flags() -> set[str]:  # and the scripts' (the corpus generator's)
    return {flag for folder in ("benchmarks", "scripts") for script in (ROOT / folder).glob("*.py")
            for flag in re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", script.read_text())}


def test_every_flag_the_docs_name_exists():
    known = set().union(*(_help_options(sub) for sub in COMMAND_MODULES)) | _benchmark_flags() | set(OTHER_PROGRAMS)
    from decodegap.demo import loop

    known |= set(re.findall(r"add_argument\(\"(--[\w-]+)\"", inspect.getsource(loop)))  # the demo loop's
    bad = []
    for path in DOCS:
        text = re.sub(r"--[\w/]*-->", "", _text(path))  # arrows of diagrams (`--link-->`)
        for flag in sorted(set(re.findall(r"(?<![\w-])(--[a-zA-Z][\w-]*)", text))):
            if flag not in known:
                bad.append(f"{_rel(path)}: {flag}")
    assert not bad, "flags no command has:\n" + "\n".join(bad)


def test_every_decodegap_name_the_docs_give_exists():
    # `decodegap.api.annotate`, `decodegap.errors.UserError`, ...: each resolves to a module or an attribute
    bad = []
    for path in DOCS:
        for name in sorted(set(re.findall(r"`[^`]*?(?<![\w.*])(decodegap(?:\.[A-Za-z_]\w*)+)", _text(path)))):
            parts = name.split(".")
            obj, i = None, len(parts)
            while i > 0:
                try:
                    obj = importlib.import_module(".".join(parts[:i]))
                    break
                except ImportError:
                    i -= 1
            try:
                for part in parts[i:]:
                    obj = getattr(obj, part)
            except AttributeError:
                bad.append(f"{_rel(path)}: {name}")
    assert not bad, "\n".join(bad)


def test_every_file_the_docs_name_exists():
    bad = []
    for path in DOCS:
        for name in sorted(set(re.findall(r"`((?:[\w.-]+/)+[\w.-]+\.(?:py|md|json|cu|gz|sh|txt))`", _text(path)))):
            if name.startswith(("~", "/", "vllm/", "sglang/")) or "<" in name:  # other projects' files
                continue
            if not any((base / name).exists() for base in (ROOT, ROOT / "src", ROOT / "src" / "decodegap",
                                                           path.parent)):
                bad.append(f"{_rel(path)}: {name}")
    assert not bad, "\n".join(bad)


# --- (b) outputs shown in the docs -------------------------------------------------------------------------------

def _sessions() -> list[tuple[str, str, str, int]]:
    """(doc, command, shown output, line) of every ``` block that starts with `$ decodegap ...`."""
    out = []
    for path in DOCS:
        for lang, body, line in _fences(path):
            if lang == "" and body.startswith("$ ") and "decodegap " in body.splitlines()[0]:
                command, _, shown = body.partition("\n")
                out.append((_rel(path), command[2:], shown, line))
    return out


def _regions() -> list[tuple[str, str, str, int]]:
    """(doc, command, shown output, line) of every `<!-- output of: ... -->` region (the whole output) and
    `<!-- start of the output of: ... -->` region (its first lines)."""
    out = []
    for path in DOCS:
        text = _text(path)
        for m in re.finditer(r"<!-- (start of the )?output of: (.*?) -->\n(.*?)<!-- end of output -->", text, re.S):
            shown = ("\0" if m.group(1) else "") + m.group(3)  # \0: a prefix of the output
            out.append((_rel(path), m.group(2), shown, text.count("\n", 0, m.start()) + 1))
    return out


@pytest.mark.parametrize(("doc", "command", "shown", "line"), _sessions() + _regions(),
                         ids=[f"{d}:{n}" for d, _, _, n in _sessions() + _regions()])
def test_shown_output_is_what_the_command_prints(doc, command, shown, line, capsys, monkeypatch):
    env, args = _argv(command)
    code, out, err = run(args, capsys, monkeypatch, env)
    assert code == 0, err
    out = out.replace(str(decodegap.EXAMPLE_TRACE), SHOWN_EXAMPLE)
    if shown.startswith("\0"):  # the first lines of the output
        shown = shown[1:].strip()
        out = "\n".join(out.strip().splitlines()[: len(shown.splitlines())])
    assert out.strip() == shown.strip(), f"{doc}:{line}: `{command}` prints another text; update the doc"


def test_the_sessions_and_regions_are_found():
    assert len(_sessions()) >= 1 and len(_regions()) >= 2


# Figures the prose quotes from the program: (doc, the quoted text as the doc writes it, command, what the output
# must hold for it). The text must be in the doc and the figure in the output.
CLAIMS = [
    ("docs/floor.md", "floors at 3.020 ms",
     "decodegap analyze --example --model tests/fixtures/configs/glm5-demo-rank.json --gpu h200 --tp 1",
     ["floor 3.020 ms/step"]),
    ("docs/floor.md", "maps 5.45 ms of GEMMs onto attention + dense MLP (floor 1.64 ms)",
     "decodegap analyze --example --model tests/fixtures/configs/glm5-demo-rank.json --gpu h200 --tp 1",
     [re.compile(r"attention_projections \+ attention_kv_read \+ dense_mlp +5\.45\d +1\.63[5-9]")]),
    ("docs/floor.md", "2.24 ms onto experts + shared experts (floor\n1.33 ms; the experts' weight gathers, 2.8 ms",
     "decodegap analyze --example --model tests/fixtures/configs/glm5-demo-rank.json --gpu h200 --tp 1",
     [re.compile(r"experts \+ shared_experts +2\.24\d +1\.33\d"), re.compile(r"copy +4\.1")]),
    ("docs/floor.md", "0.07 ms onto lm_head (floor 0.05 ms)",
     "decodegap analyze --example --model tests/fixtures/configs/glm5-demo-rank.json --gpu h200 --tp 1",
     [re.compile(r"lm_head +0\.07\d +0\.05\d")]),
    ("docs/floor.md", "floors at\n9.203 ms, more than this rank's 7.70 ms of GEMMs",
     "decodegap analyze --example --model tests/fixtures/configs/glm-5-nvfp4 --gpu h200 --tp 1",
     ["floor 9.203 ms/step", re.compile(r"shared_experts +7\.69[5-9] .*BELOW FLOOR")]),
    ("README.md", "With the default PCIe all-reduce model the same step floors at 7.12 ms (156 all-reduces at ~25 us)",
     "decodegap floor --model tests/fixtures/configs/glm-5-nvfp4 --gpu rtx-pro-6000 --tp 8 --batch 1 --context 8192",
     ["floor 7.12", "156 calls x (25 us"]),
    ("docs/floor.md", "= 3.95 ms of all-reduce, 3.90 ms more than at 0 µs: **7.12 ms = 140 tok/s**",
     "decodegap floor --model tests/fixtures/configs/glm-5-nvfp4 --gpu rtx-pro-6000 --tp 8 --batch 1 --context 8192 "
     "--format md", ["floor 7.124 ms/step = 140.", "| allreduce | 0.003 | 0.000 | 0.000 | 3.952 |"]),
    ("docs/floor.md", "4.48 ms of weights + 134 MB of BF16 KV (1024 x 32 layers x 2048 x 2 B) = 0.04 ms",
     "decodegap floor --model tests/fixtures/configs/llama-3.1-8b.json --gpu h100 --context 1024 --format md",
     ["| kv_cache | 0.134 | 0.040 |", "1 x 1024 tokens/layer x 2048 x 2 B"]),
    ("docs/floor.md", "(dense attention: 3.229 ms = 310 tok/s)",
     "decodegap floor --model tests/fixtures/configs/glm-5-nvfp4 --gpu rtx-pro-6000 --tp 8 --batch 1 --context 8192 "
     "--allreduce-us 0 --dense-attention",
     ["floor 3.229 ms/step = 309.", re.compile(r"kv_cache\s*│\s*0\.368\s*│\s*0\.205\s*│")]),
    ("docs/floor.md", "+3.69 GB/GPU =\n  +2.06 ms",
     "decodegap floor --model tests/fixtures/configs/glm-5-nvfp4 --gpu rtx-pro-6000 --tp 8 --batch 1 --context 8192 "
     "--allreduce-us 0 --format md", [re.compile(r"\+3\.6(8[5-9]|9[0-4]) GB/GPU, \+2\.0(5[5-9]|6[0-4]) ms/step")]),
    ("docs/floor.md", "**4.52 ms = 221 tok/s**",
     "decodegap floor --model tests/fixtures/configs/llama-3.1-8b.json --gpu h100 --context 1024",
     ["floor 4.52", "= 221."]),
    ("README.md", "`decodegap gate: FAIL: median step 62.392 -> 66.132 ms (6.0%\nslower; limit 5% slower)`",
     "decodegap diff tests/fixtures/traces/gather_cast_eager.json.gz tests/fixtures/traces/cast_eager.json.gz "
     "--fail-if-slower 5", ["decodegap gate: FAIL: median step 62.392 -> 66.132 ms (6.0% slower; limit 5% slower)"]),
    ("README.md", "at 80 columns the example's kernel table keeps kernel, category, calls/step, ms/step and share",
     "COLUMNS=80 decodegap analyze --example", [re.compile(r"\nkernel +category +calls/step +ms/step +share *\n")]),
    ("README.md", "(with `--top 8`, whose categories are shorter words, us/call too)",
     "COLUMNS=80 decodegap analyze --example --top 8",
     [re.compile(r"\nkernel +category +calls/step +ms/step +share +us/call *\n")]),
]


@pytest.mark.parametrize(("doc", "quote", "command", "wanted"), CLAIMS, ids=[f"{c[0]}:{c[1][:30]}" for c in CLAIMS])
def test_figures_the_prose_quotes_are_what_the_program_prints(doc, quote, command, wanted, capsys, monkeypatch):
    text = " ".join(_text(ROOT / doc).split())
    assert " ".join(quote.split()) in text, f"{doc} no longer says {quote!r}: update CLAIMS with the doc"
    env, args = _argv(command)
    code, out, err = run(args, capsys, monkeypatch, env)
    assert code in (0, 1), err  # 1: a gate that fails, as the doc says
    for want in wanted:
        found = want.search(out) if isinstance(want, re.Pattern) else want in out
        assert found, f"{doc}: `{command}` does not print {want!r}"


def test_the_floor_validation_table_is_what_its_benchmark_prints():
    shown = _text(ROOT / "docs" / "floor.md")
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "floor_validation.py")], capture_output=True,
                         text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}).stdout
    table = [line for line in out.splitlines() if line.startswith("|")]
    assert len(table) > 5
    for line in table:
        assert line in shown, f"docs/floor.md lacks the row {line!r} that benchmarks/floor_validation.py prints"


def test_the_floor_library_call_is_the_real_signature():
    from decodegap.floor import compute_floor

    params = inspect.signature(compute_floor).parameters
    doc = _text(ROOT / "docs" / "floor.md")
    call = re.search(r"`decodegap\.floor\.compute_floor\((.*?)\) -> Floor`", doc, re.S).group(1)
    for name in re.findall(r"(\w+)=", call):
        assert name in params, f"docs/floor.md names compute_floor({name}=), which it does not take"
        default = re.search(rf"{name}=([\w.]+)", call)
        if default:
            assert repr(params[name].default) == default.group(1)


# --- (c) JSON keys against the schema ------------------------------------------------------------------------------

SCHEMA = json.loads((ROOT / "docs" / "report.schema.json").read_text())


def _resolve(node: dict) -> dict:
    while "$ref" in node:
        node = SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[1]]
    return node


def _children(node: dict) -> dict[str, dict]:
    """The keys an object node may hold (arrays: their items'; unions: every member's)."""
    node = _resolve(node)
    out: dict[str, dict] = {}
    for key in ("anyOf", "oneOf"):
        for member in node.get(key, []):
            out |= _children(member)
    if node.get("type") == "array" or "items" in node:
        out |= _children(node.get("items", {}))
    if "additionalProperties" in node and isinstance(node["additionalProperties"], dict):
        out["*"] = node["additionalProperties"]
    for name, sub in node.get("properties", {}).items():
        out[name] = sub
    return out


ROOT_NODE = {"$ref": "#/$defs/Analysis"}
PHASES = ("decode", "prefill", "mixed", "training")


def _lookup(path: str, node: dict = ROOT_NODE) -> dict | None:
    """A dotted key path (`steps.<phase>.ms.median`, `categories[]`, `floor.params.active`) in the schema."""
    for part in re.split(r"\.", path.replace("[]", "")):
        if not part:
            continue
        children = _children(node)
        if part == "<phase>":
            part = "decode"
        if part not in children:
            if "*" in children:
                node = children["*"]
                continue
            return None
        node = children[part]
    return node


def _brace_names(text: str, start: int) -> tuple[dict[str, object], int]:
    """The names of a `{a, b[{c, d}], e}` list starting at text[start] == "{": {name: nested or None}, end."""
    names: dict[str, object] = {}
    i, word = start + 1, ""
    while i < len(text):
        ch = text[i]
        if ch == "{":
            nested, i = _brace_names(text, i)
            if word.strip():
                names[word.strip()] = nested
            word = ""
        elif ch in ",}":
            if word.strip() and word != "\0":
                names.setdefault(word.strip(), None)
            word = ""
            if ch == "}":
                return names, i
        elif ch in "[]":
            pass
        elif ch == ":":  # `status: new|gone`: values follow, not names
            if word.strip() and word != "\0":
                names.setdefault(word.strip(), None)
            word = "\0"
        elif word != "\0":
            word += ch
        i += 1
    return names, i


def _missing(names: dict[str, object], node: dict, where: str) -> list[str]:
    out = []
    children = _children(node)
    for name, nested in names.items():
        if name.startswith("+") or " " in name:
            continue
        if name not in children:
            out.append(f"{where}.{name}")
        elif isinstance(nested, dict):
            out += _missing(nested, children[name], f"{where}.{name}")
    return out


def _schema_doc_rows() -> list[tuple[list[str], str]]:
    """(keys of the first column, the meaning) of each row of the report's key table."""
    doc = _text(ROOT / "docs" / "report-schema.md")
    table = doc.split("| key | meaning |", 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in table.splitlines()[2:]:
        cells = line.split(" | ", 1)
        keys = re.findall(r"`([^`]+)`", cells[0])
        rows.append((keys, cells[1] if len(cells) > 1 else ""))
    return rows


def test_every_key_the_schema_doc_names_is_in_the_schema():
    bad = []
    rows = _schema_doc_rows()
    assert len(rows) > 25
    for keys, meaning in rows:
        nodes = []
        for key in keys:
            node = _lookup(key)
            if node is None:
                bad.append(key)
            else:
                nodes.append((key, node))
        for key_is, span in re.findall(r"(?:`([\w.]+)` (?:is|are) )?`([^`]*\{[^`]*\}[^`]*)`", meaning):
            prefix, _, rest = span.partition("{")  # `{a, b}`, `params.{a, b}`, `ms` is `{a, b}`
            prefix = prefix or key_is
            names, _ = _brace_names("{" + rest, 0)
            if prefix.strip(". "):  # `params.{...}`: under that key of one of the row's keys
                found = [n for _, root in nodes for n in [_lookup(prefix.strip(". "), root)] if n is not None]
                if not found:
                    bad.append(f"{keys}: {prefix}")
                    continue
                targets = found
            else:
                targets = [node for _, node in nodes]
            misses = [_missing(names, node, "/".join(keys)) for node in targets]
            if targets and all(misses):
                bad += min(misses, key=len)
    assert not bad, "docs/report-schema.md names keys the schema lacks:\n" + "\n".join(bad)


def test_the_readme_contract_keys_are_in_the_schema():
    readme = _text(ROOT / "README.md")
    core = readme.split("The contract's core:", 1)[1].split("\n\n", 1)[0]
    keys = re.findall(r"`([\w.\[\]]+)`", core)
    assert len(keys) >= 9 and all(_lookup(k) is not None for k in keys), keys


def test_the_value_lists_the_schema_doc_gives_are_the_codes():
    from decodegap.analysis import Finding
    from decodegap.ops.categories import CATEGORIES
    from decodegap.floor.ledger import MAPPINGS

    doc = " ".join(_text(ROOT / "docs" / "report-schema.md").split())
    listed = re.search(r"\(`mapping`: (.*?)\); otherwise `null`", doc).group(1)
    assert [m.strip() for m in listed.replace(" or ", ", ").split(", ")] == list(MAPPINGS), listed
    names = re.search(r"names: ([a-z, ]+) \|", doc).group(1)
    assert [n.strip() for n in names.split(",")] == list(CATEGORIES)
    ids = re.search(r"Finding ids: (.*?)\. Their evidence", doc).group(1)
    tags = [cls.__struct_config__.tag for cls in Finding.__subclasses__()]
    assert sorted(re.findall(r"`(\w+)`", ids)) == sorted(tags)


def test_the_diff_keys_the_doc_names_are_in_a_real_diff(capsys, monkeypatch):
    code, out, err = run(["diff", "tests/fixtures/traces/gather_cast_eager.json.gz",
                          "tests/fixtures/traces/cast_eager.json.gz", "--fail-if-slower", "5", "--format", "json"],
                         capsys, monkeypatch)
    d = json.loads(out)
    # and a fix whose finding predicted the step (the prediction is null on the pair above, which got slower)
    code, out, err = run(["diff", "tests/fixtures/traces/cast_eager.json.gz",
                          "tests/fixtures/traces/gather_cast_eager.json.gz", "--model",
                          "tests/fixtures/configs/glm5-demo-rank.json", "--context", "2048", "--format", "json"],
                         capsys, monkeypatch)
    fixed = json.loads(out)
    assert fixed["predicted"] is not None
    doc = _text(ROOT / "docs" / "report-schema.md").split("prints schema `decodegap.diff/1`", 1)[1]
    doc = doc.split("The JSON Schema of the report", 1)[0]

    def keys_of(value) -> set[str]:
        if isinstance(value, dict):
            return set(value) | {k for v in value.values() for k in keys_of(v)}
        if isinstance(value, list):
            return {k for v in value for k in keys_of(v)}
        return set()

    real = keys_of(d) | keys_of(fixed)
    braced: set[str] = set()

    def flat(n) -> set[str]:
        return {k for k, v in n.items() for k in {k} | (flat(v) if isinstance(v, dict) else set())}

    for m in re.finditer(r"\{", doc):
        if doc[:m.start()].count("{") == doc[:m.start()].count("}"):  # an outermost list
            braced |= flat(_brace_names(doc, m.start())[0])
    named = braced | {w for span in re.findall(r"`([^`]+)`", doc) for w in re.findall(r"[a-z_]+", span)}
    assert not braced - real, f"the diff doc names keys a diff has not: {braced - real}"
    assert not real - named, f"keys of a diff the doc does not name: {real - named}"
    statuses = set(re.search(r"status: ([\w|]+)", doc).group(1).split("|"))
    from decodegap.report import diff as compare

    emitted = set(re.findall(r'"(\w+)"', inspect.getsource(compare._kernel_row))) & {
        "new", "gone", "same", "faster", "slower", "kept"}
    assert statuses == emitted - {"same"}  # the rows of unchanged groups are left out of `kernels`


# --- (d) measured figures name the benchmark that makes them -----------------------------------------------------

MEASURE_WORDS = re.compile(r"\b(measured|medians? of|best of|took|seen on|on an h200|in a fresh process|"
                           r"quiet machine)\b", re.I)
UNIT = re.compile(r"\d[\d,.]*\s?(?:ms|µs|us|s|MB|GB|GB/s|kB|x)\b")
# Passages that read as measurements but come from elsewhere, by a fragment of their text, and why.
MEASURED_ELSEWHERE = {
    "The incident behind it: a 744B MoE model": "the incident's own measurements (the engine's TPOT, its profile)",
    "Default latency per interconnect: PCIe 25 µs": "NCCL measurements on other machines, cited as such",
    "Measured: 95 ms/step (10.5 tok/s)": "the incident's TPOT",
    "The best engines at batch 1 reach": "the published measurements of the validation table (sources cited)",
}


def _passages(path: Path) -> list[str]:
    """Prose paragraphs (each list item its own) with the code blocks and tables that follow them."""
    out: list[str] = []
    text = FENCE.sub(lambda m: m.group(0).replace("\n\n", "\n\0\n"), _text(path))
    for block in re.split(r"\n\s*\n", text):
        block = block.replace("\0", "")
        items = re.split(r"\n(?=- )", block) if block.startswith("- ") else [block]
        for item in items:
            if (item.startswith(("```", "|", "    ")) or not item.strip()) and out:
                out[-1] += "\n\n" + item
            else:
                out.append(item)
    return out


def test_every_benchmark_the_docs_name_exists():
    bad = []
    for path in DOCS:
        for name in sorted(set(re.findall(r"benchmarks/[\w./-]*\w", _text(path)))):
            if not (ROOT / name).exists():
                bad.append(f"{_rel(path)}: {name}")
    assert not bad, "\n".join(bad)


def test_measured_figures_name_their_benchmark():
    bad = []
    for path in DOCS:
        for passage in _passages(path):
            if not (MEASURE_WORDS.search(passage) and UNIT.search(passage)):
                continue
            if "benchmarks/" in passage or any(f in passage for f in MEASURED_ELSEWHERE):
                continue
            if "```\n$ " in passage or "output of:" in passage or passage.lstrip().startswith("```python"):
                continue  # the program's output, checked against the program above
            bad.append(f"{_rel(path)}: {passage[:160]!r}")
    assert not bad, "measured figures without the benchmark that makes them:\n" + "\n\n".join(bad)


def test_the_same_benchmark_gives_the_same_figures_everywhere():
    # docs/ARCHITECTURE.md quotes bench_scale's figures that the README's table holds: they must agree
    readme = _text(ROOT / "README.md")
    arch = " ".join(_text(ROOT / "docs" / "ARCHITECTURE.md").split())
    # bench_scale's table: | layout | trace | text MB | json.load s | json.load MB | analyze s | analyze MB | ...
    rows = {cells[2].strip(): cells for line in readme.splitlines()
            if line.startswith("| kineto |") for cells in [line.split("|")]}
    one, eight = rows["1x"], rows["8x"]
    quoted = re.search(r"json\.load` builds a dict per event \(([\d.]+) s, ([\d,]+) MB", arch)
    assert quoted and quoted.groups() == (one[4].strip(), one[5].strip()), quoted and quoted.groups()
    peak = re.search(r"peaks at ([\d,]+) MB instead of ([\d,]+) MB", arch)
    assert peak and peak.groups() == (eight[7].strip(), one[7].strip()), peak and peak.groups()


def test_the_findings_table_states_the_detectors_thresholds():
    from decodegap.findings import collective_bound, host_bound, profiler_overhead, weight_copy

    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)`[^|]*\| (.*?) \|", _text(ROOT / "README.md"),
                                                        re.M)}
    stated = {
        "host_bound": [f"busy < {host_bound.MAX_BUSY:.0%}"],
        "collective_bound": [f">= {collective_bound.MIN_SHARE:.0%} of GPU time",
                             f">= {collective_bound.MIN_EXCESS_SHARE:.0%} of GPU time",
                             f">= {collective_bound.MIN_SLOWDOWN:g}x that expectation"],
        "straggler_rank": [f">= {collective_bound.STRAGGLER_SPREAD:.0%} of the step"],
        "weight_copy": [f"two dims >= {weight_copy.MIN_WEIGHT_DIM}",
                        f">= {weight_copy.MIN_BYTES_PER_STEP / 1e6:g} MB per step",
                        f">= {weight_copy.MIN_SHARE:.0%} of GPU time"],
        "profiler_overhead": [f"> {profiler_overhead.TOLERANCE:.0%}"],
    }
    for finding, phrases in stated.items():
        for phrase in phrases:
            assert phrase in rows[finding], f"README's findings table, {finding}: no {phrase!r} in {rows[finding]!r}"


def test_the_constants_the_readme_states_are_the_codes():
    from decodegap.report import annotate
    from decodegap.ops import categories
    from decodegap.report import progress, text

    readme = " ".join(_text(ROOT / "README.md").split())
    for phrase in (f"pid {annotate.PID}", f"(files and pipes get {text.PIPE_WIDTH} columns)",
                   f"until each name column has {text.NAME_MIN} characters",
                   f"over {progress.PROGRESS_MIN_BYTES // 1_000_000} MB of text",
                   f"by its first {categories.NAME_HEAD // 1024} kB"):
        assert phrase in readme, f"README.md does not say {phrase!r}"


def test_the_record_metadata_keys_record_md_shows_are_the_ones_record_writes():
    block = next(body for lang, body, _ in _fences(ROOT / "docs" / "record.md") if lang == "json")
    keys = set(re.findall(r'"(\w+)":', block))
    source = "".join(p.read_text() for p in (ROOT / "src" / "decodegap" / "capture").glob("*.py"))
    source += (ROOT / "src" / "decodegap" / "samples.py").read_text()
    missing = sorted(k for k in keys if f'"{k}"' not in source)
    assert len(keys) > 15 and not missing, f"docs/record.md shows keys record does not write: {missing}"
