"""How another library's exception reads inside one of our one-line messages (`error: ...`, a `DataError`, a
`ModelFolderError`): its type and its message, whitespace and line breaks made single spaces."""

from __future__ import annotations

# Long enough for a path and a reason; a library's message can run to a page (a report, a dump of a request).
ERROR_LINE_LIMIT = 300


def error_line(error: BaseException, limit: int = ERROR_LINE_LIMIT) -> str:
    """`error` as one line, "TypeName: message", the message cut at `limit` characters; the type alone when the
    message is empty."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:limit]}" if text else type(error).__name__


__all__ = ["ERROR_LINE_LIMIT", "error_line"]
