"""`make bench`: how fast the operator brings up many TrainingJobs, and what it costs at rest.

Not a test: speed and memory targets live here, never in timed test assertions. One run:

1. starts a throwaway control plane in its own dev directory (`TJ_DEV_DIR`, default `.dev/bench`) with
   enough kwok nodes for every pod, and makes sure the CRD is installed and Established;
2. starts the operator as a process (`python -m controller`, default flags except
   `--metrics-bind-address 127.0.0.1:<free port> --metrics-secure=false`,
   `--health-probe-bind-address 127.0.0.1:<free port>` and `--lease-namespace default`, plus any
   extra flags given);
3. creates N TrainingJobs x R replicas from several threads and times, from the first create, when
   every pod exists, is bound, is Running, and when every job is Running;
4. counts the operator's API requests by verb (its `rest_client_requests_total`), its CPU seconds
   (`/proc/<pid>/stat`) and peak RSS (`VmHWM`) over that burst;
5. waits for steady state and watches the operator over a window: API writes per minute (POST, PUT,
   PATCH, DELETE; the leader-election Lease renewals are counted apart) and CPU as % of one core;
6. scales to BENCH_MEMORY_JOBS jobs (default 1,000, so 4,000 pods in the caches) and reads the RSS.

It prints one JSON object on stdout (targets included, each marked met or not) and progress lines
with the elapsed time on stderr. The operator and the bench cluster are stopped at the end, also on
failure and on Ctrl-C. See docs/bench.md.

    .venv/bin/python -m testbed.harness.bench [--jobs N] [--replicas R] [...] [-- extra operator flags]

Its modules: options (flags and variables), cluster (the bench cluster and its jobs), operator (the
operator process and its metrics), tracker (when pods and jobs got where, from the bench's watches),
procfs (CPU and memory from /proc), phases (the run), targets (what counts as met), __main__.
"""
