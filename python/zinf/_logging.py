"""zinf's log lines through Python's ``logging``, logger ``"zinf"``: configure it as any
library's (``logging.basicConfig(level=logging.INFO)``, a handler of its own, a level).

The lines are queued by whichever thread of zinf's writes them and handed to the logger on a
Python thread once the call that wrote them returns (Note [Log bridge] in
python/csrc/log_bridge.cc). zinf formats only the lines the logger's level lets through:
``follow_logger_level()`` sets that threshold from the logger's effective level (zinf does it
when an engine is made), unless ZINF_LOG_LEVEL is set, which then decides as it does outside
Python."""

import atexit
import logging
import os

from zinf import _zinf

logger = logging.getLogger("zinf")

TRACE = 5  # zinf's trace lines, below logging.DEBUG
_LEVELS = {"trace": TRACE, "debug": logging.DEBUG, "info": logging.INFO,
           "warning": logging.WARNING, "error": logging.ERROR}


def _emit(lines):
    for level, message in lines:
        logger.log(_LEVELS[level], message)


def follow_logger_level():
    """Sets zinf's threshold to the "zinf" logger's effective level (ZINF_LOG_LEVEL wins)."""
    if os.environ.get("ZINF_LOG_LEVEL"):
        return
    level = logger.getEffectiveLevel()
    for name, value in _LEVELS.items():
        if level <= value:
            _zinf.set_log_level(name)
            return
    _zinf.set_log_level("off")


def flush():
    """Hands the lines zinf has queued to the logger now."""
    _zinf.drain_logs()


def _close():
    # Before the interpreter goes away: what is queued reaches the logger, later lines stderr.
    try:
        flush()
    finally:
        _zinf.set_log_handler(None)


_zinf.set_log_handler(_emit)
follow_logger_level()
atexit.register(_close)
