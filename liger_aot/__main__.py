import sys

from liger_aot.cli import main

if __name__ == "__main__":  # spawned build workers import this module too
    sys.exit(main())
