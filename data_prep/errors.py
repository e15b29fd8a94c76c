"""The one exception type for user errors: the CLI prints its message as a single ``error:`` line."""


class UserError(Exception):
    """A problem the user can fix (bad flag, missing file, unusable input); message is one line."""
