#!/bin/sh
# What `make` needs before it can install Kairos into .venv: a Python 3.11 or newer with its venv module.
# Called by the Makefile's install step with the interpreter to use ($1, the Makefile's PYTHON). A missing
# piece gets one line saying what is missing and how to get it, and exit status 2, instead of a traceback
# from halfway through an install.
python="${1:-python3}"
need="3.11"
if ! command -v "$python" >/dev/null 2>&1; then
    echo "kairos: '$python' not found: install Python $need or newer (https://www.python.org/downloads/, or your system's python3 package), or name one: make PYTHON=/path/to/python3 ..." >&2
    exit 2
fi
if ! "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
    found=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo "an unknown version")
    echo "kairos: '$python' is Python $found; Kairos needs $need or newer: install it, or name one: make PYTHON=/path/to/python3.12 ..." >&2
    exit 2
fi
if ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
    echo "kairos: '$python' has no venv module (Debian and Ubuntu ship it apart): apt-get install python3-venv, or name another Python: make PYTHON=... ..." >&2
    exit 2
fi
