"""Stand-in for SGLang's scheduler/detokenizer child processes: lives as long as its parent.

Why: real SGLang is a process tree (main + one scheduler per TP rank + detokenizer); the launcher must end the
whole tree, and tests must see it do so. Like SGLang's PR_SET_PDEATHSIG children, it exits when the parent dies.
"""

import os
import sys
import time


def main() -> None:
    parent = int(sys.argv[1])
    for _ in range(10**9):
        if os.getppid() != parent:
            return
        time.sleep(0.5)


if __name__ == "__main__":
    main()
