"""A child process's log file, read by the script while the child still writes it.

The child writes through a descriptor of its own and every read opens the file afresh. One
descriptor shared by both (`open(path, "w+")`, then `seek(0)` and `read()` to poll it) shares one
file offset: a poll that runs while the child writes moves the child's next write back into the
file, over lines already there. The churn soak lost a progress line that way (CI, 2026-12-03).
"""


class ChildLog:
    def __init__(self, path):
        self.path = path
        # Handed to subprocess.Popen as stdout or stderr; only the child writes through it.
        self.sink = open(path, "w")

    def read(self):
        with open(self.path, errors="replace") as f:
            return f.read()
