#!/usr/bin/env bash
# Run COMMAND (a pytest run) in the current directory with core dumps on; when it dies of a
# signal that dumps core (SIGSEGV, SIGABRT, SIGBUS, SIGILL, SIGFPE), print every thread's
# native stack from the core (gdb), remove the core, and exit with COMMAND's status.
#
#   tests/native_stack.sh COMMAND...
#
# Why: twice in CI a Ray 2.54.1 contract run died of SIGSEGV after its summary, past
# Python's finalization, where the fault handler (PYTHONFAULTHANDLER=1) prints nothing: what
# crashed is only in native code. Once more (stop 43, the vLLM 0.32 run) this printed it: a
# thread other than the main one in ray::RayLog::~RayLog. The Makefile's RUN_PYTEST now ends
# pytest with os._exit after its exit hooks; a crash in a test or an exit hook still prints. The kernel writes the core as ./core (core_pattern "core",
# the process's working directory): a core found here before COMMAND runs is refused, never
# overwritten or removed.
#
# Only COMMAND's own process may dump, and only from its end on: every process the run
# starts (Ray's, vLLM's engines and workers) keeps a core limit of 0, since one killed at a
# job's teardown would otherwise write GiBs into its own working directory and hold its
# shared memory while it does. pytest raises its own limit at pytest_unconfigure
# (tests/conftest.py, RSL_TEST_CORE_AT_EXIT), after its Ray clusters and jobs are gone.
set -uo pipefail

if [ -e core ]; then
    echo "native_stack: $(pwd)/core exists already; remove it or run elsewhere" >&2
    exit 2
fi
ulimit -S -c 0
RSL_TEST_CORE_AT_EXIT=1 "$@"
status=$?
if [ -f core ]; then
    echo "native_stack: a process of '$*' dumped core (exit status $status); its threads:" >&2
    program=$(file -b core | sed -n "s/.*execfn: '\([^']*\)'.*/\1/p")
    if command -v gdb >/dev/null && [ -n "$program" ]; then
        gdb -q -batch -ex "info threads" -ex "thread apply all bt 40" "$program" core 2>&1 \
            | grep -v "^\[New LWP\|^warning:" | tail -400 >&2
    else
        echo "native_stack: no gdb here, or the core names no program; $(file -b core)" >&2
    fi
    rm -f core
fi
exit "$status"
