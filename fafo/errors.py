"""The one error type users see for bad input: a single line naming the setting and the fix."""


class ConfigError(ValueError):
    """Bad user input (a setting, a path, a hub id). The message names the setting and how to fix it.

    The runner prints it as one line (``error: <message>``) and exits with status 2, before any model is loaded
    where the problem can be detected that early.
    """
