"""What a user error is, and how a value shows in one. Imports nothing of fastrl: every layer raises it, and the
command line prints it as one line without a traceback (documented as ``fastrl.config.UserError``)."""
import argparse
import reprlib
import sys


class UserError(Exception):
    """A mistake in what the user asked for: reported as one line, never with a traceback."""
    __module__ = "fastrl.config"  # its documented home, as tracebacks and pickles name it


class ArgParser(argparse.ArgumentParser):
    """The commands' parser: a bad command line is a UserError (one line, exit 2, no usage dump)."""

    def error(self, message):
        raise UserError(message)


_BRIEF = reprlib.Repr()
_BRIEF.maxlevel, _BRIEF.maxlist, _BRIEF.maxdict, _BRIEF.maxstring, _BRIEF.maxother = 3, 6, 6, 80, 80


def print_line(line: str) -> None:
    """``line`` and its newline to stderr in one write: ``print`` writes the text and the newline apart, and a line
    the run's logging process (or another rank) writes in between would join the two."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def first_line(error: BaseException, default: str = "") -> str:
    """The first line of ``str(error)`` (``default`` when it has none): what a one-line message quotes of an error."""
    return (str(error).strip().splitlines() or [default])[0]


def brief(value, limit: int = 80) -> str:
    """``repr(value)`` cut to about ``limit`` characters, without expanding it first (an alias bomb's value is
    billions of items deep in references): what error messages show of a value."""
    text = _BRIEF.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
