"""The one exception type a user can cause: the CLI prints its message on one line and exits with code 2."""

from __future__ import annotations

# The value of a parameter named without one (`{gpu}` in "{gpu} needs {model}"): `gpu=` / `--gpu`.
NAME_ONLY = object()


class UserError(Exception):
    """Bad input from the user (path, file, flag). The message is shown as-is, on one line."""


class ParameterError(UserError):
    """Bad values of parameters, worded for whoever passed them: each `{name}` of the template is the parameter as
    Python spells it (`tp=3`, `context='2048'`, `gpu=`), and `as_flags(flags)` words the same line for the command
    line (`--tp 3`, `--context 2048`, `--gpu`). The command modules (decodegap.commands) know the flags."""

    def __init__(self, template: str, **values):
        self.template = template
        self.values = values  # a key may carry a suffix after "__" to name one parameter twice (ray, ray__local)
        super().__init__(template.format(**{key: _python(_param(key), value) for key, value in values.items()}))

    def as_flags(self, flags: dict[str, str] | None = None) -> str:
        """The message with each parameter as its command-line flag (`flags`: Python name -> flag; default
        `--name-with-dashes`)."""
        flags = flags or {}
        return self.template.format(**{key: _flag(flags.get(_param(key), "--" + _param(key).replace("_", "-")), value)
                                       for key, value in self.values.items()})


def _param(key: str) -> str:
    return key.split("__", 1)[0]


def _python(name: str, value) -> str:
    return f"{name}=" if value is NAME_ONLY else f"{name}={value!r}"


def _flag(flag: str, value) -> str:
    if value is NAME_ONLY or value is True or (isinstance(value, str) and not value):
        return flag
    return f"{flag} {value}"
