"""Programs that drive the operator on a local cluster of their own and report: `make demo`
(`demo`), `make bench` (`bench`), `make chaos` (`chaos`) and `make soak` (`soak`).

Why together: each starts a throwaway cluster, runs the operator against it, and stops both at the
end, also on failure and on Ctrl-C; they share that base (`base`: options, the cluster, the ending).
They run with the development virtualenv (they use the operator's client). See README.md beside
this file.
"""
