"""Which module names the main script of a process answers to (no subprocess: the parsing alone)."""

from __future__ import annotations

import types
from pathlib import Path

from decodegap.capture.main_script import namespace_names, patch_main, startup_main
from decodegap.capture.target import parse_target


def test_a_script_path_answers_to_its_stem_and_its_dotted_path(tmp_path: Path) -> None:
    script = tmp_path / "src" / "pkg" / "toy_decode.py"
    script.parent.mkdir(parents=True)
    script.write_text("")
    names, label = startup_main([str(script), "40"], ["python", str(script), "40"], [str(tmp_path / "src")])
    assert (names, label) == ({"toy_decode", "pkg.toy_decode"}, str(script))


def test_dash_m_answers_to_the_module_and_its_main() -> None:
    assert startup_main(["-m", "40"], ["python", "-u", "-m", "toy_decode", "40"], []) == (
        {"toy_decode", "toy_decode.__main__"},
        "-m toy_decode",
    )
    assert startup_main(["-m"], ["python", "-mpkg.serve"], [])[0] == {"pkg.serve", "pkg.serve.__main__"}


def test_dash_c_and_an_interactive_prompt_answer_to_nothing() -> None:
    assert startup_main(["-c", "x"], ["python", "-c", "print(1)", "x"], []) == (set(), "")
    assert startup_main([""], ["python"], []) == (set(), "")


def test_a_spawn_childs_main_and_its_functions_globals(tmp_path: Path) -> None:
    # runpy runs the script in one namespace and multiprocessing copies it into __mp_main__: a function target
    # must be replaced in both, or the script's own functions still call the original.
    home: dict = {"__name__": "__mp_main__", "__file__": str(tmp_path / "toy_decode.py")}
    exec("def step(x):\n    return x + 1\ndef loop(x):\n    return step(x)\n", home)  # noqa: S102
    main = types.ModuleType("__mp_main__")
    main.__dict__.update(home)
    assert "toy_decode" in namespace_names(main.__dict__, [])
    target = parse_target("toy_decode:step")

    def patch(module: types.ModuleType) -> None:
        module.step = lambda x, _f=module.step: _f(x) * 10

    patch_main(target, main, patch)
    assert (main.loop(1), home["loop"](1), main.step(1)) == (20, 20, 20)
