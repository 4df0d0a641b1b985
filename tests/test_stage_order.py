"""The stage order is a rule: trace < steps < breakdown < findings, floor < pipeline < analysis < report < api <
commands. A module may import only modules of its own stage or below; the analysis core never imports the GPU side."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).parent.parent / "src" / "decodegap"

# Stage of each module (by dotted name under decodegap; a package's entry covers its modules).
STAGES = [
    ("helpers", ["errors", "rounding", "records", "samples", "ops"]),
    ("trace", ["trace"]),
    ("steps", ["steps"]),
    ("breakdown", ["breakdown"]),
    ("verdicts", ["findings", "floor"]),
    ("pipeline", ["pipeline"]),
    ("analysis", ["analysis"]),
    ("views", ["report"]),
    ("api", ["api"]),
    ("gpu side", ["capture", "kernels", "demo"]),  # record, the kernels, the demo: above the views they use
    ("commands", ["commands", "cli", "__main__"]),
]
STAGE_OF = {name: i for i, (_, names) in enumerate(STAGES) for name in names}


def _stage(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "decodegap" or len(parts) < 2:
        return None
    return STAGE_OF.get(parts[1])


def _imports(path: Path, module: str) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = module.split(".")[: -node.level]
                out.append(".".join(base + ([node.module] if node.module else [])))
            elif node.module:
                out.append(node.module)
                out += [f"{node.module}.{a.name}" for a in node.names if node.module == "decodegap"]
    return out


def test_every_module_has_a_stage():
    top = {p.stem if p.is_file() else p.name for p in SRC.iterdir()
           if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())}
    assert not sorted(top - set(STAGE_OF) - {"data"}), "add the new module to STAGES"


def test_imports_only_go_down_the_stages():
    bad = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        own = _stage(module)
        if own is None:
            continue
        for target in _imports(path, module):
            stage = _stage(target)
            if stage is not None and stage > own:
                bad.append(f"{module} ({STAGES[own][0]}) imports {target} ({STAGES[stage][0]})")
    assert not bad, "\n".join(bad)


def test_no_two_modules_import_each_other():
    # a circle (the kernels had one: mla_decode <-> mla_decode_triton) means a shared piece belongs in its own module
    graph: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        graph[module] = {t for t in _imports(path, module) if t.startswith("decodegap.")}
    pairs = sorted({tuple(sorted((a, b))) for a, targets in graph.items() for b in targets
                    if b != a and a in graph.get(b, ()) and not a.startswith(b + ".") and not b.startswith(a + ".")})
    assert not pairs, "modules that import each other: " + "; ".join(f"{a} <-> {b}" for a, b in pairs)
