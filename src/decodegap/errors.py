"""The one exception type a user can cause: the CLI prints its message on one line and exits with code 2."""


class UserError(Exception):
    """Bad input from the user (path, file, flag). The message is shown as-is, on one line."""
