"""What psycopg logs that the services' logs should not carry.

Importing the package installs the filter on psycopg's logger, so that no process
using pg_tx logs it, whichever of its modules it imports.
"""

from __future__ import annotations

import logging


class QuietAbortedPipeline(logging.Filter):
    """psycopg warns when leaving a pipeline fails while an exception already leaves
    the block: "error ignored terminating <pipeline>: ..." when the closing sync
    fails ("pipeline aborted" after a failed statement, or the server's own words and
    CONTEXT lines when it went away), and "error ignored exiting <pipeline>: ..."
    when libpq cannot leave pipeline mode (the server ended the session while
    results were still due: "cannot exit pipeline mode while busy"). It logs them
    only while the block's own exception propagates, and that one is raised and
    translated anyway, so the warnings tell an operator nothing new and would put
    driver text into the services' logs."""

    QUIET = frozenset({"error ignored terminating %r: %s", "error ignored exiting %r: %s"})

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg not in self.QUIET


logging.getLogger("psycopg").addFilter(QuietAbortedPipeline())
