"""The GPU check kit (issue 37): pack.py packs a GPU release here, calls.py prints the device
calls, check.py serves and measures it there from the modules beside it (standard library only)."""
