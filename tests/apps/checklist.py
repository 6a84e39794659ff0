"""The checks of a test script: each printed ok or FAIL as it is made; finish() exits 1 when any
failed or none was made (a script whose checks never ran has not passed)."""
import sys

failures = []
checked = []


def check(cond, what):
    checked.append(what)
    print(f"  {'ok' if cond else 'FAIL'}: {what}")
    if not cond:
        failures.append(what)


def finish():
    if not checked:
        failures.append("no check ran")
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("every check passed")
