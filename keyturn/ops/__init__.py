"""Running Keyturn: the ``keyturn`` command, ``doctor``, the interruption
experiment, server processes and throwaway databases (for the experiment, the
benchmark and the tests)."""
