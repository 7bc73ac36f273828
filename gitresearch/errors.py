"""The one base of every error gitresearch raises on purpose. The CLI catches it in one
place, prints its message on one line and exits with EXIT_ERROR; anything else is a bug and
keeps its traceback."""

EXIT_NEGATIVE = 1  # the command ran and its answer is no (a run failed, a gain did not reproduce)
EXIT_USAGE = 2  # bad command-line usage (click's own)
EXIT_ERROR = 3  # a GitresearchError: bad input, a broken config or repo, a failed setup
EXIT_INTERRUPTED = 130  # stopped by SIGINT/SIGTERM; state is in git, run again to resume


class GitresearchError(Exception):
    """An error with a message meant for the user."""
