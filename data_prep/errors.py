"""The one exception type for user errors (shared with app/): the CLI prints its message as one ``error:`` line."""

from app.common.errors import UserError

__all__ = ["UserError"]
