"""Run the probe: ``python3 -m gpuprobe [options]`` with the package's directory on ``sys.path``, or
``python3 DIR/gpuprobe [options]`` (the package directory itself, as the timer role runs it)."""

import os
import sys

if __package__:  # python3 -m gpuprobe
    from .cli import main
else:
    # python3 DIR/gpuprobe: Python runs this file as a script with DIR/gpuprobe as sys.path[0]. Put DIR there instead
    # (what sys.path[0] was when the probe was one file, DIR/gpuprobe.py: pynvml.py installed next to it is found the
    # same way) and import the package by its name.
    sys.path[0] = os.path.dirname(os.path.abspath(sys.path[0] or os.path.dirname(__file__)))
    from gpuprobe.cli import main

if __name__ == "__main__":
    sys.exit(main())
